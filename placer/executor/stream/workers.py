"""Process workers for a per-batch CPU stage: one child process per worker thread.

May import: placer.pipeline, placer.devices, placer.errors, placer.executor.stagecall,
placer.executor.shipping, placer.executor.stream.config; cloudpickle inside functions.

Pure-Python per-sample code holds the GIL, so thread workers of such a stage run
one at a time. With ``StreamConfig(worker_kind={stage: "process"})`` each of the
stage's worker threads hands its batches to a child process of its own and waits
for the result: the runner's queues, ordering, backpressure and accounting stay
as they are, only the stage's call happens elsewhere.

Children are started once per stream run, before the stream's clock starts, as
fresh interpreters (``python -c``, like multiprocessing's ``spawn``: nothing is
forked from a process whose threads are running, and the parent's ``__main__`` is
not imported again) that take the parent's ``sys.path``. The stage travels to each
child once, pickled by cloudpickle (its module by value when it is a pipeline file
or another module that is not installed), with its one-shot inputs. Each batch
then travels as a pickle (protocol 5) whose array buffers follow it out of band:
every buffer crosses the socket once and lands in a writable buffer that the
array is rebuilt on, without further copies.

Faults: a child that dies (``os._exit``, a signal) makes the call raise
:class:`WorkerDied`, naming the stage and how it died; every wait is bounded, so
nothing hangs; :meth:`ProcessPool.close` ends every child (politely, then with
SIGKILL) and reaps it. Children start in a session of their own, so Ctrl-C in a
terminal (sent to the foreground process group) reaches the parent only, and they
ignore SIGINT besides: the parent decides when they stop. A child whose parent has
gone exits when it next waits for work or answers.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from placer.devices import Device
from placer.errors import PlacerError
from placer.executor.shipping import ship_by_value
from placer.executor.stagecall import call_stage
from placer.executor.stream.config import BatchInfo
from placer.pipeline import BATCH_INFO, Stage

#: seconds between checks of the stop flag and of the child while waiting for a result
_POLL_S = 0.05
#: the longest a child may take to start (import placer, unpickle the stage)
START_TIMEOUT_S = 120.0
#: how long a child gets to leave on its own before it is killed
_QUIT_S = 1.0
_HEADER = struct.Struct("<Q")


class WorkerDied(PlacerError):
    """A worker process ended while it was working on a batch (or before it could start)."""


class WorkerStopped(PlacerError):
    """The stream stopped (interrupted) while a worker process was working."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process (the ``__cause__`` of the re-raised one)."""

    def __str__(self) -> str:
        return self.args[0]


@dataclass
class StageCall:
    """What a child runs for each batch: one stage on one CPU device, with its one-shot inputs."""

    stage: Stage
    device: Device
    consts: dict[str, Any]
    takes_info: bool

    def __call__(self, inputs: dict[str, Any], info: BatchInfo) -> Any:
        extra = {BATCH_INFO: info} if self.takes_info else None
        return call_stage(self.stage, self.device, {**self.consts, **inputs}, extra=extra)


@dataclass
class PoolTimes:
    """What a pool measured: start-up, and of the busy time, computing vs moving batches."""

    start_s: float = 0.0
    compute_s: float = 0.0
    round_trip_s: float = 0.0
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, compute: float, round_trip: float) -> None:
        with self.lock:
            self.compute_s += compute
            self.round_trip_s += round_trip
            self.calls += 1


class ProcessPool:
    """``count`` child processes running one stage; each calling thread gets a child of its own.

    Parameters
    ----------
    name : str
        The stage (for messages).
    call : StageCall
    count : int
        Children to start (the stage's workers).
    stop : threading.Event
        Set when the stream stops: a call waiting on a child gives up, and the child is killed.
    """

    def __init__(self, name: str, call: StageCall, count: int, stop: threading.Event):
        self.name, self.call_obj, self.count, self.stop = name, call, count, stop
        self.children: list[_Child] = []
        self.times = PoolTimes()
        self._mine = threading.local()
        self._next = 0
        self._lock = threading.Lock()

    def start(self) -> float:
        """Start every child (in parallel) and wait until each has loaded the stage; return the seconds."""
        t = time.perf_counter()
        payload = [pickle.dumps(list(sys.path)), _dumps_stage(self.call_obj)]
        try:
            self.children = [_Child.launch(self.name) for _ in range(self.count)]
            for c in self.children:
                c.send_raw(payload)
            for c in self.children:
                c.wait_ready(self.stop)
        except BaseException:
            self.close()
            raise
        self.times.start_s = time.perf_counter() - t
        return self.times.start_s

    def __call__(self, inputs: dict[str, Any], info: BatchInfo) -> Any:
        """Run the stage on one batch in this thread's child; raise what the stage raised there."""
        child = getattr(self._mine, "child", None)
        if child is None:
            with self._lock:
                child = self._mine.child = self.children[self._next]
                self._next += 1
        t = time.perf_counter()
        out, compute = child.call(inputs, info, self.stop)
        self.times.add(compute, time.perf_counter() - t)
        return out

    def close(self) -> None:
        """End every child and reap it (bounded: a child that does not leave is killed)."""
        for c in self.children:
            c.ask_to_quit()
        deadline = time.perf_counter() + _QUIT_S
        for c in self.children:
            c.end(max(0.0, deadline - time.perf_counter()))


class _Child:
    """One child process and the socket to it."""

    def __init__(self, name: str, proc: subprocess.Popen, sock: socket.socket):
        self.name, self.proc, self.sock = name, proc, sock

    @classmethod
    def launch(cls, name: str) -> _Child:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        root = os.path.abspath(__file__)
        for _ in __name__.split("."):  # up from this file to the folder that holds the ``placer`` package
            root = os.path.dirname(root)
        env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
        fd = theirs.fileno()
        code = f"from placer.executor.stream.workers import serve; serve({fd})"
        # a session of its own: Ctrl-C in a terminal reaches the parent only, which ends its children
        proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=[fd], env=env, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        theirs.close()  # the child's end lives in the child only: its death reads as end of file here
        return cls(name, proc, ours)

    def send_raw(self, parts: list[bytes]) -> None:
        try:
            _send_parts(self.sock, parts)
        except OSError as exc:
            raise self._died("while starting") from exc

    def wait_ready(self, stop: threading.Event) -> None:
        deadline = time.perf_counter() + START_TIMEOUT_S
        while not _readable(self.sock):
            if stop.is_set():
                raise WorkerStopped(f"stream stopped while the workers of stage {self.name!r} started",
                                    stage=self.name)
            if self.proc.poll() is not None:
                raise self._died("while starting")
            if time.perf_counter() > deadline:
                raise WorkerDied(f"a worker process of stage {self.name!r} did not start within "
                                 f"{START_TIMEOUT_S:.0f} s", stage=self.name)
        status, value, _ = self._receive("while starting")
        if status != "ready":
            raise _remote_error(value)

    def call(self, inputs: dict[str, Any], info: BatchInfo, stop: threading.Event) -> tuple[Any, float]:
        try:
            _send_parts(self.sock, _dumps((inputs, info)))
        except OSError as exc:
            raise self._died("before it got the batch") from exc
        while not _readable(self.sock):
            if stop.is_set():
                self.proc.kill()
                raise WorkerStopped(f"stream stopped while stage {self.name!r} worked", stage=self.name)
            if self.proc.poll() is not None and not _readable(self.sock):
                raise self._died("while working on the batch")
        status, value, compute = self._receive("while working on the batch")
        if status != "ok":
            raise _remote_error(value)
        return value, compute

    def _receive(self, when: str) -> tuple:
        try:
            return _recv_parts(self.sock)
        except (OSError, EOFError) as exc:
            raise self._died(when) from exc

    def _died(self, when: str) -> WorkerDied:
        try:
            code = self.proc.wait(timeout=_QUIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return WorkerDied(f"the worker process (pid {self.proc.pid}) running stage {self.name!r} died {when} "
                          f"({how})", stage=self.name)

    def ask_to_quit(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)  # end of file: the child leaves its loop
        except OSError:
            pass

    def end(self, wait_s: float) -> None:
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()


# -- the wire: a header (number of parts), then each part with its length ---------------------
def _dumps(obj: Any) -> list[Any]:
    """``obj`` as a pickle and its out-of-band buffers (arrays are not copied into the pickle)."""
    bufs: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    return [data, *(b.raw() for b in bufs)]


def _dumps_stage(call: StageCall) -> bytes:
    import cloudpickle

    ship_by_value([impl.fn for impl in (call.stage.fn, call.stage.cpu, call.stage.gpu) if impl is not None])
    return cloudpickle.dumps(call)


def _send_parts(sock: socket.socket, parts: list[Any]) -> None:
    views = [memoryview(p).cast("B") for p in parts]
    sock.sendall(_HEADER.pack(len(views)) + b"".join(_HEADER.pack(v.nbytes) for v in views))
    for v in views:
        sock.sendall(v)


def _recv_parts(sock: socket.socket) -> Any:
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    sizes = [_HEADER.unpack(_recv_exact(sock, _HEADER.size))[0] for _ in range(n)]
    parts = [_recv_exact(sock, size) for size in sizes]
    return pickle.loads(parts[0], buffers=parts[1:])


def _recv_exact(sock: socket.socket, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("the other end closed the connection")
        got += k
    return buf


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], _POLL_S)[0])


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any exception that cannot travel is described instead
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _remote_error(value: tuple[BaseException, str]) -> BaseException:
    exc, text = value
    exc.__cause__ = RemoteTraceback(text)
    return exc


# -- the child ---------------------------------------------------------------------------------
def serve(fd: int) -> None:
    """A child's life: load the stage, then answer one batch at a time until the socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when its workers stop
    sock = socket.socket(fileno=fd)
    try:
        call = _recv_stage(sock)
        _send_parts(sock, _dumps(("ready", None, 0.0)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        _reply_error(sock, exc)
        return
    while True:
        try:
            inputs, info = _recv_parts(sock)
        except (EOFError, OSError):
            return  # the parent closed the socket (or is gone): done
        t = time.perf_counter()
        try:
            reply = ("ok", call(inputs, info), time.perf_counter() - t)
            parts = _dumps(reply)
        except Exception as exc:  # noqa: BLE001 - the stage's exception, re-raised in the parent
            _reply_error(sock, exc)
            continue
        try:
            _send_parts(sock, parts)
        except OSError:
            return  # the parent is gone


def _recv_stage(sock: socket.socket) -> StageCall:
    """The parent's ``sys.path`` (put first here), then the stage, unpickled with it."""
    import cloudpickle

    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    sizes = [_HEADER.unpack(_recv_exact(sock, _HEADER.size))[0] for _ in range(n)]
    path, payload = (_recv_exact(sock, size) for size in sizes)
    parent = pickle.loads(path)
    sys.path[:] = parent + [p for p in sys.path if p not in parent]
    return cloudpickle.loads(payload)


def _reply_error(sock: socket.socket, exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    try:
        _send_parts(sock, _dumps(("error", (_portable(exc), text), 0.0)))
    except OSError:
        pass

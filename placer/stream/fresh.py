"""The drop-in's runs, each in a fresh process: the state the user's script starts in.

May import: placer.timing; cloudpickle, torch, placer.data.stream, placer.stream.procmem,
placer.stream.reopen, placer.stream.dropin.{guards,measuring} inside functions.

A script the user runs starts in a fresh process; the drop-in's runs otherwise all share the
user's long-lived one, whose history moves them: placer settles glibc's allocator there
(:func:`placer.timing.settle_allocator`), and each run's heap is what the runs before it left.
Settings that differ by a fifth in a fresh script can measure alike in such a process, and one
setting can read a quarter faster or slower there than in the script.

:class:`FreshRuns` starts one helper interpreter that loads a copy of the user's loader and step
(pickled with cloudpickle by a child forked for it, :func:`pickled_apart`, so the user's heap is left as it
was: a ``__main__`` Dataset or step goes by value; open files, arrays mapped from files, SQLite
connections and locks are opened again by name, :mod:`placer.stream.reopen`), reads one batch through
the step at one intra-op thread (:func:`_prime`: the script's first batch, its first-call costs
paid), then forks one child per run: each run starts from the same fresh state, with the
allocator as the script's first batch leaves it, unsettled, and the step trains a copy of the
model (the user's is not changed). The runs' random state starts from the user's process's (torch, numpy, ``random``).
torch's OpenMP threads do not survive a fork of a process that has used them (a child of the
user's process hangs at its first parallel operation): the helper is a new interpreter, not a fork.

Where that cannot be (not Linux, a step on a GPU, a loader or step that does not pickle, a helper
that fails to start or to answer), the runs stay in this process and :func:`start` or
:meth:`FreshRuns.run` says why. A run that outlasts its share of the budget by far (:func:`stuck_after`)
is ended alone: :class:`RunStuck` names it, and the other runs go on in fresh processes.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

#: seconds a run may last past its own deadline before its process is stopped and the runs go on here
RUN_TIMEOUT_S = 120.0
#: a run outlasting ``STUCK_TIMES`` x (its share of the budget + the warm-up it may take) + ``STUCK_MARGIN_S``
#: is stuck (a step or a batch that blocks): its process is ended and its setting reported unmeasured, so
#: that one call that hangs does not hold the advice for the whole of it. A run with no bound on its warm-up
#: (the user's own settings, whose first runs set the others' bound, or a loader without a length) keeps
#: ``RUN_TIMEOUT_S`` past its share: its workers' start-up is not known yet (two numpy-augmenting worker
#: processes took 4-6 s to their first batch on 2 cores)
STUCK_TIMES = 2.0
STUCK_MARGIN_S = 5.0
#: seconds the helper may take to start (an interpreter, torch, the loader and step unpickled)
START_TIMEOUT_S = 120.0

_BOOT = ("import os, pickle, sys; f = os.fdopen(int(sys.argv[1]), 'rb'); sys.path[:0] = pickle.load(f); "
         "from placer.stream.fresh import _serve; _serve(f, int(sys.argv[2]))")


class FreshUnavailable(RuntimeError):
    """The runs cannot be made in fresh processes; the message says why."""


class RunStuck(RuntimeError):
    """One run outlasted its limit (:func:`stuck_after`) and its process was ended; the helper serves on."""


def stuck_after(kw: dict[str, Any]) -> float:
    """Seconds after which a run with :func:`~placer.stream.dropin.run_loader`'s ``kw`` is stuck."""
    give_up = kw.get("give_up_s")
    share = max(kw["deadline"].left(), 0.0)
    if give_up is None:
        return share + RUN_TIMEOUT_S
    return STUCK_TIMES * (share + give_up) + STUCK_MARGIN_S


def why_not(device_kind: str) -> str | None:
    """Why runs cannot be fresh here before trying (None where they may be)."""
    if not sys.platform.startswith("linux"):
        return f"fresh processes are forked, which placer does only on Linux (this is {sys.platform})"
    if device_kind != "cpu":
        return "the step runs on a GPU: a fresh process for each run would start the GPU afresh each time"
    return None


def pickled_apart(path: str, obj: Any, timeout_s: float = START_TIMEOUT_S) -> None:
    """``obj`` pickled (cloudpickle) to ``path`` by a child forked for it, so this process's heap is left as it was.

    Pickling the user's loader where it lives fills and frees a memo and a payload of the Dataset's size
    there, and the script's own loop runs slower after it (by about a tenth where it was measured). The
    child only pickles and writes.
    Where it cannot fork, fails to start or outlasts ``timeout_s``, the pickling is done here.
    Raises what pickling raises (in the child: :class:`FreshUnavailable` with its message).
    """
    from placer.stream.reopen import dump

    def here() -> None:
        with open(path, "wb") as f:
            dump(obj, f)

    if not hasattr(os, "fork"):
        return here()
    err = path + ".err"
    import warnings

    with warnings.catch_warnings():  # Python 3.12+ warns of forking a threaded process; the child only pickles
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork")
        pid = os.fork()
    if pid == 0:  # the child: pickle, write whole, leave without running anything of the parent's
        code = 0
        try:
            with open(path + ".part", "wb") as f:
                dump(obj, f)
            os.replace(path + ".part", path)
        except BaseException as e:  # noqa: BLE001 - carried to the parent
            code = 1
            try:
                with open(err, "w") as f:
                    f.write(f"{type(e).__name__}: {e}")
            except BaseException:  # noqa: BLE001
                pass
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = None
            break
        time.sleep(0.005)
    if status is not None and os.path.exists(path) and os.waitstatus_to_exitcode(status) == 0:
        return None
    why = None
    if os.path.exists(err):
        with open(err) as f:
            why = f.read()
    for left in (err, path + ".part"):
        with contextlib.suppress(OSError):
            os.remove(left)
    if why is not None:
        raise FreshUnavailable(why)
    return here()  # the child outlasted its time or died without a word: pickled here


class FreshRuns:
    """A helper process holding a copy of ``loader`` and ``step``; :meth:`run` forks a child for each run.

    Raises :class:`FreshUnavailable` where they do not pickle or the helper does not start.
    """

    def __init__(self, loader: Any, step: Any):
        self.dir = tempfile.mkdtemp(prefix="placer-fresh-")
        # the helper maps the payload from a file: reading it into memory and freeing it would raise glibc's
        # mmap threshold to the payload's size (up to 32 MiB), the settled state a fresh script is not in
        loaded = os.path.join(self.dir, "payload.pkl")
        try:
            pickled_apart(loaded, (loader, step))
        except Exception as e:  # whatever the user's objects raise (named by the child that pickled them)
            shutil.rmtree(self.dir, ignore_errors=True)
            why = str(e) if isinstance(e, FreshUnavailable) else f"{type(e).__name__}: {e}"
            raise FreshUnavailable(f"the loader or the step could not be pickled for a fresh process ({why})") from e
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, str(to_r), str(from_w)],
                                     pass_fds=(to_r, from_w), start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self._w = os.fdopen(to_w, "wb")
        self._r = from_r
        self._rest = b""
        self._n = 0
        try:
            pickle.dump([p for p in sys.path if p], self._w)
            pickle.dump(loaded, self._w)
            self._w.flush()
            answer = self._recv(START_TIMEOUT_S)
        except (OSError, EOFError, pickle.UnpicklingError, TimeoutError) as e:
            self.close()
            raise FreshUnavailable(f"the fresh process did not start ({type(e).__name__}: {e})") from e
        if answer[0] != "ready":
            self.close()
            raise FreshUnavailable(f"the fresh process could not load the loader and step ({answer[1]})")

    def _recv(self, timeout_s: float) -> Any:
        # the helper answers twice a run ("started", then "done"), and one read may hold both: what follows
        # the first answer stays in ``_rest`` for the next call
        data, self._rest = self._rest, b""
        while True:  # one pickled answer, read whole before it is unpickled
            if data:
                f = io.BytesIO(data)
                try:
                    answer = pickle.load(f)
                except (EOFError, pickle.UnpicklingError):
                    pass
                else:
                    self._rest = data[f.tell():]
                    return answer
            ready, _, _ = select.select([self._r], [], [], timeout_s)
            if not ready:
                self._rest = data
                raise TimeoutError(f"no answer in {timeout_s:.0f} s")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise EOFError("the fresh process ended")
            data += chunk

    def run(self, settings: Any, step: bool, threads: int | None, kw: dict[str, Any]) -> Any:
        """:func:`~placer.stream.dropin.measuring.run_loader` of the loader rebuilt with ``settings`` (with the step
        when
        ``step``), at ``threads`` intra-op threads, in a child forked for it; ``kw`` as ``run_loader`` takes it.
        Fills ``kw["keep"]`` and updates ``kw["count"]`` as the run did; raises what the run raised,
        :class:`RunStuck` where the run outlasted :func:`stuck_after` (its process group ended: the child and
        its workers; the helper serves the next run), and :class:`FreshUnavailable` where the child died
        without its result or the helper stopped answering."""
        import random

        import numpy as np
        import torch

        self._n += 1
        out = os.path.join(self.dir, f"run{self._n}.pkl")
        req = {"out": out, "settings": settings, "step": step, "threads": threads, "kw": kw,
               "rng": (torch.get_rng_state(), np.random.get_state(), random.getstate())}
        limit = stuck_after(kw)
        try:
            pickle.dump(req, self._w)
            self._w.flush()
            started = self._recv(START_TIMEOUT_S)  # ("started", the run's pid): its process group to end
            try:
                answer = self._recv(limit)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(started[1], signal.SIGKILL)  # the run and its workers; the helper reaps it
                self._recv(START_TIMEOUT_S)
                with contextlib.suppress(OSError):
                    os.unlink(out)
                raise RunStuck(f"its run did not end in {limit:.0f} s (twice its share of the budget and its "
                               "warm-up, and a margin), so it was stopped: a step or a batch that blocks for "
                               "long (a lock, a read that hangs) holds your script too") from None
        except (OSError, EOFError, TimeoutError) as e:
            self.close(kill=True)
            raise FreshUnavailable(f"a run in a fresh process did not end ({type(e).__name__}: {e})") from e
        try:
            with open(out, "rb") as f:
                result = pickle.load(f)
            os.unlink(out)
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            self.close()
            raise FreshUnavailable(f"a run in a fresh process ended without its result (exit status "
                                   f"{answer[1]})") from e
        if result[0] == "error":
            error, text = result[1], result[2]
            if isinstance(error, BaseException):
                raise error
            raise RuntimeError(f"a run of the loader and step in a fresh process failed:\n{text}")
        trial, kept, count = result[1]
        if kw.get("keep") is not None:
            kw["keep"].extend(kept)
        if kw.get("count") is not None and count is not None:
            kw["count"].__dict__.update(count.__dict__)
        return trial

    def close(self, kill: bool = False) -> None:
        """Stop the helper (and any child left: at once where ``kill``) and remove its files."""
        try:
            self._w.close()
        except OSError:
            pass
        try:
            os.close(self._r)
        except OSError:
            pass
        if self.proc.poll() is None:
            try:
                if kill:
                    raise subprocess.TimeoutExpired(self.proc.args, 0)
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def start(loader: Any, step: Any, device_kind: str) -> tuple[FreshRuns | None, str | None]:
    """The fresh runs for ``loader`` and ``step``, or None and why they cannot be."""
    why = why_not(device_kind)
    if why is not None:
        return None, why
    try:
        return FreshRuns(loader, step), None
    except FreshUnavailable as e:
        return None, str(e)


def _serve(read: Any, write_fd: int) -> None:
    """The helper: load the loader and step, then fork a child for each run asked for, one at a time."""
    from placer import timing

    timing.leave_allocator()
    write = os.fdopen(write_fd, "wb")

    def answer(*what: Any) -> None:
        pickle.dump(what, write)
        write.flush()

    try:
        import mmap

        import cloudpickle

        with open(pickle.load(read), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            loader, step = cloudpickle.loads(m)
        threads = _prime(loader, step)
        from placer.stream import procmem

        procmem.sizes(full=False)  # psutil imported once here, not in each run's child (each reads its memory)
    except Exception as e:  # noqa: BLE001 - the user's objects may fail to load anywhere
        answer("failed", f"{type(e).__name__}: {e}")
        return
    answer("ready", None)
    while True:
        try:
            req = pickle.load(read)
        except EOFError:
            return
        pid = os.fork()
        if pid == 0:
            _child(loader, step, req, threads)
        answer("started", pid)
        _, status = os.waitpid(pid, 0)
        answer("done", status)


def _prime(loader: Any, step: Any) -> int:
    """One batch of the loader, in this process, through the step, at one intra-op thread; returns torch's
    threads before. The children then start where the script is after its first batch: its modules
    imported and its first-call costs paid (images' fresh runs spent 0.7-1.0 s on them, every run alike,
    which the script pays once), its allocator as that batch left it. One thread: no OpenMP team exists
    in this process that a child would inherit without its threads (:mod:`placer.stream.fresh`)."""
    import torch

    from placer.data.stream import LoaderSettings
    from placer.stream.dropin.measuring import close_iterator, rebuild

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    it = iter(rebuild(loader, LoaderSettings()))
    try:
        batch = next(it, None)
        if batch is not None and step is not None:
            step(batch)
    finally:
        close_iterator(it)
    return threads


def _child(loader: Any, step: Any, req: dict[str, Any], threads: int) -> None:
    """One run, its result written to ``req["out"]`` whole (a temporary file renamed), then exit."""
    code = 0
    try:
        os.setpgid(0, 0)  # a group of its own, with its workers: a stuck run is ended whole (RunStuck)
        import random

        import numpy as np
        import torch

        from placer.stream.dropin.guards import past_the_cores
        from placer.stream.dropin.measuring import rebuild, run_loader
        from placer.timing import torch_threads

        rng = req["rng"]
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
        kw = req["kw"]
        with torch_threads(req["threads"] or threads), past_the_cores():
            trial = run_loader(rebuild(loader, req["settings"]), step if req["step"] else None, **kw)
        result: tuple = ("ok", (trial, kw.get("keep") or [], kw.get("count")))
    except BaseException as e:  # noqa: BLE001 - carried to the user's process
        result = ("error", e, traceback.format_exc())
    try:
        tmp = req["out"] + ".part"
        with open(tmp, "wb") as f:
            try:
                pickle.dump(result, f)
            except Exception:  # noqa: BLE001 - an error that does not pickle goes as its text
                f.seek(0)
                f.truncate()
                pickle.dump(("error", None, result[2] if result[0] == "error" else traceback.format_exc()), f)
        os.replace(tmp, req["out"])
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

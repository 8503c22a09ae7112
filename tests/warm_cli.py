"""``python -m placer ARGS`` (or ``python SCRIPT ARGS``) for the tests, forked from one interpreter that has
already imported torch.

Importing torch takes a second or more; about a hundred tests run the command. Each call here is still
its own process, as ``subprocess.run([sys.executable, "-m", "placer", ...])`` gives: its own working
directory, environment, stdin, stdout and stderr, exit status and interpreter exit (atexit handlers,
flushed streams), and a timeout that kills it. Only the imports of torch (with ``torch._dynamo``, which a
first optimizer imports), numpy and the libraries placer imports (networkx, pydantic, typer, jinja2) are
done once, in a
server process forked for every call. A call whose environment differs from the server's in what
those imports or the interpreter's start-up read (``PYTHON*`` but ``PYTHONPATH``, which the child puts
on ``sys.path`` as start-up would, thread counts, CUDA's devices, typer's terminal) runs as
a fresh subprocess instead, and so does every call when ``PLACER_TEST_FRESH_CLI=1``. What the server's
imports set in its environment (``TORCHINDUCTOR_CACHE_DIR``, which importing ``torch._dynamo`` sets, here too
once a test has imported it) matches where the caller holds the same value.
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading

# read by the interpreter's start-up or by the server's imports (torch, numpy, typer's terminal settings):
# a call must match the server in these
_STARTUP = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "GOTO", "BLIS_", "KMP_", "VECLIB", "NUMEXPR", "CUDA_",
            "TORCH", "PYTORCH", "LD_", "TYPER_", "_TYPER_", "TERMINAL_WIDTH", "GITHUB_ACTIONS", "FORCE_COLOR",
            "PY_COLORS")

_SERVER = r"""
import json, os, sys
BEFORE = dict(os.environ)
import numpy, torch  # the imports every call would otherwise repeat
import torch._dynamo  # what torch.optim's first optimizer imports (about 2 s)
import jinja2, networkx, pydantic, typer  # what importing placer imports besides (half a second)
# what the imports put in the environment (torch._dynamo sets TORCHINDUCTOR_CACHE_DIR): the first line out
os.write(1, json.dumps({k: v for k, v in os.environ.items() if BEFORE.get(k) != v}).encode() + b"\n")


def pythonpath(value, cwd):
    # sys.path's entries from a PYTHONPATH, as the interpreter's start-up makes them (absolute, once each)
    out = []
    for p in value.split(os.pathsep):
        if p and os.path.abspath(os.path.join(cwd, p)) not in out:
            out.append(os.path.abspath(os.path.join(cwd, p)))
    return out


OWN = pythonpath(os.environ.get("PYTHONPATH", ""), os.getcwd())  # this server's, in sys.path after [0]


def serve():
    requests = sys.stdin.buffer
    while True:
        line = requests.readline()
        if not line:
            os._exit(0)
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return req
        os.write(1, b"%d\n" % pid)
        _, status = os.waitpid(pid, 0)
        os.write(1, b"%d\n" % os.waitstatus_to_exitcode(status))


req = serve()
# this is the forked child: it becomes `python -m placer ARGS` in the caller's folder and environment
os.setsid() if req["new_session"] else None
os.chdir(req["cwd"])
if req["env"].get("PYTHONPATH", "") != os.environ.get("PYTHONPATH", ""):
    # the caller's PYTHONPATH instead of the server's: first after sys.path[0], before the standard library
    theirs = pythonpath(req["env"].get("PYTHONPATH", ""), req["cwd"])
    rest = [p for p in sys.path[1:] if p not in OWN]
    sys.path[1:] = theirs + [p for p in rest if p not in theirs]
os.environ.clear()
os.environ.update(req["env"])
for fd, path, flags in ((0, req["stdin"], os.O_RDONLY), (1, req["stdout"], os.O_WRONLY),
                        (2, req["stderr"], os.O_WRONLY)):
    f = os.open(path, flags)
    os.dup2(f, fd)
    os.close(f)
via = req["via"]
if via == "script":  # `python SCRIPT ARGS`: the script's folder first on sys.path, its path as argv[0]
    sys.path[0] = os.path.dirname(os.path.abspath(req["args"][0]))
    sys.argv = list(req["args"])
else:
    sys.path[0] = os.getcwd() if via == "-m" else ""  # as `python -m` and `python -c` put it
    sys.argv = [via, *req["args"]]
del serve, req
try:
    if via == "-m":
        import runpy
        runpy.run_module("placer", run_name="__main__", alter_sys=True)
    elif via == "script":
        import runpy
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        from placer.cli import main
        main()
    code = 0
except SystemExit as exc:
    code = exc.code
except BaseException:
    sys.excepthook(*sys.exc_info())
    code = 1
# the interpreter's exit, less tearing down the modules (torch's take about a second): non-daemon
# threads are joined, atexit handlers run, and every file still open is flushed, as exiting would
import _io, atexit, gc, threading
threading._shutdown()
atexit._run_exitfuncs()
if code is None:
    code = 0
elif not isinstance(code, int):
    print(code, file=sys.stderr)
    code = 1
for f in gc.get_objects():
    if _io._IOBase in type(f).__mro__:
        try:
            f.flush()
        except Exception:
            pass
for f in (sys.stdout, sys.stderr):
    try:
        f.flush()
    except Exception:
        pass
os._exit(code & 0xFF)
"""

_lock = threading.Lock()
_server: subprocess.Popen | None = None
_SERVER_ENV = dict(os.environ)  # the tests' environment as conftest.py set it


_set_by_imports: dict[str, str] = {}  # what the server's imports put in its environment


def _startup(env: dict[str, str]) -> dict[str, str]:
    """What start-up reads of ``env``, less PYTHONPATH (the server puts the caller's on sys.path) and less what
    the server's imports set to the value ``env`` holds (this process's own imports set the same, when they run)."""
    return {k: v for k, v in env.items()
            if k.startswith(_STARTUP) and k != "PYTHONPATH" and _set_by_imports.get(k) != v}


def _start() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env=_SERVER_ENV, cwd=tempfile.gettempdir(), start_new_session=True)
        atexit.register(_stop)
        _set_by_imports.clear()
        _set_by_imports.update(json.loads(_readline(_server, None)))
    return _server


def _stop() -> None:
    global _server
    if _server is not None and _server.poll() is None:
        _server.stdin.close()
        try:
            _server.wait(10)
        except subprocess.TimeoutExpired:
            _server.kill()
    _server = None


def _readline(server: subprocess.Popen, timeout: float | None) -> str | None:
    fd = server.stdout.fileno()
    if timeout is not None and not select.select([fd], [], [], max(timeout, 0.0))[0]:
        return None
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            raise RuntimeError("the placer test server ended")
        line += chunk
    return line.decode()


def run(args, *, env: dict[str, str] | None = None, cwd=None, timeout: float | None = None, input=None,
        capture_output: bool = True, text: bool = True, check: bool = False,
        start_new_session: bool = False, via: str = "-m") -> subprocess.CompletedProcess:
    """As ``subprocess.run([sys.executable, "-m", "placer", *args], capture_output=True, ...)``; with
    ``via="-c"``, as ``subprocess.run([sys.executable, "-c", "from placer.cli import main; main()", *args], ...)``;
    with ``via="script"``, as ``subprocess.run([sys.executable, *args], ...)`` where ``args[0]`` is a script's path."""
    args = [str(a) for a in args]
    head = {"-m": ["-m", "placer"], "-c": ["-c", "from placer.cli import main; main()"], "script": []}[via]
    cmd = [sys.executable, *head, *args]
    env = dict(os.environ if env is None else env)
    fresh = not capture_output or os.environ.get("PLACER_TEST_FRESH_CLI") == "1"
    if not fresh:
        with _lock:
            _start()
            fresh = _startup(env) != _startup(_SERVER_ENV)
    if fresh:
        return subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, input=input, capture_output=capture_output,
                              text=text, check=check, start_new_session=start_new_session)
    with _lock, tempfile.TemporaryDirectory(prefix="placer-cli-") as tmp:
        paths = {name: os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")}
        data = input if input is not None else ""
        with open(paths["stdin"], "w" if isinstance(data, str) else "wb") as f:
            f.write(data)
        for name in ("stdout", "stderr"):
            open(paths[name], "wb").close()
        if input is None:
            paths["stdin"] = os.devnull
        server = _start()
        req = {"args": args, "env": env, "cwd": os.path.abspath(cwd or os.getcwd()),
               "new_session": start_new_session, "via": via, **paths}
        server.stdin.write(json.dumps(req).encode() + b"\n")
        server.stdin.flush()
        pid = int(_readline(server, None))
        rc_line = _readline(server, timeout)
        timed_out = rc_line is None
        if timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            rc_line = _readline(server, None)
        mode = "r" if text else "rb"
        kw = {"encoding": locale.getpreferredencoding(False)} if text else {}
        with open(paths["stdout"], mode, **kw) as f:
            out = f.read()
        with open(paths["stderr"], mode, **kw) as f:
            err = f.read()
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
    done = subprocess.CompletedProcess(cmd, int(rc_line), out, err)
    if check:
        done.check_returncode()
    return done

"""Running the user's command with the hook: one trial, one applied run.

May import: the standard library; placer.errors.

A run starts the command as the user typed it, in the user's folder and environment, with
this package's ``site/`` folder first on ``PYTHONPATH`` (its ``sitecustomize`` loads
:mod:`placer.tune.hook` before the script's first line), ``PLACER_TUNE`` naming the run's
instructions and, for a trial, ``PLACER_TUNING=1`` (a script may skip its checkpoints and
uploads while it is tuned). Each run is a new session (process group): a trial that outlasts
its time, or a Ctrl-C, ends the script and every process it started (:func:`end_group`), before the
interrupt goes on to the caller.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placer.errors import PlacerError

SITE = Path(__file__).resolve().parent / "site"
#: the last lines of the script's output kept to show when it fails
TAIL_LINES = 20
#: launchers that start several Python processes: placer tune times one process
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "accelerate", "deepspeed",
             "mpirun", "horovodrun")


class TuneError(PlacerError):
    """``placer tune`` cannot tune this command; the message says why and what to do."""


@dataclass
class ScriptRun:
    """One run of the script under the hook: what it measured and how it ended."""

    report: dict[str, Any]
    returncode: int | None
    wall_s: float
    started: float
    output_tail: str = ""
    timed_out: bool = False
    settings: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def loaders(self) -> list[dict[str, Any]]:
        return self.report.get("loaders", [])

    def loader(self, site: str) -> dict[str, Any] | None:
        """The first loader built at ``site`` that was iterated (or the first built there)."""
        there = [r for r in self.loaders if r["site"] == site]
        iterated = [r for r in there if r["batches"]]
        return (iterated or there or [None])[0]


def python_command(command: list[str]) -> list[str]:
    """The command to run: ``script.py ARGS`` becomes ``python script.py ARGS``; anything that is not
    Python, or that launches several processes, is refused with what to run instead."""
    if not command:
        raise TuneError("no command to tune: give it after --, e.g. placer tune -- python train.py")
    first = command[0]
    name = os.path.basename(first)
    if any(part in LAUNCHERS for part in (name, *command[1:3])):
        raise TuneError(f"`{shlex.join(command)}` launches several processes ({name}): placer tune measures one "
                        "process; tune one rank, e.g. placer tune -- python train.py")
    if first.endswith(".py"):
        return [sys.executable, *command]
    if name.startswith("python") or name in ("py", "pypy3"):
        return list(command)
    path = Path(first)
    if path.is_file():
        try:
            head = path.open("rb").readline(200)
        except OSError:
            head = b""
        if head.startswith(b"#!") and b"python" in head:
            return list(command)
    raise TuneError(f"`{shlex.join(command)}` is not a Python command: placer tune runs Python scripts "
                    "(placer tune -- python train.py ARGS, or placer tune train.py ARGS)")


def run_script(command: list[str], instructions: dict[str, Any], *, timeout_s: float | None,
               trial: bool = True, capture: bool = True) -> ScriptRun:
    """Run ``command`` once with the hook and ``instructions``; wait for its end (or end it at ``timeout_s``)."""
    with tempfile.TemporaryDirectory(prefix="placer-tune-") as tmp:
        report_path = Path(tmp) / "report.json"
        spec_path = Path(tmp) / "run.json"
        spec_path.write_text(json.dumps({**instructions, "report": str(report_path)}))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(SITE), *filter(None, [env.get("PYTHONPATH")])])
        env["PLACER_TUNE"] = str(spec_path)
        env.pop("PLACER_TUNE_OWNER", None)
        if trial:
            env["PLACER_TUNING"] = "1"
        else:
            env.pop("PLACER_TUNING", None)
        out_path = Path(tmp) / "output.txt"
        started = time.perf_counter()
        with out_path.open("wb") as out:
            proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out if capture else None, stderr=subprocess.STDOUT if capture else None,
                                    start_new_session=True)
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BaseException:
                end_group(proc)
                raise
            finally:
                end_group(proc)
        wall = time.perf_counter() - started
        report = json.loads(report_path.read_text()) if report_path.exists() else {"loaders": []}
        tail = ""
        if capture and out_path.exists():
            lines = out_path.read_text(errors="replace").splitlines()
            tail = "\n".join(lines[-TAIL_LINES:])
        return ScriptRun(report=report, returncode=proc.returncode, wall_s=wall, started=started,
                         output_tail=tail, timed_out=timed_out, settings=instructions.get("settings"))


def end_group(proc: subprocess.Popen) -> None:
    """End the script and every process it started (its session): TERM, then KILL after a moment; where an
    interrupt (Ctrl-C) comes in the meantime, KILL at once before it goes on."""
    try:
        _term_then_kill(proc)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        raise


def _term_then_kill(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; its group may still hold workers
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return

"""The pipeline forms of the plain scripts: their advice, and a stream plan written as the script's flags.

``benchmarks/plain/pipelines/<script>_pipeline.py`` is a plain script ported to placer
(its own Dataset, sampler and model, imported from the script). :func:`advise` runs
``placer advise`` on it as a user would, at the script's size and epochs, and keeps
the plan's settings and speed-ups; :func:`plan_flags` writes those settings as the
script's flags, saying what of the plan the flags cannot express.

May import: placer.data.stream; the standard library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FORMS = HERE / "plain" / "pipelines"

#: the option of ``placer advise`` that runs the stream as the script as written does: one batch at a time
#: (the loader in the main process, then the step), torch's own threads
AS_WRITTEN = "num_workers=0"


def forms() -> dict[str, Path]:
    """Script name -> its pipeline form."""
    return {p.name.removesuffix("_pipeline.py"): p for p in sorted(FORMS.glob("*_pipeline.py"))}


def plan_flags(settings: Mapping[str, Any], source: str, step: str, *, cache_flag: bool,
               thread_flag: bool = True) -> tuple[list[str], list[str]]:
    """The script's flags for a stream plan's settings, and notes on what they cannot express.

    Parameters
    ----------
    settings : mapping
        The plan's settings as ``placer advise --json`` prints them (``streams[i].settings``):
        ``placement`` and the :class:`~placer.data.stream.StreamSettings` decisions.
    source, step : str
        The stream's source (a DataLoader or Dataset: its workers are the script's loader's) and step;
        the placement's other members are its per-batch stages.
    cache_flag : bool
        Whether the script has ``--cache`` (a per-sample cache of its deterministic work).
    thread_flag : bool
        Whether the script has a thread-pool loader (``--worker-kind thread``).

    The mapping: the source's workers are DataLoader worker processes, so ``--num-workers``
    (processes), or a thread-pool loader's threads where its kind is ``thread`` (``--num-workers k
    --worker-kind thread``); the queue depth is their ``--prefetch-factor`` (placer's own conversion,
    :meth:`LoaderSettings.from_stream`); workers kept between epochs (``persistent_workers``) are
    ``--persistent-workers``; ``torch_threads`` is ``--threads``; a cache at the
    source is ``--cache``, with ``--persistent-workers`` when there are workers (the script's
    cache is a dict in each worker process, which non-persistent workers lose every epoch;
    the stream's is one store all of them share). A per-batch stage runs inside the script's
    loader: one thread worker for it is what the script does; more, or processes, have no flag.
    ``workers`` without source workers reads the DataLoader in one thread beside the step: the
    script's thread-pool loader with one thread (``--worker-kind thread``), where it has one.
    Pinned copies matter only with a GPU in the placement.

    Examples
    --------
    >>> flags, notes = plan_flags({"placement": {"src": "cpu", "aug": "cpu", "train": "cpu"}, "workers": 1,
    ...     "stage_workers": {"src": 2, "aug": 3}, "prefetch": 4, "cache": "src", "torch_threads": 1},
    ...     "src", "train", cache_flag=True)
    >>> flags
    ['--num-workers', '2', '--prefetch-factor', '4', '--persistent-workers', '--threads', '1', '--cache']
    >>> notes
    ["3 thread workers of 'aug': no flag (the script runs it inside its loader)"]
    >>> plan_flags({"placement": {"src": "cpu", "train": "cpu"}, "workers": 1, "stage_workers": {"src": 2},
    ...     "worker_kind": {"src": "thread"}, "prefetch": 2, "torch_threads": 1}, "src", "train", cache_flag=False)[0]
    ['--num-workers', '2', '--worker-kind', 'thread', '--prefetch-factor', '2', '--threads', '1']
    """
    from placer.data.stream import LoaderSettings, StreamSettings

    placement = dict(settings.get("placement", {}))
    s = StreamSettings(**{k: v for k, v in settings.items() if k in StreamSettings.model_fields})
    loader = LoaderSettings.from_stream(s, source)
    flags: list[str] = []
    notes: list[str] = []
    if loader.num_workers and loader.worker_threads and thread_flag:
        flags += ["--num-workers", str(loader.num_workers), "--worker-kind", "thread",
                  "--prefetch-factor", str(loader.prefetch_factor)]
    elif loader.num_workers and loader.worker_threads:
        notes.append(f"{loader.num_workers} loader threads for '{source}': the script has no thread-pool loader; "
                     "as flags, as many worker processes")
        flags += ["--num-workers", str(loader.num_workers), "--prefetch-factor", str(loader.prefetch_factor)]
    elif loader.num_workers:
        flags += ["--num-workers", str(loader.num_workers), "--prefetch-factor", str(loader.prefetch_factor)]
    elif not s.sequential and thread_flag:
        flags += ["--num-workers", "1", "--worker-kind", "thread", "--prefetch-factor", str(s.prefetch)]
    elif not s.sequential:
        notes.append(f"the stream reads '{source}' in a thread beside the step: the script has no thread-pool "
                     "loader; as flags, no workers")
    for n in [n for n in placement if n not in (source, step)]:
        if s.sequential:
            continue
        w, kind = s.workers_of(n), s.kind_of(n)
        if w > 1 or kind != "thread":
            notes.append(f"{w} {kind} worker{'s' if w > 1 else ''} of '{n}': no flag (the script runs it inside "
                         "its loader)")
        elif not loader.num_workers:
            notes.append(f"'{n}' in a thread of its own beside the loader's: no flag (the script's loader runs "
                         "it in its thread)")
    gpu = sorted(n for n, d in placement.items() if d != "cpu")
    if gpu:
        notes.append(f"{', '.join(gpu)} on {placement[gpu[0]]}: the script runs on the CPU; no flag")
        if s.pin_memory:
            flags.append("--pin-memory")
    if loader.num_workers and not loader.worker_threads and (loader.persistent_workers
                                                             or (s.cache == source and cache_flag)):
        flags.append("--persistent-workers")
    if s.torch_threads is not None:
        flags += ["--threads", str(s.torch_threads)]
    if s.cache == source and cache_flag:
        flags.append("--cache")
    elif s.cache is not None:
        notes.append(f"cache after '{s.cache}': cannot be applied (" + (
            "the script has no --cache)" if not cache_flag else "the script's --cache keeps its Dataset's items)"))
    if s.stage_group:
        notes.append(f"batches per cluster task {s.stage_group}: no flag")
    return flags, notes


def advise(script: str, base: list[str], *, budget_s: float, timeout_s: float) -> dict[str, Any]:
    """``placer advise`` on ``script``'s pipeline form at the sizes of ``base`` (the script's
    ``--size``, ``--epochs``, ``--data-dir``; its own defaults where absent), in a new process.

    Returns the stream's plan (``settings``), its predicted and measured samples/s, the
    ``options`` placer measured (its speed-up over each), ``predicted_speedup``: the plan's
    predicted speed-up over :data:`AS_WRITTEN` (the script as written, the model's number), ``measured_speedup``
    placer's measured one (its runs of the two, interleaved), ``claimed_speedup``: the one the report states
    (the options table's measured speed-up; the predicted one where placer did not run the two), the
    candidates its verification ran (``verified``), the command and its printed output; or ``error``.
    """
    args = dict(zip(base[::2], base[1::2]))
    cmd = [sys.executable, "-m", "placer", "advise", str(FORMS / f"{script}_pipeline.py"), "--budget-s",
           str(budget_s), "--target", "none", "--json"]
    if "--size" in args:
        cmd += ["--size", args["--size"]]
    for flag, name in (("--epochs", "epochs"), ("--data-dir", "data_dir")):
        if flag in args:
            cmd += ["-p", f"{name}={args[flag]}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="plain_pipeline_") as tmp:
        report = Path(tmp) / "report.md"
        try:
            p = subprocess.run([*cmd, "-o", str(report)], capture_output=True, text=True, timeout=timeout_s,
                               env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            return {"script": script, "command": cmd, "error": f"timed out after {timeout_s} s"}
        text = report.read_text() if report.exists() else ""
    if p.returncode != 0:
        return {"script": script, "command": cmd, "error": (p.stderr or p.stdout)[-2000:]}
    doc = json.loads(p.stdout)
    stream = doc["streams"][0]
    written = next((o for o in stream["options"] if o["name"] == AS_WRITTEN), {})
    return {"script": script, "command": cmd, "source": stream["source"], "step": stream["step"],
            "settings": stream["settings"],
            "predicted_samples_per_s": stream["predicted_samples_per_s"],
            "measured_samples_per_s": stream["measured_samples_per_s"], "bottleneck": stream["bottleneck"],
            "options": stream["options"], "verified": stream.get("verified", []),
            "predicted_speedup": written.get("plan_speedup_predicted"),
            "measured_speedup": written.get("plan_speedup_measured"),
            "claimed_speedup": written.get("plan_speedup_measured") or written.get("plan_speedup_predicted"),
            "seconds": doc.get("timings_s"),
            "report": text}

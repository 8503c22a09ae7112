"""A stream's CPU stages on a dask cluster: the cluster measured or described, and the offload planned.

May import: pydantic, placer.errors, placer.log, placer.data.stream, placer.devices.cpu,
placer.stream.{remote,planner}; numpy and distributed inside functions.

The stream model prices a stage run as tasks on a cluster from a
:class:`~placer.data.stream.ClusterLink` (:mod:`placer.stream.remote`). This module
gives one:

- :func:`probe_cluster` measures a running cluster once per scheduler address (and
  batch size, to the next power of two), like the host↔device link: empty tasks from
  one client thread (the per-task overhead, and the CPU seconds they cost this process,
  the scheduler and the workers), then round trips of an array of the stage's real
  batch size (the bandwidth a batch travels at, pickling included, and this process's
  CPU per byte). The workers' threads come from ``client.scheduler_info()``; workers
  on this machine (127.0.0.1 or its own addresses) share its cores and its CPU. Each CPU
  stage's own seconds per batch on a worker against here is measured when the stream is
  profiled with the cluster (:func:`placer.stream.profile.profile_stream`, ``cluster``:
  ``StreamStageProfile.remote_ratio``), and :func:`ratio_notes` says it in the plan.
- :func:`load_cluster` reads a description of a cluster that is not running (JSON or
  YAML: nodes × cores, network bandwidth and latency, optionally the per-task overhead
  and a core's speed relative to one here); :func:`describe_link` turns it into a link.

:func:`plan_offload` plans a profiled stream again with the cluster in the search
(each CPU per-batch stage on this machine's workers or as tasks on the cluster, how
many in flight, how many batches per task) and returns the best candidate that uses the
cluster with its facts (:class:`~placer.data.stream.Offload`): remote workers per
stage, the grouping, the predicted samples per second against this machine's best, and
the network load. The planner prefers this machine's workers on a tie, so an offload is
chosen only when the model predicts it faster.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from placer.data.stream import ClusterLink, Offload, OffloadStage, StreamPlan, StreamProfile
from placer.devices.cpu import cpu_model
from placer.errors import PlacerError
from placer.log import get_logger
from placer.stream import remote

log = get_logger(__name__)

#: empty tasks timed by the probe (the first is not used: it warms the workers)
EMPTY_TASKS = 24
#: round trips of a batch-sized array timed by the probe
BYTE_TRIPS = 8
#: smallest array the probe moves (4 MiB: enough to time the bytes, not only the task; smaller batches are
#: priced at its per-byte rate)
MIN_PROBE_BYTES = 1 << 22

_PROBES: dict[tuple[str, int], ClusterLink] = {}
_PROBES_LOCK = threading.Lock()


class ClusterDescriptionError(PlacerError):
    """A cluster description that cannot be read, or a field with a bad value (named, with the fix)."""


# -- a described cluster ----------------------------------------------------------------------------
#: the fix for each field of a description, for error messages
FIXES = {
    "nodes": "the number of worker machines, an integer of at least 1",
    "cores_per_node": "each machine's cores (worker threads), an integer of at least 1",
    "bandwidth_gbit_s": "the network's bandwidth between this machine and the workers in Gbit/s, above 0 "
                        "(10 for 10 GbE)",
    "latency_ms": "the network's one-way latency in milliseconds, 0 or more (0.1 in one rack)",
    "task_overhead_ms": "the scheduler's overhead per task in milliseconds, 0 or more (dask: about 1)",
    "core_speed": "a worker core's speed relative to one core of this machine, above 0 (1: the same CPU)",
    "client_cpu_per_task_ms": "this machine's CPU milliseconds per task submitted, 0 or more",
    "stage_ratio": "per stage, a batch's seconds on a worker over its seconds here, above 0 "
                   "({\"decode\": 3} for a stage three times slower there)",
    "name": "a name for the cluster, text",
}


class ClusterDescription(BaseModel):
    """A cluster that is not running, described (``placer plan STREAM --cluster FILE``).

    Examples
    --------
    >>> d = ClusterDescription(nodes=4, cores_per_node=16, bandwidth_gbit_s=10)
    >>> link = describe_link(d)
    >>> link.threads, round(link.bandwidth_bytes_per_s / 1e9, 2), link.source
    (64, 1.25, 'described')
    """

    model_config = ConfigDict(extra="forbid")

    name: str = "described cluster"
    nodes: int = Field(ge=1)
    cores_per_node: int = Field(ge=1)
    bandwidth_gbit_s: float = Field(gt=0)
    latency_ms: float = Field(0.1, ge=0)
    task_overhead_ms: float = Field(1.0, ge=0)
    core_speed: float = Field(1.0, gt=0)
    client_cpu_per_task_ms: float = Field(0.3, ge=0)
    stage_ratio: dict[str, float] = Field(default_factory=dict)

    @field_validator("stage_ratio")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k, r in v.items() if not r > 0]
        if bad:
            raise ValueError(f"stage {bad[0]!r} has a ratio of {v[bad[0]]}, not above 0")
        return v


def describe_link(d: ClusterDescription) -> ClusterLink:
    """The link a description implies: a task's round trip is its overhead plus two network round trips
    (client → scheduler → worker, and back); a batch's bytes travel at the bandwidth; this process pays
    ``client_cpu_per_task_ms`` per task and pickles at about 2 GB/s."""
    return ClusterLink(
        name=d.name, source="described", workers=d.nodes, threads_per_worker=d.cores_per_node,
        task_s=(d.task_overhead_ms + 4 * d.latency_ms) / 1e3, bandwidth_bytes_per_s=d.bandwidth_gbit_s * 1e9 / 8,
        client_cpu_task_s=d.client_cpu_per_task_ms / 1e3, client_cpu_per_byte_s=1 / 2e9,
        cpu_scale=1.0 / d.core_speed, stage_ratio=dict(d.stage_ratio), shares_host=False,
        notes=[f"{d.name}: described, not measured: {d.nodes} × {d.cores_per_node} cores, "
               f"{d.bandwidth_gbit_s:g} Gbit/s, {d.latency_ms:g} ms latency, {d.task_overhead_ms:g} ms per task"])


def parse_cluster(text: str, *, where: str = "cluster description", yaml_text: bool = False) -> ClusterDescription:
    """A :class:`ClusterDescription` from JSON (or YAML) text; errors name the field and the fix."""
    try:
        if yaml_text:
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - a syntax error of either format, explained
        raise ClusterDescriptionError(f"{where}: not valid {'YAML' if yaml_text else 'JSON'} ({exc}); fix the "
                                      "syntax") from None
    if not isinstance(data, dict):
        raise ClusterDescriptionError(f"{where}: expected an object with nodes, cores_per_node and "
                                      "bandwidth_gbit_s, got " + type(data).__name__)
    try:
        return ClusterDescription.model_validate(data)
    except ValidationError as exc:
        parts = []
        for e in exc.errors():
            field = ".".join(str(x) for x in e["loc"]) or "?"
            if e["type"] == "extra_forbidden":
                parts.append(f"unknown field {field!r}; known fields: {', '.join(FIXES)}")
            else:
                parts.append(f"field {field!r}: {e['msg'].lower()}; give {FIXES.get(field, 'a valid value')}")
        raise ClusterDescriptionError(f"{where}: " + "; ".join(parts)) from None


def load_cluster(path: str | Path) -> ClusterDescription:
    """A cluster description from a JSON or YAML file (``.yaml``/``.yml``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ClusterDescriptionError(f"cannot read cluster description {str(p)!r}: {exc.strerror}; give a JSON "
                                      "file such as {\"nodes\": 4, \"cores_per_node\": 16, "
                                      "\"bandwidth_gbit_s\": 10}") from None
    return parse_cluster(text, where=str(p), yaml_text=p.suffix.lower() in (".yaml", ".yml"))


# -- a running cluster, measured -------------------------------------------------------------------
def _noop() -> None:
    return None


def _echo(x: Any) -> Any:
    return x.copy()


def _cpu() -> float:
    return time.process_time()


def _local_hosts() -> set[str]:
    names = {"127.0.0.1", "localhost", "::1"}
    try:
        host = socket.gethostname()
        names |= {host, socket.gethostbyname(host)}
    except OSError:
        pass
    return names


def _is_local(address: str) -> bool:
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    return host in _local_hosts()


def _array_work(n: int) -> float:
    """Seconds of a numpy workload with ``n``-element temporaries (the best of three)."""
    import numpy as np

    x = np.arange(n, dtype=np.int32) % 1000
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(10):
            y = x // 2 + (x - 1)
            np.concatenate([y, x])[::2] * 3
        best = min(best, time.perf_counter() - t)
    return best


def array_ratio(client: Any, nbytes: int) -> float | None:
    """A numpy workload's seconds on the workers (median) over here, with temporaries of ``nbytes``."""
    n = max(1 << 14, min(nbytes, 1 << 22) // 4)
    workers = list(client.scheduler_info(n_workers=-1)["workers"])
    here = _array_work(n)
    there = client.gather([client.submit(_array_work, n, workers=[w], allow_other_workers=False, pure=False)
                           for w in workers])
    here = min(here, _array_work(n))
    return statistics.median(there) / here if here > 0 and there else None


def _remote_cpu(client: Any) -> float:
    """CPU seconds the scheduler and the workers have used so far."""
    total = sum(client.run(_cpu).values())
    try:
        total += client.run_on_scheduler(_cpu)
    except Exception:  # noqa: BLE001 - a scheduler that refuses to run code: its CPU is not counted
        pass
    return total


def probe_cluster(client: Any, nbytes: int = MIN_PROBE_BYTES, *, refresh: bool = False) -> ClusterLink:
    """Measure the cluster of ``client`` for tasks moving about ``nbytes`` each way (cached per address).

    Parameters
    ----------
    client : distributed.Client
    nbytes : int
        A batch's bytes one way (the probe moves the next power of two, at least
        :data:`MIN_PROBE_BYTES`).
    refresh : bool
        Measure again even when this address was measured.
    """
    import numpy as np

    size = max(MIN_PROBE_BYTES, 1 << max(0, int(nbytes) - 1).bit_length())
    address = str(client.scheduler.address)
    key = (address, size)
    with _PROBES_LOCK:
        if not refresh and key in _PROBES:
            return _PROBES[key]
    workers = client.scheduler_info(n_workers=-1)["workers"]
    if not workers:
        raise PlacerError(f"the cluster at {address} has no workers; start some, or drop --scheduler")
    nthreads = [w.get("nthreads", 1) for w in workers.values()]
    client.submit(_noop, pure=False).result()  # warm-up
    cpu0, rem0 = time.process_time(), _remote_cpu(client)
    trips = []
    for _ in range(EMPTY_TASKS):
        t = time.perf_counter()
        client.submit(_noop, pure=False).result()
        trips.append(time.perf_counter() - t)
    cpu1, rem1 = time.process_time(), _remote_cpu(client)
    task_s = statistics.median(trips)
    client_task = (cpu1 - cpu0) / EMPTY_TASKS
    remote_task = max(0.0, rem1 - rem0) / EMPTY_TASKS
    arr = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    client.submit(_echo, arr, pure=False).result()  # warm-up
    cpu0 = time.process_time()
    moves = []
    for _ in range(BYTE_TRIPS):
        t = time.perf_counter()
        client.submit(_echo, arr, pure=False).result()
        moves.append(time.perf_counter() - t)
    per_byte_cpu = max(0.0, (time.process_time() - cpu0) / BYTE_TRIPS - client_task) / (2 * size)
    move = max(statistics.median(moves) - task_s, 1e-6)
    link = ClusterLink(
        name=address, source="measured", workers=len(nthreads),
        threads_per_worker=max(1, round(sum(nthreads) / len(nthreads))), task_s=task_s,
        bandwidth_bytes_per_s=2 * size / move, client_cpu_task_s=client_task, client_cpu_per_byte_s=per_byte_cpu,
        remote_cpu_task_s=remote_task, shares_host=all(_is_local(a) for a in workers),
        notes=[f"{address}: measured {EMPTY_TASKS} empty tasks ({task_s * 1e3:.2f} ms each, median) and "
               f"{BYTE_TRIPS} round trips of {size:,} bytes ({2 * size / move / 1e6:,.0f} MB/s)"])
    try:
        theirs = sorted(set(client.run(cpu_model).values()))
    except Exception:  # noqa: BLE001 - a worker that cannot say: assumed the same
        theirs = []
    try:
        link.array_ratio = array_ratio(client, nbytes)
    except Exception:  # noqa: BLE001 - a diagnostic only
        link.array_ratio = None
    if link.array_ratio is not None and link.array_ratio > 1.5:
        link.notes.append(f"a numpy workload with batch-sized temporaries ran {link.array_ratio:.1f}x slower on the "
                          "workers than here (a diagnostic; dask's nanny starts workers with "
                          "MALLOC_TRIM_THRESHOLD_=65536, from distributed.nanny.pre-spawn-environ, which turns off "
                          "glibc's dynamic mmap threshold): each stage is priced at its own ratio when the stream "
                          "is profiled with the cluster, else at this machine's seconds")
    here = cpu_model()
    other = [m for m in theirs if m != here]
    if other:
        link.notes.append(f"the workers' CPU ({', '.join(other)}) is not this machine's ({here}): each stage is "
                          "priced there at its own ratio when the stream is profiled with the cluster, else at its "
                          "seconds here")
    log.info("cluster probe: %s", link.notes[0])
    with _PROBES_LOCK:
        _PROBES[key] = link
    return link


def probe_bytes(profile: StreamProfile) -> int:
    """The bytes one way of the largest CPU per-batch stage's batch (what the probe moves)."""
    sizes = [remote.stage_bytes(profile, s.name) // 2 for s in profile.stages if s.role == "batch"]
    return max([MIN_PROBE_BYTES, *sizes])


# -- planning the offload --------------------------------------------------------------------------
def plan_offload(profile: StreamProfile, link: ClusterLink, *, objective: str = "auto",
                 epochs: int | None = None) -> tuple[StreamPlan, Any, Offload | None]:
    """Plan ``profile``'s stream with ``link``'s cluster in the search.

    Returns
    -------
    (StreamPlan, Candidate or None, Offload or None)
        The plan (this machine's workers unless the model predicts an offload faster), the best
        candidate that runs a stage on the cluster, and that candidate's facts (None when no CPU
        per-batch stage can go there).
    """
    from placer.stream.planner import plan_from_profile

    prof = profile.model_copy(update={"cluster": link})
    plan, ranked, scorer = plan_from_profile(prof, objective=objective, epochs=epochs)
    best_local = next((c for c in ranked if not c.remote), None)
    best_remote = next((c for c in ranked if c.remote), None)
    if best_remote is None:
        return plan, None, None
    pred = scorer.predict(best_remote)
    stages = []
    for m in sorted(best_remote.remote, key=prof.members.index):
        w, g = best_remote.settings.workers_of(m), best_remote.settings.group_of(m)
        stages.append(OffloadStage(name=m, remote_workers=w, group=g, bytes_per_batch=remote.stage_bytes(prof, m),
                                   predicted_batches_per_s=remote.rate(prof, m, link, w, g),
                                   bound=remote.bound(prof, m, link, w, g)))
    load = remote.network_load(prof, best_remote.settings, pred.batches_per_s)
    local_value = scorer.score(best_local) if best_local is not None else 0.0
    value = scorer.value(pred)
    chosen = bool(plan.settings.worker_kind) and any(k == "dask" for k in plan.settings.worker_kind.values())
    off = Offload(cluster=link.name, source=link.source, threads=link.threads, stages=stages,
                  predicted_samples_per_s=value, local_predicted_samples_per_s=local_value,
                  network_bytes_per_s=load, network_share=load / link.bandwidth_bytes_per_s,
                  bandwidth_bytes_per_s=link.bandwidth_bytes_per_s, chosen=chosen,
                  reason=offload_reason(stages, value, local_value, chosen))
    plan.offload = off
    plan.notes.extend(n for n in link.notes if n not in plan.notes)
    plan.notes.extend(n for n in ratio_notes(prof, link) if n not in plan.notes)
    return plan, best_remote, off


def ratio_notes(profile: StreamProfile, link: ClusterLink) -> list[str]:
    """What the plan's notes say of each CPU per-batch stage's seconds on the cluster's workers against here."""
    out = []
    for st in profile.stages:
        if st.role != "batch" or "cpu" not in st.seconds:
            continue
        r, how = remote.ratio(profile, st.name, link)
        if how == "assumed":
            continue
        what = how
        if abs(r - 1) < 0.05:
            out.append(f"{st.name!r} {what} as fast per batch on the cluster's workers as here: priced so")
        elif r > 1:
            out.append(f"{st.name!r} {what} {r:.1f}x slower per batch on the cluster's workers than here: priced so")
        else:
            out.append(f"{st.name!r} {what} {1 / r:.1f}x faster per batch on the cluster's workers than here: "
                       "priced so")
    return out


def offload_reason(stages: list[OffloadStage], value: float, local: float, chosen: bool) -> str:
    """The offload's prediction in words."""
    what = ", ".join(f"{s.name} on {s.remote_workers} task{'s' if s.remote_workers != 1 else ''} in flight"
                     + (f" of {s.group} batches" if s.group > 1 else "") + f" ({s.bound}-bound)" for s in stages)
    words = f"predicted on the cluster: {what}: {value:,.1f} samples/s against {local:,.1f} on this machine's workers"
    return words + ("; the cluster is chosen" if chosen else "; this machine's workers are kept (the model does "
                                                             "not predict the cluster faster)")


__all__ = ["ClusterDescription", "ClusterDescriptionError", "describe_link", "load_cluster", "parse_cluster",
           "plan_offload", "probe_bytes", "probe_cluster", "ratio_notes"]

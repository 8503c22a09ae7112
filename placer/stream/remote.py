"""Remote CPU workers in the stream model: a stage's batches as tasks on a dask cluster.

May import: placer.data.stream. Pure arithmetic on a
:class:`~placer.data.stream.StreamProfile` and its
:class:`~placer.data.stream.ClusterLink`: no cluster, no measuring.

A stage with ``k`` dask workers keeps ``k`` tasks in flight (one per worker thread
of the runner), each carrying ``g`` consecutive batches (``StreamSettings.stage_group``).
One batch costs

- ``c``: its compute on one core of a worker: its seconds here times its ratio there
  (:func:`ratio`: the stage's own per-batch seconds on a worker over here, measured on a
  running cluster, or given by a description; else the link's ``cpu_scale``, 1 on the
  same CPU);
- ``m``: moving it, to the worker and back: ``bytes / bandwidth`` (the stage's
  per-batch inputs and its output, as measured here; pickling included in the
  measured bandwidth);

and one task costs ``o``, the cluster's per-task overhead (an empty task's round
trip). A task takes ``τ = o + g (c + m)``, so the stage delivers at most

- ``k g / τ`` batches per second (**tasks in flight**: per-task overhead when ``o``
  dominates ``τ``),
- ``W / c`` (**cluster cores**: ``W`` worker processes, each scaling its threads as
  the stage's threads scale here),
- ``bandwidth / bytes`` (**network**),

and its rate is the smallest. This machine pays the client's CPU per task and per
byte (it holds the GIL); on a cluster that runs on this machine
(``shares_host``), the workers' compute and the scheduler's per-task CPU come
from this machine's cores too. :func:`choose_group` takes the smallest group that
keeps ``o`` under :data:`OVERHEAD_SHARE` of a task's time, leaving each cluster thread at
least :data:`TASKS_PER_THREAD` tasks an epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from placer.data.stream import ClusterLink, StreamProfile

#: batches per task tried
GROUPS = (1, 2, 4, 8, 16, 32)
#: per-task overhead kept under this share of a task's time when grouping batches
OVERHEAD_SHARE = 0.1
#: tasks each cluster thread gets an epoch at least, when grouping batches
TASKS_PER_THREAD = 8


@dataclass(frozen=True)
class RemoteTerms:
    """One stage's costs as tasks on a cluster: seconds per batch and per task, bytes per batch."""

    compute_s: float
    move_s: float
    bytes: int
    task_s: float
    group: int
    #: this process's CPU seconds per batch (the client: submitting, pickling)
    client_cpu_s: float
    #: the cluster's CPU seconds per batch (compute and the per-task share)
    remote_cpu_s: float

    @property
    def task_seconds(self) -> float:
        """One task, submit to result: ``o + g (c + m)``."""
        return self.task_s + self.group * (self.compute_s + self.move_s)

    @property
    def seconds_per_batch(self) -> float:
        return self.task_seconds / self.group


def stage_bytes(profile: StreamProfile, stage: str) -> int:
    """Bytes one batch of ``stage`` moves as a task: the per-batch values it reads and its output (on the host)."""
    st = profile.stage(stage)
    ins = sum(profile.stage(r).out_bytes.get("host", 0) for r in st.reads)
    return int(ins + st.out_bytes.get("host", 0))


def ratio(profile: StreamProfile, stage: str, link: ClusterLink) -> tuple[float, str]:
    """A batch's seconds of ``stage`` on a worker of ``link``'s cluster over its seconds here, and where the
    ratio comes from: ``described`` (the link's ``stage_ratio``: a description's, taken as given),
    ``measured`` (the stage timed on a worker of that cluster: ``StreamStageProfile.remote_ratio`` for the link's
    address) or ``assumed`` (the link's ``cpu_scale``)."""
    st = profile.stage(stage)
    if stage in link.stage_ratio:
        return link.stage_ratio[stage], "described"
    if link.source == "measured" and link.name in st.remote_ratio:
        return st.remote_ratio[link.name], "measured"
    return link.cpu_scale, "assumed"


def terms(profile: StreamProfile, stage: str, link: ClusterLink, group: int = 1) -> RemoteTerms:
    """The costs of ``stage`` as tasks of ``group`` batches on ``link``'s cluster."""
    st = profile.stage(stage)
    c = st.seconds.get("cpu", 0.0) * ratio(profile, stage, link)[0]
    b = stage_bytes(profile, stage)
    g = max(1, group)
    return RemoteTerms(compute_s=c, move_s=b / link.bandwidth_bytes_per_s, bytes=b, task_s=link.task_s, group=g,
                       client_cpu_s=link.client_cpu_task_s / g + b * link.client_cpu_per_byte_s,
                       remote_cpu_s=c + link.remote_cpu_task_s / g)


def limits(profile: StreamProfile, stage: str, link: ClusterLink, workers: int, group: int = 1) -> dict[str, float]:
    """Batches per second each limit of ``stage`` allows with ``workers`` tasks in flight of ``group`` batches."""
    t = terms(profile, stage, link, group)
    st = profile.stage(stage)
    per_worker = st.speedup(link.threads_per_worker, "thread") if link.threads_per_worker > 1 else 1.0
    inv = (lambda s: 1.0 / s if s > 0 else math.inf)
    return {"tasks in flight": max(1, workers) * t.group * inv(t.task_seconds),
            "cluster cores": link.workers * per_worker * inv(t.compute_s),
            "network": link.bandwidth_bytes_per_s * inv(t.bytes) if t.bytes else math.inf}


def rate(profile: StreamProfile, stage: str, link: ClusterLink, workers: int, group: int = 1) -> float:
    """Batches per second of ``stage`` on the cluster: the smallest of its :func:`limits`."""
    return min(limits(profile, stage, link, workers, group).values())


def bound(profile: StreamProfile, stage: str, link: ClusterLink, workers: int, group: int = 1) -> str:
    """What bounds ``stage`` on the cluster: ``per-task overhead``, ``compute`` or ``network``."""
    lim = limits(profile, stage, link, workers, group)
    which = min(lim, key=lim.get)
    if which == "network":
        return "network"
    t = terms(profile, stage, link, group)
    if which == "tasks in flight" and t.task_s > t.group * (t.compute_s + t.move_s):
        return "per-task overhead"
    return "compute"


def choose_group(profile: StreamProfile, stage: str, link: ClusterLink) -> int:
    """Batches per task: the smallest of :data:`GROUPS` whose per-task overhead is under
    :data:`OVERHEAD_SHARE` of the task, and no larger than leaves each of the cluster's threads
    :data:`TASKS_PER_THREAD` tasks an epoch (the steady state the model predicts needs several rounds of
    tasks: an epoch of a few large tasks is mostly filling and draining)."""
    t = terms(profile, stage, link, 1)
    per = t.compute_s + t.move_s
    most = GROUPS[-1]
    if profile.batches_per_epoch:
        most = max(1, min(most, profile.batches_per_epoch // (TASKS_PER_THREAD * link.threads)))
    for g in GROUPS:
        if g >= most or t.task_s <= OVERHEAD_SHARE * g * per:
            return min(g, most)
    return most


def group_of(profile: StreamProfile, stage: str, settings) -> int:
    """The group a candidate's settings give ``stage`` (chosen when they give none)."""
    if settings.kind_of(stage) != "dask" or profile.cluster is None:
        return 1
    g = settings.stage_group.get(stage)
    return g if g else choose_group(profile, stage, profile.cluster)


def network_load(profile: StreamProfile, settings, batches_per_s: float) -> float:
    """Bytes per second the stream's cluster stages move at ``batches_per_s``."""
    return sum(stage_bytes(profile, m) for m in profile.members if settings.kind_of(m) == "dask") * batches_per_s


__all__ = ["GROUPS", "OVERHEAD_SHARE", "TASKS_PER_THREAD", "RemoteTerms", "bound", "choose_group", "group_of", "limits",
           "network_load", "rate", "ratio", "stage_bytes", "terms"]

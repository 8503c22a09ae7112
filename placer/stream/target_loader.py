"""A plain script's DataLoader and train step planned for a described machine: measured here as a two-member
stream, then planned there (:func:`placer.stream.target.plan_for_target`).

May import: placer.data.measures, placer.data.stream, placer.errors, placer.stream.{target,target_words};
placer.costmodel.counts,
placer.executor.transfer, placer.timing, placer.stream.dropin.measuring inside functions.
"""

from __future__ import annotations

from typing import Any

from placer.data.measures import Work
from placer.data.stream import StreamPlan, StreamProfile, StreamStageProfile
from placer.errors import PlacerError
from placer.stream.target import plan_for_target
from placer.stream.target_words import LOADER, STEP


def loader_profile(loader: Any, step: Any, kept: list, *, batches: int = 6, step_on_cpu: bool = True
                   ) -> tuple[StreamProfile, dict[str, Work]]:
    """A plain script's DataLoader and step as a two-member stream profile, measured here, and the step's work.

    The loader runs in this process (``num_workers=0``, rebuilt from the user's: same dataset, sampler
    and order) for ``batches`` batches, each fetch timed (wall and CPU seconds; the first is warm-up);
    the step runs on the ``kept`` batches, timed, and once more under the work counter (when it runs on
    the CPU here: a step on a GPU here cannot be counted on CPU tensors).
    """
    import os

    from placer.costmodel.counts import count_work
    from placer.executor.transfer import nbytes
    from placer.stream.dropin.measuring import counter_of, rebuild, settings_of
    from placer.timing import Clock, Timings

    if not kept:
        raise PlacerError("no batch of the loader was kept to time the step on; give the loader at least one batch")
    user = settings_of(loader)
    plain = rebuild(loader, user.model_copy(update={"num_workers": 0, "prefetch_factor": None,
                                                    "persistent_workers": False, "pin_memory": False}))
    timings = Timings()
    fetches = []
    it = iter(plain)
    for _ in range(max(2, batches) + 1):
        with Clock() as c:
            batch = next(it, None)
        if batch is None:
            break
        fetches.append(c)
    del it
    for c in fetches[1:] or fetches:  # the first fetch is warm-up, unless it is the only one
        timings.add(LOADER, c)
    for b in [*kept, *kept][: max(3, len(kept))]:
        with Clock() as c:
            step(b)
        timings.add(STEP, c)
    work = {STEP: count_work(lambda: step(kept[-1]))[1]} if step_on_cpu else {}
    count = counter_of(loader)
    spb = sum(count(b) for b in kept) / len(kept)
    wall, cpu = timings.wall(LOADER).lower_quartile_s, timings.cpu(LOADER).lower_quartile_s
    src = StreamStageProfile(name=LOADER, role="source", kind="other", devices=["cpu"], seconds={"cpu": wall},
                       cpu_seconds={"cpu": cpu}, out_bytes={"host": int(nbytes(kept[-1]))})
    st = StreamStageProfile(name=STEP, role="step", kind="training", reads=[LOADER],
                      devices=["cpu"] if step_on_cpu else [])
    if step_on_cpu:
        st.seconds["cpu"] = timings.wall(STEP).lower_quartile_s
        st.cpu_seconds["cpu"] = timings.cpu(STEP).lower_quartile_s
    try:
        per_epoch = len(loader)
    except TypeError:
        per_epoch = None
    prof = StreamProfile(pipeline="script", source=LOADER, step=STEP, members=[LOADER, STEP],
                         batch_size=loader.batch_size, samples_per_batch=spb, batches_per_epoch=per_epoch,
                         source_kind="loader", loader=user, cores=os.cpu_count() or 1, stages=[src, st],
                         torch_threads=user.torch_threads)
    return prof, work


def plan_loader_for_target(loader: Any, step: Any, kept: list, target: Any, *, step_on_cpu: bool = True,
                           here_cpu: Any = None) -> StreamPlan:
    """A plain script's DataLoader and step planned for ``target`` (:func:`loader_profile`, then
    :func:`plan_for_target`): DataLoader workers up to the target's cores, pinning, the step on its GPU."""
    prof, work = loader_profile(loader, step, kept, step_on_cpu=step_on_cpu)
    plan = plan_for_target(prof, target, work, here_cpu=here_cpu)
    if not step_on_cpu:
        plan.notes.append("the step runs on a GPU here: its work was not counted on the CPU, so the target's GPU "
                          "time of the step is not predicted; advise with device='cpu' to count it")
    return plan

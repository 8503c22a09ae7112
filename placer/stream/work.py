"""The work of one batch of a stream, counted on this machine's CPU: what a described GPU's roofline prices.

May import: placer.data.measures, placer.costmodel.counts, placer.devices, placer.executor (to run the
stream one batch at a time and call a stage's GPU implementation on the counter), placer.pipeline,
placer.stream.profile; all inside the function but the data model.
"""

from __future__ import annotations

from typing import Any

from placer.data.measures import Work

#: batches run to count one batch's work (the last is counted; the first warms up)
COUNT_BATCHES = 2
#: seconds the step's work may be counted for (its time outside torch ops is the least of the calls)
STEP_COUNT_S = 1.5


def count_stream_work(pipeline: Any, source: str, *, inventory: Any = None, consts: dict | None = None,
                      batches: int = COUNT_BATCHES, notes: list[str] | None = None) -> dict[str, Work]:
    """The work of one batch of every member a GPU could run, counted on this machine's CPU.

    The stream runs sequentially on the CPU for ``batches`` batches; on the last, each
    per-batch stage with a torch GPU implementation runs that implementation on CPU
    tensors under the counter, and the step's own call is counted (its state trained by
    one more batch, as profiling does).

    Returns
    -------
    dict
        Member → :class:`~placer.data.measures.Work` (members whose work could not be
        counted are left out, with a note).
    """
    from placer.costmodel.counts import count_work
    from placer.devices import SIM, Device, discover
    from placer.executor.stagecall import call_stage
    from placer.executor.stream.config import StreamConfig
    from placer.executor.stream.nodes import takes
    from placer.executor.stream.runner import StreamRun
    from placer.executor.transfer import to_location
    from placer.pipeline import BATCH_INFO
    from placer.stream.profile import can_run, one_shot_inputs

    notes = [] if notes is None else notes
    p = pipeline.validate()
    inv = inventory or discover()
    members = p.streams()[source]
    blocked = [m for m in members if not can_run(p, m, "cpu")]
    if blocked:
        notes.append(f"{', '.join(blocked)} cannot run on the CPU: the stream's work was not counted")
        return {}
    consts = one_shot_inputs(p, source, inv) if consts is None else consts
    devices = {m: inv.resolve("cpu", stage=m) for m in members}
    run = StreamRun(p, source, devices, consts, StreamConfig(workers=0, max_batches=max(1, batches)))
    counter = Device(name=SIM, kind="sim", label="work counter (runs the GPU implementation on the CPU)")
    out: dict[str, Work] = {}
    run.step.start()
    bundles = list(run.bundles())
    for i, b in enumerate(bundles):
        last = i == len(bundles) - 1
        for node in run.nodes[1:]:
            if last and node.kind == "step":
                # the least time outside torch ops over a few calls: noise on a busy machine only adds to it
                out[node.name] = count_work(lambda n=node, b=b: run.work(n, b), budget_s=STEP_COUNT_S)[1]
                continue
            if last and node.kind == "batch":
                impl = node.stage.impl_for("gpu")
                if impl is not None and impl.api == "torch":
                    inputs = {a: to_location(b.values[s][node.location], counter)[0] for a, s in node.reads.items()}
                    const = {a: to_location(v, counter)[0] for a, v in node.consts.items()}
                    extra = {BATCH_INFO: b.info} if takes(impl.fn, BATCH_INFO) else None
                    try:
                        def gpu_call(st=node.stage, x={**const, **inputs}, e=extra):
                            return call_stage(st, counter, x, extra=e)

                        out[node.name] = count_work(gpu_call)[1]
                    except Exception as exc:  # noqa: BLE001 - counting is best effort: the stage stays on the CPU
                        notes.append(f"the work of {node.name!r} on a GPU could not be counted "
                                     f"({type(exc).__name__}: {exc}); it is planned on the CPU only")
                elif impl is not None:
                    notes.append(f"{node.name!r}: its GPU implementation is {impl.api} code, whose work cannot be "
                                 "counted without a GPU; it is planned on the CPU only")
            run.work(node, b)
    return out

"""Describing this machine: a short, bounded calibration of its CPU, its GPUs and their links.

May import: torch and numpy (inside functions), placer.devices, placer.timing,
placer.files, placer.profile.cache (where calibrations are kept),
placer.profile.transfers (copies, measured as the executor makes them),
placer.target.{description,ops}, placer.costmodel.roofline, placer.costmodel.counts
(each op's counted work: operations issued, bytes moved).

:func:`calibrate_cpu` times the reference ops of :data:`placer.target.ops.CALIBRATION`
on this CPU (a few seconds; each at all threads by the wall clock and at one thread by
its own CPU time, keeping the faster: a busy machine stalls threaded small ops and
shares its cores, and a thread's CPU time leaves out the time it waited; each row
records the threads it kept busy, CPU over wall time and at least its speed-up over
one thread, and its counted work), the per-op dispatch cost (:func:`placer.costmodel.counts.dispatch_s`:
tiny ops, one thread's CPU time; a GPU stage's host time is charged by it), a pass of
plain Python (:func:`placer.costmodel.counts.python_s`: the Python between ops is scaled by
it) and a matrix product at one thread and at all (thread scaling). :func:`this_cpu` keeps that
calibration per CPU in the profile cache directory, so it runs once per machine.
:func:`describe_machine` adds each GPU (peak FLOP/s from matrix products, memory
bandwidth from a device copy, launch and synchronise costs, the copies) and returns
the :class:`~placer.target.description.TargetDescription` ``placer describe`` writes.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from placer.target.description import CpuDescription, OpRow, TargetDescription, TargetError

#: seconds a CPU calibration may take by default
CPU_BUDGET_S = 15.0


def cpu_key(host: dict[str, Any]) -> str:
    """A stable key of a host CPU (and the torch that ran the ops) from an inventory's ``host``."""
    parts = [str(host.get(k)) for k in ("machine", "cpu_model", "cores", "torch")]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _best(m) -> float:
    """A measurement's time: its fastest repeat (noise on a busy machine only adds time)."""
    raw = [t for t in m.raw_times if t > 0]
    return float(min(raw)) if raw else m.median_s


def calibrate_cpu(*, budget_s: float = CPU_BUDGET_S, rows=None) -> CpuDescription:
    """Time the calibration ops on this CPU (each within its share of ``budget_s``)."""
    import torch

    from placer.costmodel.counts import count_work, dispatch_s, python_s
    from placer.devices import discover
    from placer.target.ops import CALIBRATION, OPS
    from placer.timing import measure

    rows = list(rows or CALIBRATION)
    host = discover().host
    t_end = time.perf_counter() + budget_s
    per = max(0.02, 0.6 * budget_s / max(len(rows), 1))
    out: list[OpRow] = []
    threads = torch.get_num_threads()
    for op, size in rows:
        if time.perf_counter() > t_end:
            break
        fn = OPS[op](size)
        best = []
        for n in sorted({threads, 1}, reverse=True):
            # a busy machine stalls threaded small ops and shares the cores: one thread's own CPU
            # time is what the op costs on a quiet machine at one thread; keep the faster
            torch.set_num_threads(n)
            clock = time.thread_time if n == 1 else time.perf_counter
            try:
                m = measure(fn, min_reps=5, max_reps=40, min_time_s=min(0.02, per / 2), max_time_s=per / 2,
                            warn=False, clock=clock)
            finally:
                torch.set_num_threads(threads)
            # threads kept busy: CPU over wall time (one at one thread)
            used = 1.0 if n == 1 else min(max((m.cpu_s or 0.0) / max(m.median_s, 1e-12), 1.0), float(n))
            best.append((_best(m), used, n))
        seconds, used, n = min(best)
        if n > 1 and len(best) > 1:
            # timed at one thread too: the same work cannot take less CPU time at several threads,
            # so at least the speed-up over one thread were busy (a stalled pool reads low)
            used = min(max(used, best[-1][0] / seconds), float(n))
        _, work = count_work(fn)
        out.append(OpRow(op=op, size=size, seconds=seconds, threads=n, threads_used=used, ops=work.ops,
                         bytes=work.bytes or None))
    cores = int(host.get("cores") or 1)
    return CpuDescription(model=str(host.get("cpu_model") or "unknown CPU"), cores=cores,
                          threads=torch.get_num_threads(), dispatch_s=dispatch_s(), python_s=python_s(),
                          thread_scaling=_thread_scaling(cores), ops=out,
                          source=f"placer calibration on {host.get('hostname', 'this machine')} "
                                 f"(torch {host.get('torch')}), {len(out)} ops")


def _thread_scaling(cores: int) -> dict[int, float]:
    """Speed-up of a 512³ float32 matrix product at all threads over one."""
    import torch

    from placer.timing import measure

    a = torch.randn(512, 512)
    old = torch.get_num_threads()
    try:
        times = {}
        for n in sorted({1, old}):
            torch.set_num_threads(n)
            times[n] = _best(measure(lambda: a @ a, min_reps=3, max_reps=20, min_time_s=0.02, max_time_s=0.2,
                                     warn=False))
    finally:
        torch.set_num_threads(old)
    return {n: times[1] / t for n, t in times.items()}


def this_cpu(*, refresh: bool = False, budget_s: float = CPU_BUDGET_S) -> CpuDescription:
    """This machine's CPU calibration: from the cache, or measured now (and cached)."""
    from placer.devices import discover
    from placer.profile.cache import ProfileCache

    cache = ProfileCache()  # a cache that cannot be read or written is no cache (one warning)
    path = cache.root / f"cpu-{cpu_key(discover().host)}.json"
    text = None if refresh else cache.read_text(path)
    if text is not None:
        try:
            cpu = CpuDescription.model_validate_json(text)
            if all(r.ops is not None for r in cpu.ops):  # else an older calibration: measure again
                return cpu
        except ValueError:
            pass  # unreadable: measure again
    cpu = calibrate_cpu(budget_s=budget_s)
    cache.write_text(path, cpu.model_dump_json(indent=1))
    return cpu


def describe_machine(*, budget_s: float = 30.0, name: str | None = None) -> TargetDescription:
    """This machine as a target: its CPU and every real GPU, measured within about ``budget_s``."""
    import platform

    from placer.devices import discover

    inv = discover()
    gpus = [d for d in inv.devices if d.is_accelerator and not d.simulated]
    cpu = calibrate_cpu(budget_s=min(CPU_BUDGET_S, budget_s / (1 + len(gpus))))
    share = (budget_s - CPU_BUDGET_S) / max(len(gpus), 1)
    described = [describe_gpu(d, budget_s=max(share, 5.0), fingerprint=inv.fingerprint()) for d in gpus]
    label = name or f"{platform.node() or 'this machine'}: {cpu.model} ({cpu.cores} cores)" + (
        f" + {len(gpus)}x {gpus[0].label}" if gpus else "")
    return TargetDescription(name=label, cpu=cpu, gpus=described,
                             source=f"placer describe on {platform.node()} ({time.strftime('%Y-%m-%d')})")


#: the side of the square matrix products that measure a GPU's peak FLOP/s
PEAK_N = 4096
#: float32 elements of the device-to-device copy that measures a GPU's memory bandwidth (256 MiB)
COPY_ELEMENTS = 1 << 26
#: fewest GPU op timings from which :func:`fit_gpu_factors` fits a GPU's own factors
MIN_FIT_POINTS = 4


def fit_gpu_factors(points, *, peak_flops: dict[str, float], mem_bandwidth_Bps: float,
                    stage_overhead_s: float, op_overhead_s: float, sync_s: float) -> dict[str, float]:
    """A GPU's efficiency factors and host factor, fitted to its own op timings.

    ``points`` are ``(work, measured_s)`` pairs: an op's counted
    :class:`~placer.costmodel.counts.Work` (its ``host_s`` set to this host's time for it) and its
    measured seconds on the GPU. The fixed costs (per stage, launch, synchronisation) are the
    GPU's measured ones; predictions follow :meth:`~placer.costmodel.roofline.DeviceDescription.predict`
    (host and device overlap: the larger of the two plus ``unhidden`` of the smaller); a grid search
    picks ``compute_eff``, ``memory_eff``, ``irregular_eff``, ``host_factor`` and ``unhidden``: the
    most ops predicted within 2x, then the least mean ``|log(predicted / measured)|`` (the rule the
    shipped H200 description was fitted by, from its reference measurements).
    """
    import math

    import numpy as np

    works = [w for w, _ in points]
    meas = np.array([m for _, m in points], dtype=float)
    flops = np.array([w.flops for w in works])
    irr = np.array([min(w.irregular_bytes, w.bytes) for w in works])
    stream = np.array([w.bytes for w in works]) - irr
    peak = np.array([peak_flops.get(w.precision, peak_flops.get("fp32", min(peak_flops.values()))) for w in works])
    fixed0 = stage_overhead_s + np.array([min(w.ops, 1) * op_overhead_s + w.syncs * sync_s for w in works])
    launches = np.array([max(w.ops - 1, 0) * op_overhead_s for w in works])
    host = np.array([w.host_s for w in works])
    ces = np.geomspace(0.05, 1.0, 27)[:, None, None, None]
    mes = np.geomspace(0.02, 1.0, 33)[None, :, None, None]
    ies = np.geomspace(0.01, 1.0, 25)[None, None, :, None]
    roof = np.maximum(flops / (peak * ces), stream / (mem_bandwidth_Bps * mes) + irr / (mem_bandwidth_Bps * ies))
    best = None
    for hf in (1.0, 1.25, 1.5, 2.0, 2.5, 3.0):  # a GPU run pays at least its host work
        for un in (0.0, 0.25, 0.5, 0.75, 1.0):
            h = hf * host + launches
            logs = np.abs(np.log((fixed0 + np.maximum(h, roof) + un * np.minimum(h, roof)) / meas))
            within = np.mean(logs <= math.log(2), axis=-1)
            key = -within * 1e3 + np.mean(logs, axis=-1)
            i = np.unravel_index(int(np.argmin(key)), key.shape)
            score = float(key[i])
            if best is None or score < best[0]:
                best = (score, hf, un, float(ces.ravel()[i[0]]), float(mes.ravel()[i[1]]), float(ies.ravel()[i[2]]))
    _, hf, un, ce, me, ie = best
    return dict(host_factor=hf, unhidden=un, compute_eff=ce, memory_eff=me, irregular_eff=ie)


def spread_error(calibration) -> float | None:
    """The relative error of a description over its calibration points (None without points):
    ``exp(rms(log(predicted / measured))) - 1``, as the shipped H200 description states its own."""
    import math

    if not calibration:
        return None
    logs = [math.log(c.ratio) for c in calibration]
    return math.exp(math.sqrt(sum(x * x for x in logs) / len(logs))) - 1


def gpu_description(*, name: str, memory_bytes: float | None, peak_flops: dict[str, float],
                    mem_bandwidth_Bps: float, op_overhead_s: float, stage_overhead_s: float, sync_s: float,
                    transfer, timed_ops) -> Any:
    """A GPU's :class:`~placer.costmodel.roofline.DeviceDescription` from what was measured on it.

    ``timed_ops`` are ``(op, size, work, measured_s)`` of the reference ops timed on this GPU.
    With at least :data:`MIN_FIT_POINTS` of them, the efficiency factors and host factor are
    this GPU's own (:func:`fit_gpu_factors`); with fewer, they are the shipped H200
    calibration's, and ``source`` says so. Either way ``rel_error`` is the spread of this
    description's predictions over this GPU's own timed ops (1.0, unknown, when none were
    timed), never the H200's, and ``calibration`` lists those ops.
    """
    from placer.costmodel.roofline import CalibrationPoint, DeviceDescription, load_description

    measured = "placer describe: measured peaks, device copy bandwidth, launch costs and copies"
    fixed = dict(op_overhead_s=op_overhead_s, stage_overhead_s=stage_overhead_s, sync_s=sync_s)
    if len(timed_ops) >= MIN_FIT_POINTS:
        factors = fit_gpu_factors([(w, m) for _, _, w, m in timed_ops], peak_flops=peak_flops,
                                  mem_bandwidth_Bps=mem_bandwidth_Bps, **fixed)
        how = f"; efficiency factors and host factor fitted to {len(timed_ops)} reference ops timed on this GPU"
    else:
        ref = load_description("h200")
        factors = dict(host_factor=ref.host_factor, unhidden=ref.unhidden, compute_eff=ref.compute_eff,
                       memory_eff=ref.memory_eff, irregular_eff=ref.irregular_eff)
        how = (f"; efficiency factors and host factor ASSUMED from the shipped H200 calibration, not fitted here "
               f"(only {len(timed_ops)} reference ops timed on this GPU; a larger --budget-s times more)")
    desc = DeviceDescription(name=name, kind="gpu", memory_bytes=memory_bytes, source=measured + how,
                             peak_flops=peak_flops, mem_bandwidth_Bps=mem_bandwidth_Bps, transfer=transfer,
                             **fixed, **factors)
    cal = [CalibrationPoint(op=o, size=s, work=w, measured_s=m, predicted_s=desc.predict(w))
           for o, s, w, m in timed_ops]
    err = spread_error(cal)
    return desc.model_copy(update={"calibration": cal, "rel_error": 1.0 if err is None else err})


def _time_reference_ops(dev, timed, *, budget_s: float) -> list:
    """``(op, size, work, seconds)`` of the calibration ops on torch device ``dev``, within ``budget_s``."""
    from placer.costmodel.counts import count_work, dispatch_s
    from placer.target.ops import CALIBRATION, OPS

    here = dispatch_s()
    out = []
    t_end = time.perf_counter() + budget_s
    for op, size in CALIBRATION:
        if time.perf_counter() > t_end:
            break
        try:
            seconds = timed(OPS[op](size, device=dev), 0.1)
            _, work = count_work(OPS[op](size))
        except Exception:  # noqa: BLE001 - an op this GPU cannot run is left out of the fit
            continue
        work.host_s = work.dispatches * here + work.outside_s  # as the cost model charges host time
        out.append((op, float(size), work, seconds))
    return out


def describe_gpu(device, *, budget_s: float = 10.0, fingerprint: str = ""):
    """A :class:`~placer.costmodel.roofline.DeviceDescription` of one CUDA GPU, measured here.

    Its peaks, bandwidth, launch costs and copies are measured; its efficiency factors are
    fitted to the reference ops timed on it (:func:`gpu_description`).
    """
    import torch

    from placer.profile.transfers import measure_transfers
    from placer.timing import measure

    if not device.is_gpu:
        raise TargetError(f"cannot describe {device.name} ({device.kind}): only real GPUs are described")
    dev = device.torch_device()

    def sync():
        device.synchronize()

    def timed(fn, max_s=0.3):
        return _best(measure(fn, sync=sync, min_reps=3, max_reps=50, min_time_s=0.02, max_time_s=max_s, warn=False))

    n = PEAK_N
    peak = {}
    for prec, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                              ("bf16", torch.bfloat16, False)):
        a = torch.randn(n, n, device=dev, dtype=dtype)
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            peak[prec] = 2 * n**3 / timed(lambda a=a: a @ a)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    peak["fp16"] = peak["bf16"]
    src = torch.empty(COPY_ELEMENTS, device=dev)
    dst = torch.empty_like(src)
    bw = 2 * src.nbytes / timed(lambda: dst.copy_(src))
    tiny = torch.zeros(1, device=dev)
    one = timed(lambda: tiny.add_(1), 0.1)
    hundred = timed(lambda: [tiny.add_(1) for _ in range(100)], 0.2)
    transfer = measure_transfers(device, budget_s=min(budget_s / 2, 8.0), fingerprint=fingerprint)
    ops = _time_reference_ops(dev, timed, budget_s=max(budget_s / 2, 2.0))
    return gpu_description(name=device.label, memory_bytes=float(device.memory_bytes or 0) or None,
                           peak_flops=peak, mem_bandwidth_Bps=bw, op_overhead_s=max((hundred - one) / 99, 1e-7),
                           stage_overhead_s=one, sync_s=one, transfer=transfer, timed_ops=ops)

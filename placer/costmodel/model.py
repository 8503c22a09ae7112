"""The cost model: predicted stage and transfer costs at any size, from a profile.

May import: numpy, pydantic, placer.costmodel.*, placer.data (it reads a
:class:`~placer.data.profile.Profile` and writes a :class:`~placer.data.cost_table.CostTable`),
placer.devices (device names and kinds), placer.errors. Never torch, the profiler, the optimizer
or placer.target (a target's CPU scale and CPU arrive as arguments).

For each (stage, device) a :class:`~placer.costmodel.fit.SizeFit` is fitted to the
measured medians; at a measured size the measurement itself is returned (labelled
``measured``), elsewhere the fit (``predicted``). For a device this machine lacks,
a :class:`~placer.costmodel.roofline.DeviceDescription` turns the stage's counted
work at each profiled size into roofline times, and a fit over those extends them
to the requested size (``roofline``). Planning for a described machine
(``cpu_scale``, ``target_cpu``), the ``cpu`` device is the target's CPU: this
machine's CPU predictions scaled by ops measured on both (``scaled``: by the
threads each measurement kept busy and its counted work, :meth:`CostModel.scale_inputs`),
and the described GPUs' host time at the target's own cost per op issued plus this machine's Python
between ops (:meth:`placer.target.CpuScale.host_seconds`). Transfers come from the separate
:class:`~placer.costmodel.bus.TransferModel`.

Examples
--------
>>> from placer.data.profile import Profile, StageProfile, DeviceProfile, Point
>>> pts = [Point(size=n, median_s=1e-4 + 1e-7 * n, iqr_s=0.0, reps=5, raw_times=[1e-4 + 1e-7 * n])
...        for n in (100, 200, 400, 800)]
>>> prof = Profile(pipeline="demo", fingerprint="x", stages={"s": StageProfile(
...     name="s", key="k", devices={"cpu": DeviceProfile(device="cpu", kind="cpu", points=pts)})})
>>> cm = CostModel(prof)
>>> p = cm.predict("s", "cpu", 8000)
>>> round(p.value, 6), p.label
(0.0009, 'predicted')
"""

from __future__ import annotations

from typing import Any

import numpy as np

from placer.costmodel import precision as precision_model
from placer.costmodel.fit import SizeFit, fit_size_model
from placer.costmodel.roofline import DeviceDescription, load_gpus
from placer.data.cost_table import CostTable
from placer.data.measures import Prediction, TransferModel, Work
from placer.data.profile import DeviceProfile, Point, Profile, StageProfile
from placer.devices import canonical_name, is_device_name, kind_of, kinds
from placer.errors import CostModelError


def _pin(pin: str | None, devices: list[str]) -> str | None:
    """A stage's pin in the table's device names (an alias such as ``gpu`` → the first
    device of its kind in the table, else what the alias stands for)."""
    if pin is None:
        return None
    p = pin.strip().lower()
    if not is_device_name(p) or canonical_name(p) == p:
        return p
    kind = kind_of(p)
    return next((d for d in devices if is_device_name(d) and canonical_name(d) == d and kind_of(d) == kind),
                canonical_name(p))


def fit_value(p: Point) -> float:
    """The per-point time a fit uses: the lower quartile of the repeats.

    Noise from other work on the machine only ever adds time, so the lower quartile
    estimates the stage's own cost better than the median when the machine is busy,
    and equals it when it is quiet. A point whose repeats came in stall-sized steps
    (``stalled``: a thread waiting for a core on a busy machine) takes its least
    repeat, which may be all that was not stalled.
    """
    raw = [t for t in p.raw_times if t > 0]
    if p.stalled and raw:
        return float(min(min(raw), p.median_s))
    if len(raw) >= 3:
        return float(min(np.percentile(raw, 25), p.median_s))
    return p.median_s


#: the least relative noise a cost table's times are taken to have
NOISE_FLOOR = 0.02
#: a stage whose every device's time is below this is "tiny": its predictions' own error is part of
#: its spread (launch, dispatch and copy costs, predicted from a description, dominate such times)
TINY_S = 1e-3


class CostModel:
    """Predictions for every (stage, device) of a profiled pipeline.

    Parameters
    ----------
    profile : Profile
    describe : list of DeviceDescription or str, optional
        Devices to predict by roofline (e.g. ``["h200"]``), each added under the
        name ``as_name`` (default ``gpu:0``, or ``gpu:1``... when taken).
    """

    def __init__(self, profile: Profile, describe: list[DeviceDescription | str] | None = None, *,
                 cpu_scale: Any = None, target_cpu: Any = None, host_scale: Any = None,
                 dispatch_s: float | None = None):
        self.profile = profile
        #: seconds one op costs to issue on the profiled machine (default: its CPU calibration's)
        self._dispatch = dispatch_s
        self._fits: dict[tuple[str, str], SizeFit] = {}
        self._out: dict[str, SizeFit] = {}
        self._peak: dict[tuple[str, str], SizeFit] = {}
        #: one core's work of the CPU over size, where timed at one thread (a profile at several)
        self._work: dict[tuple[str, str], SizeFit] = {}
        self.described: dict[str, DeviceDescription] = {}
        #: scales this machine's CPU seconds to the target's CPU (a placer.target.CpuScale)
        self.cpu_scale = cpu_scale
        #: with ``cpu_scale``: the "cpu" device is the target's CPU (a placer.target.CpuDescription)
        self.target_cpu = target_cpu
        #: scales the host time described GPUs pay (default ``cpu_scale``): their host is the target's
        self.host_scale = host_scale if host_scale is not None else cpu_scale
        #: stage → a precision the user fixed (``--precision train=bf16``): planned as it is
        self.fixed_precision: dict[str, str] = {}
        for desc in describe or []:
            for d in _gpus_of(desc):
                name = next(f"gpu:{i}" for i in range(64) if f"gpu:{i}" not in self.devices)
                self.described[name] = d
        for n, sp in profile.stages.items():
            self._fit_stage(n, sp)

    # -- fitting -------------------------------------------------------------------------
    def _fit_stage(self, name: str, sp: StageProfile) -> None:
        outs = []
        for dev, dp in sp.devices.items():
            pts = [p for p in dp.points if p.median_s > 0]
            if not pts:
                continue
            self._fits[(name, dev)] = fit_size_model([p.size for p in pts], [fit_value(p) for p in pts])
            if self.scaled(dev) and any(p.one_core_s for p in pts):
                self._work[(name, dev)] = fit_size_model([p.size for p in pts], [work_value(p) for p in pts])
            on_device = getattr(kinds().get(dp.kind), "accelerator", False)  # its memory is the device's
            peak = [(p.size, p.peak_device_bytes if on_device else p.peak_host_bytes) for p in pts]
            peak = [(s, b) for s, b in peak if b is not None and b > 0]
            if peak:
                self._peak[(name, dev)] = fit_size_model(*zip(*peak), forms=("linear", "power"))
            outs += [(p.size, p.output_bytes) for p in pts if p.output_bytes > 0]
        if outs:
            self._out[name] = fit_size_model(*zip(*outs), forms=("linear", "power"))
        for dev, desc in self.described.items():
            if not sp.work or "gpu" not in sp.device_classes:
                continue
            fit = fit_size_model(*zip(*self.described_points(name, desc)))
            counted = max(float(w.size) for w in sp.work)
            if counted > 0 and fit.n_max > counted:  # points built beyond the counted sizes are not measured ones
                fit = fit.model_copy(update={"n_max": counted})
            self._fits[(name, dev)] = fit

    def host_seconds(self, stage: str) -> list[float]:
        """Host-side seconds a GPU run of ``stage`` pays at each counted size (``profile.stages[stage].work``).

        Measured, never read off a CPU fit: the framework's cost of issuing one op
        (:meth:`dispatch_s`, measured with tiny tensors) times the calls dispatched at that
        size (forward, backward and optimizer ops alike, views and metadata included: each
        costs a dispatch though it launches no kernel), plus the time the counted call
        spent outside torch ops there (``Work.outside_s``: Python, numpy, a DataLoader;
        torch's own work kept out of it; read off the robust line through every counted
        size's reading, :func:`smoothed_outside`). Both are one thread's time on this machine;
        for a target that describes its CPU (``host_scale``), each op costs the target's own
        measured tiny-op cost and the Python between ops is scaled by the two CPUs' Python
        speeds (:meth:`placer.target.CpuScale.host_seconds`): what the prediction charges then
        does not hang on how fast this machine issues ops. Without this machine's dispatch
        cost (a profile from a machine never calibrated), the target CPU's own is charged per op.
        """
        work = self.profile.stages[stage].work
        outside = smoothed_outside(work)
        here = self.dispatch_s()
        if self.host_scale is not None:
            return [self.host_scale.host_seconds(w.work.dispatches, o, here) for w, o in zip(work, outside)]
        if here is not None:
            return [w.work.dispatches * here + o for w, o in zip(work, outside)]
        there = getattr(self.target_cpu, "dispatch_s", None) or 0.0
        return [w.work.dispatches * there + o for w, o in zip(work, outside)]

    def described_points(self, stage: str, desc: DeviceDescription, precision: str | None = None
                         ) -> list[tuple[float, float]]:
        """(size, seconds) of ``stage`` on the described device ``desc`` at each counted size,
        its host time included, for a fit over size.

        With work counted at one size only, a line through one point would split the time
        between a fixed and a per-item part at random; points at 2, 4 and 16 times the size are
        added as a batched stage does it (the same calls, launches and host time; that many
        times the FLOPs and bytes), so that host and launch costs stay fixed and the work grows.

        With work counted at several sizes, the time at each is a sum of parts that grow
        differently: FLOPs and bytes in proportion to the batch, the calls, launches and host
        time hardly at all for a batched stage (a few ops more or fewer at a tiny batch, and
        the host readings' noise). A line through the times at small counted sizes would
        carry a difference of a few calls, or of one noisy host reading, to the planned size
        in proportion (a training step counted at 1 and 2 sequences charged its 18 extra calls
        and 1 ms of host noise 62 times over at 64). So points at 4 and 16 times the largest
        counted size are added, each part extended on its own: FLOPs and bytes on the line
        through the two largest counted sizes, ops and calls by their growth between them in
        logs (between none and in proportion, :func:`grown`), host time per call as at the
        largest. The fit over size then follows the work; its range stays the counted sizes.
        """
        sp = self.profile.stages[stage]
        host = self.host_seconds(stage)
        works = [precision_model.under(self, stage, precision, w.work, h, w.size) for w, h in zip(sp.work, host)]
        pts = [(float(w.size), desc.predict(wk.model_copy(update={"host_s": h}), precision=precision))
               for w, (wk, h) in zip(sp.work, works)]
        if len(sp.work) == 1 and sp.work[0].size > 0:
            w, h = works[0]
            # host and device overlap (DeviceDescription.predict), so the time bends where the growing
            # work overtakes the fixed host time: points at 4 and 16 times too let the fit follow it
            for times in (2.0, *BEYOND):
                grown_w = w.model_copy(update={"host_s": h, **{k: times * getattr(w, k) for k in _GROWS if hasattr(w, k)}})
                pts.append((times * sp.work[0].size, desc.predict(grown_w, precision=precision)))
        elif len({w.size for w in sp.work if w.size > 0}) >= 2:
            for times in BEYOND:
                size, work, h = self._beyond(stage, host, times)
                wk, hk = precision_model.under(self, stage, precision, work, h, size)
                pts.append((size, desc.predict(wk.model_copy(update={"host_s": hk}), precision=precision)))
        return pts

    def _beyond(self, stage: str, host: list[float], times: float) -> tuple[float, Any, float]:
        """``stage``'s counted work (fp32) and host seconds extended to ``times`` its largest counted size:
        see :meth:`described_points`."""
        sp = self.profile.stages[stage]
        by = sorted(((float(w.size), w.work, h) for w, h in zip(sp.work, host) if w.size > 0), key=lambda t: t[0])
        (n0, w0, _), (n1, w1, h1) = by[-2], by[-1]
        size = times * n1
        upd: dict[str, Any] = {}
        for k in _GROWS:
            a, b = float(getattr(w0, k)), float(getattr(w1, k))
            upd[k] = max(b + (b - a) * (size - n1) / (n1 - n0), b)
        upd["ops"] = grown(w0.ops, w1.ops, n0, n1, size)
        calls0, calls1 = w0.dispatches, w1.dispatches
        calls = grown(calls0, calls1, n0, n1, size)
        if w1.calls:
            upd["calls"] = calls
        return size, w1.model_copy(update=upd), h1 * (calls / calls1 if calls1 else 1.0)

    def dispatch_s(self) -> float | None:
        """Seconds one op costs to issue on the machine the profile was measured on (its CPU
        calibration's ``dispatch_s``: tiny ops, measured once per machine), or None when unknown."""
        if self._dispatch is not None:
            return self._dispatch
        cal = self.profile.machine.get("cpu_calibration") or {}
        value = cal.get("dispatch_s") if isinstance(cal, dict) else None
        return float(value) if value else None

    def loop_carried(self, stage: str) -> bool:
        """Whether measurements show sequential (loop-carried) work: an accelerator that
        was measured (not described) is slower than the CPU at every measured size, and
        its disadvantage does not shrink as the size grows (parallel work would catch up).
        """
        sp = self.profile.stages[stage]
        cpu = sp.devices.get("cpu")
        if cpu is None or not cpu.points:
            return False
        cpu_at = {p.size: fit_value(p) for p in cpu.points}
        for dev, dp in sp.devices.items():
            if not getattr(kinds().get(dp.kind), "accelerator", True) or len(dp.points) < 3:
                continue
            ratios = [fit_value(p) / cpu_at[p.size] for p in sorted(dp.points, key=lambda p: p.size)
                      if p.size in cpu_at and cpu_at[p.size] > 0]
            if len(ratios) >= 3 and min(ratios) > 1.0 and ratios[-1] >= 0.8 * ratios[0]:
                return True
        return False

    # -- views ---------------------------------------------------------------------------
    @property
    def devices(self) -> dict[str, dict[str, Any]]:
        """Device name → description (measured ones from the profile, then described ones)."""
        out = {n: dict(d) for n, d in self.profile.devices.items()}
        if getattr(self, "target_cpu", None) is not None:
            out["cpu"] = self.target_cpu.device_entry()
        for n, d in getattr(self, "described", {}).items():
            out[n] = d.device_entry()
        return out

    @property
    def stages(self) -> list[str]:
        return list(self.profile.stages)

    def label(self, stage: str, device: str) -> str:
        """``measured`` (fit to this machine's measurements), ``roofline`` (described device) or
        ``scaled`` (this machine's CPU scaled to a described target's CPU)."""
        if device in self.described:
            return "roofline"
        return "scaled" if self.scaled(device) else "measured"

    def scaled(self, device: str) -> bool:
        """Whether ``device``'s predictions are this machine's CPU scaled to the target's."""
        return self.cpu_scale is not None and device == "cpu"

    def fit(self, stage: str, device: str) -> SizeFit:
        """The fitted size model of ``stage`` on ``device``."""
        try:
            return self._fits[(stage, device)]
        except KeyError:
            have = sorted(d for s, d in self._fits if s == stage)
            if stage not in self.profile.stages:
                raise CostModelError(f"no stage {stage!r} in the profile of {self.profile.pipeline!r}; "
                                     f"stages: {', '.join(self.profile.stages)}") from None
            raise CostModelError(
                f"stage {stage!r} has no measurements or description for device {device!r} "
                f"(it has: {', '.join(have) or 'none'}); profile on that device or describe it"
            ) from None

    # -- predicting ----------------------------------------------------------------------
    def predict(self, stage: str, device: str, size: float) -> Prediction:
        """Seconds of ``stage`` on ``device`` at ``size``, with its error and label."""
        fit = self.fit(stage, device)
        if device in self.described:
            p = fit.predict(size, label="roofline")
            return p.model_copy(update={"rel_error": max(self.described[device].rel_error, fit.loo_error,
                                                         p.fit_spread)})
        dp: DeviceProfile = self.profile.stages[stage].devices[device]
        at = [p for p in dp.points if p.size == size]
        if (stage, device) in self._work:
            return self._one_core_scaled(stage, device, size, at)
        if at:
            # for a target, this machine's noise is no part of the stage's cost: the lower quartile;
            # here too where the repeats were noisy or stalled (the machine was busy), as the fits do
            med = sum(fit_value(p) if self.scaled(device) or p.noisy or p.stalled else p.median_s
                      for p in at) / len(at)
            iqr = max(p.iqr_s for p in at)
            here = Prediction(value=med, rel_error=iqr / med if med else 0.0, label="measured")
        else:
            here = fit.predict(size)
        if not self.scaled(device):
            return here
        kw = self.scale_inputs(stage, device, size)
        return here.model_copy(update={"value": self.cpu_scale.seconds(here.value, **kw), "label": "scaled",
                                       "rel_error": max(here.rel_error, 0.3)})

    def _one_core_scaled(self, stage: str, device: str, size: float, at: list[Point]) -> Prediction:
        """The target CPU's time of ``stage`` at ``size`` from one core's work here: timed at one
        thread beside every point of a profile at several (``Point.one_core_s``), fitted over
        size (or the points at ``size``), and scaled by the calibration ops like it, as a
        one-thread profile's time is: what the threads made of it here (their split into
        serial and parallel time, a pool waiting for a core) is no part of the target's."""
        if at:
            value = sum(work_value(p) for p in at) / len(at)
            here = Prediction(value=value, rel_error=max(p.iqr_s / p.median_s if p.median_s else 0.0 for p in at),
                              label="measured")
        else:
            here = self._work[(stage, device)].predict(size)
        kw = {k: v for k, v in self.scale_inputs(stage, device, size).items() if k not in ("work_share", "threads_used",
                                                                                           "threads")}
        return here.model_copy(update={"value": self.cpu_scale.seconds(here.value, **kw), "label": "scaled",
                                       "rel_error": max(here.rel_error, 0.3)})

    def scale_inputs(self, stage: str, device: str, size: float) -> dict[str, Any]:
        """What the CPU scale needs to know of ``stage``'s work at ``size``.

        ``threads_used`` (CPU time over wall time) of the nearest measured point, the
        threads it was measured with, and the counted operations (:func:`ops_at`: between
        the counted sizes around ``size``, so that a loop over more batches is placed
        by its ops at that size) and bytes of the nearest counted size (bytes in
        proportion to the size). A point's CPU time
        tells its threads only when each thread had a core: not when it stalled, nor
        when the load average beyond its own threads left a thread without a core (a
        pool thread waiting for one leaves the others spinning or idle, and the call
        reads as serial); then the time is taken as one core's work.

        ``work_share``: the nearest point's one core's work (:func:`one_core`) over its
        thread-seconds (the lower quartile times the threads kept busy, or one when those
        were not told), where less than 1: its threads waited for cores or spun at a
        barrier (a pool's spinning counts as CPU time), and the target is charged the work,
        not the waits, so that profiles at one and at several threads, on a quiet or a
        busy machine, predict the same. Where one core's work was timed (``Point.one_core_s``,
        a profile at several threads), it is that work over the lower quartile (above 1 when
        the threads worked in parallel) and ``threads_used`` is left out: the target is
        charged one core's work scaled by the calibration ops like it, as a one-thread
        profile of the stage is. The split into serial and parallel time that
        ``threads_used`` would give is not kept: a one-thread profile cannot read it, and
        read from the process's CPU time it calls short parallel work serial (the CPU time of
        the pool's other thread is counted at the scheduler's tick, not as it runs), which
        made a stage's target CPU time differ several-fold between the two profiles.
        """
        kw: dict[str, Any] = {}
        sp = self.profile.stages[stage]
        machine = self.profile.machine
        threads = int(machine.get("threads") or machine.get("cores") or 1)
        cores = int(machine.get("cores") or threads)
        pts = [p for p in sp.devices[device].points
               if p.cpu_s is not None and p.cpu_s > 0 and not p.stalled and p.copied_from is None]
        if pts:
            p = min(pts, key=lambda p: abs(np.log(p.size / max(size, 1e-9))))
            wall = float(np.mean([t for t in p.raw_times if t > 0] or [p.median_s]))
            used = p.cpu_s / wall if wall > 0 else 0.0
            if used > 0 and (p.load is None or p.load - used <= max(cores - threads, 0) + 0.5):
                kw["threads_used"] = used
                kw["threads"] = threads
        pts = [(p, one) for p in sp.devices[device].points if p.copied_from is None
               and (one := one_core(p, threads, cores))]
        if pts:
            p, one = min(pts, key=lambda po: abs(np.log(po[0].size / max(size, 1e-9))))
            if p.one_core_s:
                # one core's work was timed: scaled as it is, whatever the threads made of it here
                # (a one-thread profile has no split to read, and a pool thread's CPU time is
                # counted late, so a short parallel call reads as serial at several threads)
                kw.pop("threads_used", None)
                kw.pop("threads", None)
                if fit_value(p) > 0:
                    kw["work_share"] = one / fit_value(p)
            else:
                busy = fit_value(p) * min(max(kw.get("threads_used", 1.0), 1.0), float(max(threads, 1)))
                if busy > 0 and one < busy:
                    kw["work_share"] = one / busy
        if sp.work:
            w = min(sp.work, key=lambda w: abs(np.log(w.size / max(size, 1e-9))))
            if w.work.source == "counted":
                kw["ops"] = ops_at(sp.work, size)
                if w.work.bytes > 0:
                    kw["bytes"] = w.work.bytes * size / w.size
        return kw

    def noise(self, devices: list[str] | None = None) -> float:
        """The relative spread of the measurements (median IQR / median over every measured
        point, kept within 2-25%): predicted times closer than this are within the noise.

        With a described device among ``devices`` (default: none), at least the spread
        of its host time (:meth:`host_noise`): the readings it is made of are noisier
        than the timed repeats.
        """
        spread = [p.iqr_s / p.median_s for sp in self.profile.stages.values() for dp in sp.devices.values()
                  for p in dp.points if p.median_s > 0 and p.reps >= 3]
        base = np.median(spread) if spread else NOISE_FLOOR
        if devices and any(d in self.described for d in devices):
            base = max(base, self.host_noise([d for d in devices if d in self.described]))
        return float(min(max(base, NOISE_FLOOR), 0.25))

    def host_noise(self, devices: list[str]) -> float:
        """How far the time outside torch ops read at each counted size lies from the line
        the host time uses (:func:`smoothed_outside`), as a fraction of the described
        device's predicted seconds there: each stage's mean over its counted sizes, the
        median over the stages (0 without a stage counted at three sizes or more)."""
        ratio = self.host_scale.python_ratio if self.host_scale is not None else 1.0
        per_stage = []
        for name, sp in self.profile.stages.items():
            if len(sp.work) < 3:
                continue
            line = smoothed_outside(sp.work)
            for dev in devices:
                if (name, dev) not in self._fits:
                    continue
                fit = self._fits[(name, dev)]
                rel = [abs(w.work.outside_s - o) * ratio / at for w, o in zip(sp.work, line)
                       if (at := float(fit(w.size))) > 0]
                if rel:
                    per_stage.append(float(np.mean(rel)))
        return float(np.median(per_stage)) if per_stage else 0.0

    def output_bytes(self, stage: str, size: float) -> float:
        fit = self._out.get(stage)
        return float(max(fit(size), 0.0)) if fit is not None else 0.0

    def peak_bytes(self, stage: str, device: str, size: float) -> float | None:
        fit = self._peak.get((stage, device))
        return float(max(fit(size), 0.0)) if fit is not None else None

    def first_call_s(self, stage: str, device: str) -> float | None:
        """One-time cost of the stage's first call on ``device`` (first call minus steady state)."""
        sp = self.profile.stages[stage]
        dp = sp.devices.get(device)
        if dp is None or not dp.points:
            return self.described[device].first_call_s if device in self.described else None
        p = min(dp.points, key=lambda p: p.size)
        return None if p.first_call_s is None else max(p.first_call_s - p.median_s, 0.0)

    def transfer_model(self, device: str | None = None) -> TransferModel | None:
        """The link model for ``device`` (default: the first real GPU, else a described
        one, else any measured device)."""
        tms = dict(self.profile.transfer)
        for n, d in self.described.items():
            if d.transfer is not None:
                tms.setdefault(n, d.transfer)
        if device is not None:
            return tms.get(device)
        devices, registered = self.devices, kinds()

        def rank(n: str) -> int:
            kind = registered.get(devices.get(n, {}).get("kind"))
            return 0 if kind is not None and kind.real_gpu else 1 if n in self.described else 2

        return min(tms.items(), key=lambda item: rank(item[0]), default=(None, None))[1]

    def transfer(self, nbytes: float, direction: str = "h2d", device: str | None = None) -> Prediction:
        """Seconds to copy ``nbytes`` between the host and ``device``, as the executor does."""
        tm = self.transfer_model(device)
        if tm is None:
            raise CostModelError(f"no transfer model for {device or 'any accelerator'}; "
                                 "profile with an accelerator or describe one")
        return tm.predict(nbytes, direction)

    def has_fit(self, stage: str, device: str) -> bool:
        """Whether ``stage`` has a fit (measured or described) on ``device``."""
        return (stage, device) in self._fits

    def predictions(self, size: float, devices: list[str] | None = None) -> dict[str, dict[str, Prediction]]:
        """Every (stage, device) prediction at ``size``: ``{stage: {device: Prediction}}``."""
        devs = devices or list(self.devices)
        out: dict[str, dict[str, Prediction]] = {}
        for s in self.stages:
            out[s] = {d: self.predict(s, d, size) for d in devs if (s, d) in self._fits}
        return out

    def table(self, size: float, devices: list[str] | None = None):
        """The optimizer's :class:`~placer.data.cost_table.CostTable` at ``size``.

        Parameters
        ----------
        size : float
            The pipeline's scale parameter.
        devices : list of str, optional
            Devices to include (default: every measured and described one). The CPU
            is always included.
        """
        devs = list(devices or self.devices)
        if "cpu" not in devs and "cpu" in self.devices:
            devs.insert(0, "cpu")
        unknown = [d for d in devs if d not in self.devices]
        if unknown:
            raise CostModelError(f"devices {unknown} are neither profiled nor described; "
                                 f"known: {', '.join(self.devices)}")
        spec = {}
        for d in devs:
            e = self.devices[d]
            spec[d] = {k: v for k, v in {"kind": e.get("kind"), "workers": e.get("workers") if e.get("kind") == "cpu" else None,
                                         "memory_bytes": e.get("memory_bytes"), "label": e.get("label", "")}.items()
                       if v is not None}
        stages = []
        noise = self.noise(devs)
        for name, sp in self.profile.stages.items():
            preds = {d: self.predict(name, d, size) for d in devs if (name, d) in self._fits}
            secs = {d: p.value for d, p in preds.items()}
            peak = {d: b for d in secs if (b := self.peak_bytes(name, d, size)) is not None}
            # where the fit forms disagree by more than the noise, a flip within that is a tie
            unsure = {d: p.fit_spread for d, p in preds.items() if p.fit_spread > noise}
            if len(secs) > 1 and max(secs.values()) < TINY_S:
                # every candidate sub-millisecond: the prediction's own error (a roofline's over its
                # calibration ops, a scaled CPU time's) decides as much as the times, so it is spread too
                for d, p in preds.items():
                    if p.rel_error > max(noise, unsure.get(d, 0.0)):
                        unsure[d] = p.rel_error
            entry = {"name": name, "kind": sp.kind, "inputs": sp.inputs, "input_bytes": 0.0,
                     "output_bytes": self.output_bytes(name, size), "seconds": secs, "peak_bytes": peak,
                     "loop_carried": self.loop_carried(name), "pin": _pin(sp.pin, devs),
                     **({"uncertainty": unsure} if unsure else {})}
            stages.append({**entry, **self._precisions(name, secs, size)})
        tm = self.transfer_model()
        doc = {"devices": spec, "stages": stages, "size": size, "size_unit": self.profile.size_unit,
               "noise": noise}
        if tm is not None and any(self.devices[d].get("kind") != "cpu" for d in devs):
            doc["link"] = tm.table_link()
        return _cost_table(doc)

    def precision_ratio(self, stage: str, device: str, precision: str, size: float | None = None) -> float | None:
        """Seconds in ``precision`` over seconds in fp32 (:func:`placer.costmodel.precision.ratio`)."""
        return precision_model.ratio(self, stage, device, precision, size)

    def _precisions(self, stage: str, secs: dict[str, float], size: float) -> dict[str, Any]:
        """A stage's times per precision and the one planned on each device (see
        :mod:`placer.costmodel.precision`); ``secs`` takes the planned precision's time. Empty when
        no lower precision was checked or fixed (the table is then as it always was)."""
        fixed = self.fixed_precision.get(stage)
        lower = [fixed] if fixed not in (None, "fp32") else list(precision_model.checks(self, stage))
        if not lower and fixed is None:
            return {}
        times, chosen = {}, {}
        for d in list(secs):
            t = precision_model.seconds(self, stage, d, size, lower)
            times[d] = t
            p = precision_model.choose(self, stage, d, t, fixed)
            secs[d] = t[p]
            if p != "fp32":
                chosen[d] = p
        return {"precision": chosen, "precision_s": times}

    def summary(self, size: float | None = None) -> dict[str, Any]:
        """A JSON-ready account: per stage and device the measured points, first call,
        memory, output bytes, fit and its error, and the prediction at ``size``."""
        out: dict[str, Any] = {}
        for name, sp in self.profile.stages.items():
            entry: dict[str, Any] = {}
            for dev in self.devices:
                if (name, dev) not in self._fits:
                    continue
                fit = self._fits[(name, dev)]
                dp = sp.devices.get(dev)
                e: dict[str, Any] = {"label": self.label(name, dev)}
                if dp is not None:
                    e["points"] = [{"size": p.size, "median_s": p.median_s, "iqr_s": p.iqr_s, "reps": p.reps,
                                    "noisy": p.noisy} for p in dp.points]
                    e["first_call_s"] = dp.points[0].first_call_s if dp.points else None
                    e["first_call_overhead_s"] = self.first_call_s(name, dev)
                    e["peak_host_bytes"] = max((p.peak_host_bytes for p in dp.points), default=0.0)
                    pd = [p.peak_device_bytes for p in dp.points if p.peak_device_bytes is not None]
                    e["peak_device_bytes"] = max(pd) if pd else None
                    e["output_bytes"] = {str(p.size): p.output_bytes for p in dp.points}
                    if dp.error:
                        e["error"] = dp.error
                else:
                    e["work"] = [{"size": w.size, **w.work.model_dump()} for w in sp.work]
                e["model"] = {**fit.model_dump(), "formula": fit.describe()}
                if size is not None:
                    e["prediction"] = self.predict(name, dev, size).model_dump()
                entry[dev] = e
            out[name] = entry
        return out


def one_core(p: Point, threads: int, cores: int) -> float | None:
    """One core's work per call of a measured CPU point: its one-thread measurement
    (``Point.one_core_s``, taken when profiling at several threads), or, profiled at one
    thread, its CPU time where that is less than the lower quartile and the machine had no
    idle core (the thread waited for one; a wait on anything else stays in); else None."""
    if p.one_core_s:
        return float(p.one_core_s)
    if threads <= 1 and p.cpu_s and p.load is not None and p.load >= cores - 0.5 and p.cpu_s < fit_value(p):
        return float(p.cpu_s)
    return None


def ops_at(work: list, size: float) -> int:
    """The ops issued at ``size``: read off the counted sizes on either side of it on a
    log-log line (from the two nearest beyond them, the growth kept between none and in
    proportion to the size), so that profiles counted at different sizes agree."""
    pts = sorted({float(w.size): max(int(w.work.ops), 1) for w in work if w.size > 0}.items())
    if not pts:
        return max(int(work[0].work.ops), 1) if work else 1
    if len(pts) == 1 or size <= 0:
        return min(pts, key=lambda sv: abs(np.log(sv[0] / max(size, 1e-9))))[1]
    lo = max([i for i, (n, _) in enumerate(pts) if n <= size] or [0])
    lo = min(lo, len(pts) - 2)
    (n0, v0), (n1, v1) = pts[lo], pts[lo + 1]
    slope = min(max((np.log(v1) - np.log(v0)) / (np.log(n1) - np.log(n0)), 0.0), 1.0)
    return max(int(round(v0 * (size / n0) ** slope)), 1)


#: multiples of the largest counted size at which :meth:`CostModel.described_points` extends the work
BEYOND = (4.0, 16.0)


def grown(v0: float, v1: float, n0: float, n1: float, size: float) -> int:
    """A count (ops, calls) at ``size`` beyond ``n1``, from ``v0`` at ``n0`` and ``v1`` at ``n1``: their
    growth in logs, kept between none and in proportion to the size (:func:`ops_at`'s rule)."""
    v0, v1 = max(float(v0), 1.0), max(float(v1), 1.0)
    slope = min(max((np.log(v1) - np.log(v0)) / (np.log(n1) - np.log(n0)), 0.0), 1.0)
    return max(int(round(v1 * (size / n1) ** slope)), 1)


def work_value(p: Point) -> float:
    """One core's work per call of a measured CPU point: its time at one thread
    (``Point.one_core_s``) where taken, else the time it is fitted by (:func:`fit_value`)."""
    return float(p.one_core_s) if p.one_core_s else fit_value(p)


#: the counted work that grows with a batched stage's size (see :meth:`CostModel.described_points`)
_GROWS = ("flops", "bytes", "tensor_flops", "tensor_bytes", "irregular_bytes")


#: time outside ops per call below which readings are taken as equal (their noise is about this)
PER_CALL_FLOOR_S = 1e-6


def smoothed_outside(work: list) -> list[float]:
    """Each counted size's time outside torch ops (``Work.outside_s``), read off the robust line
    through all of them against the calls dispatched at each size, never below zero; with one
    counted size, the reading.

    That time is a few microseconds per call of a thread's CPU time less the counter's
    measured overhead: on a busy machine one size's reading can be off by tens of
    microseconds either way, and on any machine the Python between large ops runs in the
    caches they evicted (a GPU's work evicts nothing), so the readings creep up with the
    size for a stage of torch ops alone. Neither is host time a GPU run pays: a stage
    that issues the same calls at every size is charged the median of its readings at the
    smaller half of the counted sizes (those whose large ops evicted the least; the lesser where
    that half holds two: a reading lumps up when the machine takes the thread's core for a while,
    which a thread's CPU time on a virtual machine counts, and a profile whose two small sizes
    read 67 and 97 us, where six other profiles read 51-64, cannot tell which one did). Python
    per step of a loop grows with the calls, and is kept: the line (Theil-Sen: the median
    of the slopes between every two sizes, and the median intercept) is a fixed cost plus
    a cost per call, so a training loop over more batches pays it per batch.

    Time outside ops that grows per item whatever the calls (numpy over every element)
    grows at least as the square root of the size per call over the counted sizes (the
    median slope between every two of them in logs; readings under
    :data:`PER_CALL_FLOOR_S` per call count as that): it is read off the same line
    against the size instead.
    """
    vs = [w.work.outside_s for w in work]
    xs = [float(w.size) for w in work]
    if len(work) < 2:
        return vs
    calls = [float(max(w.work.dispatches, 1)) for w in work]
    per = [max(v / c, PER_CALL_FLOOR_S) for v, c in zip(vs, calls)]
    grows = [(np.log(per[b]) - np.log(per[a])) / (np.log(xs[b]) - np.log(xs[a]))
             for a in range(len(xs)) for b in range(a + 1, len(xs)) if xs[a] > 0 and xs[b] > 0 and xs[b] != xs[a]]
    if grows and float(np.median(grows)) >= 0.5:
        return vs if len(work) < 3 else _theil_sen(xs, vs)
    if len(set(calls)) == 1:
        by_size = [v for _, v in sorted(zip(xs, vs))]
        half = by_size[:(len(by_size) + 1) // 2]
        # with two readings there is no telling which one lumped; time stolen from the thread only adds
        return [max(float(np.median(half)) if len(half) >= 3 else min(half), 0.0)] * len(vs)
    return _theil_sen(calls, vs)


def _theil_sen(xs: list[float], vs: list[float]) -> list[float]:
    """``vs`` read off their Theil-Sen line against ``xs`` (the median where every x is the same),
    never below zero."""
    slopes = [(vs[b] - vs[a]) / (xs[b] - xs[a]) for a in range(len(xs)) for b in range(a + 1, len(xs))
              if xs[b] != xs[a]]
    slope = float(np.median(slopes)) if slopes else 0.0
    cut = float(np.median([v - slope * x for v, x in zip(vs, xs)]))
    return [max(cut + slope * x, 0.0) for x in xs]


def _gpus_of(desc: Any) -> list[DeviceDescription]:
    """The GPU descriptions in ``desc``: a name or file (every GPU of a target), a target
    (:class:`placer.target.TargetDescription`: its ``gpus``), or one GPU's description."""
    if isinstance(desc, str):
        return load_gpus(desc)
    if hasattr(desc, "gpus"):
        return list(desc.gpus)
    return [desc]


def _cost_table(doc: dict) -> CostTable:
    return CostTable.model_validate(doc)

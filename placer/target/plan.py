"""From a target to what planning needs: the scale from the profiled CPU to the target's.

May import: placer.devices, placer.target.{description,scale}; placer.target.calibrate inside
:func:`host_scale` (it measures this machine when the profile was taken here).

The CPU a profile was measured on is described by its calibration: kept in the
profile (``machine["cpu_calibration"]``) when it was planned for a target before,
else measured now when the profile comes from this machine (and kept in the
profile, so that a saved profile plans for a target on any machine).
"""

from __future__ import annotations

from typing import Any

from placer.target.description import CpuDescription, TargetDescription
from placer.target.scale import CpuScale


def profiled_cpu(profile: Any, *, here_host: dict | None = None) -> CpuDescription | None:
    """The calibration of the CPU ``profile`` was measured on, or None when it cannot be had.

    ``here_host`` is this machine's inventory ``host``; when the profile's machine
    is this one (same CPU and torch), a missing calibration is measured (once per
    machine, cached) and stored in ``profile.machine``.
    """
    from placer.target.calibrate import cpu_key, this_cpu

    cal = profile.machine.get("cpu_calibration")
    if cal:
        return CpuDescription.model_validate(cal)
    if here_host is None:
        from placer.devices import discover

        here_host = discover().host
    if cpu_key(profile.machine) != cpu_key(here_host):
        return None
    cpu = this_cpu()
    profile.machine["cpu_calibration"] = cpu.model_dump(mode="json")
    return cpu


def host_scale(profile: Any, target: TargetDescription, *, here_host: dict | None = None,
               notes: list[str] | None = None) -> CpuScale | None:
    """The scale from ``profile``'s CPU to ``target``'s CPU (None, with a note, when impossible)."""
    if target.cpu is None:
        if notes is not None:
            notes.append(f"target {target.name!r} describes no CPU: its CPU times are this machine's")
        return None
    here = profiled_cpu(profile, here_host=here_host)
    if here is not None and (here.model, here.cores) == (target.cpu.model, target.cpu.cores):
        if notes is not None:  # two calibrations of one CPU differ only by noise
            notes.append(f"the target's CPU is this profile's ({here.model}, {here.cores} cores): its times are "
                         "used as measured")
        return None
    scale = CpuScale.between(here, target.cpu) if here is not None else None
    if notes is not None:
        notes.append(scale.describe() if scale is not None else (
            f"the profile's CPU has no calibration and was measured on another machine: CPU times for "
            f"{target.name!r} are that machine's, unscaled; profile on this machine to scale them"))
    return scale

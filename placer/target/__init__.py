"""Targets: the machine you plan for, which need not be the one you are on.

May import: placer.target.* (the description and scale modules import no torch;
placer.target.calibrate measures, with torch inside its functions).

- :mod:`placer.target.description`: :class:`TargetDescription` (host CPU, each GPU,
  their links), :class:`CpuDescription`, :func:`load_target` (``"h200"`` or a file);
- :mod:`placer.target.scale`: :class:`CpuScale`, this machine's CPU times scaled to
  the target's CPU by ops measured on both;
- :mod:`placer.target.ops`: the reference ops both CPUs run;
- :mod:`placer.target.calibrate`: measuring this machine (``placer describe``, and the per-op
  dispatch cost that GPU host time is charged by).

:func:`host_scale` joins them for planning: the scale from the CPU a profile was
measured on to a target's CPU.
"""

from placer.target.description import CpuDescription, OpRow, TargetDescription, TargetError, load_target
from placer.target.scale import CpuScale
from placer.target.plan import host_scale

__all__ = ["CpuDescription", "CpuScale", "OpRow", "TargetDescription", "TargetError", "host_scale",
           "load_target"]

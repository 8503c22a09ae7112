"""Profiling a pipeline: measured stage costs at several sizes, and transfer costs.

May import: placer.profile.*, placer.data, placer.entry, placer.warnings; this package is where measuring
happens (with the executor, one of the places that touch devices).

- :mod:`placer.profile.profiler`: :func:`profile`, the stage measurements;
- :mod:`placer.profile.transfers`: :func:`measure_transfers`, host↔device copies;
- :mod:`placer.profile.memory`: peak host and device memory of a block of work;
- :mod:`placer.profile.cache`: the profile cache (:class:`ProfileCache`).

The measurements themselves are plain data in :mod:`placer.data.profile`
(:class:`Profile` and its parts, re-exported here).

The package is callable: ``placer.profile(pipeline, ...)`` is :func:`profile`.
"""

from placer.data.profile import SCHEMA, DeviceProfile, Point, Profile, StageProfile, WorkPoint
from placer.profile.cache import TRANSFER_SCHEMA, ProfileCache, ProfileCacheWarning, cache_dir
from placer.profile.profiler import GROWTH, MAX_POINTS, MIN_TIMED_S, plan_sizes, profile, stage_key
from placer.profile.transfers import TRANSFER_SIZES, measure_transfers
from placer.entry import make_callable

__all__ = [
    "GROWTH", "MAX_POINTS", "MIN_TIMED_S", "SCHEMA", "TRANSFER_SCHEMA", "TRANSFER_SIZES",
    "DeviceProfile", "Point", "Profile", "ProfileCache", "ProfileCacheWarning", "StageProfile",
    "WorkPoint", "cache_dir", "measure_transfers", "plan_sizes", "profile", "stage_key",
]

# ``placer.profile(...)`` is profile(...)
make_callable(__name__, profile)

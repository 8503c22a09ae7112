"""placer's warning categories: one small hierarchy under :class:`PlacerWarning`.

May import: abc only (the standard library's ``warnings`` is not imported here, and
this module's name never shadows it: placer's modules import absolutely).

Every warning placer issues is a :class:`PlacerWarning`, so one filter turns them all
up or down, and each kind has its own category to filter on its own::

    import warnings, placer
    warnings.simplefilter("ignore", placer.NoisyMeasurementWarning)   # one kind
    warnings.simplefilter("error", placer.PlacerWarning)              # all of them, as errors

========================================  =====================================================
category                                  issued when
========================================  =====================================================
:class:`PlacerWarning`                    the base of all of them (a ``UserWarning``)
:class:`NoisyMeasurementWarning`          a timing's IQR exceeds 10% of its median
                                          (:mod:`placer.timing`)
:class:`ProfileCacheWarning`              a cached profile or transfer model cannot be used and is
                                          re-measured (:mod:`placer.profile.cache`; registered as
                                          a PlacerWarning by :mod:`placer.profile`)
:class:`CheckWarning`                     ``placer check`` compares against a baseline that lacks
                                          something it needs (:mod:`placer.check`)
========================================  =====================================================

Examples
--------
>>> issubclass(NoisyMeasurementWarning, PlacerWarning), issubclass(PlacerWarning, UserWarning)
(True, True)
"""

from __future__ import annotations

from abc import ABCMeta


class PlacerWarning(UserWarning, metaclass=ABCMeta):
    """The base of every warning placer issues.

    Categories defined elsewhere (such as the profile cache's) join it with
    ``PlacerWarning.register(category)``, so ``issubclass`` and warning filters
    treat them as placer warnings.
    """


class NoisyMeasurementWarning(PlacerWarning):
    """A measurement's interquartile range exceeds 10% of its median."""


class CheckWarning(PlacerWarning):
    """``placer check``: the baseline lacks something the comparison needs (a stage, a measurement)."""


def __getattr__(name: str):
    if name == "ProfileCacheWarning":  # defined by the profile cache; loaded on first use
        from placer.profile.cache import ProfileCacheWarning

        return ProfileCacheWarning
    raise AttributeError(f"module 'placer.warnings' has no attribute {name!r}")

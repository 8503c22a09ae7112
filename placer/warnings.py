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
                                          re-measured, or the cache cannot be written
                                          (:mod:`placer.profile.cache`)
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

    Every category is defined in this module, so the modules that issue them import
    this one and it imports none of placer's.
    """


class NoisyMeasurementWarning(PlacerWarning):
    """A measurement's interquartile range exceeds 10% of its median."""


class ProfileCacheWarning(PlacerWarning):
    """A cached profile was unusable (it is re-measured), or the cache cannot be written."""


class CheckWarning(PlacerWarning):
    """``placer check``: the baseline lacks something the comparison needs (a stage, a measurement)."""

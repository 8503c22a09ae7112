"""Packages that are also functions: ``placer.profile(...)`` and ``placer.report(...)``.

May import: sys, types, inspect.

``placer.profile`` is the profiler's package and ``placer.report`` the reports'
package; calling either calls its main function (:func:`placer.profile.profile`,
:func:`placer.report.report`), so the top-level API reads ``placer.profile(p)`` while
``import placer.profile.cache`` keeps working (a package attribute cannot be a
function: importing a submodule would replace it).
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable
from typing import Any


class CallablePackage(types.ModuleType):
    """A package whose call runs its ``__entry__`` function."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__["__entry__"](*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.__dict__["__entry__"])


def make_callable(module_name: str, fn: Callable[..., Any]) -> None:
    """Make the module ``module_name`` callable as ``fn``, and append ``fn``'s doc to the module's.

    Parameters
    ----------
    module_name : str
        A module in ``sys.modules`` (a package's ``__name__``).
    fn : callable
        What calling the module calls.
    """
    mod = sys.modules[module_name]
    mod.__entry__ = fn
    mod.__class__ = CallablePackage
    sig = inspect.signature(fn)
    mod.__doc__ = (f"{mod.__doc__ or ''}\nCalling the package\n-------------------\n"
                   f"``{module_name}{sig}`` calls :func:`{fn.__module__}.{fn.__name__}`:\n\n"
                   f"{inspect.getdoc(fn) or ''}\n")

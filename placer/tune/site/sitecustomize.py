"""Run at start-up by a Python that ``placer tune`` starts: the hook first, then the user's own sitecustomize.

This folder is put first on the script's ``PYTHONPATH`` by ``placer tune``; the hook is loaded
from its file, without importing the ``placer`` package (which the script may never import).

May import: the standard library only.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _load_hook() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("_placer_tune_hook", os.path.join(os.path.dirname(here), "hook.py"))
    hook = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hook
    spec.loader.exec_module(hook)
    hook.install()
    # a sitecustomize of the user's own (another folder on the path) still runs
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    theirs = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if theirs is not None and theirs.loader is not None:
        module = importlib.util.module_from_spec(theirs)
        theirs.loader.exec_module(module)


_load_hook()

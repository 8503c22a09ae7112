"""Recognising the values devices hold, without importing torch or numba.

May import: os, sys. A value is a tensor only when torch is already
imported, so asking never imports it.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def torch_module():
    """The torch module when it is already imported, else None."""
    return sys.modules.get("torch")


def is_tensor(v: Any) -> bool:
    """Whether ``v`` is a torch tensor."""
    t = torch_module()
    return t is not None and isinstance(v, t.Tensor)


def is_module(v: Any) -> bool:
    """Whether ``v`` is a ``torch.nn.Module``."""
    t = torch_module()
    return t is not None and isinstance(v, t.nn.Module)


def is_cuda_array(v: Any) -> bool:
    """Whether ``v`` is a numba.cuda device array (real or simulated)."""
    return hasattr(v, "copy_to_host") and hasattr(v, "shape")  # numpy arrays have no copy_to_host


def numba_cuda_simulated() -> bool:
    """Whether numba.cuda runs in its simulator (``NUMBA_ENABLE_CUDASIM=1``), on the CPU."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

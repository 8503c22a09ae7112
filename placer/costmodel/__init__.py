"""Cost models: compute fits per (stage, device), the transfer model, and rooflines.

May import: numpy, pydantic, placer.pipeline, placer.errors. Never torch at import
time: planning from a saved profile must stay fast. The submodules are

- :mod:`placer.costmodel.fit`: time (or bytes) against input size, by leave-one-out;
- :mod:`placer.costmodel.bus`: host↔device copies, apart from compute (as StarPU's
  ``perfmodel_bus``);
- :mod:`placer.costmodel.counts`: counting a call's FLOPs, bytes and ops (imports
  torch inside its function);
- :mod:`placer.costmodel.roofline`: device descriptions for devices this machine lacks;
- :mod:`placer.costmodel.model`: :class:`CostModel`, predictions for a whole pipeline.
"""

from placer.costmodel.bus import Link, TransferModel, fit_link
from placer.costmodel.counts import Work
from placer.costmodel.fit import Prediction, SizeFit, fit_size_model
from placer.costmodel.roofline import DeviceDescription, load_description

__all__ = [
    "DeviceDescription",
    "Link",
    "Prediction",
    "SizeFit",
    "TransferModel",
    "Work",
    "fit_link",
    "fit_size_model",
    "load_description",
]

"""Peak memory of a block of work: host (RSS sampled every ms, and tracemalloc) and device.

May import: psutil (inside), placer.devices. torch only through the device's own probe.
"""

from __future__ import annotations

import threading
import tracemalloc

from placer.devices import Device



# -- memory ----------------------------------------------------------------------------------
class PeakMemory:
    """Peak host memory during a block (RSS sampled every ms, and tracemalloc) and CUDA peak."""

    def __init__(self, device: Device):
        self.device = device
        self.host = 0.0
        self.dev: float | None = None

    def __enter__(self):
        import psutil

        self._proc = psutil.Process()
        self._base = self._proc.memory_info().rss
        self._peak = self._base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()
        self._tm = not tracemalloc.is_tracing()
        if self._tm:
            tracemalloc.start()
        tracemalloc.reset_peak()
        if self.device.kind == "gpu":
            import torch

            torch.cuda.synchronize(self.device.index)
            torch.cuda.reset_peak_memory_stats(self.device.index)
            self._dev_base = torch.cuda.memory_allocated(self.device.index)
        return self

    def _sample(self):
        while not self._stop.wait(0.001):
            self._peak = max(self._peak, self._proc.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self._peak = max(self._peak, self._proc.memory_info().rss)
        traced = tracemalloc.get_traced_memory()[1]
        if self._tm:
            tracemalloc.stop()
        self.host = float(max(self._peak - self._base, traced))
        if self.device.kind == "gpu":
            import torch

            self.dev = float(torch.cuda.max_memory_allocated(self.device.index) - self._dev_base)
        return False

"""Peak memory of a block of work: host (RSS sampled every ms, and tracemalloc) and device.

May import: psutil (inside), placer.devices. The device's own memory is read by its
kind's probe (:meth:`placer.devices.Device.memory_probe`).
"""

from __future__ import annotations

import threading
import tracemalloc

from placer.devices import Device


# -- memory ----------------------------------------------------------------------------------
class PeakMemory:
    """Peak host memory during a block (RSS sampled every ms, and tracemalloc) and the device's.

    ``dev`` stays None for a device whose memory is the host's.
    """

    def __init__(self, device: Device):
        self.device = device
        self.host = 0.0
        self.dev: float | None = None
        self._probe = device.memory_probe()

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
        if self._probe is not None:
            self._probe.start()
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
        if self._probe is not None:
            self.dev = self._probe.peak_bytes()
        return False

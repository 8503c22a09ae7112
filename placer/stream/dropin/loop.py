"""Measuring the user's own loop: ``for batch in measure(loader)`` records each wait on ``next(loader)``.

May import: placer.timing, placer.stream.dropin.{advice,measuring,trial,words}.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from placer.stream.dropin.advice import LoaderAdvice
from placer.stream.dropin.measuring import counter_of, settings_of, step_device
from placer.stream.dropin.trial import Trial
from placer.stream.dropin.words import UNKNOWN_COUNT
from placer.timing import Clock

#: what an exhausted iterator gives ``next``
_END = object()


class MeasuredLoader:
    """The user's loader, iterated as usual, with the wait on each ``next(loader)`` recorded.

    The step's time is the time between fetches. :meth:`advice` reports, like
    :func:`advise_loader`, who waits for whom, from this loop alone (no settings tried).
    """

    def __init__(self, loader: Any, *, device: Any = None):
        self.loader = loader
        self.device = step_device(device)
        self.fetch_s: list[float] = []
        self.samples: list[int] = []
        self.count = counter_of(loader)
        self.seconds = 0.0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        self.fetch_s, self.samples = [], []
        it = iter(self.loader)
        with Clock(settle=False) as loop:  # the user's loop, in their allocator's state
            try:
                while True:
                    with Clock(settle=False) as fetch:
                        batch = next(it, _END)
                    if batch is _END:
                        break
                    self.fetch_s.append(fetch.wall)
                    self.samples.append(self.count(batch))
                    self.seconds = loop.elapsed()
                    yield batch
            finally:
                self.device.synchronize()
                self.seconds = loop.elapsed()

    def trial(self) -> Trial:
        """The loop's steady state: every batch but the first (whose wait includes starting workers)."""
        if len(self.fetch_s) < 2:
            raise ValueError("measure() needs a loop of at least two batches")
        seconds = self.seconds - self.fetch_s[0]
        samples = sum(self.samples[1:])
        return Trial(settings=settings_of(self.loader), samples_per_s=samples / seconds,
                     first_batch_s=self.fetch_s[0], fetch_fraction=sum(self.fetch_s[1:]) / seconds,
                     batches=len(self.samples) - 1, samples=samples, seconds=seconds)

    def advice(self) -> LoaderAdvice:
        """Who waits for whom in this loop: the share of its time spent in ``next(loader)``."""
        t = self.trial()
        fetch = t.fetch_fraction * t.seconds
        step = t.seconds - fetch
        loader_rate = t.samples / fetch if fetch > 0 else None
        step_rate = t.samples / step if step > 0 else None
        loader_bound = fetch > step
        notes = ["measured in your loop: no settings were tried (advise_loader tries them)"]
        if self.count.unknown:
            notes.append(UNKNOWN_COUNT)
        return LoaderAdvice(user=t, recommended=t, trials=[t], bottleneck="loader" if loader_bound else "step",
                            wait_fraction=t.fetch_fraction, step_samples_per_s=step_rate,
                            loader_samples_per_s=loader_rate, step_device=self.device.name, notes=notes,
                            seconds=self.seconds, source=self.loader)

    def __str__(self) -> str:
        return str(self.advice())


def measure(loader: Any, *, device: Any = None) -> MeasuredLoader:
    """Wrap a DataLoader so that ``for batch in measure(loader)`` records its fetch times.

    ``str()`` of the result (or its :meth:`~MeasuredLoader.advice`) after the loop
    says what share of the loop waited on the loader.
    """
    return MeasuredLoader(loader, device=device)

"""What :func:`~placer.stream.dropin.advise_loader` measured and recommends, as plain data and its JSON.

May import: placer.stream.dropin.{measuring,trial,words}; placer.stream.target_words inside functions (an advice for
a described machine).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from placer.stream.dropin.measuring import rebuild
from placer.stream.dropin.trial import Trial
from placer.stream.dropin.words import describe


@dataclass
class LoaderAdvice:
    """What :func:`advise_loader` measured and recommends; ``str()`` reads it, :meth:`to_json` saves it.

    Attributes
    ----------
    user, recommended : Trial
        The user's own settings and the recommended ones, each measured with the step.
    trials : list of Trial
        Every setting measured with the step (the user's first).
    bottleneck : str
        ``loader`` when the loader alone delivers fewer samples/s than the step alone
        takes, else ``step``.
    wait_fraction : float
        The step's idle share with the user's settings: ``1 - user / step alone``.
    step_samples_per_s, loader_samples_per_s : float or None
        The step alone on batches fetched once; the loader alone with the user's settings.
    step_device : str
        Where the step runs (the loader runs on the CPU).
    threads : dict or None
        The intra-op thread count tried with the recommended workers, if one was.
    """

    user: Trial
    recommended: Trial
    trials: list[Trial]
    bottleneck: str
    wait_fraction: float
    step_samples_per_s: float | None
    loader_samples_per_s: float | None
    step_device: str
    threads: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    source: Any = field(default=None, repr=False)
    #: the wall-clock budget the runs were given
    budget_s: float | None = None
    #: why a faster-measured setting was not recommended: its gain was within the runs' spread
    within_noise: str | None = None
    #: the loader and step planned for a described machine (``target=``): a StreamPlan, every number predicted
    target: Any = None
    #: the caching found inside the dataset (:class:`~placer.stream.dataset_cache.CacheAdvice`), if looked for
    cache: Any = None
    #: the user's whole run predicted (:func:`whole_run`): epochs, batches, seconds with each setting
    whole_run: dict[str, Any] | None = None
    #: the longer runs that confirmed (or overturned) the recommendation (:func:`confirm`)
    confirmed: dict[str, Any] | None = None
    #: the knobs whose change made the recommendation faster (:func:`decided_by`)
    knobs: list[dict[str, Any]] = field(default_factory=list)
    #: the user's runs at two speeds, where they ran so (:func:`user_speeds`)
    user_speeds: dict[str, Any] | None = None
    #: where the runs were made: ``fresh processes`` (as the script starts) or ``this process``
    runs_in: str = "this process"
    #: the run's epochs were not given: the sentence saying what was assumed (:mod:`.epochs`)
    epochs_assumed: str | None = None
    #: slow samples and ``in_order=False``: the timed samples, the predicted and measured gain, whether
    #: recommended (:func:`placer.stream.dropin.reorder.consider`)
    reorder: dict[str, Any] | None = None
    #: the threads inside each worker process and one per worker measured
    #: (:func:`placer.stream.dropin.worker_threads.consider`)
    per_worker_threads: dict[str, Any] | None = None
    #: the memory budget and each setting's memory over the run (:mod:`placer.stream.dropin.fits`): ``budget_bytes``,
    #: ``budget_from``, ``user`` and ``recommended`` (projected: ``main``, ``workers``, ``total``), ``over_budget``
    memory: dict[str, Any] | None = None

    @property
    def steady_speedup(self) -> float:
        """Recommended samples/s over the user's in the steady state, both measured here."""
        return self.recommended.samples_per_s / max(self.user.samples_per_s, 1e-12)

    @property
    def speedup(self) -> float:
        """The speed-up of the user's whole run (start-up and epoch boundaries included) where its
        epochs and batches are known, else the steady state's; where the user's runs ran at two
        speeds, the speed-up over the faster ones (:func:`user_speeds`)."""
        if self.user_speeds is not None and "speedup" in self.user_speeds:
            return self.user_speeds["speedup"]
        return self.mixed_speedup

    @property
    def mixed_speedup(self) -> float:
        """The speed-up over the user's runs as measured here, whatever their speeds."""
        if self.whole_run is not None:
            return self.whole_run["speedup"]
        return self.steady_speedup

    @property
    def change(self) -> bool:
        """Whether the recommendation differs from the user's settings."""
        return self.recommended.settings != self.user.settings

    def loader(self) -> Any:
        """A DataLoader over the user's dataset and sampler with the recommended settings (and cache)."""
        if self.source is None:
            raise ValueError("this advice has no loader to rebuild (it was read back from JSON)")
        cached = self.cache.apply() if self.cache is not None and self.cache.recommended else None
        return rebuild(self.source, self.recommended.settings, dataset=cached)

    def as_dict(self) -> dict[str, Any]:
        return {
            "bottleneck": self.bottleneck, "wait_fraction": round(self.wait_fraction, 4),
            "samples_per_s": {"pipeline": _round(self.user.samples_per_s), "loader": _round(self.loader_samples_per_s),
                              "step": _round(self.step_samples_per_s)},
            "stages": {"loader": "cpu", "step": self.step_device},
            "user": self.user.as_dict(),
            "recommended": {**self.recommended.as_dict(),
                            **({"projected_memory_bytes": self.memory["recommended"]} if self.memory else {})},
            "change": self.change, "speedup": round(self.speedup, 3), "threads": self.threads,
            "steady_speedup": round(self.steady_speedup, 3), "whole_run": self.whole_run,
            "confirmed": self.confirmed, "decided_by": list(self.knobs),
            "trials": [t.as_dict() for t in self.trials], "notes": list(self.notes),
            "seconds": round(self.seconds, 3), "budget_s": self.budget_s, "within_noise": self.within_noise,
            "user_speeds": self.user_speeds, "runs_in": self.runs_in, "epochs_assumed": self.epochs_assumed,
            "reorder": self.reorder, "per_worker_threads": self.per_worker_threads,
            "projected_memory_bytes": None if self.memory is None else self.memory["recommended"],
            "memory": self.memory,
            **_target_dict(self.target),
            "cache": None if self.cache is None else self.cache.as_dict(),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.as_dict(), indent=indent)

    def __str__(self) -> str:
        return "\n".join([*describe(self), *_target_lines(self.target)])


def _target_dict(plan: Any) -> dict[str, Any]:
    """``{"target": ...}`` for a plan made for a described machine, else nothing."""
    if plan is None:
        return {}
    from placer.stream.target_words import target_summary

    return {"target": target_summary(plan)}


def _target_lines(plan: Any) -> list[str]:
    """The target's lines of the advice's text: the bound-by sentence, the settings, the what-ifs."""
    if plan is None:
        return []
    from placer.stream.target_words import target_summary

    t = target_summary(plan)
    lo = t.get("loader", {})
    out = [t["bottleneck_sentence"] or "",
           f"  settings for {t['machine']} (predicted {t['predicted_samples_per_s']:,.0f} samples/s): "
           f"num_workers={lo.get('num_workers')}, pin_memory={lo.get('pin_memory')}, step on "
           f"{t['settings']['placement'].get(plan.step)}"]
    out += [f"  what if {w['name']}: {w['predicted_samples_per_s']:,.0f} samples/s predicted on {t['machine']}"
            for w in t["what_if"]]
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)

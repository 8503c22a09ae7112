"""Which setting the drop-in recommends from its runs, by the rule of :mod:`placer.stream.rounds`.

May import: numpy, placer.data.stream, placer.timing, placer.stream.rounds, placer.stream.dropin.{space,trial}.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from placer.stream import rounds
from placer.data.stream import LoaderSettings
from placer.stream.dropin.space import cost, measured_as
from placer.stream.dropin.trial import Trial, label, span
from placer.stream.rounds import MIN_GAIN
from placer.timing import two_speeds


#: among settings this close to the fastest, the one with the fewest workers is chosen
NEAR_BEST = 0.95


#: a step that waits for data at most this share of the time waits within noise: even a loader
#: that never kept it waiting would gain at most ``1 / (1 - WAIT_NOISE)``, i.e. ``MIN_GAIN``, so no
#: loader setting is recommended for it (a single run that measured more measured noise)
#: (or half the spread of the user's runs, when larger: a wait the runs cannot tell from noise)
WAIT_NOISE = 1 - 1 / (1 + MIN_GAIN)


def wait_noise(user: Trial) -> float:
    """The step's wait that is within noise: ``WAIT_NOISE``, or half the spread of the user's runs if larger."""
    return max(WAIT_NOISE, user.spread / 2)


def choose(user: Trial, trials: list[Trial], *, waits: bool = True) -> Trial:
    """The recommendation: the cheapest setting near the fastest when that beats the user's clearly.

    Otherwise the user's own settings, or fewer workers when they are as fast. A step
    that waits for data only within noise (``waits=False``) sets the pace: no faster
    loader setting is recommended for it, whatever a single run measured.
    """
    best = max(trials, key=lambda t: t.score)
    if waits and best.score > user.score * (1 + MIN_GAIN):
        near = [t for t in trials if t.score >= NEAR_BEST * best.score]
        return min(near, key=lambda t: cost(t.settings))
    fewer = [t for t in trials if t.settings.num_workers < user.settings.num_workers
             and t.score >= NEAR_BEST * user.score]
    return min(fewer, key=lambda t: cost(t.settings)) if fewer else user


def decide(user: Trial, trials: list[Trial], *, waits: bool = True) -> tuple[Trial, str | None]:
    """The recommendation from repeated runs, and why a faster one was not taken (or None).

    Only settings run more than once (the user's too) may be recommended. A setting
    beats the user's when its median is ``MIN_GAIN`` faster and its slowest run is
    faster than the user's fastest (:func:`beats`). Of those, the cheapest within
    ``NEAR_BEST`` of the fastest; and a cheaper setting ranked at least as fast as
    that one is taken instead. A step that waits within noise (``waits=False``)
    gets no loader change: only fewer step threads, or fewer workers as fast.
    """
    repeated = [t for t in trials if len(t.rates) > 1 or t is user]
    allowed = eligible(user, trials, waits=waits)
    winners = [t for t in allowed if beats(t, user)]
    if winners:
        fastest = max(winners, key=lambda t: t.score)
        near = [t for t in winners if t.score >= NEAR_BEST * fastest.score]
        choice = min(near, key=lambda t: cost(t.settings))
        # a cheaper setting whose runs read at least as fast as the choice's: its own runs did not clear
        # the noise against yours, but a setting they match did, and it holds less
        cheaper = [t for t in allowed if cost(t.settings) < cost(choice.settings) and t.score >= choice.score]
        return min([*cheaper, choice], key=lambda t: cost(t.settings)), None
    noise = None
    fastest = contender(user, trials, waits=waits)
    if fastest is not None:
        noise = (f"{label(fastest.settings)} measured {span(fastest)}, yours {span(user)}: "
                 "the difference is within noise")
    fewer = [t for t in repeated if t.settings.num_workers < user.settings.num_workers
             and t.score >= NEAR_BEST * user.score]
    return (min(fewer, key=lambda t: cost(t.settings)) if fewer else user), noise


def eligible(user: Trial, trials: list[Trial], *, waits: bool) -> list[Trial]:
    """The settings besides the user's that may be recommended: those run more than once and, for a step
    that waits within noise (``waits=False``), only the user's loader at other step threads."""
    return [t for t in trials if t is not user and len(t.rates) > 1
            and (waits or loader_part(t.settings) == loader_part(user.settings))]


def loader_part(s: LoaderSettings) -> tuple:
    return s.num_workers, s.prefetch_factor, s.pin_memory


def contender(user: Trial, trials: list[Trial], *, waits: bool = True) -> Trial | None:
    """The fastest repeated setting whose median is ``MIN_GAIN`` faster than the user's (None if none):
    what :func:`decide` keeps the user's settings against when the gain is within noise. A step that
    waits within noise (``waits=False``) is compared with the user's loader at other step threads only."""
    fastest = max(eligible(user, trials, waits=waits), key=lambda t: t.score, default=None)
    return fastest if fastest is not None and fastest.score > user.score * (1 + MIN_GAIN) else None


def within_reach(user: Trial, trials: list[Trial], *, waits: bool = True) -> Trial | None:
    """The fastest repeated setting whose median is not ``MIN_GAIN`` faster than the user's but whose
    fastest run is (None if none): a gain its runs' spread may hide, which :func:`settle`'s more rounds
    tell from noise before the user's settings are kept: short runs that spread by a third can hide a
    gain of a third, and keeping the user's settings with most of the budget left wastes it."""
    reach = [t for t in eligible(user, trials, waits=waits)
             if t.score <= user.score * (1 + MIN_GAIN) < max(t.scores)]
    return max(reach, key=lambda t: t.score, default=None)


#: settings run once that read faster than every repeated one, raced (repeated with the user's) per round
RIVALS = 2


def rivals(user: Trial, trials: list[Trial], *, waits: bool = True) -> list[Trial]:
    """The settings run once whose run read faster than the median of every repeated setting and
    ``MIN_GAIN`` faster than the user's (``RIVALS`` at most, fastest first): a single run is the luckiest
    of many, so the finalists of the first round often fall back when repeated, and the next fastest
    must be repeated before the user's settings are kept. A step that waits within noise (``waits=False``) races the user's loader at other step threads only."""
    repeated = eligible(user, trials, waits=waits)
    bar = max([user.score * (1 + MIN_GAIN), *(t.score for t in repeated)])
    single = [t for t in trials if t is not user and len(t.rates) == 1 and t.score > bar
              and (waits or loader_part(t.settings) == loader_part(user.settings))]
    return sorted(single, key=lambda t: -t.score)[:RIVALS]


def runner_up(user: Trial, best: Trial, trials: list[Trial], *, waits: bool = True) -> Trial | None:
    """The fastest setting besides ``best`` that also beat the user's in repeated runs (:func:`beats`),
    with persistent workers where it has worker processes; None if none. Where the longer runs overturn
    ``best``, it gets its own: the fastest in short runs (more workers, a deeper queue) can lose over the
    whole run where the next fastest, which also beat the user's, still wins."""
    key = measured_as(best.settings)
    won = [t for t in eligible(user, trials, waits=waits) if measured_as(t.settings) != key and beats(t, user)]
    if not won:
        return None
    return persistent(max(won, key=lambda t: t.score))


def persistent(t: Trial) -> Trial:
    """A recommended setting with worker processes keeps them between epochs (``persistent_workers``)."""
    if t.settings.num_workers and not t.settings.worker_threads:
        return replace(t, settings=t.settings.model_copy(update={"persistent_workers": True}))
    return t


def beats(t: Trial, user: Trial) -> bool:
    """Whether ``t`` beats the user's settings by more than the noise of their runs
    (:func:`placer.stream.rounds.beats`).

    Its :attr:`Trial.score` must be :data:`~placer.stream.rounds.MIN_GAIN` faster, and either its slowest run
    faster than the user's fastest, or its runs faster than the user's run of the same round (:func:`paired`)
    in enough rounds (a sign test). Runs are interleaved: one round's two runs share the machine's load,
    which on a shared machine moves both far more than a setting does, so a noisy setting's range alone
    would hide a gain that the rounds show.
    """
    return rounds.beats(t.scores, user.scores, pairs=paired(t, user), centres=(t.score, user.score))


def paired(t: Trial, user: Trial) -> list[tuple[float, float]]:
    """Each run of ``t`` with the user's run of the same round (:func:`placer.stream.rounds.paired`)."""
    return rounds.paired(t.scores, t.started, user.scores, user.started)


#: the knobs of a loader setting, as :func:`decided_by` names them
KNOBS = ("num_workers", "worker_threads", "prefetch_factor", "torch_threads", "persistent_workers", "in_order",
         "threads_per_worker")


def decided_by(user: Trial, best: Trial, trials: list[Trial], run: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The knobs the recommendation changes, each with what it gained where that was measured.

    A knob's gain: the recommended rate over that of the measured setting equal to the
    recommended but for that knob, set back to the user's value (``None``: no such run).
    ``persistent_workers``'s gain is the whole run's with and without it (predicted), both without the
    cache where one is offered (``without_persistent_s`` is the settings' alone: set against the run with
    the cache, the cache's gain would read as the workers').
    """
    out = []
    for k in KNOBS:
        mine, theirs = getattr(user.settings, k), getattr(best.settings, k)
        if k == "prefetch_factor" and mine is None:  # no workers: the DataLoader's default depth
            mine = 2
        if k == "prefetch_factor" and not best.settings.num_workers or mine == theirs:
            continue
        if k == "persistent_workers" and not best.settings.num_workers:
            continue
        gain = None
        if k == "persistent_workers":
            if run is not None and "without_persistent_s" in run:
                with_it = run.get("settings_recommended_s", run["recommended_s"])
                gain = round(run["without_persistent_s"] / max(with_it, 1e-12), 3)
        else:
            back = measured_as(best.settings.model_copy(update={k: mine}))
            base = next((t for t in trials if measured_as(t.settings) == back), None)
            if base is not None:
                gain = round(best.score / max(base.score, 1e-12), 3)
        out.append({"knob": k, "yours": mine, "recommended": theirs, "gain": gain})
    return out


def user_speeds(user: Trial, recommended: Trial | None, *, basis: Trial | None = None,
                speedup: float | None = None) -> dict[str, Any] | None:
    """The user's runs split into two speeds (:func:`placer.timing.two_speeds`), with the recommendation's
    median over each and a sentence saying so; None where the runs show one speed.

    The same settings at two speeds is the machine, not the loader (some hosts run one process at two
    speeds for seconds at a time): a speed-up over the median of runs made mostly at the slower speed
    holds over the slower runs only. The user is told both.

    ``speedup``, the whole run's speed-up over ``basis`` (the user's runs it was predicted from), is
    claimed over the faster runs instead (``speedup`` and ``over_the_mix`` in the result): the claim
    that holds whichever speed the user's script meets. ``user`` holds all the user's runs."""
    split = two_speeds(list(user.scores))
    if split is None:
        return None
    slow, fast = split
    what = "samples/s over your run" if user.run_rates else "samples/s"
    out: dict[str, Any] = {"slow": [round(x, 1) for x in slow], "fast": [round(x, 1) for x in fast]}
    text = (f"your settings ran at two speeds here, {len(slow)} runs at {slow[0]:,.0f}-{slow[-1]:,.0f} and "
            f"{len(fast)} at {fast[0]:,.0f}-{fast[-1]:,.0f} {what}: the same settings, so the machine moved them, "
            "not the loader")
    if recommended is not None:
        rec = float(np.median(list(recommended.scores)))
        out["over_slow"] = round(rec / float(np.median(slow)), 3)
        out["over_fast"] = round(rec / float(np.median(fast)), 3)
        text += (f". The recommendation's runs ({rec:,.0f} {what}) are {out['over_slow']:.2f}x your slower runs and "
                 f"{out['over_fast']:.2f}x your faster ones")
        if speedup is not None and basis is not None and basis.scores:
            mix = float(np.median(list(basis.scores)))
            out["over_the_mix"] = round(speedup, 3)
            out["speedup"] = round(min(speedup, speedup * mix / float(np.median(fast))), 3)
            text += (f"; the speed-up claimed above ({out['speedup']:.2f}x) is over your faster runs, "
                     f"{speedup:.2f}x over the mix measured here: a run of your script may meet either speed")
        else:
            text += "; a run of your script may meet either speed"
    else:
        text += f": a run of your script may take {fast[len(fast) // 2] / slow[len(slow) // 2]:.2f}x as long as another"
    out["sentence"] = text
    return out

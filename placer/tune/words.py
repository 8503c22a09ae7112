"""``placer tune``'s result in words and as JSON.

May import: placer.tune.{search,caching}, placer.stream.dropin (the settings' label and the noise rule).

A result stopped by Ctrl-C says so (``interrupted``) and, where its rounds had not decided, shows its
runs with no recommendation; :func:`recommendation` (``--apply``) refuses such a file.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from placer.stream.dropin import MIN_GAIN, Trial, label
from placer.tune.caching import CacheResult
from placer.tune.search import Tuned, TuneState, other_loader, settings_dict, settings_from


def verdict(t: Tuned) -> str:
    """One sentence: does the loop wait for data, and how much (a search stopped before its rounds decided:
    that first, and what its runs show so far)."""
    waits = f"Your loop waits for data {t.wait_fraction:.0%} of the time (the DataLoader built at {t.site})"
    waits += ": the loader holds it back." if t.waits else ": within noise, the loop sets the pace."
    return waits if t.decided else f"{stopped_sentence(t)} {waits}"


def stopped_sentence(t: Tuned) -> str:
    """A search stopped before its rounds decided: when, and the fastest setting so far against the user's."""
    said = (f"Stopped by Ctrl-C during {t.interrupted}, after {len(t.runs)} measured run(s) of your script, before "
            "the interleaved rounds that decide: no recommendation")
    others = [x for x in t.trials if x is not t.user]
    if not others:
        return said + "."
    best = max(others, key=lambda x: x.score)
    return (f"{said}; so far the fastest, {label(best.settings)}, read "
            f"{best.samples_per_s / max(t.user.samples_per_s, 1e-12):.2f}x your settings' samples/s "
            f"({len(best.rates)} run(s) against your {len(t.user.rates)}; not decided).")


def loader_line(t: Tuned) -> list[str]:
    """What to paste: the DataLoader call with the recommended settings, and torch's threads."""
    s = t.recommended.settings
    d = settings_dict(s)
    kw = [f"num_workers={d['num_workers']}"]
    if d["num_workers"]:
        kw.append(f"prefetch_factor={d['prefetch_factor']}")
        if d["worker_kind"] == "processes":
            kw.append(f"persistent_workers={d['persistent_workers']}")
        if d.get("in_order") is False:
            kw.append("in_order=False")
    kw.append(f"pin_memory={d['pin_memory']}")
    kept = [f"{k}={v if not v.startswith('<') else '...'}" for k, v in t.arguments.items()
            if k not in ("dataset", "num_workers", "prefetch_factor", "persistent_workers", "pin_memory")
            and not (k == "in_order" and d.get("in_order") is False)]
    args = ", ".join(["dataset", *kept, *kw])
    if d["worker_kind"] == "threads":
        lines = [f"  placer.stream.ThreadLoader({args})",
                 "  (worker threads, not processes: a Dataset read from several threads must guard state it changes)"]
    else:
        lines = [f"  DataLoader({args})"]
    if s.torch_threads is not None and s.torch_threads != t.user.settings.torch_threads:
        lines.append(f"  torch.set_num_threads({s.torch_threads})")
    if d.get("in_order") is False:
        lines.append("  (in_order=False: batches come as the workers finish them, so their order varies from run to "
                     "run; you allowed it with --allow-reorder)")
    return lines


def describe(t: Tuned) -> list[str]:
    """The result as lines of text."""
    stopped = f"stopped by Ctrl-C during {t.interrupted}: " if t.interrupted else ""
    lines = [f"placer tune: {stopped}{len(t.runs) + 1} runs of `{' '.join(t.command)}` in {t.used_s:.0f} s "
             f"of a {t.budget_s:.0f} s budget; each run's start-up ({t.startup_s:.1f} s as written) is not "
             f"counted; each counts {t.batches} batches of your loop", verdict(t),
             f"As written:  {label(t.user.settings)} -> {t.user.samples_per_s:,.0f} samples/s"]
    if not t.decided:
        lines.append("Recommended: none (stopped before the interleaved rounds decided): run placer tune to its "
                     "end for one; a smaller --budget-s ends sooner")
    elif t.change:
        ratios = t.round_ratios()
        spread = (f"; round by round {min(ratios):.2f}-{max(ratios):.2f}x" if len(ratios) > 1 else "")
        lines += [f"Recommended: {label(t.recommended.settings)} -> {t.recommended.samples_per_s:,.0f} samples/s, "
                  f"{t.speedup:.2f}x as written over {len(t.recommended.rates)} interleaved runs{spread}",
                  *loader_line(t),
                  "  or run the script unchanged with it: placer tune --apply FILE -- COMMAND "
                  "(FILE: this result saved with -o)"]
    elif t.cached:
        lines.append("Recommended: keep your settings, and keep the cache inside the Dataset below")
    elif t.noise:
        lines.append(f"Recommended: keep your settings ({t.noise})")
    else:
        lines.append(f"Recommended: keep your settings (no setting tried was more than {MIN_GAIN:.0%} faster "
                     "beyond the noise of repeated runs)")
    if t.interrupted and t.decided:
        lines.append(f"Stopped by Ctrl-C during {t.interrupted}: the settings above were decided by their "
                     "completed rounds; the cache inside the Dataset was not (a run of placer tune to its end weighs it)")
    lines += cache_lines(t)
    lines.append("Measured (samples/s of the counted batches, the median of the runs; spread: the runs' range "
                 "over their median; memory: the script's process (its own memory) and what its workers add "
                 "(their unique set sizes), at a run's end):")
    lines.append(f"  {'settings':<78} {'samples/s':>10} {'runs':>4} {'spread':>6} {'memory':>9}")
    for tr in sorted(t.trials, key=lambda x: -x.score):
        mark = "  (as written)" if tr is t.user else ("  (recommended)" if tr is t.recommended and t.decided
                                                       else "")
        lines.append(f"  {label(tr.settings):<78} {tr.samples_per_s:>10,.0f} {len(tr.rates):>4} "
                     f"{tr.spread:>6.0%} {_mb(t.memory(tr)):>9}{mark}")
    if t.others:
        lines.append("Other loaders (not tuned): " + "; ".join(
            f"{o['site']} ({o['batches']} batches, {o['iterated_s']:.2f} s)" for o in t.others))
    return lines + [f"Note: {n}" for n in t.notes]


def cache_lines(t: Tuned) -> list[str]:
    """The cache inside the Dataset: what to keep, what it gained and how to get it; or why there is none."""
    c: CacheResult | None = t.cache
    if c is None:
        return []
    if not c.recommended:
        what = f"`{c.method}` not kept" if c.method else "nothing to keep"
        return [f"Cache inside the Dataset: {what} ({c.reason})"]
    f = c.found
    per_epoch = f" (epochs 2+ {f['epoch_speedup']:.1f}x in the search's passes of the loader alone)" \
        if f.get("epoch_speedup") else ""
    return [f"Cache inside the Dataset: keep `{c.method}`'s output by its arguments "
            f"({_bytes(f.get('bytes'))} for the whole dataset, in shared memory): {c.gain:.2f}x your loop with "
            f"{'the recommended' if t.change else 'your'} settings, over {c.batches} batches in {len(c.plain)} "
            f"interleaved rounds of your script with and without it{per_epoch}"
            + (f"; with the recommended settings, {t.speedup_with_cache:.2f}x as written" if t.change else ""),
            "  no DataLoader argument does this: placer tune --apply FILE -- COMMAND applies it (FILE: this result "
            "saved with -o), or in code placer.stream.advise_loader(loader, step).loader() builds the loader with "
            "it"]


def _bytes(n: int | None) -> str:
    return "?" if n is None else (f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} kB")


def _mb(m: dict[str, int] | None) -> str:
    return "-" if not m else f"{(m['main'] + m['workers']) / 2**20:,.0f} MB"


def _trial(tr: Trial, t: Tuned) -> dict[str, Any]:
    return {**settings_dict(tr.settings), "samples_per_s": round(tr.samples_per_s, 2),
            "memory_bytes": t.memory(tr),
            "runs": [round(r, 2) for r in tr.rates], "spread": round(tr.spread, 4),
            "fetch_fraction": round(tr.fetch_fraction, 4), "first_batch_s": round(tr.first_batch_s, 4),
            **({"cut": True} if tr.cut else {})}


def to_json(t: Tuned) -> dict[str, Any]:
    """The result as plain data (``placer tune --json``; ``--apply`` reads ``recommended``).

    ``interrupted`` is true where Ctrl-C stopped the search (``stopped_during`` says when); one stopped before
    its rounds decided has ``recommended`` null (and ``change`` false, no speed-up), its runs all there.
    """
    ratios = t.round_ratios() if t.decided else []
    return {"command": t.command, "loader": t.site, "other_loaders": t.others,
            "interrupted": t.interrupted is not None, "stopped_during": t.interrupted,
            "verdict": {"wait_fraction": round(t.wait_fraction, 4), "waits_for_data": t.waits,
                        "sentence": verdict(t)},
            "recommended": {**settings_dict(t.recommended.settings),
                            "cache": None if t.cache is None else t.cache.spec()} if t.decided else None,
            "change": (t.change or t.cached) and t.decided,
            "speedup": round(t.speedup_with_cache, 4) if t.decided else None,
            "settings_speedup": round(t.speedup, 4) if t.decided else None,
            "cache": None if t.cache is None else t.cache.as_dict(),
            "speedup_rounds": [round(r, 4) for r in ratios],
            "speedup_median": round(float(np.median(ratios)), 4) if ratios else None,
            "as_written": settings_dict(t.user.settings), "within_noise": t.noise,
            "trials": [_trial(tr, t) for tr in t.trials], "runs": t.runs, "batches_counted": t.batches,
            "startup_s": round(t.startup_s, 3), "budget_s": t.budget_s, "used_s": round(t.used_s, 2),
            "notes": t.notes}


def recommendation(saved: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The loader's place and settings from a saved result (``placer tune -o FILE``), checked; the cache
    inside the Dataset, where one is recommended, under the settings' ``cache``."""
    if isinstance(saved, dict) and saved.get("interrupted") and saved.get("recommended") is None:
        raise ValueError(f"this result was stopped by Ctrl-C during {saved.get('stopped_during') or 'the search'}, "
                         "before its rounds decided: it holds the runs measured, no recommendation to apply; "
                         "run placer tune -o FILE -- COMMAND to its end (a smaller --budget-s ends sooner), "
                         "then --apply FILE")
    try:
        site, rec = saved["loader"], saved["recommended"]
        settings_from(rec)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a placer tune result (needs 'loader' and 'recommended'): {exc}") from None
    cache = rec.get("cache")
    if cache is not None:
        method, budget = (cache.get("method"), cache.get("budget_bytes")) if isinstance(cache, dict) else (None, None)
        if not isinstance(method, str) or "." not in method:
            raise ValueError(f"recommended.cache.method must name the cached method as Class.method, got {method!r}")
        if not isinstance(budget, int) or budget <= 0:
            raise ValueError(f"recommended.cache.budget_bytes must be a positive number of bytes, got {budget!r}")
    return site, rec


def unmeasured(state: TuneState) -> tuple[list[str], dict[str, Any]]:
    """A search stopped before any run over its window completed: what it knew, in words and as JSON
    (the shape of :func:`to_json`'s, its measurements empty)."""
    rec = state.rec or {}
    runs = state.runner.runs if state.runner is not None else []
    sentence = (f"Stopped by Ctrl-C during {state.step}, before any run of your script was measured: "
                "no recommendation.")
    used = state.used_s()
    data = {"command": state.command, "loader": rec.get("site"),
            "other_loaders": [other_loader(r) for r in state.others], "interrupted": True,
            "stopped_during": state.step,
            "verdict": {"wait_fraction": None, "waits_for_data": None, "sentence": sentence},
            "recommended": None, "change": False, "speedup": None, "settings_speedup": None, "cache": None,
            "speedup_rounds": [], "speedup_median": None,
            "as_written": None if state.as_written is None else settings_dict(state.as_written),
            "within_noise": None, "trials": [], "runs": runs, "batches_counted": state.batches,
            "startup_s": round(state.startup_s, 3), "budget_s": state.budget_s, "used_s": round(used, 2),
            "notes": []}
    lines = [f"placer tune: stopped by Ctrl-C during {state.step} of `{' '.join(state.command)}`, "
             f"{used:.0f} s into a {state.budget_s:.0f} s budget", sentence]
    return lines, data

"""The drop-in's advice in words: who waits for whom, what is recommended, what was measured.

May import: placer.devices, placer.stream.rounds, placer.stream.dropin.{trial,deciding,memory}.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from placer.devices import is_real_gpu
from placer.stream.dropin.deciding import wait_noise
from placer.stream.dropin.memory import mib
from placer.stream.dropin.trial import Trial, label
from placer.stream.rounds import MIN_GAIN

if TYPE_CHECKING:
    from placer.stream.dropin.advice import LoaderAdvice


#: batches counted with neither a leading dimension nor a batch size (a note says so)
UNKNOWN_COUNT = ("samples are counted as batches: a batch has no array with a leading dimension and the "
                 "loader no batch_size, so each batch counts as one sample")


def _rate(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f} samples/s"


def verdict(a: LoaderAdvice) -> str:
    """One sentence: who waits for whom."""
    who = "The GPU" if is_real_gpu(a.step_device) else "The step"
    waits = f"{who} waits for data {a.wait_fraction:.0%} of the time"
    if a.step_samples_per_s is None:
        return f"{waits} (measured in your loop)."
    if a.bottleneck == "loader":
        return (f"{waits}: the loader caps you at {_rate(a.loader_samples_per_s)}, the step could take "
                f"{a.step_samples_per_s:,.0f}.")
    if a.wait_fraction > wait_noise(a.user):
        return (f"{waits}: the loader alone delivers {_rate(a.loader_samples_per_s)}, more than the step's "
                f"{_rate(a.step_samples_per_s)}, yet together they are slower (they share the cores).")
    if a.change and a.speedup > 1 + MIN_GAIN:
        return (f"{waits}: the step sets the pace ({_rate(a.step_samples_per_s)}; the loader alone delivers "
                f"{_rate(a.loader_samples_per_s)}).")
    return (f"{waits}: the loader is fast enough ({_rate(a.loader_samples_per_s)} alone); the step takes "
            f"{_rate(a.step_samples_per_s)}.")


def row(t: Trial, yours: bool) -> str:
    s = t.settings
    workers = f"{s.num_workers} threads" if s.worker_threads else str(s.num_workers)
    return (f"  {workers:>11} {s.prefetch_factor or '-':>15} {str(s.pin_memory):>10} {s.torch_threads:>13} "
            f"{t.samples_per_s:>10,.0f} {t.first_batch_s:>9.2f} s {len(t.rates):>4} {t.spread:>6.0%}"
            + (f" {t.score:>9,.0f}" if t.run_rates else "")
            + (f" {mib(t.memory.end['main']):>9} {mib(t.memory.end['workers']):>9}" if t.memory is not None else "")
            + f"{'  (yours)' if yours else ''}"
            + ("  (stopped in its warm-up: slower to its first batches than your whole run)" if t.cut else ""))


def describe(a: LoaderAdvice) -> list[str]:
    """The advice as lines of text."""
    budget = f" of a {a.budget_s:g} s budget" if a.budget_s is not None else ""
    lines = [f"Loader advice ({len(a.trials)} settings measured in {a.seconds:.1f} s{budget}; "
             f"loader on cpu, step on {a.step_device})", verdict(a),
             f"Your settings: {label(a.user.settings)} -> {_rate(a.user.samples_per_s)}"]
    if a.change:
        kw = ", ".join(f"{k}={v}" for k, v in a.recommended.settings.kwargs().items())
        where = "over your whole run" if a.whole_run is not None else "in the steady state"
        if a.speedup != a.mixed_speedup:
            where += f" at your faster runs' speed ({a.mixed_speedup:.2f}x over the mix of both measured here)"
        lines += [f"Recommended:   {label(a.recommended.settings)} -> {_rate(a.recommended.samples_per_s)}, "
                  f"{a.speedup:.2f}x yours {where}",
                  f"  placer.stream.ThreadLoader(dataset, ..., {kw})  (advice.loader() builds it; threads, not "
                  "processes: a Dataset read from several threads must guard any state it changes)"
                  if a.recommended.settings.worker_threads else f"  DataLoader(..., {kw})"]
        if a.recommended.settings.torch_threads != a.user.settings.torch_threads:
            lines.append(f"  torch.set_num_threads({a.recommended.settings.torch_threads})")
        if a.recommended.settings.threads_per_worker is not None:
            lines.append(f"  DataLoader(..., worker_init_fn=placer.stream.WorkerThreads("
                         f"{a.recommended.settings.threads_per_worker}, your_worker_init_fn))  (advice.loader() "
                         "builds it: each worker's torch and BLAS threads set, then your worker_init_fn called)")
    elif a.within_noise:
        lines.append(f"Recommended:   keep your settings ({a.within_noise})")
    elif len(a.trials) > 1 and a.bottleneck == "step" and a.wait_fraction <= wait_noise(a.user):
        lines.append("Recommended:   keep your settings (the step waits for data only within noise: "
                     "no loader setting can make it faster)")
    elif len(a.trials) > 1:
        lines.append("Recommended:   keep your settings (no setting tried was more than "
                     f"{MIN_GAIN:.0%} faster)")
    if a.cache is not None and a.cache.recommended:  # what was not offered, and why: in the JSON
        lines.append(a.cache.sentence())
    lines += _whole_run_lines(a) + memory_lines(a)
    lines += ["Measured (steady state, the median of the runs; the first batch waits for the workers to start; "
              "spread: the runs' range over their median; your run: samples/s over your epochs x batches, "
              "start-up and epoch ends included, which ranks them; memory at a run's end: the main process's "
              "own, what its worker processes add):" if len(a.trials) > 1
              else "Measured (your loop, after its first batch):",
              f"  {'num_workers':>11} {'prefetch_factor':>15} {'pin_memory':>10} {'torch_threads':>13} "
              f"{'samples/s':>10} {'first batch':>11} {'runs':>4} {'spread':>6}"
              + (f" {'your run':>9}" if a.user.run_rates else "")
              + (f" {'main':>9} {'workers':>9}" if a.user.memory is not None else "")]
    over = {o["settings"] for o in a.memory["over_budget"]} if a.memory else set()
    lines += [row(t, t is a.user) + ("  (over the memory budget)" if label(t.settings) in over else "")
              for t in a.trials]
    return lines + [f"Note: {n}" for n in a.notes]


def _whole_run_lines(a: LoaderAdvice) -> list[str]:
    """The whole run predicted, the confirming runs, and the knobs that decided."""
    out = []
    w = a.whole_run
    if w is not None:
        uc, rc = w["user_costs"], w["recommended_costs"]
        line = (f"Your whole run ({w['epochs']} epoch{'s' if w['epochs'] != 1 else ''} x {w['batches']} batches), "
                f"predicted from the {w['from']}: {w['user_s']:.2f} s with your settings (start-up "
                f"{uc['start_s']:.2f} s, {uc['per_batch_s'] * 1000:.1f} ms a batch)")
        if a.change:
            line += (f", {w['recommended_s' if 'cache' not in w else 'settings_recommended_s']:.2f} s "
                     f"recommended (start-up {rc['start_s']:.2f} s, {rc['per_batch_s'] * 1000:.1f} ms a batch): "
                     f"{w['speedup' if 'cache' not in w else 'settings_speedup']:.2f}x")
        out.append(line)
        if "cache" in w:
            c = w["cache"]
            out.append(f"  with the cache (advice.loader()): {w['recommended_s']:.2f} s, {w['speedup']:.2f}x yours "
                       f"(its first epoch fills it at {c['fill']:.2f}x an uncached epoch's time, later epochs "
                       f"read it at {c['hit']:.2f}x)")
        if "without_persistent_s" in w:
            out.append(f"  without persistent_workers: {w['without_persistent_s']:.2f} s (the workers would "
                       "start again every epoch)")
    c = a.confirmed
    if c is not None:
        out.append(f"Confirmed by longer runs ({c['runs']} each of up to {c['batches']} batches, interleaved): "
                   f"{c['recommended']['samples_per_s']:,.0f} vs your {c['user']['samples_per_s']:,.0f} samples/s"
                   + ("" if c["held"] else
                      f" - not enough over your faster runs ({c['over_faster']:.2f}x; your runs ran at two "
                      "speeds): your settings are kept" if c.get("over_faster", 2.0) < 1 + MIN_GAIN else
                      " - faster in the steady state, but not by enough over your whole run (worker start-up "
                      "and epoch ends take back the gain): your settings are kept"
                      if c.get("steady_speedup", 1.0) > 1 + MIN_GAIN and a.whole_run is not None
                      else " - not enough: your settings are kept"))
    if a.knobs:
        def part(k: dict) -> str:
            return f"{k['knob']} {k['yours']} -> {k['recommended']}" + (
                f" ({k['gain']:.2f}x)" if k["gain"] is not None else "")

        # a knob whose own measured gain is within noise came along with the others
        decided = [k for k in a.knobs if k["gain"] is None or k["gain"] > 1 + MIN_GAIN]
        along = [k for k in a.knobs if k not in decided]
        if decided:
            out.append("Decided by: " + "; ".join(part(k) for k in decided))
        if along:
            out.append("Changed along (no clear gain of its own measured): " + "; ".join(part(k) for k in along))
    return out


def memory_lines(a: LoaderAdvice) -> list[str]:
    """The memory over the whole run, projected (:mod:`placer.stream.dropin.memory`), against the budget."""
    m = a.memory
    if m is None or m["user"] is None:
        return []

    def over(p: dict) -> str:
        run = (f"over your run ({p['epochs']} epoch{'s' if p['epochs'] != 1 else ''} x {p['batches']:,} batches)"
               if p.get("extrapolated") else "at the run's end")
        return f"{mib(p['total'])} {run} (main process {mib(p['main'])}, workers {mib(p['workers'])})"

    budget = f"budget {mib(m['budget_bytes'])}" if m["budget_bytes"] is not None else "no budget"
    line = f"Memory ({budget}): yours {over(m['user'])}"
    if a.change and m["recommended"] is not None:
        line += f"; recommended {over(m['recommended'])}"
    return [line]

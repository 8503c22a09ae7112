"""``placer profile``: measure a pipeline's stages and transfers, fit and show the cost model."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from placer.cli.app import (app, error_line, fail, output_path, positive_int, positive_seconds, stage_timeout_option,
                            usage)
from placer.cli.options import build_param_option


def profile_document(prof, model, size) -> dict:
    """The JSON document ``placer profile --json`` prints and ``-o`` saves (schema: ``placer schema profile``)."""
    from placer.data.documents import profile_document as document

    return document(prof, model, size)


@app.command("profile")
@build_param_option
def profile_cmd(
    pipeline: str = typer.Argument(..., help="A .py file exposing build(size=None, **params), or module:function."),
    size: int = typer.Option(None, "--size", callback=positive_int, help="The size to predict at; profiling measures up to it when the budget allows."),
    budget_s: float = typer.Option(60.0, "--budget-s", callback=positive_seconds, help="Time budget for the whole profile, in seconds."),
    output: Path = typer.Option(None, "-o", "--output", callback=output_path, help="Save the profile (JSON, as --json prints it) here, for `placer plan --profile`."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    max_size: int = typer.Option(None, "--max-size", callback=positive_int, help="Largest size to profile (default: --size)."),
    devices: str = typer.Option(None, "--devices", help="Comma-separated devices to profile (default: all)."),
    describe: str = typer.Option(None, "--describe", help="Predict a device this machine lacks from its description "
                                 "(e.g. h200, or a JSON file); default: h200 when no GPU is profiled. 'none' to skip."),
    threads: int = typer.Option(None, "--threads", callback=positive_int, help="Intra-op threads while profiling (default: as a run uses)."),
    fresh: bool = typer.Option(False, "--fresh", help="Ignore cached measurements."),
    stage_timeout_s: float = stage_timeout_option(),
    target: str = typer.Option(None, "--target", help="Also predict for this machine: h200 or a JSON file from "
                               "`placer describe` (its GPUs by roofline, its CPU by scaling this one's times)."),
    precision: str = typer.Option(None, "--precision", help="auto: also check tf32 and bf16 on every torch stage; "
                                  "stages' own declared precisions are checked either way. The checks are saved "
                                  "with the profile, so `placer plan --profile` plans them."),
) -> None:
    """Measure every stage of PIPELINE on every device at several sizes; fit and show the cost model."""
    t_start = time.perf_counter()
    from placer.errors import PlacerError
    from placer.executor import stage_timeout
    from placer.files import write_text_atomic
    from placer.profile import ProfileCache
    from placer.site import LocalSite, costs_from_profile

    if target is not None and describe is not None:
        usage("give --target or --describe, not both (--target also scales the CPU to the target's)")
    if precision is not None and precision.strip().lower() != "auto":
        usage("--precision on `placer profile` takes auto only (a fixed STAGE=PRECISION is a planning choice: "
              "give it to `placer plan` or `placer run`)")
    try:
        left = budget_s - (time.perf_counter() - t_start) - 1.0  # keep a second for fitting and printing
        site = LocalSite(cache=None if not fresh else _fresh_cache(ProfileCache()))
        with stage_timeout(stage_timeout_s):
            prof = site.measure(pipeline, size=size, max_size=max_size, budget_s=max(left, 0.5),
                                devices=devices.split(",") if devices else None, threads=threads, progress=None)
            from placer.site import attach_precision_checks

            attach_precision_checks(prof, pipeline, size, precision)
        want = None if (describe or "").lower() == "none" else target or describe or (
            "h200" if not any(d.get("kind") == "gpu" for d in prof.devices.values()) else None)
        costs = costs_from_profile(prof, size=size, describe=want, inventory=site.inventory())
        model = costs.target_model if target is not None else costs.model
    except PlacerError as exc:
        fail(error_line(exc))
    except (ValueError, TypeError, FileNotFoundError) as exc:
        fail(f"{pipeline}: {error_line(exc)}")
    at = size or (max(prof.measured_sizes) if prof.measured_sizes else None)
    doc = profile_document(prof, model, at)
    if target is not None:
        doc["target"] = {"name": costs.target.name, "cpu": model.devices["cpu"], "notes": costs.target_notes}
    if output is not None:  # one shape, printed or saved
        write_text_atomic(output, json.dumps(doc, indent=1, default=str))
    if as_json:
        print(json.dumps(doc, indent=1, default=str))
        return
    _print(prof, model, at, output)


def _fresh_cache(cache):
    """A cache that reads nothing but still saves the new profile."""
    cache.load = lambda *a, **k: None
    cache.load_transfer = lambda *a, **k: None
    return cache


def coverage_lines(prof, at) -> list[str]:
    """Short lines: which stages were measured at ``at``, which extrapolated (with the error), the load seen."""
    measured, extrapolated = [], []
    for name, sp in prof.stages.items():
        for dev, cov in sp.coverage.items():
            err = cov.get("rel_error")
            e = f" ±{err:.0%}" if isinstance(err, (int, float)) else ""
            if cov.get("extrapolated"):
                extrapolated.append(f"{name} on {dev}{e} ({cov.get('error_from')})")
            elif cov.get("extrapolated") is False:
                measured.append(f"{name} on {dev}{e}")
    out = []
    if measured:
        out.append(f"measured at {at}: {', '.join(measured)}")
    if extrapolated:
        out.append(f"extrapolated to {at}: {', '.join(extrapolated)}")
    ld = prof.machine_load or {}
    if ld.get("load_start") is not None:
        cpu = ld.get("cpu_per_wall")
        out.append(f"load average {ld['load_start']:.1f} -> {ld.get('load_end') or 0:.1f} while profiling "
                   f"({ld.get('cores') or '?'} cores)"
                   + (f"; timed calls used {cpu:.2f} CPU s per wall s" if cpu is not None else ""))
    return out


def _print(prof, model, at, output) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    sizes = ", ".join(str(s) for s in prof.measured_sizes)
    t = Table(title=f"{prof.pipeline}: profiled at {sizes} {prof.size_unit} in {prof.elapsed_s:.1f} s; "
                    f"predictions at {at}")
    for col in ("stage", "device", "model", "LOO error", f"at {at}", "label", "first call"):
        t.add_column(col)
    for name in model.stages:
        for dev in model.devices:
            if not model.has_fit(name, dev):
                continue
            fit = model.fit(name, dev)
            p = model.predict(name, dev, at)
            fc = model.first_call_s(name, dev)
            flag = " (far outside measured sizes)" if p.far_outside else ""
            if p.fit_spread > 0:
                flag += f" (fit forms disagree by {p.fit_spread:.0%})"
            t.add_row(name, dev, fit.describe(), f"{fit.loo_error:.0%}", f"{p.value:.4g} s ±{p.rel_error:.0%}{flag}",
                      p.label, "" if fc is None else f"+{fc:.3g} s")
    c.print(t)
    for d, tm in prof.transfer.items():
        link = tm.table_link()
        c.print(f"transfer {d} (measured): h2d {link['h2d']['latency_s'] * 1e6:.1f} us + "
                f"{link['h2d']['bandwidth_Bps'] / 1e9:.2f} GB/s; d2h {link['d2h']['latency_s'] * 1e6:.1f} us + "
                f"{link['d2h']['bandwidth_Bps'] / 1e9:.2f} GB/s")
    for d, desc in model.described.items():
        c.print(f"{d}: {desc.name} is described, not measured: its times are roofline predictions")
    for line in coverage_lines(prof, at):
        c.print(line)
    for note in prof.notes:
        c.print(f"note: {note}")
    if output is not None:
        c.print(f"profile saved to {output}")

"""The top-level API: discoverable (``dir``, ``help``), lazily imported, fully documented."""

from __future__ import annotations

import inspect
import pydoc
import re
import subprocess
import sys
from pathlib import Path

import pytest

import placer

ROOT = Path(__file__).resolve().parents[1]
ENTRY_POINTS = ("advise", "execute", "profile", "plan", "report", "Pipeline", "Stage")


def documented_parameters(doc: str) -> set[str]:
    """Names in the numpydoc ``Parameters`` (or, for data, ``Attributes``) sections of ``doc``
    (``a, b : type`` lines count each name)."""
    names = set()
    for m in re.finditer(r"^(?:Parameters|Attributes)\n-+\n(.*?)(?=^\S[^\n]*\n-+\n|\Z)", doc, re.S | re.M):
        names |= _names(m.group(1))
    return names


def _names(section: str) -> set[str]:
    names = set()
    for line in section.splitlines():
        if line and not line[0].isspace():
            head = line.split(" : ")[0]
            names |= {n.strip().lstrip("*") for n in head.split(",") if n.strip()}
    return names


def parameters(obj) -> list[str]:
    if inspect.isclass(obj) and hasattr(obj, "model_fields"):  # a pydantic model: its fields
        return list(obj.model_fields)
    sig = inspect.signature(obj)
    return [n for n, p in sig.parameters.items() if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def test_import_placer_stays_light():
    code = ("import sys, placer; dir(placer); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'dask', 'numba', 'distributed'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_entry_points_show_in_dir_and_all(name):
    assert name in dir(placer)
    assert name in placer.__all__


# outputs_digest is documented in prose (its one parameter is the outputs)
DOCUMENTED = sorted(n for n in placer.__all__ if n not in ("outputs_digest",) and not n.endswith("Error")
                    and not n.endswith("Warning"))


@pytest.mark.parametrize("name", DOCUMENTED)
def test_public_names_document_every_parameter(name):
    obj = getattr(placer, name)
    doc = inspect.getdoc(obj.__entry__ if hasattr(obj, "__entry__") else obj)
    missing = [p for p in parameters(obj) if p not in documented_parameters(doc)]
    assert not missing, f"placer.{name}: parameters without documentation: {missing}"


def test_help_of_advise_prints_its_signature_and_parameters():
    out = subprocess.run([sys.executable, "-c", "import placer; help(placer.advise)"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT, env={"PAGER": "cat", "PATH": "/usr/bin:/bin",
                                                                "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "advise(pipeline: 'str | Pipeline', *, size:" in out.stdout
    assert "budget_s : float" in out.stdout and "scheduler : str or distributed.Client" in out.stdout


def test_profile_and_report_are_packages_and_callables():
    import placer.profile.cache  # a submodule import does not replace the entry point
    from placer.profile.profiler import profile
    from placer.report import report

    assert callable(placer.profile) and placer.profile.__entry__ is profile
    assert inspect.signature(placer.profile) == inspect.signature(profile)
    assert placer.report.__entry__ is report
    assert "budget_s" in pydoc.render_doc(placer.profile)


def test_calling_the_profile_package_profiles(tmp_path):
    p = placer.Pipeline("tiny", size=4)
    p.add(name="make", kind="cleaning", fn=lambda device, n=4: list(range(n)))
    prof = placer.profile(p, cache=False, budget_s=5, devices=["cpu"], progress=False)
    assert prof.pipeline == "tiny" and "make" in prof.stages
    assert prof.stages["make"].devices["cpu"].points


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        placer.nope  # noqa: B018


def test_version_matches_the_package_metadata():
    from importlib.metadata import version

    assert placer.__version__ == version("placer")


def test_dir_lists_placers_api_only():
    """No names placer merely imports (typing's Any, importlib's helpers, the __future__ feature)."""
    names = set(dir(placer))
    assert names == set(placer.__all__) | {"__version__"}
    assert not names & {"Any", "annotations", "import_module", "PackageNotFoundError", "errors", "pipeline"}
    for name in placer.__all__:  # each still resolves (lazily loaded or not)
        assert getattr(placer, name) is not None

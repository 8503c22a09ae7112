"""The house rules between placer's packages, read from the source with ``ast``.

Each rule is one that a refactoring could silently break: the cost model must not
reach into the profiler or the optimizer, the data layer must stay free of measuring
and device code, no module may import another module's private names, and no
import of placer's own modules may be guarded by ``except ImportError``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "placer"


def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def imports(tree: ast.Module, current: str) -> list[tuple[str, list[str], ast.AST]]:
    """``(module, names, node)`` for every import in ``tree``, at any depth, relative ones resolved."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = current.split(".")[: -node.level]
                mod = ".".join([*base, mod] if mod else base)
            out.append((mod, [a.name for a in node.names], node))
    return out


MODULES = modules()


def placer_imports(name: str) -> set[str]:
    return {m for m, _, _ in imports(MODULES[name], name) if m.startswith("placer")}


def test_the_source_tree_is_read():
    assert {"placer.data.costs", "placer.costmodel.model", "placer.site", "placer.advisor"} <= set(MODULES)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("placer.costmodel")))
def test_the_cost_model_reads_a_profile_and_writes_a_table_without_profiler_or_optimizer(name):
    bad = {m for m in placer_imports(name) if m.startswith(("placer.profile", "placer.optimize"))}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("placer.data")))
def test_the_data_layer_has_no_measuring_or_device_code(name):
    allowed = ("placer.data", "placer.errors", "placer.files", "placer.devices")
    bad = {m for m in placer_imports(name) if not m.startswith(allowed)}
    assert not bad, f"{name} imports {sorted(bad)}"
    heavy = {m for m, _, _ in imports(MODULES[name], name) if m.split(".")[0] in ("torch", "dask", "numba")}
    assert not heavy, f"{name} imports {sorted(heavy)}"


def test_no_module_imports_a_private_name_of_another_placer_module():
    found = []
    for name, tree in MODULES.items():
        for mod, names, node in imports(tree, name):
            if mod.startswith("placer") and mod != name:
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                found += [f"{name}:{node.lineno} imports {mod}.{n}" for n in private]
    assert not found, "\n".join(found)


def test_no_import_of_placer_is_guarded_by_import_error():
    found = []
    for name, tree in MODULES.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            catches = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
            if not any("ImportError" in c or "ModuleNotFoundError" in c for c in catches):
                continue
            body = ast.Module(body=node.body, type_ignores=[])
            own = [m for m, _, _ in imports(body, name) if m.startswith("placer")]
            found += [f"{name}:{node.lineno} guards the import of {m}" for m in own]
    assert not found, "\n".join(found)


def test_every_module_says_what_it_may_import():
    missing = [n for n, tree in MODULES.items()
               if not n.startswith("placer.cli") and n not in ("placer", "placer.__main__")
               and "May import" not in (ast.get_docstring(tree) or "")]
    assert not missing, f"modules without a 'May import' line: {missing}"


def test_the_core_imports_without_torch_dask_or_numba():
    code = ("import sys; import placer.data.costs, placer.data.profile, placer.data.plan, placer.data.run, "
            "placer.data.report, placer.costmodel.model, placer.optimize, placer.site; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'dask', 'numba', 'distributed'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=PKG.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

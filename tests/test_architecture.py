"""The house rules between placer's packages, read from the source with ``ast``.

Each rule is one that a refactoring could silently break: the cost model must not
reach into the profiler or the optimizer, the data layer must stay free of measuring
and device code, no module may import another module's private names, no import of
placer's own modules may be guarded by ``except ImportError``, no two packages import
each other (at any depth of a module, ``TYPE_CHECKING`` blocks aside), and every
module imports only what its "May import" line names.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "placer"
ARCHITECTURE = PKG.parent / "docs" / "architecture.md"


def paths() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        out[".".join(rel.parts).removesuffix(".__init__")] = path
    return out


def modules() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in PATHS.items()}


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


PATHS = paths()
MODULES = modules()


def placer_imports(name: str) -> set[str]:
    return {m for m, _, _ in imports(MODULES[name], name) if m.startswith("placer")}


def is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): imports for annotations only."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(name: str) -> list[tuple[str, int]]:
    """``(module, line)`` of every placer import ``name`` runs, at module level or inside functions.

    Imports under ``if TYPE_CHECKING:`` are left out (their ``else`` branch is kept);
    ``from placer import x`` counts as importing ``placer.x`` when ``x`` is a module.
    """
    tree = MODULES[name]
    package = name if PATHS[name].name == "__init__.py" else name.rsplit(".", 1)[0]
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if is_type_checking(child):
                for other in child.orelse:
                    visit(ast.Module(body=[other], type_ignores=[]))
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                mod = child.module or ""
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    mod = ".".join([*base, mod] if mod else base)
                subs = [f"{mod}.{a.name}" for a in child.names if f"{mod}.{a.name}" in MODULES]
                out.extend((m, child.lineno) for m in (subs or [mod]))
            visit(child)

    visit(tree)
    return [(m, line) for m, line in out if m == "placer" or m.startswith("placer.")]


def package_of(module: str) -> str:
    """The package a module belongs to: ``placer.executor.stream.nodes`` -> ``executor``; ``placer.site`` -> ``site``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "placer"


def package_graph() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) package -> where (``module:line``), for imports between two packages."""
    edges: dict[tuple[str, str], list[str]] = {}
    for name in MODULES:
        for mod, line in runtime_imports(name):
            a, b = package_of(name), package_of(mod)
            if a != b and "placer" not in (a, b):
                edges.setdefault((a, b), []).append(f"{name}:{line} imports {mod}")
    return edges


def test_the_source_tree_is_read():
    assert {"placer.data.cost_table", "placer.costmodel.model", "placer.site", "placer.advisor"} <= set(MODULES)


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
    code = ("import sys; import placer.data.cost_table, placer.data.profile, placer.data.plan, placer.data.run, "
            "placer.data.report, placer.costmodel.model, placer.optimize, placer.site; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'dask', 'numba', 'distributed'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=PKG.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


#: pairs of packages that still import each other, each with the change that removes it
def test_runtime_imports_leave_out_type_checking_blocks_and_see_inside_functions():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import placer.site\n"
                     "def f():\n    from placer.executor import transfer\n")
    MODULES["placer._probe"], PATHS["placer._probe"] = tree, PKG / "_probe.py"
    try:
        assert runtime_imports("placer._probe") == [("placer.executor.transfer", 5)]
    finally:
        del MODULES["placer._probe"], PATHS["placer._probe"]


def test_no_two_packages_import_each_other():
    """No cycle between placer's packages (``placer.site`` and such top-level modules count as packages).

    Imports inside functions count: an import moved into a function to dodge a cycle at
    load time is still a cycle in the design.
    """
    import networkx as nx

    edges = package_graph()
    graph = nx.DiGraph(list(edges))
    cycles = [c for c in nx.strongly_connected_components(graph) if len(c) > 1]
    lines = []
    for comp in cycles:
        lines.append(f"packages {sorted(comp)} import each other:")
        lines += [f"  {w}" for (a, b), where in sorted(edges.items()) if {a, b} <= comp for w in where]
    assert not cycles, "\n".join(lines)


def declared_imports(doc: str) -> set[str] | None:
    """The placer modules a "May import" paragraph names: ``placer.x.{a,b}`` and ``placer.x.*`` expanded."""
    found = re.search(r"May import:(.*?)(?:\n\s*\n|\Z)", doc, re.S)
    if found is None:
        return None
    out = set()
    for token in re.findall(r"placer(?:\.\w+)*(?:\.\{[\w,\s]+\}|\.\*)?", found.group(1)):
        token = re.sub(r"\s", "", token)
        braces = re.fullmatch(r"(.*)\.\{(.*)\}", token)
        if braces:
            out |= {f"{braces.group(1)}.{m}" for m in braces.group(2).split(",")}
        else:
            out.add(token.removesuffix(".*"))
    return out


def test_may_import_lines_are_read_with_braces_and_stars():
    doc = "Text.\n\nMay import: numpy, placer.{devices,errors}, placer.executor.stream.*;\nplacer.site inside.\n\nMore."
    assert declared_imports(doc) == {"placer.devices", "placer.errors", "placer.executor.stream", "placer.site"}


@pytest.mark.parametrize("name", sorted(n for n in MODULES
                                        if not n.startswith("placer.cli") and n not in ("placer", "placer.__main__")))
def test_every_module_imports_only_what_its_may_import_line_names(name):
    """A module's own package is always allowed; any other placer module must be named (or a package above it)."""
    declared = declared_imports(ast.get_docstring(MODULES[name]) or "")
    assert declared is not None, f"{name} has no 'May import' line"
    own = ".".join(name.split(".")[:2])
    undeclared = sorted({f"{mod} (line {line})" for mod, line in runtime_imports(name)
                         if mod != own and not mod.startswith(own + ".")
                         and not any(mod == d or mod.startswith(d + ".") for d in declared)})
    assert not undeclared, f"{name} imports what its 'May import' line does not name: {undeclared}"


def documented_imports() -> dict[str, set[str]]:
    """The block under "Imports between packages" in docs/architecture.md: package -> packages it may import."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("## Imports between packages"):]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None, "docs/architecture.md: no block of allowed imports under 'Imports between packages'"
    out = {}
    for line in block.group(1).splitlines():
        found = re.match(r"(\S+)\s+->\s*([^(]*)", line)
        assert found, f"docs/architecture.md: cannot read {line!r} (write 'package -> a, b')"
        out[found.group(1)] = {m.strip() for m in found.group(2).split(",") if m.strip()}
    return out


def test_every_package_imports_only_what_docs_architecture_allows():
    allowed = documented_imports()
    packages = {package_of(n) for n in MODULES} - {"placer"}
    assert packages <= set(allowed), f"docs/architecture.md does not list {sorted(packages - set(allowed))}"
    extra = []
    for (a, b), where in sorted(package_graph().items()):
        if b not in allowed.get(a, set()):
            extra.append(f"{a} -> {b} ({where[0]}{f' and {len(where) - 1} more' if len(where) > 1 else ''})")
    assert not extra, "imports between packages that docs/architecture.md does not allow:\n" + "\n".join(extra)


def test_the_documented_imports_are_read():
    allowed = documented_imports()
    assert "stream" not in allowed["executor"] and "executor" in allowed["stream"]
    assert allowed["errors"] == set() and "site" not in allowed["cluster"]


def module_graph() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) module -> where (``line``), for imports between two modules of one package.

    A package's ``__init__`` that gathers its modules' names is left out as an importer (it sits above
    them all); an import of a package counts as an import of its ``__init__``.
    """
    edges: dict[tuple[str, str], list[str]] = {}
    for name in MODULES:
        if PATHS[name].name == "__init__.py":
            continue
        for mod, line in runtime_imports(name):
            if mod in MODULES and mod != name and package_of(mod) == package_of(name):
                edges.setdefault((name, mod), []).append(f"{name}:{line} imports {mod}")
    return edges


def test_no_modules_of_one_package_import_each_other():
    """No cycle between the modules of a package (imports inside functions count, as between packages)."""
    import networkx as nx

    edges = module_graph()
    graph = nx.DiGraph(list(edges))
    cycles = [c for c in nx.strongly_connected_components(graph) if len(c) > 1]
    lines = []
    for comp in cycles:
        lines.append(f"modules {sorted(comp)} import each other:")
        lines += [f"  {w}" for (a, b), where in sorted(edges.items()) if {a, b} <= comp for w in where]
    assert not cycles, "\n".join(lines)


def private_attributes(tree: ast.Module, name: str) -> list[tuple[str, str, int]]:
    """``(module, attribute, line)`` for each ``mod._private`` read where ``mod`` is a placer module imported
    by name in ``tree`` (``from placer.x import mod``, ``import placer.x.mod as mod``)."""
    aliases: dict[str, str] = {}
    for mod, names, node in imports(tree, name):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("placer") and a.asname:
                    aliases[a.asname] = a.name
        elif mod.startswith("placer"):
            for a in node.names:
                if f"{mod}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{mod}.{a.name}"
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            out.append((aliases[node.value.id], node.attr, node.lineno))
    return out


def test_no_module_reads_a_private_name_of_another_through_the_module():
    found = [f"{name}:{line} reads {mod}.{attr}" for name, tree in MODULES.items()
             for mod, attr, line in private_attributes(tree, name) if mod != name]
    assert not found, "\n".join(found)


def test_private_names_through_a_module_are_seen():
    tree = ast.parse("from placer.stream import rounds\nimport placer.timing as t\nrounds._x\nt._y\nrounds.ok\n")
    assert private_attributes(tree, "placer._probe") == [("placer.stream.rounds", "_x", 3), ("placer.timing", "_y", 4)]


def test_modules_stay_readable_in_one_sitting():
    """No module of placer over 900 lines, none of the stream wing (placer.stream) over 500."""
    too_long = []
    for name, path in PATHS.items():
        n = len(path.read_text().splitlines())
        limit = 500 if name.startswith("placer.stream") else 900
        if n > limit:
            too_long.append(f"{name}: {n} lines (at most {limit})")
    assert not too_long, "\n".join(too_long)


def test_the_stream_wings_functions_are_short_enough_to_name():
    """No function of placer.stream over 80 lines (docstring included); advise_loader's body at most 60."""
    long_ones = []
    for name, tree in MODULES.items():
        if not name.startswith("placer.stream"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long_ones.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long_ones, "\n".join(long_ones)
    advise = next(n for n in ast.walk(MODULES["placer.stream.dropin.advise"])
                  if isinstance(n, ast.FunctionDef) and n.name == "advise_loader")
    body = advise.body[1:] if isinstance(advise.body[0], ast.Expr) else advise.body
    assert body[-1].end_lineno - body[0].lineno + 1 <= 60

"""The README and docs say what the code and the recorded results say.

- **Code blocks.** Every fenced block of README.md and docs/*.md is accounted for: a python
  block runs (in a temporary folder, with the files it reads made first) unless
  :data:`ILLUSTRATIVE` names it with the reason it cannot run here in seconds (it needs a
  GPU, a cluster, the user's own loader, or minutes of profiling); a JSON block parses; a
  shell block runs when :data:`SHELL_RUN` names it, other shell blocks and diagrams are
  illustrative (reason in :func:`_shell_reason`). A new python block that is neither run nor
  named fails :func:`test_every_python_block_is_run_or_named_illustrative`. The README's two
  long examples are run by ``tests/test_readme.py`` and are not run again here.
- **Links.** Every relative link of README.md and docs/*.md names an existing file, and
  its ``#anchor``, where it has one, a heading of that file.
- **Cited numbers.** The convention: a number in the same sentence as a markdown link to a
  file under ``benchmarks/results/`` (or in a table that directly follows a paragraph citing
  exactly one such file) is that file's, and must occur in its text (thousands separators
  ignored). A changed result or a mistyped number fails
  :func:`test_numbers_next_to_a_results_link_are_that_files`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


def _blocks():
    out = []
    for path in DOCS:
        text = path.read_text()
        for i, m in enumerate(BLOCK.finditer(text)):
            line = text[: m.start()].count("\n") + 1
            out.append((path, i, line, m.group(1), m.group(2)))
    return out


BLOCKS = _blocks()


def _id(b) -> str:
    path, i, line, lang, _ = b
    return f"{path.relative_to(ROOT)}:{line}:{lang or 'text'}"


# -- which python blocks are illustrative, and why (file, a snippet the block contains) -----
ILLUSTRATIVE: dict[tuple[str, str], str] = {
    ("README.md", "from placer import Pipeline, execute\nfrom placer.jit import njit"):
        "run by tests/test_readme.py (the README's first example, on every placement)",
    ("README.md", "@p.source(epochs=2, batch_size=64)"):
        "run by tests/test_readme.py (the stream example, against the sequential run)",
    ("README.md", "advice = placer.stream.advise_loader(loader, train_step"):
        "a fragment: `loader` and `train_step` are the user's own; "
        "examples/stream_training_script.py runs the same call in tests/test_examples.py",
    ("README.md", 'advised = placer.advise("pipelines/tabular.py", size=20_000)'):
        "profiles, plans and runs the tabular pipeline at 20,000 rows (tens of seconds); "
        "tests/test_api.py runs placer.advise at small sizes",
    ("docs/cluster.md", 'from distributed import Client'):
        "needs a running dask scheduler at the address shown",
    ("docs/cluster.md", "from dask_cuda import LocalCUDACluster"): "needs dask-cuda and a GPU",
    ("docs/cluster.md", "from placer.cluster import plan_for_cluster"):
        "needs a running dask scheduler at the address shown",
    ("docs/cluster.md", "from placer.cluster import measure_worker_link"):
        "needs a running dask scheduler at the address shown",
    ("docs/profiling.md", 'CostModel(Profile.load("profile.json")'):
        "needs a profile.json from `placer profile` (tens of seconds of measuring); "
        "tests/costmodel/test_costmodel.py runs CostModel on built profiles",
    ("docs/reports.md", 'facts = report("report.html", plan="plan.json"'):
        "needs the JSON files `placer advise --save DIR` writes (a whole advise run); "
        "examples/report_from_json.py does the same in tests/test_examples.py",
    ("docs/streams.md", "advice = placer.stream.advise_loader(loader, train_step"):
        "a fragment: `loader` and `train_step` are the user's own; "
        "examples/stream_training_script.py runs the same call in tests/test_examples.py",
    ("docs/streams.md", "plan = plan_stream(pipeline, budget_s=10)"):
        "a fragment: `pipeline` is the user's stream, and planning it profiles for 10 s; "
        "tests/stream/test_stream_plan.py plans streams",
}

#: JSON blocks that are abridged on purpose ("..." stands for rows left out)
ABRIDGED_JSON = {("docs/targets.md", '"schema": "placer.target/1"')}

#: shell blocks run as written (``placer`` is this interpreter's ``-m placer``)
SHELL_RUN = {("docs/schemas.md", "placer schema run > run.schema.json")}


def _named(table, b):
    path, *_, body = b
    rel = str(path.relative_to(ROOT))
    return next((v if isinstance(table, dict) else True for (f, snip), v in
                 (table.items() if isinstance(table, dict) else ((k, None) for k in table))
                 if f == rel and snip in body), None)


def _shell_reason(body: str) -> str:
    if re.search(r"pip install|venv", body):
        return "installs packages (network, minutes)"
    if "tcp://" in body or "dask " in body:
        return "needs a dask cluster"
    if re.search(r"^\$?\s*(placer|python)", body, re.M):
        return ("a command line shown with its options; the CLI tests run each command at small sizes "
                "(whole pipelines at these sizes take minutes)")
    return "not code: a diagram, a formula, a layout or sample output"


# -- python blocks that run, with what they need set up first ------------------------------
def _setup_prepare(tmp_path, ns):
    from placer import Pipeline

    p = Pipeline("serve", size=4)

    @p.stage(kind="inference")
    def score(device):
        import torch

        return torch.arange(4.0, device=device).sum()

    ns["p"] = p


def _setup_cost_table(tmp_path, ns):
    body = next(b[-1] for b in BLOCKS if b[0].name == "costs.md" and b[3] == "json" and '"stages"' in b[-1])
    (tmp_path / "table.json").write_text(body)


def _setup_precision(tmp_path, ns):
    from placer import Pipeline

    ns["Pipeline"] = Pipeline


SETUP = {
    ("README.md", "with prepare(p, "): _setup_prepare,
    ("docs/costs.md", 'CostTable.load("table.json")'): _setup_cost_table,
    ("docs/precision.md", 'p = Pipeline("lm", precision=())'): _setup_precision,
}

PYTHON = [b for b in BLOCKS if b[3] == "python"]


@pytest.mark.parametrize("block", PYTHON, ids=_id)
def test_python_blocks_run(block, tmp_path, monkeypatch):
    reason = _named(ILLUSTRATIVE, block)
    if reason:
        pytest.skip(f"illustrative: {reason}")
    setup = _named(SETUP, block)
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__doc_block__"}
    if setup:
        setup(tmp_path, ns)
    path, _, line, _, body = block
    exec(compile(body, f"{path.name}:{line}", "exec"), ns)  # noqa: S102 - our own docs


def test_every_python_block_is_run_or_named_illustrative():
    """A named block must still exist (a stale name hides nothing), and the run set is not empty."""
    for table in (ILLUSTRATIVE, SETUP):
        for f, snip in table:
            assert any(str(b[0].relative_to(ROOT)) == f and snip in b[-1] for b in PYTHON), (
                f"no python block of {f} contains {snip!r} any more: update tests/test_docs.py")
    assert sum(1 for b in PYTHON if not _named(ILLUSTRATIVE, b)) >= 3


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[3] == "json"], ids=_id)
def test_json_blocks_parse(block):
    body = block[-1]
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        data = json.loads("{" + body + "}")  # a fragment of an object: a field and its value
    assert data
    if _named(ABRIDGED_JSON, block):
        return
    if block[0].name == "costs.md" and '"stages"' in body:
        from placer.data.cost_table import CostTable

        CostTable.model_validate(data)


SHELL = [b for b in BLOCKS if b[3] not in ("python", "json", "yaml")]


@pytest.mark.parametrize("block", SHELL, ids=_id)
def test_shell_blocks(block, tmp_path):
    if not _named(SHELL_RUN, block):
        pytest.skip(f"illustrative: {_shell_reason(block[-1])}")
    cmd = block[-1].splitlines()[0].replace("placer ", f"{sys.executable} -m placer ", 1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "run.schema.json").read_text())["title"]


# -- links ----------------------------------------------------------------------------------
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return BLOCK.sub("", text)


def _slug(heading: str) -> str:
    s = re.sub(r"[`*_]", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", _prose(path.read_text()), re.M)}


def _links():
    out = []
    for path in DOCS:
        for target in LINK.findall(_prose(path.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            out.append((path, target))
    return out


@pytest.mark.parametrize("link", _links(), ids=lambda x: f"{x[0].name}->{x[1]}")
def test_relative_links_resolve(link):
    path, target = link
    file, _, anchor = target.partition("#")
    dest = (path.parent / file).resolve() if file else path
    assert dest.exists(), f"{path.relative_to(ROOT)} links to {target}, which does not exist"
    if anchor and dest.suffix == ".md":
        assert anchor in _anchors(dest), f"{path.relative_to(ROOT)} links to {target}: no such heading"


def test_the_link_check_sees_links():
    links = _links()
    assert len(links) > 20
    assert any("benchmarks/results/" in t for _, t in links)


# -- numbers that cite a results file ---------------------------------------------------------
NUM = re.compile(r"(?<![\w.\-/])\d[\d,]*(?:\.\d+)?")
RESULTS = re.compile(r"\]\(([^)\s#]*benchmarks/results/[^)\s#]+)\)")


def _sentences(paragraph: str) -> list[str]:
    return re.split(r"(?<=[.!?:])\s+(?=[A-Z(\[`*\"])", paragraph)


def _numbers(text: str) -> list[str]:
    text = re.sub(r"\]\([^)]*\)", "]", text)  # not the digits of a link's path
    text = re.sub(r"`[^`]*`", "", text)  # nor of code
    return [n.rstrip(",") for n in NUM.findall(text)]


def _citations():
    """(doc, results file, the text that cites it, its numbers)."""
    out = []
    for path in DOCS:
        paragraphs = re.split(r"\n\s*\n", _prose(path.read_text()))
        previous: list[str] = []
        for para in paragraphs:
            is_table = all(line.lstrip().startswith("|") for line in para.strip().splitlines())
            if is_table and len(previous) == 1:
                for row in para.strip().splitlines():
                    if _numbers(row):
                        out.append((path, previous[0], row, _numbers(row)))
            for sentence in _sentences(para):
                for target in set(RESULTS.findall(sentence)):
                    out.append((path, target, sentence, _numbers(sentence)))
            previous = sorted(set(RESULTS.findall(para)))
    return out


def _results_text(path: Path, target: str) -> str:
    return (path.parent / target).resolve().read_text().replace(",", "")


@pytest.mark.parametrize("cite", _citations(), ids=lambda c: f"{c[0].name}->{Path(c[1]).name}:{c[2][:40]}")
def test_numbers_next_to_a_results_link_are_that_files(cite):
    path, target, text, numbers = cite
    found = _results_text(path, target)
    missing = [n for n in numbers if n.replace(",", "") not in found]
    assert not missing, (f"{path.relative_to(ROOT)} cites {target} with {missing}, which it does not hold: "
                         f"{text.strip()[:300]}")


def test_the_number_check_covers_the_cited_results_and_would_catch_a_change():
    cites = _citations()
    cited = {Path(t).name for _, t, *_ in cites}
    assert {"optimizer.txt", "plain-vm-epyc-quiet-v40-screened.md", "plain-target-h200-vm.md"} <= cited
    path, target, text, numbers = next(c for c in cites if Path(c[1]).name == "optimizer.txt" and "5.991" in c[3])
    found = _results_text(path, target)
    assert "5.991" in found and "5.981" not in found  # a mistyped number would fail the check
    assert _numbers("the worst 5.991 % (of 1,000 cases, [x](benchmarks/results/a-2026-12-01.txt))") == [
        "5.991", "1,000"]


# -- counts the README states ----------------------------------------------------------------
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                     "thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}


def test_the_readme_counts_the_pipelines_that_exist():
    modules = sorted(p.stem for p in (ROOT / "pipelines").glob("*.py") if p.stem != "__init__")
    m = re.search(r"`pipelines/` holds (\w+) ready pipelines", (ROOT / "README.md").read_text())
    assert m and WORDS[m.group(1)] == len(modules), (m and m.group(1), modules)
    gallery = (ROOT / "docs/pipelines.md").read_text()
    assert all(f"| `{name}` |" in gallery for name in modules), "docs/pipelines.md leaves a pipeline out"


def test_every_plain_script_with_placer_advice_is_said_to_have_it():
    scripts = sorted(p.name for p in (ROOT / "benchmarks/plain").glob("*.py"))
    have = [s for s in scripts if "--placer-advice" in (ROOT / "benchmarks/plain" / s).read_text()]
    page = (ROOT / "docs/benchmarks-plain.md").read_text()
    assert len(have) == 6 and "Flags common to all six" in page and "`--placer-advice`" in page

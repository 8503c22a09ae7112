"""The report's pictures, drawn with matplotlib and returned as SVG text.

May import: matplotlib (inside functions, through ``matplotlib.figure.Figure``, never
pyplot), networkx, placer.data.report, placer.report.{facts,advice,critical,kinds}.

Three pictures: the pipeline's graph with each stage coloured by its device
(:func:`dag_svg`), the measured and predicted timelines (:func:`timeline_svg`),
and predicted against measured seconds per stage (:func:`errors_svg`); and one per
stream of minibatches (:func:`stream_svg`): each node's busy, starved and blocked
shares, and its queues' occupancy over time. Text is
drawn as glyph paths, so the SVG needs no font; :func:`inline_svg` makes it fit to sit
inside an HTML page.
Stage names reach matplotlib with ``$`` escaped, so no name is read as math.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable

import networkx as nx

from placer.report.advice import fmt_bytes
from placer.report.critical import span_word
from placer.report.kinds import is_real_gpu, is_simulated
from placer.data.report import Bar, ReportFacts

#: colours by device kind; the simulated device is hatched so it never looks like a GPU
KIND_COLOURS = {"cpu": "#4C78A8", "gpu": "#54A24B", "sim": "#F58518"}
#: the colour of any other registered kind of accelerator
OTHER_KIND = "#B279A2"
EXTRA_GPU_COLOURS = ["#2E7D32", "#88C057", "#1B5E20"]
LINK_COLOUR = "#9D755D"
ABSENT_COLOUR = "#B279A2"
MAX_LABEL = 22


def tex_safe(text: str, limit: int = MAX_LABEL) -> str:
    """A label matplotlib draws as written: shortened, ``$`` escaped (no mathtext)."""
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("\\", "\\\\").replace("$", r"\$")


def device_colours(facts: ReportFacts) -> dict[str, str]:
    """A colour per device name: by kind, later GPUs in other greens, absent ones purple."""
    out, extra = {}, iter(EXTRA_GPU_COLOURS)
    seen_gpu = False
    for d in facts.meta.devices:
        if not d.present:
            out[d.name] = ABSENT_COLOUR
        elif is_real_gpu(d.kind) and seen_gpu:
            out[d.name] = next(extra, KIND_COLOURS["gpu"])
        else:
            out[d.name] = KIND_COLOURS.get(d.kind, OTHER_KIND)
            seen_gpu = seen_gpu or is_real_gpu(d.kind)
    return out


def device_legend_title(facts: ReportFacts, name: str) -> str:
    d = facts.device(name)
    if d is None:
        return name
    if not d.present:
        return f"{name} (absent here: predicted)"
    return tex_safe(d.title, 60)


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    return fig


def to_svg(fig, name: str) -> str:
    """Render a figure to a standalone SVG document, without metadata or comments."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": f"placer-{name}"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    svg = _METADATA.sub("", buf.getvalue())
    check_svg(svg, name)
    return svg


_METADATA = re.compile(r"<metadata>.*?</metadata>|<!--.*?-->", re.S)
_PROLOGUE = re.compile(r"<\?xml[^>]*\?>|<!DOCTYPE[^>]*>", re.S)
_ROOT = re.compile(r"<svg\b[^>]*>", re.S)
_UNSAFE = re.compile(r"<\s*script|<\s*foreignObject|javascript:|\bon[a-z]+\s*=", re.I)


def check_svg(svg: str, name: str) -> None:
    """Raise ValueError when an SVG holds a script, a foreign object or an event handler.

    It never should (matplotlib escapes text); this keeps it that way.
    """
    if _UNSAFE.search(svg):
        raise ValueError(f"the {name} picture contains active content; refusing to embed it")


def inline_svg(svg: str, name: str) -> str:
    """An SVG document made fit to sit inside an HTML page.

    The XML prologue goes (HTML parses inline SVG by itself, namespaces included),
    and the root scales to its container through its ``viewBox``.
    """
    svg = _PROLOGUE.sub("", svg).strip()
    m = _ROOT.search(svg)
    view = re.search(r'viewBox="([^"]+)"', m.group(0))
    root = (f'<svg class="figure" id="fig-{name}" role="img" aria-label="{name}" '
            f'viewBox="{view.group(1) if view else "0 0 100 100"}" preserveAspectRatio="xMinYMin meet">')
    svg = svg[: m.start()] + root + svg[m.end():]
    check_svg(svg, name)
    return svg


# -- the graph -----------------------------------------------------------------------------
def dag_layout(nodes: list[str], edges: Iterable[tuple[str, str]]) -> dict[str, tuple[float, float]]:
    """Left-to-right layers by longest path from a source; stages in a layer spread vertically."""
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    layer = {}
    for n in nx.topological_sort(g):
        layer[n] = max((layer[p] + 1 for p in g.predecessors(n)), default=0)
    pos = {}
    for lv in set(layer.values()):
        members = [n for n in nodes if layer[n] == lv]
        k = len(members)
        for i, n in enumerate(members):
            pos[n] = (float(lv), (k - 1) / 2.0 - i)
    return pos


def dag_svg(facts: ReportFacts) -> str:
    """The pipeline's graph: boxes coloured by device, crossing edges labelled with bytes."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

    names = [n.name for n in facts.dag.nodes]
    pos = dag_layout(names, [(e.src, e.dst) for e in facts.dag.edges])
    layers = max(x for x, _ in pos.values()) + 1
    height = max(abs(y) for _, y in pos.values()) * 2 + 1
    fig = _figure(max(10.0, 2.3 * layers), max(2.2, 0.95 * height + 1.0))
    ax = fig.add_axes((0, 0.14, 1, 0.86))
    ax.set_axis_off()
    colours = device_colours(facts)
    bw, bh = 0.56, 0.42
    for e in facts.dag.edges:
        (x0, y0), (x1, y1) = pos[e.src], pos[e.dst]
        style = dict(color="#C0392B", lw=2.2, ls="--") if e.crosses else dict(color="#555555", lw=1.3)
        ax.add_patch(FancyArrowPatch((x0 + bw / 2, y0), (x1 - bw / 2, y1), arrowstyle="-|>",
                                     mutation_scale=14, connectionstyle="arc3,rad=0.08", **style))
        if e.crosses:
            text = fmt_bytes(e.bytes) + (f"\n{e.transfer_s * 1e3:.2f} ms" if e.transfer_s is not None else "")
            ax.text((x0 + x1) / 2, max(y0, y1) + bh / 2 + 0.04, text, ha="center", va="bottom", fontsize=8.5,
                    color="#C0392B", bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.9))
    for n in facts.dag.nodes:
        x, y = pos[n.name]
        d = facts.device(n.device)
        hatch = "//" if d is not None and (is_simulated(d.kind) or not d.present) else None
        ax.add_patch(FancyBboxPatch((x - bw / 2, y - bh / 2), bw, bh, boxstyle="round,pad=0.03,rounding_size=0.08",
                                    fc=colours.get(n.device, "#999999"), ec="#222222", lw=1.0, hatch=hatch, alpha=0.95))
        ax.text(x, y + 0.05, tex_safe(n.name, 18), ha="center", va="center", fontsize=10, color="white",
                fontweight="bold", bbox=dict(boxstyle="round,pad=0.1", fc=colours.get(n.device, "#999"), ec="none"))
        ax.text(x, y - 0.13, tex_safe(f"{n.kind} · {n.device}", 26), ha="center", va="center", fontsize=7.5,
                color="white")
    ax.set_xlim(-0.5, layers - 0.5)
    ax.set_ylim(-height / 2 - 0.1, height / 2 + 0.45)
    used = list(dict.fromkeys(n.device for n in facts.dag.nodes))
    handles = [Patch(fc=colours.get(d, "#999"), ec="#222", hatch="//" if (facts.device(d) and (is_simulated(facts.device(d).kind) or not facts.device(d).present)) else None,
                     label=device_legend_title(facts, d)) for d in used]
    handles.append(Patch(fc="white", ec="#C0392B", ls="--", label="crosses devices: bytes, copy time"))
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=8.5, frameon=False)
    return to_svg(fig, "dag")


# -- the timeline --------------------------------------------------------------------------
def lane_order(lanes: Iterable[str]) -> list[str]:
    """CPU worker lanes first, then a stream's stages in stream order, then accelerators, then links."""
    first: dict[str, int] = {}
    for lane in lanes:
        first.setdefault(lane, len(first))

    def key(lane: str):
        if lane.startswith("cpu"):
            tail = lane.split("/", 1)[-1]
            return (0, int(tail) if tail.isdigit() else 0, lane)
        if lane.startswith("stream: "):
            return (1, first[lane], lane)
        if lane.startswith("link"):
            return (3, 0, lane)
        return (2, 0, lane)

    return sorted(first, key=key)


def _draw_lanes(ax, bars: list[Bar], lanes: list[str], colours: dict[str, str], span: float, facts: ReportFacts) -> None:
    row = {lane: i for i, lane in enumerate(lanes)}
    min_w = span * 0.004
    for b in bars:
        y = row[b.lane]
        w = max(b.end_s - b.start_s, min_w)
        if b.kind == "stage":
            d = facts.device(b.device)
            hatch = "//" if d is not None and (is_simulated(d.kind) or not d.present) else None
            ax.barh(y, w, left=b.start_s, height=0.62, color=colours.get(b.device, "#999"),
                    edgecolor="#222", lw=0.6, hatch=hatch)
        else:
            ax.barh(y, w, left=b.start_s, height=0.42, color=LINK_COLOUR, edgecolor="#222", lw=0.5)
        if w >= span * 0.07:
            ax.text(b.start_s + w / 2, y, tex_safe(b.label, max(4, int(w / span * 60))), ha="center",
                    va="center", fontsize=8, color="white", clip_on=True)
    ax.set_yticks(range(len(lanes)), [tex_safe(x, 26) for x in lanes], fontsize=8.5)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.grid(axis="x", color="#dddddd", lw=0.6)
    ax.set_axisbelow(True)


def timeline_svg(facts: ReportFacts) -> str:
    """The measured run (one lane per CPU worker, accelerator and link) over the predicted schedule."""
    from matplotlib.patches import Patch

    tl = facts.timeline
    word = span_word(facts)
    panels = [(f"measured run ({_secs(tl.measured_makespan_s, word)})", tl.measured),
              (f"predicted schedule ({_secs(tl.predicted_makespan_s, word)})", tl.predicted)]
    panels = [(t, b) for t, b in panels if b]
    if not panels:
        panels = [("no timeline recorded", [])]
    lanes = [lane_order(b.lane for b in bars) or ["(none)"] for _, bars in panels]
    spans = [max([b.end_s for b in bars] + [1e-9]) for _, bars in panels]
    shared = max(spans) <= 2 * min(spans)  # one scale unless it would squash a panel
    heights = [max(1.4, 0.42 * len(ls) + 0.8) for ls in lanes]
    fig = _figure(10.0, sum(heights) + 0.9 + (0 if shared else 0.4 * (len(panels) - 1)))
    axes = fig.subplots(len(panels), 1, sharex=shared, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    colours = device_colours(facts)
    for ax, (title, bars), ls, span in zip(axes, panels, lanes, spans):
        span = max(spans) if shared else span
        _draw_lanes(ax, bars, ls, colours, span, facts)
        ax.set_title(title + ("" if shared else " (own time scale)"), fontsize=10, loc="left")
        ax.set_xlim(0, span * 1.02)
        if not shared or ax is axes[-1]:
            ax.set_xlabel("seconds since the run started", fontsize=9)
    used = list(dict.fromkeys(b.device for _, bars in panels for b in bars if b.kind == "stage"))
    handles = [Patch(fc=colours.get(d, "#999"), ec="#222", label=device_legend_title(facts, d)) for d in used]
    if any(b.kind == "transfer" for _, bars in panels for b in bars):
        handles.append(Patch(fc=LINK_COLOUR, ec="#222", label="copy between memories"))
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=8.5, frameon=False,
                   bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return to_svg(fig, "timeline")


def _secs(s: float | None, word: str = "makespan") -> str:
    return "?" if s is None else f"{word} {s:.3g} s"


# -- prediction errors ---------------------------------------------------------------------
def errors_svg(facts: ReportFacts) -> str:
    """Predicted and measured seconds per stage and device (log scale), error in percent."""
    from matplotlib.patches import Patch

    rows = [e for e in facts.errors if e.predicted_s is not None]
    colours = device_colours(facts)
    fig = _figure(10.0, max(1.8, 0.42 * len(rows) + 1.4))
    ax = fig.add_subplot(1, 1, 1)
    labels = []
    for i, e in enumerate(rows):
        c = colours.get(e.device, "#999")
        y = i
        ax.barh(y - 0.19, e.predicted_s, height=0.36, color="white", edgecolor=c, lw=1.4,
                hatch="//" if e.prediction_only else None)
        if e.measured_s is not None:
            ax.barh(y + 0.19, e.measured_s, height=0.36, color=c, edgecolor="#222", lw=0.6)
        if e.rel_error is not None:
            note = f"{e.rel_error:+.0%}"
        elif e.prediction_only:
            note = "prediction only (device absent)"
        else:
            note = "not measured"
        top = max(e.predicted_s, e.measured_s or 0)
        ax.text(top * 1.15, y, note, va="center", fontsize=8, color="#333")
        labels.append(tex_safe(f"{e.stage} · {e.device}", 34))
    if not rows:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no predictions: report made from a run alone", ha="center", va="center",
                transform=ax.transAxes, color="#555")
        return to_svg(fig, "errors")
    ax.set_yticks(range(len(rows)), labels, fontsize=8.5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    positive = [v for e in rows for v in (e.predicted_s, e.measured_s) if v]
    if positive:
        ax.set_xscale("log")
        ax.set_xlim(min(positive) / 2, max(positive) * 8)
    ax.set_xlabel("seconds (log scale)")
    ax.grid(axis="x", color="#dddddd", lw=0.6, which="both")
    ax.set_axisbelow(True)
    handles = [Patch(fc="white", ec="#333", label="predicted"), Patch(fc="#777", ec="#222", label="measured"),
               Patch(fc="white", ec="#333", hatch="//", label="predicted for an absent device")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8.5, frameon=False)
    fig.tight_layout(rect=(0, 0.45 / fig.get_figheight(), 1, 1))
    return to_svg(fig, "errors")


# -- streams -------------------------------------------------------------------------------
#: colours of a stream node's time: computing, waiting for input, waiting for room downstream
SHARE_COLOURS = {"busy": "#4C78A8", "starved": "#E45756", "blocked": "#ECA82C"}
SHARE_LABELS = {"busy": "busy (computing)", "starved": "starved (waiting for input)",
                "blocked": "blocked (waiting for room downstream)"}
QUEUE_COLOURS = ["#4C78A8", "#72B7B2", "#B279A2", "#9D755D", "#54A24B"]


def stream_svg(facts: ReportFacts, index: int) -> str:
    """One stream: each node's busy/starved/blocked shares, and its queues' occupancy over time."""
    from matplotlib.patches import Patch

    s = facts.streams[index]
    nodes = s.stages
    trace = bool(s.queue_trace and s.queues)
    top = max(1.6, 0.5 * len(nodes) + 0.9)
    fig = _figure(10.0, top + (2.3 if trace else 0) + 0.5)
    axes = fig.subplots(2 if trace else 1, 1, squeeze=False,
                        gridspec_kw={"height_ratios": [top, 2.3] if trace else [top]})[:, 0]
    _draw_shares(axes[0], nodes, s.bottleneck)
    axes[0].set_title(tex_safe(f"stream {s.source} → {s.step}: where each node's worker time went", 90),
                      fontsize=10, loc="left")
    handles = [Patch(fc=SHARE_COLOURS[k], ec="#222", label=SHARE_LABELS[k]) for k in SHARE_COLOURS]
    if trace:
        _draw_queues(axes[1], s)
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8.5, frameon=False, bbox_to_anchor=(0.5, -0.01))
    fig.tight_layout(rect=(0, 0.35 / fig.get_figheight(), 1, 1))
    return to_svg(fig, f"stream{index}")


def _draw_shares(ax, nodes, bottleneck: str) -> None:
    for y, n in enumerate(nodes):
        left = 0.0
        for key in ("busy", "starved", "blocked"):
            w = getattr(n, f"{key}_share")
            ax.barh(y, w, left=left, height=0.6, color=SHARE_COLOURS[key], edgecolor="#222", lw=0.5)
            if w >= 0.07:
                ax.text(left + w / 2, y, f"{w:.0%}", ha="center", va="center", fontsize=8.5,
                        color="white" if key != "blocked" else "#222")
            left += w
        if n.name == bottleneck:
            ax.text(1.01, y, "bottleneck", va="center", fontsize=8.5, color="#C0392B", fontweight="bold")
    labels = [tex_safe(f"{n.name} ({n.kind}) · {n.device} ×{n.workers}", 40) for n in nodes]
    ax.set_yticks(range(len(nodes)), labels, fontsize=8.5)
    ax.set_ylim(len(nodes) - 0.5, -0.5)
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(_percent())
    ax.set_xlabel("share of the node's worker time (wall time × workers)", fontsize=9)
    ax.grid(axis="x", color="#dddddd", lw=0.6)
    ax.set_axisbelow(True)


def _draw_queues(ax, s) -> None:
    times = [t for t, _ in s.queue_trace]
    for i, q in enumerate(s.queues):
        sizes = [row[i] if i < len(row) else 0 for _, row in s.queue_trace]
        ax.step(times, sizes, where="post", lw=1.6, color=QUEUE_COLOURS[i % len(QUEUE_COLOURS)],
                label=tex_safe(f"{q.src} → {q.dst} (mean {q.mean:.1f})", 48), marker="o", ms=3)
    ax.axhline(s.prefetch, color="#555", ls="--", lw=1.0)
    ax.text(times[0], s.prefetch + 0.12, f"capacity (prefetch {s.prefetch})", va="bottom", fontsize=8, color="#555")
    ax.set_ylim(-0.2, s.prefetch + 1.1)
    ax.set_yticks(range(s.prefetch + 1))
    ax.set_ylabel("batches queued", fontsize=9)
    ax.set_xlabel("seconds since the stream started (sampled as the step took each batch)", fontsize=9)
    ax.set_title("queue occupancy", fontsize=10, loc="left")
    ax.legend(loc="upper right", fontsize=8, frameon=False, ncol=min(3, len(s.queues)))
    ax.grid(color="#eeeeee", lw=0.6)


def _percent():
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(1.0, decimals=0)

"""Pictures of what a run did: the layouts flowing through a parallelized model
(:func:`trace_flow` / :func:`draw_flow`), the collectives CommDebugMode counted
(:func:`draw_comm_chart`), a timeline of compute and transfers (:func:`draw_timeline`) and
memory stacked by component (:func:`draw_memory`).
Reached as ``tensorplay_edu.viz.*``; colours and conventions are viz's.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle
from matplotlib.transforms import blended_transform_factory

from ..debug import CommDebugMode
from ..dtensor import DTensor
from .style import COMM_COLOR, FLOAT8_STYLE, LANE_COLORS, PHASE_COLORS, RANK_COLORS, comm_label, float8_tag

__all__ = ["trace_flow", "draw_flow", "draw_comm_chart", "draw_timeline", "draw_memory"]


def _describe_value(x) -> str:
    scaled = getattr(x, "scaled", None)  # a float8 module input (tensorplay_edu.float8's Float8Input)
    if scaled is not None and isinstance(getattr(scaled, "data", None), torch.Tensor):
        return f"Float8Input {float8_tag(scaled.data.dtype) or scaled.data.dtype} {list(scaled.data.shape)}"
    if isinstance(x, torch.Tensor) and float8_tag(x.dtype):
        return f"tensor {float8_tag(x.dtype)} {list(x.shape)}"
    if isinstance(x, DTensor):
        return f"DTensor {','.join(map(str, x.placements))} {list(x.shape)}"
    if isinstance(x, torch.Tensor):
        return f"tensor {list(x.shape)}"
    if isinstance(x, (tuple, list)) and x:
        return _describe_value(x[0])
    return type(x).__name__


def trace_flow(model, *inputs, depth: int = 3) -> list[tuple[str, str, str, str]]:
    """Run ``model(*inputs)`` once (inside a rank) and list, for each module down to
    ``depth`` dots, what it received and returned and the collectives issued under it
    (forward; :func:`comm_label`: float8 ones name their format, ``"all_gather e4m3"``).
    Plain strings: return them from the rank and draw with :func:`draw_flow`."""
    rows, handles = [], []
    for name, module in model.named_modules():
        if name.count(".") >= depth or not name:
            continue

        def hook(mod, args, out, name=name):
            rows.append([name, _describe_value(args[0] if args else None), _describe_value(out)])

        handles.append(module.register_forward_hook(hook))
    with CommDebugMode() as comm:
        model(*inputs)
    for h in handles:
        h.remove()
    for row in rows:
        ops = [comm_label(r) for r in comm.records
               if r.module == getattr(model.get_submodule(row[0]), "_tp_fqn", row[0])]
        row.append(", ".join(ops))
    return [tuple(r) for r in rows]


def draw_flow(steps, title=None):
    """The layouts through a model: ``steps`` is a list of ``(module, input layout, output
    layout, collectives)`` rows (strings), top to bottom, e.g. from a traced forward; an arrow
    leads from each module to the next.

    A layout or a collective naming a float8 format (``e4m3``, ``e5m2``, ``float8_e4m3fn``...)
    is drawn in a gold dashed box (:data:`FLOAT8_STYLE`); a float8 collective is tagged
    ``1 B/elem``, and a note under the rows says what the box means.
    """
    n = len(steps)
    any_float8 = any(float8_tag(text) for step in steps for text in step[1:])
    fig, ax = plt.subplots(figsize=(9, 0.9 * n + 0.8 + (0.3 if any_float8 else 0)))
    ax.axis("off")
    for i, (module, layout_in, layout_out, comms) in enumerate(steps):
        y = n - i - 0.5
        ax.add_patch(Rectangle((0.3, y - 0.3), 0.4, 0.6, facecolor="#E8EEF7", edgecolor="black"))
        if i + 1 < n:  # what runs next: an arrow to the box below
            ax.add_patch(FancyArrowPatch((0.5, y - 0.3), (0.5, y - 0.7), arrowstyle="-|>", mutation_scale=10,
                                         color="black", lw=0.8, gid=f"flow {i}->{i + 1}"))
        ax.text(0.5, y, module, ha="center", va="center", fontsize=9, weight="bold")
        for x, ha, layout in ((0.28, "right", layout_in), (0.72, "left", layout_out)):
            ax.text(x, y, layout, ha=ha, va="center", fontsize=8, bbox=FLOAT8_STYLE if float8_tag(layout) else None)
        lines = [c for c in comms.split(", ") if c] if comms else []
        if lines and not any(float8_tag(c) for c in lines):  # one collective per line, in the right margin
            ax.text(1.0, y, comms.replace(", ", "\n"), ha="left", va="center", fontsize=8, color=COMM_COLOR)
        else:  # one text per collective, the float8 ones boxed and tagged
            for j, c in enumerate(lines):
                yj = y + 0.22 * ((len(lines) - 1) / 2 - j)
                f8 = float8_tag(c)
                ax.text(1.0, yj, f"{c}  1 B/elem" if f8 else c, ha="left", va="center", fontsize=8,
                        color="black" if f8 else COMM_COLOR, bbox=FLOAT8_STYLE if f8 else None)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.45 if any_float8 else 0, n)
    if any_float8:
        ax.text(0.5, -0.3, "float8 (e4m3 forward, e5m2 gradients): 1 byte per element", ha="center", va="center",
                fontsize=8, bbox=FLOAT8_STYLE)
    ax.set_title(title or "layouts in -> module -> layouts out   (collectives in dark red)", fontsize=10)
    fig.tight_layout()
    return fig


def draw_comm_chart(records, title=None):
    """Every collective in the order the rank issued it, top to bottom: a timeline of one
    step, forward first, then backward below a line.  One bar per collective, its length the
    bytes this rank sent, labelled with the module and the op (:func:`comm_label`); the bars
    are coloured by phase (:data:`PHASE_COLORS`), never by rank."""
    records = list(records)
    order = [r for r in records if r.phase == "forward"] + [r for r in records if r.phase != "forward"]
    n = len(order)
    fig, ax = plt.subplots(figsize=(8, 0.28 * n + 1.5))
    for y, r in enumerate(order):
        ax.barh(y, r.bytes, height=0.7, color=PHASE_COLORS[r.phase], edgecolor="black", linewidth=0.6)
    ax.set_yticks(range(n), [f"{r.module or '-'}  {comm_label(r)}" for r in order], fontsize=8)
    n_fwd = sum(r.phase == "forward" for r in order)
    if 0 < n_fwd < n:
        ax.axhline(n_fwd - 0.5, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylim(n - 0.5, -0.5)  # the first collective at the top
    ax.set_xlabel("bytes sent by this rank")
    ax.set_ylabel("issue order (top first)", fontsize=8)
    ax.legend([Patch(facecolor=c, edgecolor="black") for c in PHASE_COLORS.values()], list(PHASE_COLORS),
              fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)  # off the bars
    ax.set_title(title or f"{n} collectives, {sum(r.bytes for r in order):,} bytes per rank", fontsize=10)
    fig.tight_layout()
    return fig


_RING_OPS = {"all_gather_matmul": "all-gather \u2192 matmul", "matmul_reduce_scatter": "matmul \u2192 reduce-scatter"}
_PHASE_SHADE = {"forward": "#EFEFEF", "backward": "#FFF6DC"}  # timeline backgrounds (not rank or lane colours)


def _ring_name(ring) -> tuple[str, str]:
    """(text, phase) of one ring: a CommRecord-like (``.module``, ``.op``, ``.phase``), a ``(module, phase[, op])``
    tuple or a plain string."""
    if hasattr(ring, "op"):
        module, phase, op = ring.module, ring.phase, ring.op
    elif isinstance(ring, str):
        return ring, ""
    else:
        module, phase, op = (tuple(ring) + ("",))[:3]
    return f"{module or '-'}: {_RING_OPS.get(op, op)}".rstrip(": "), phase


def _bar_labels(ivs, t):
    """Per interval, its labels longest first: ``"step 2/3: matmul chunk 1"``, ``"matmul chunk 1"``, ``"chunk 1"``,
    ``"1"``.  A rank's rings are t computes and t-1 transfers each, one after the other (async_tp's rings):
    where the counts say so, each bar gets its ring (``ring``) and step; a transfer's step is the matmul it
    runs under.  Returns (labels, ring of each interval or None)."""
    comps = sorted((j for j, iv in enumerate(ivs) if iv[0] == "compute"), key=lambda j: ivs[j][2])
    sends = sorted((j for j, iv in enumerate(ivs) if iv[0] == "transfer"), key=lambda j: ivs[j][2])
    rings = len(comps) // t if t > 1 and len(comps) % t == 0 and len(sends) == (t - 1) * (len(comps) // t) else 0
    ring_of, step_of = [None] * len(ivs), [None] * len(ivs)
    for i, j in enumerate(comps if rings else []):
        ring_of[j], step_of[j] = i // t, i % t
    for i, j in enumerate(sends if rings else []):
        ring_of[j] = i // (t - 1)
        mine = comps[ring_of[j] * t:(ring_of[j] + 1) * t]
        step_of[j] = next((k for k, c in enumerate(mine) if ivs[c][2] >= ivs[j][2]), t - 1)
    scatter = {ring_of[j] for j in sends if ivs[j][1].startswith("sum ")}
    labels = []
    for j, (kind, label, *_) in enumerate(ivs):
        word, _, num = label.rpartition(" ")
        ring, k = ring_of[j], step_of[j]
        if word not in ("chunk", "sum") or not num.isdigit():
            labels.append([label, num] if num else [label])
            continue
        c = int(num)
        if kind == "compute":
            what = f"part of sum {c}" if ring is not None and ring in scatter else f"matmul chunk {c}"
        else:
            what = f"send {word} {(c + 1) % t}, get {word} {c}" if t > 1 else f"get {word} {c}"
        long = [f"step {k + 1}/{t}: {what}"] if k is not None else []
        labels.append(long + [what, label, num])
    return labels, ring_of


def draw_timeline(per_rank_intervals, title=None, *, rings=None, ring_size=None):
    """A Gantt chart of :class:`~tensorplay_edu.async_tp.timeline.Timeline` intervals.  ``per_rank_intervals[r]``
    lists rank r's ``Interval``s (or plain ``(kind, label, start, end)`` tuples, in seconds).  Each rank,
    top to bottom, gets a compute lane above a transfer lane, marked on the left by a strip in its colour.
    Each interval is a bar labelled with what it is, as much as fits: ``"step 2/3: matmul chunk 1"``
    (a gather ring's matmul), ``"part of sum 1"`` (a reduce-scatter ring's), ``"send chunk 2, get chunk 1"``
    (a transfer), down to the chunk number.  A ring is ``ring_size`` steps (default: the ranks drawn).

    ``rings`` (optional) names the rings in the order each rank ran them: CommRecords of the fused ops
    (``all_gather_matmul`` / ``matmul_reduce_scatter``, with their module and phase), ``(module, phase[, op])``
    tuples or strings.  Then each ring gets a numbered bracket above the lanes, a key beside the chart names
    it, and the forward and the backward are shaded.  Time in ms."""
    rows = [[(i.kind, i.label, i.start, i.end) if hasattr(i, "kind") else tuple(i) for i in ivs]
            for ivs in per_rank_intervals]
    bad = sorted({k for ivs in rows for k, *_ in ivs} - set(LANE_COLORS))
    if bad:
        raise ValueError(f"draw_timeline: interval kinds must be {sorted(LANE_COLORS)}, got {bad}")
    n, t = len(rows), ring_size or len(rows)
    names = [_ring_name(ring) for ring in rings] if rings is not None else []
    lane = lambda r, kind: 3 * (n - 1 - r) + (kind == "compute")  # compute above transfer, a gap between ranks
    span = 1e3 * max((end for ivs in rows for *_, end in ivs), default=0.0) or 1.0  # ms
    top = 3 * n - 1.3 + (0.9 if names else 0)  # room for the ring brackets
    key_lines = max((sum(ph == p for _, ph in names) for p in {ph for _, ph in names}), default=-1) + 1
    fig, ax = plt.subplots(figsize=(10, 0.9 * n + 1.4 + (0.5 + 0.16 * key_lines if names else 0)))
    ax.set_yticks([lane(r, k) for r in range(n) for k in LANE_COLORS],
                  [f"rank {r} {k}" for r in range(n) for k in LANE_COLORS], fontsize=8)
    ax.tick_params(axis="y", length=0, pad=12)
    ax.set(xlim=(0, span * 1.01), ylim=(-0.7, top), xlabel="time (ms)")
    ax.set_title(title or f"compute and transfers on {n} ranks", fontsize=10, loc="left")
    labelled = [_bar_labels(ivs, t) for ivs in rows]
    extent: dict = {}  # ring -> (first start, last end) over the ranks, ms
    for ivs, (_, ring_ids) in zip(rows, labelled):
        for (_, _, start, end), ring in zip(ivs, ring_ids):
            if ring is not None and ring < len(names):
                a, b = extent.get(ring, (1e3 * start, 1e3 * end))
                extent[ring] = (min(a, 1e3 * start), max(b, 1e3 * end))
    handles = [Patch(facecolor=c) for c in LANE_COLORS.values()]
    legend = list(LANE_COLORS)
    for phase, shade in _PHASE_SHADE.items():  # one background per phase, from its first ring to its last
        spans = [extent[i] for i, (_, ph) in enumerate(names) if ph == phase and i in extent]
        if spans:
            ax.axvspan(min(a for a, _ in spans), max(b for _, b in spans), color=shade, zorder=0, lw=0)
            handles.append(Patch(facecolor=shade, edgecolor="#999999"))
            legend.append(phase)
    for i, (a, b) in sorted(extent.items()):
        y = 3 * n - 1.25 + 0.3 * (i % 2)  # alternate heights: neighbours' numbers do not collide
        ax.plot([a, a, b, b], [y - 0.12, y, y, y - 0.12], color="black", lw=0.8)
        ax.text((a + b) / 2, y + 0.05, str(i + 1), ha="center", va="bottom", fontsize=8)
    columns = dict.fromkeys(phase for _, phase in names)  # a key under the chart: one column per phase
    for c, phase in enumerate(columns if extent else []):
        key = [f"{i + 1:2d}  {text}" for i, (text, ph) in enumerate(names) if ph == phase]
        ax.annotate("\n".join([f"{phase or 'rings'}:"] + key), (0.53 * c, 0), xycoords="axes fraction",
                    xytext=(0, -32), textcoords="offset points", ha="left", va="top", fontsize=8, family="monospace")
    if names:  # four entries: beside the lanes, clear of the title
        ax.legend(handles, legend, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    else:
        ax.legend(handles, legend, fontsize=8, ncol=2, loc="lower right", bbox_to_anchor=(1, 1), frameon=False)
    fig.tight_layout()
    points_per_ms = ax.get_position().width * fig.get_figwidth() * 72 / (span * 1.01)  # to fit the labels
    strip = blended_transform_factory(ax.transAxes, ax.transData)  # x in axes fractions, y in lanes
    for r, (ivs, (labels, _)) in enumerate(zip(rows, labelled)):
        ax.add_patch(Rectangle((-0.014, lane(r, "transfer") - 0.45), 0.009, 1.9, transform=strip, clip_on=False,
                               facecolor=RANK_COLORS[r % len(RANK_COLORS)]))
        for (kind, _, start, end), texts in zip(ivs, labels):
            x, w, y = 1e3 * start, 1e3 * (end - start), lane(r, kind)
            ax.add_patch(Rectangle((x, y - 0.4), w, 0.8, facecolor=LANE_COLORS[kind], edgecolor="white",
                                   lw=0.5 if w * points_per_ms > 3 else 0))  # a white edge would hide a thin bar
            for text in texts:  # the longest label that fits, else a shorter one, else nothing
                if text and w * points_per_ms >= 4.7 * len(text) + 4:
                    ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=8,
                            color="white" if kind == "compute" else "black")
                    break
    return fig


def draw_memory(bars, unit: str = "MB", title=None):
    """Stacked bars: ``bars`` maps a bar's label (``"no TP"``, ``"TP"``, ``"TP + SP"``...) to
    ``{component: amount}`` (``"attention"``, ``"norms"``...; the same components in every bar,
    in the same order).  Each component keeps its colour across bars, so what a plan removes is
    the segment that shrinks; each bar's total is written above it."""
    labels = list(bars)
    components = list(dict.fromkeys(c for parts in bars.values() for c in parts))
    colors = plt.get_cmap("cividis")([0.15 + 0.75 * i / max(len(components) - 1, 1) for i in range(len(components))])
    fig, ax = plt.subplots(figsize=(1.5 * len(labels) + 3.5, 3.6))
    bottoms = [0.0] * len(labels)
    for comp, color in zip(components, colors):
        values = [float(bars[b].get(comp, 0.0)) for b in labels]
        ax.bar(labels, values, bottom=bottoms, color=color, edgecolor="black", linewidth=0.5, label=comp)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for x, total in enumerate(bottoms):
        ax.text(x, total, f"{total:,.0f} {unit}" if total >= 100 else f"{total:.3g} {unit}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(unit)
    ax.set_ylim(0, max(bottoms, default=1) * 1.15 or 1)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.set_title(title or "memory by component", fontsize=10)
    fig.tight_layout()
    return fig

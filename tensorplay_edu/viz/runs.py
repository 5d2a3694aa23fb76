"""Pictures of what a run did: the layouts flowing through a parallelized model
(:func:`trace_flow` / :func:`draw_flow`), memory stacked by component (:func:`draw_memory`), the loss
differences step by step (:func:`draw_relative_differences`) and the order of a backward's gradient collectives
(:func:`draw_grad_sync_order`). Reached as ``tensorplay_edu.viz.*``; colours and conventions are viz's.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..debug import CommDebugMode
from ..dtensor import DTensor
from .style import COMM_COLOR, FLOAT8_STYLE, comm_label, float8_tag

__all__ = ["trace_flow", "draw_flow", "draw_memory", "draw_relative_differences", "draw_grad_sync_order"]


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


def _flow_text(ax, x, y, text, ha, fontsize=8):
    return ax.text(x, y, text, ha=ha, va="center", fontsize=fontsize, bbox=FLOAT8_STYLE if float8_tag(text) else None)


def _flow_comms(ax, y, comms):
    lines = [c for c in comms.split(", ") if c] if comms else []
    if lines and not any(float8_tag(c) for c in lines):  # one collective per line, in the right margin
        return [ax.text(1.0, y, comms.replace(", ", "\n"), ha="left", va="center", fontsize=8, color=COMM_COLOR)]
    texts = []
    for j, c in enumerate(lines):  # one text per collective, the float8 ones boxed and tagged
        yj = y + 0.22 * ((len(lines) - 1) / 2 - j)
        f8 = float8_tag(c)
        texts += [ax.text(1.0, yj, f"{c}  1 B/elem" if f8 else c, ha="left", va="center", fontsize=8,
                          color="black" if f8 else COMM_COLOR, bbox=FLOAT8_STYLE if f8 else None)]
    return texts


def _each(texts):
    """One text for a row of side-by-side modules: the shared one, or each module's on its own line."""
    texts = list(texts)
    return texts[0] if len(set(texts)) == 1 else "\n".join(texts)


def draw_flow(steps, title=None, comm_header=None):
    """The layouts through a model: ``steps`` is a list of ``(module, input layout, output
    layout, collectives)`` rows (strings), top to bottom, e.g. from a traced forward; an arrow
    leads from each module to the next.

    A step may also be a **list** of such rows: modules that read the same input side by side
    (``wq``, ``wk``, ``wv``). They are drawn as boxes in one row, each fed by an arrow from the
    step above (a fan-out) and each leading to the step below (a fan-in); their input is written
    once when they share it, and an output or collectives they share is written once with
    ``(each)``. A row whose three texts are empty is a step that is not a module (the attention
    core: functions): a dashed box, its name in italics.

    A layout or a collective naming a float8 format (``e4m3``, ``e5m2``, ``float8_e4m3fn``...)
    is drawn in a gold dashed box (:data:`FLOAT8_STYLE`); a float8 collective is tagged
    ``1 B/elem``, and a note under the rows says what the box means. ``comm_header`` (e.g.
    ``"collectives"``) heads the right-hand column, so its texts do not float unexplained.
    """
    levels = [list(step) if isinstance(step, list) else [tuple(step)] for step in steps]
    n = len(levels)
    any_float8 = any(float8_tag(text) for level in levels for row in level for text in row[1:])
    fig, ax = plt.subplots(figsize=(9, 0.9 * n + 0.8 + (0.3 if any_float8 else 0)))
    ax.axis("off")
    centres, outs, comm_texts = [], [], []  # per level, the x of each box's centre; the right-hand texts
    for i, level in enumerate(levels):
        y, k = n - i - 0.5, len(level)
        width = (0.4 - 0.03 * (k - 1)) / k
        xs = [0.3 + j * (width + 0.03) for j in range(k)]
        centres.append([x + width / 2 for x in xs])
        for x, (module, layout_in, layout_out, comms) in zip(xs, level):
            note = not (layout_in or layout_out or comms)
            ax.add_patch(Rectangle((x, y - 0.3), width, 0.6, facecolor="white" if note else "#E8EEF7",
                                   edgecolor="black", linestyle="--" if note else "-"))
            ax.text(x + width / 2, y, module, ha="center", va="center", fontsize=9 if k == 1 else 8,
                    weight="normal" if note else "bold", style="italic" if note else "normal")
        _flow_text(ax, 0.28, y, _each(row[1] for row in level), "right")
        out, comms = _each(row[2] for row in level), _each(row[3] for row in level)
        shared = k > 1 and len({row[2] for row in level}) == 1
        outs.append(_flow_text(ax, 0.72, y, f"{out}  (each)" if shared and out else out, "left"))
        comm_texts += _flow_comms(ax, y, ", ".join(f"{c} (each)" for c in comms.split(", ")) if k > 1 and comms and
                                  len({row[3] for row in level}) == 1 else comms)
    for i in range(n - 1):  # every box of a step to every box of the next: what runs next
        y = n - i - 0.5
        for a, xa in enumerate(centres[i]):
            for b, xb in enumerate(centres[i + 1]):
                one = len(centres[i]) == len(centres[i + 1]) == 1
                gid = f"flow {i}->{i + 1}" if one else f"flow {i}.{a}->{i + 1}.{b}"
                ax.add_patch(FancyArrowPatch((xa, y - 0.3), (xb, y - 0.7), arrowstyle="-|>", mutation_scale=10,
                                             color="black", lw=0.8, gid=gid))
    if comm_header:  # above the top row, moved with the column
        comm_texts.append(ax.text(1.0, n + 0.05, comm_header, ha="left", va="bottom", fontsize=9, weight="bold",
                                  color=COMM_COLOR, gid="comm header"))
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.45 if any_float8 else 0, n + (0.35 if comm_header else 0))
    if any_float8:
        ax.text(0.5, -0.3, "float8 (e4m3 forward, e5m2 gradients): 1 byte per element", ha="center", va="center",
                fontsize=8, bbox=FLOAT8_STYLE)
    ax.set_title(title or "layouts in -> module -> layouts out   (collectives in dark red)", fontsize=10)
    fig.tight_layout()
    _clear_columns(fig, ax, outs, comm_texts)
    return fig


def _clear_columns(fig, ax, outs, comm_texts, gap_px=14):
    """Labels never overlap: the collectives' column moves right of the widest output label (the figure widens
    by as much), and a frameless margin keeps the boxed labels' frames off the figure's edge."""
    for _ in range(3):
        renderer = fig.canvas.get_renderer()
        ext = lambda t: (t.get_bbox_patch() or t).get_window_extent(renderer)  # noqa: E731  the frame, if boxed
        fig.canvas.draw()
        right = max((ext(t).x1 for t in outs if t.get_text()), default=None)
        left = min((ext(t).x0 for t in comm_texts), default=None)
        if right is None or left is None or left - right >= gap_px:
            break
        dx = right + gap_px - left  # pixels
        for t in comm_texts:
            t.set_x(t.get_position()[0] + dx / ax.bbox.width)
        fig.set_size_inches(fig.get_figwidth() + dx / fig.dpi, fig.get_figheight())
        fig.tight_layout()
    fig.canvas.draw()
    framed = [t.get_bbox_patch().get_window_extent(fig.canvas.get_renderer()) for t in ax.texts if t.get_bbox_patch()]
    if framed:  # bbox_inches="tight" crops to the texts, not their frames: an invisible line spanning the frames
        x0, x1 = min(b.x0 for b in framed) - gap_px, max(b.x1 for b in framed) + gap_px
        inv = ax.transAxes.inverted()
        (a0, _), (a1, _) = inv.transform((x0, 0)), inv.transform((x1, 0))
        ax.plot([a0, a1], [0.5, 0.5], transform=ax.transAxes, linewidth=0, clip_on=False, gid="margin")


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


def draw_relative_differences(curves, title=None, floor=1e-17):
    """``curves[label] = (values per step, marker, colour)``: the relative loss differences on a log scale, one
    line each; a difference of 0 is drawn at ``floor``."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for label, (values, marker, color) in curves.items():
        ax.semilogy([max(v, floor) for v in values], marker + "-", color=color, markeredgecolor="black",
                    markersize=4, label=label)
    ax.set(xlabel="training step", ylabel=f"|relative loss difference|\n(0 shown as {floor:g})")
    ax.set_title(title or "relative loss differences", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def draw_grad_sync_order(timeline, norms, groups, title=None, last_label=None):
    """A backward's collectives in the order one rank issued them (not to scale in time), on two lanes: its TP
    group above, its DP group below. ``timeline`` lists ``(index, "tp" | "dp", op, module, params)``: a DP
    record is one DDP bucket, ``params`` the parameters it carries. A norm weight's all-reduce (``module`` in
    ``norms``) is a black diamond named above; a DDP bucket's all-reduce is a black triangle on the DP lane; a
    dotted line joins a norm weight's all-reduce to the bucket that carries that weight across. The legend names
    each marker. ``groups = {"tp": [...], "dp": [...]}``, the rank's two groups. ``last_label``, if given, is
    written to the right of the TP lane's last record (the row's last collective), with an arrow to it."""
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(9, 3.1))
    lanes = {"tp": 1, "dp": 0}
    kinds = {  # (lane, op, a norm weight?) -> (marker, colour, legend label)
        ("tp", "all_gather", False): ("o", "lightgray", "all-gather (TP)"),
        ("tp", "reduce_scatter", False): ("s", "lightgray", "reduce-scatter (TP)"),
        ("tp", "all_reduce", False): ("D", "lightgray", "all-reduce (TP)"),
        ("tp", "all_reduce", True): ("D", "black", "norm weight's all-reduce (TP)"),
        ("dp", "all_reduce", False): ("^", "black", "DDP bucket's all-reduce (DP)"),
    }
    at = {module: k for k, (_, _, _, module, _) in enumerate(timeline) if module in norms}
    seen = []
    for k, (_, grp, op, module, params) in enumerate(timeline):
        norm = grp == "tp" and module in norms
        kind = kinds.get((grp, op, norm), ("x", "black", f"{op} ({grp.upper()})"))
        if kind not in seen:
            seen.append(kind)
        ax.plot(k, lanes[grp], kind[0], color=kind[1], markeredgecolor="black" if kind[1] == "black" else "gray",
                markersize=9)
        for p in params:
            if p in norms:
                ax.plot([at[p], k], [1, 0], ":", color="black", linewidth=1)
        if grp == "dp":
            ax.text(k, -0.3, f"{len(params)} grads", ha="center", va="top", fontsize=8)
        if norm:
            short = "\n".join(module.removesuffix(".weight").rsplit(".", 1))  # the module path as written, two lines
            ax.text(k, 1.25, short, ha="center", va="bottom", fontsize=8)
    if last_label:
        last = max(k for k, (_, grp, *_rest) in enumerate(timeline) if grp == "tp")
        ax.annotate(last_label, (last, 1), xytext=(last + 0.5, 0.6), ha="left", va="center", fontsize=8,
                    arrowprops=dict(arrowstyle="->", color="black", linewidth=0.8), gid="last tp")
        left, right = ax.get_xlim()
        ax.set_xlim(left, max(right, left + (last + 0.5 - left) / 0.78))  # the label's 22 % of the width
    handles = [Line2D([], [], linestyle="", marker=m, color=c, markeredgecolor="black" if c == "black" else "gray",
                      markersize=8, label=label) for m, c, label in seen]
    if any(p in norms for *_, params in timeline for p in params):
        handles.append(Line2D([], [], linestyle=":", color="black", label="carries that norm weight across"))
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False)
    ax.set_yticks([0, 1], [f"DP group {groups['dp']}\n(DDP buckets)", f"TP group {groups['tp']}"], fontsize=9)
    ax.set_ylim(-0.8, 1.9)
    ax.set_xlabel("backward collectives in the order the rank issued them, not to scale in time", fontsize=8)
    ax.set_xticks([])
    ax.set_title(title or "when each gradient becomes whole, and when DDP sends it across", fontsize=10)
    fig.tight_layout()
    return fig

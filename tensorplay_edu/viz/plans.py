"""Pictures of whole-model plans (notebooks 06, 06b and 12): how far a plan's losses are from one
process's, what the package costs against the hand-written floor, and where ``f`` and ``f\u0304``
sit in a Hugging Face decoder layer under HF's own plan.  Each function returns the Figure.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Circle, Patch, Rectangle

from .style import COMM_COLOR

PLAN_COLORS = {"apply_tp": "#1b9e77", "vanilla": "#d95f02", "full": "#7570b3"}  # plans, not ranks
LOSS_GAP_FLOOR = 1e-18  # where an exact 0 is drawn on the log axis (a log axis has no 0)
TURNS_COLOR = "#5A5A5A"  # ours/hand taken in turns (not a rank colour)
SPLIT_COLOR = "#D6E6F5"  # a module split over the ranks (draw_hf_layer)


def draw_loss_gaps(gaps, ref_losses, bound: float = 1e-12, title=None):
    """``|loss - single device|`` at every step, one colour per plan (``gaps``: {plan: [gap per step]}), on a
    log axis: the grey line is one float64 unit in the last place of the loss (``math.ulp``), the dotted line
    the check's ``bound``; an exact 0 (no place on a log axis) is a hollow triangle on the bottom edge."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    steps = range(len(ref_losses))
    ax.plot(steps, [math.ulp(x) for x in ref_losses], color="gray", linewidth=2, alpha=0.6,
            label="one float64 step at the loss (ulp)")
    n = len(gaps)
    for k, (name, gap) in enumerate(gaps.items()):
        color = PLAN_COLORS.get(name, f"C{k}")
        xs = [i + (k - (n - 1) / 2) * 0.15 for i in steps]  # the plans side by side at each step
        ax.plot([x for x, d in zip(xs, gap) if d > 0], [d for d in gap if d > 0], "o", color=color, markersize=5,
                label=name)
        zeros = [x for x, d in zip(xs, gap) if d == 0]
        ax.plot(zeros, [LOSS_GAP_FLOOR * 1.5] * len(zeros), "v", mfc="none", color=color, markersize=6, clip_on=False)
    ax.plot([], [], "v", mfc="none", color="gray", label="exactly 0 (hollow, bottom edge)")
    ax.axhline(bound, color="black", linestyle=":", linewidth=1)
    ax.text(len(ref_losses) - 1, bound * 1.6, f"the check's bound, {bound:g}", ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(LOSS_GAP_FLOOR, bound * 100)
    ax.set(xlabel="training step", ylabel="|loss - single device|")
    ax.set_title(title or "each plan's loss against one process: rounding, or exactly 0 (bottom)", fontsize=10)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    return fig


def draw_overhead_ratios(rows, title=None):
    """The package's step time over the hand-written floor's, one row per configuration, top to bottom in the
    order given.  ``rows``: dicts with ``label`` (the configuration), ``ratio`` (ours/hand, taken in turns) and
    ``interval`` (its 95 % interval, ``(low, high)``), optionally ``apart`` and ``apart range`` (the ratio with
    each launched on its own, and its range).  A bar runs from 1 (the hand-written step) to the ratio, its
    interval drawn as an error bar; the ratio launched apart is a hollow diamond on a thin line (its range)
    just below it."""
    rows = list(rows)
    n = len(rows)
    fig, ax = plt.subplots(figsize=(9, 0.55 * n + 2.0))
    for y, r in enumerate(rows):
        low, high = r["interval"]
        ax.barh(y - 0.1, r["ratio"] - 1, left=1, height=0.42, color=TURNS_COLOR, edgecolor="black", linewidth=0.6)
        ax.errorbar(r["ratio"], y - 0.1, xerr=[[r["ratio"] - low], [high - r["ratio"]]], fmt="none", ecolor="black",
                    capsize=3, linewidth=1)
        ax.text(high + 0.006, y - 0.1, f"{r['ratio']:.3f}", va="center", fontsize=8)
        if r.get("apart") is not None:
            a_low, a_high = r.get("apart range", (r["apart"], r["apart"]))
            ax.plot([a_low, a_high], [y + 0.27] * 2, color="black", linewidth=0.8)
            ax.plot(r["apart"], y + 0.27, "D", mfc="white", mec="black", markersize=5)
    ax.axvline(1, color="black", linewidth=1)
    ax.set_yticks(range(n), [r["label"] for r in rows], fontsize=8)
    ax.set_ylim(n - 0.5, -0.6)
    ax.set_xlabel("step time, ours / hand-written (1 = the hand-written step; right of it: ours slower)")
    fig.legend([Patch(facecolor=TURNS_COLOR, edgecolor="black"),
               Line2D([], [], color="black", marker="|", linestyle="none", markersize=8),
               Line2D([], [], color="black", marker="D", mfc="white", linewidth=0.8)],
               ["in turns, median of the per-step ratios", "its 95 % interval", "launched apart, and its range"],
               fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=3, frameon=False)  # under the title
    fig.suptitle(title or "what the package costs: ours over the hand-written step", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return fig


def draw_hf_layer(title=None):
    """One Hugging Face decoder layer under HF's own plan: the norms and the residual add whole on every rank
    (grey), the Linears and the attention / SiLU core split over the ranks (blue), an ``f`` in front of every
    ``"colwise"`` Linear (5 a layer) and a ``g`` after each ``"rowwise"`` one (red circles).

    The residual stream is drawn as the data flows: the layer's input ``x`` feeds ``input_layernorm`` and, by
    the line over the top, the first ``+ residual``; that sum ``h`` feeds ``post_attention_layernorm`` (the
    line between the halves) and, straight down, the second ``+ residual``, whose sum is the layer's output.
    Each skip line is tagged ``residual_x`` / ``residual_h`` (its ``gid``) for the tests."""
    fig, ax = plt.subplots(figsize=(10, 3.6))
    ax.set_axis_off()
    ax.set(xlim=(-1.25, 11.2), ylim=(-0.65, 3.75))

    def box(x, y, text, color, w=1.3):
        ax.add_patch(Rectangle((x - w / 2, y - 0.22), w, 0.44, facecolor=color, edgecolor="black", lw=0.8))
        ax.text(x, y, text, ha="center", va="center", fontsize=8)

    def comm(x, y, letter):
        ax.add_patch(Circle((x, y), 0.17, facecolor=COMM_COLOR, edgecolor="black", lw=0.8))
        ax.text(x, y, letter, ha="center", va="center", fontsize=9, fontweight="bold", color="white")

    def arrow(x0, y0, x1, y1):
        ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", lw=0.8, shrinkA=0, shrinkB=0))

    whole = "#EEEEEE"
    for y0, norm, readers, core, last in (
            (2.55, "input_layernorm", ("q_proj", "k_proj", "v_proj"), "attention\nH/t, K/t heads", "o_proj"),
            (0.55, "post_attention_\nlayernorm", ("gate_proj", "up_proj"), "SiLU(gate) * up\nits hidden units",
             "down_proj")):
        box(0.75, y0, norm, whole, w=1.5)
        ys = [y0 + 0.55 * (len(readers) - 1) / 2 - 0.55 * k for k in range(len(readers))]
        for y, name in zip(ys, readers):
            arrow(1.5, y0, 2.05, y)
            comm(2.25, y, "f")
            arrow(2.42, y, 2.85, y)
            box(3.55, y, f'{name}\n"colwise"', SPLIT_COLOR)
            arrow(4.2, y, 4.95, y0)
        box(5.7, y0, core, SPLIT_COLOR, w=1.5)
        arrow(6.45, y0, 6.85, y0)
        box(7.55, y0, f'{last}\n"rowwise"', SPLIT_COLOR)
        arrow(8.2, y0, 8.55, y0)
        comm(8.75, y0, r"$\bar{f}$")
        arrow(8.92, y0, 9.45, y0)
        box(9.9, y0, "+ residual", whole, w=0.9)
        ax.text(10.45, y0, ("h" if y0 > 1 else "out") + ": whole\n[b, s, h]", va="center", fontsize=8)

    def path(points, gid):  # a polyline whose last segment ends in an arrow head
        ax.add_line(Line2D([p[0] for p in points[:-1]], [p[1] for p in points[:-1]], lw=0.8, color="black", gid=gid))
        arrow(*points[-2], *points[-1])

    ax.text(-1.2, 2.55, "x: whole\n[b, s, h]", va="center", fontsize=8)             # the layer's input
    arrow(-0.45, 2.55, 0.0, 2.55)
    path([(-0.3, 2.55), (-0.3, 3.45), (9.9, 3.45), (9.9, 2.77)], "residual_x")     # x + attention's output
    ax.text(5.0, 3.5, "residual: x, whole, no communication", ha="center", fontsize=7)
    path([(9.9, 2.33), (9.9, 0.77)], "residual_h")                                  # h + the MLP's output
    path([(9.9, 1.45), (-0.3, 1.45), (-0.3, 0.55), (0.0, 0.55)], "h_to_norm")       # h into the second norm
    ax.text(5.0, 1.5, "h, whole, into the second half", ha="center", fontsize=7)
    ax.text(0.05, -0.2, "f: identity forward; backward, the all-reduce of the input gradient (HF's plan: one per "
            "Colwise Linear, 5 a layer)", fontsize=8)
    ax.text(0.05, -0.5, r"$\bar{f}$: the all-reduce of the partial sums forward; identity backward", fontsize=8)
    ax.legend([Rectangle((0, 0), 1, 1, fc=SPLIT_COLOR, ec="black"), Rectangle((0, 0), 1, 1, fc=whole, ec="black")],
              ["split over the t ranks", "whole on every rank"], fontsize=8, loc="lower right", ncol=2)
    ax.set_title(title or "an HF decoder layer under its own plan: where f and $\\bar{f}$ sit", fontsize=10)
    return fig

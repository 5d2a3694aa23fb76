"""Pictures of whole-model plans (notebooks 06 and 06b): how far a plan's losses are from one process's,
and what the package costs against the hand-written floor (an HF decoder layer's plan: :mod:`.hf_layer`).
Each function returns the Figure.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch


PLAN_COLORS = {"apply_tp": "#1b9e77", "vanilla": "#d95f02", "full": "#7570b3"}  # plans, not ranks
LOSS_GAP_FLOOR = 1e-18  # where an exact 0 is drawn on the log axis (a log axis has no 0)
TURNS_COLOR = "#5A5A5A"  # ours/hand taken in turns (not a rank colour)


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

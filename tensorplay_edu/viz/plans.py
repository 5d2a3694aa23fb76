"""A picture of whole-model plans (notebook 06b): what the package costs against the hand-written floor (an HF
decoder layer's plan: :mod:`.hf_layer`). It returns the Figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

TURNS_COLOR = "#5A5A5A"  # ours/hand taken in turns (not a rank colour)


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

"""What TP adds to a step on a CPU (notebook 07b §3): the prediction stacked in its parts (ring steps at α, bytes at
β, the rest) beside the overhead measured, its median and the range of its rounds.

The function takes numbers already computed (seconds) and only draws them, in ms; the stacked bars carry gids
(``"<part> <i>"``: ``alpha``, ``beta``, ``other``) so that tests can read them back.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

__all__ = ["OVERHEAD_PARTS", "draw_overhead_parts"]

OVERHEAD_PARTS = {"alpha": ("#4C72B0", "predicted: ring steps x α (36 at every width)"),
                  "beta": ("#DD8452", "predicted: bytes x β"),
                  "other": ("#BBBBBB", "predicted: the plan's own work + thinner matmuls (red, dashed: < 0, subtracted)")}


def draw_overhead_parts(labels, alpha, beta, other, measured, low, high, title=None, floor=None):
    """One column per width (``labels``): the prediction as stacked bars, α's part at the bottom, then β's, then the
    other parts (when negative: drawn down from there as an empty, red, dashed box labelled "−", a subtraction the
    dash sits under), a black dash at the whole prediction; a dot for the
    measured overhead (the rounds' median) with a bar through the rounds' range (``low`` to ``high``). All arguments
    in seconds, one per label; drawn in ms. The y axis starts at 0, or below the lowest round when one is negative;
    ``floor`` (seconds, negative) clips it there, and a range that reaches below is marked with its low end, off scale."""
    x = list(range(len(labels)))
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    bottom = [0.0] * len(x)
    for part, values in (("alpha", alpha), ("beta", beta), ("other", other)):
        color, label = OVERHEAD_PARTS[part]
        bars = ax.bar(x, [v * 1e3 for v in values], width=0.55, bottom=bottom, color=color, edgecolor="black",
                      linewidth=0.5, label=label)
        for i, bar in enumerate(bars):
            bar.set_gid(f"{part} {i}")
            if values[i] < 0:  # a subtraction: an empty box down from the stack's top, to the dash
                bar.set(facecolor="none", edgecolor="#C44E52", linestyle="--", linewidth=1.2, hatch="///")
                ax.annotate(f"−{-values[i] * 1e3:.0f} ms", (x[i] + 0.3, bottom[i] + values[i] * 5e2), color="#C44E52",
                            fontsize=9, va="center", ha="left", fontweight="bold")
        bottom = [b + v * 1e3 for b, v in zip(bottom, values)]
    ax.hlines(bottom, [i - 0.35 for i in x], [i + 0.35 for i in x], color="black", linewidth=2.5,
              label="predicted: the whole", gid="predicted")
    med = [m * 1e3 for m in measured]
    ax.errorbar(x, med, yerr=[[m - lo * 1e3 for m, lo in zip(med, low)], [hi * 1e3 - m for m, hi in zip(med, high)]],
                fmt="o", color="black", markersize=7, capsize=4, label="measured (median, range of the rounds)")
    ax.set_xticks(x, list(labels))
    lowest = min([0.0] + [lo * 1e3 for lo in low])  # a round's overhead can come out below zero: keep its bar whole
    if floor is not None and lowest < floor * 1e3:  # one outlier would set the scale: clip, and say where it went
        lowest = floor * 1e3 / 1.1
        for i, lo in enumerate(low):
            if lo * 1e3 < lowest:
                ax.annotate(f"↓ {lo * 1e3:.0f} ms, off scale", (x[i] + 0.08, lowest * 1.02), fontsize=8, va="bottom")
    if lowest < 0:
        ax.axhline(0, color="black", linewidth=0.6)
    ax.set(ylabel="ms per step", ylim=(1.1 * lowest, None), title=title or "What TP 2 adds to a step on this CPU")
    label_lines = max(str(label).count("\n") + 1 for label in labels)  # room under two-line tick labels
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.04 - 0.07 * label_lines), frameon=False)
    fig.tight_layout()
    return fig

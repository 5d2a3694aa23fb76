"""Async TP against published runs: the modelled and measured gains of each pair (notebook 10c, section 3).

One row per pair of runs with and without async TP, two bars: the step model's gain (speed-up - 1, gid ``"ours"``)
and the published one (gid ``"theirs"``), in percent.
"""

import matplotlib.pyplot as plt

__all__ = ["draw_async_tp_gaps"]

OURS, THEIRS = "#1f5f6a", "#e08a3c"


def draw_async_tp_gaps(gains: dict, title: str = ""):
    """``gains``: {pair: (ours, theirs)} as fractions. Returns the figure (one axis)."""
    names = list(gains)
    fig, ax = plt.subplots(figsize=(6.6, 0.5 * len(names) + 1.8))
    for j, (gid, color, offset) in enumerate((("ours", OURS, -0.2), ("theirs", THEIRS, 0.2))):
        values = [100 * gains[name][j] for name in names]
        bars = ax.barh([y + offset for y in range(len(names))], values, height=0.38, color=color,
                       label="the step model" if gid == "ours" else "torchtitan, measured")
        for bar in bars:
            bar.set_gid(gid)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("async TP's gain, speed-up - 1 (%)")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("gain per pair of runs", fontsize=9, loc="left")
    if title:
        fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    return fig

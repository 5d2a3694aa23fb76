"""Async TP against published runs: the modelled and measured gains of each pair, and the gap against the ring
steps (notebook 10c, section 4).

Left: one row per pair of runs with and without async TP, two bars: the step model's gain (speed-up - 1, gid
``"ours"``) and the published one (gid ``"theirs"``), in percent. Right: each pair's gap (the model's saving minus
the published one, ms per optimizer step) against ``n``, its ring steps per optimizer step and GPU, one dot each,
with the line ``gap = c n`` of a per-ring-step overhead ``c`` fitted through 0 (gid ``"c n"``). Pairs at one ``n``
stack vertically: what a fit through them can and cannot tell.
"""

import matplotlib.pyplot as plt

__all__ = ["draw_async_tp_gaps"]

OURS, THEIRS = "#1f5f6a", "#e08a3c"


def draw_async_tp_gaps(gains: dict, gaps: dict | None = None, c: float | None = None, title: str = "",
                       k_gaps: dict | None = None, k: float | None = None):
    """``gains``: {pair: (ours, theirs)} as fractions; ``gaps``: {pair: (n, gap in seconds)}; ``c``: seconds per
    ring step. ``k_gaps`` (optional): {pair: gap in seconds} the other fit, ``gap = k ours``, predicts, drawn as
    crosses (gid ``"k ours"``), just left of their n, with ``k`` in the legend. Returns the figure (two axes; one,
    the gains, when ``gaps`` is None)."""
    names = list(gains)
    if gaps is None:
        fig, left = plt.subplots(figsize=(6.6, 0.5 * len(names) + 1.8))
    else:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.5 * len(names) + 1.8), width_ratios=(1.1, 1))
    for j, (gid, color, offset) in enumerate((("ours", OURS, -0.2), ("theirs", THEIRS, 0.2))):
        values = [100 * gains[name][j] for name in names]
        bars = left.barh([y + offset for y in range(len(names))], values, height=0.38, color=color,
                         label="the step model" if gid == "ours" else "torchtitan, measured")
        for bar in bars:
            bar.set_gid(gid)
    left.set_yticks(range(len(names)), names, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("async TP's gain, speed-up - 1 (%)")
    left.legend(fontsize=8, loc="lower right")
    left.set_title("gain per pair of runs", fontsize=9, loc="left")
    if gaps is None:
        if title:
            fig.suptitle(title, fontsize=10, x=0.01, ha="left")
        fig.tight_layout()
        return fig
    ns = [gaps[name][0] for name in gaps]
    right.scatter(ns, [1e3 * gaps[name][1] for name in gaps], color=OURS, zorder=3, gid="pairs")
    for name, (n, gap) in gaps.items():
        right.annotate(name.split(",")[0] + (", float8" if "float8" in name else "") + (" (Dec 2024)" if "2024" in name else ""),
                       (n, 1e3 * gap), xytext=(6, 0), textcoords="offset points", fontsize=7, va="center")
    top = 1.15 * max(ns)
    (line,) = right.plot([0, top], [0, 1e3 * c * top], color="grey", ls="--", label=f"gap = c n, c = {c * 1e6:.0f} µs (fit through 0, illustrative)")
    line.set_gid("c n")
    if k_gaps:
        shift = 0.04 * top                                  # drawn just left of their n, so as not to hide the dots
        right.scatter([gaps[name][0] - shift for name in k_gaps], [1e3 * g for g in k_gaps.values()], marker="x",
                      color="grey", zorder=3, gid="k ours", label=f"gap = k × ours, k = {k:.0%} (fit through 0; drawn left of n)")
    right.axhline(0, color="black", lw=0.6)
    right.set_xlim(0, top)
    right.set_xlabel("ring steps per optimizer step and GPU, n")
    right.set_ylabel("gap: model's saving - measured (ms)")
    right.legend(fontsize=8, loc="upper left")
    right.set_title("the gap against n: two values of n only", fontsize=9, loc="left")
    if title:
        fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    return fig

"""One Hugging Face decoder layer under a tensor-parallel plan (notebook 12b), drawn from one function:
HF's own plan, where every ``"colwise"`` Linear pays its own ``f``, or the fixed plan, where one
``PrepareModuleInput`` per half puts a single ``f`` in front of all of that half's readers.

What it draws, left to right in each half: the norm (whole on every rank, grey), the ``f`` circles (red),
the colwise readers and the attention / SiLU core (split over the ranks, blue), the rowwise Linear, its
``f\u0304`` and the ``+ residual`` add (grey).  The residual stream runs as the data flows: the layer's input
``x`` skips over the first half into its add; that sum ``h`` feeds the second norm and, straight down, the
second add.  Every label fits inside its box (``tests/test_viz_hf_layer.py`` measures them).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Circle, Rectangle

from .style import COMM_COLOR

__all__ = ["draw_layer_plan", "SPLIT_COLOR", "WHOLE_COLOR"]

SPLIT_COLOR = "#D6E6F5"  # a module split over the ranks
WHOLE_COLOR = "#EEEEEE"  # a module whole on every rank
HALVES = ((2.55, "input_layernorm", ("q_proj", "k_proj", "v_proj"), "attention\nH/t, K/t heads", "o_proj"),
          (0.55, "post_attention_layernorm", ("gate_proj", "up_proj"), "SiLU(gate) * up\nits hidden units",
           "down_proj"))
NORM_X, NORM_W = 1.15, 2.3       # the norm box: x from 0.0 to 2.3
READER_X, CORE_X, ROW_X, RES_X = 4.25, 6.45, 8.35, 10.75
RES_W, CORE_W = 1.2, 1.8


def draw_layer_plan(fixed: bool = False, title: str | None = None):
    """The layer under HF's plan (``fixed=False``: an ``f`` before each of the 5 colwise Linears) or under
    the fixed plan (``fixed=True``: one ``f`` per half, on the norm's output before it fans out, 2 a layer).
    Both have one ``f\u0304`` after each rowwise Linear.  Returns the Figure; its circles carry the gid
    ``"f"`` or ``"fbar"``, the skip lines ``residual_x``, ``h_to_norm``, ``residual_h``."""
    fig, ax = plt.subplots(figsize=(10.8, 3.6))
    ax.set_axis_off()
    ax.set(xlim=(-1.25, 12.25), ylim=(-0.65, 3.75))

    def box(x, y, text, color, w=1.3, size=8):
        ax.add_patch(Rectangle((x - w / 2, y - 0.24), w, 0.48, facecolor=color, edgecolor="black", lw=0.8))
        ax.text(x, y, text, ha="center", va="center", fontsize=size, gid="label")

    def comm(x, y, letter, gid):
        ax.add_patch(Circle((x, y), 0.17, facecolor=COMM_COLOR, edgecolor="black", lw=0.8, zorder=3, gid=gid))
        ax.text(x, y, letter, ha="center", va="center", fontsize=9, fontweight="bold", color="white", zorder=4)

    def arrow(x0, y0, x1, y1):
        ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", lw=0.8, shrinkA=0, shrinkB=0))

    left = READER_X - 0.65                                              # the readers' left edge
    for y0, norm, readers, core, last in HALVES:
        box(NORM_X, y0, norm, WHOLE_COLOR, w=NORM_W, size=7.5)
        ys = [y0 + 0.55 * (len(readers) - 1) / 2 - 0.55 * k for k in range(len(readers))]
        if fixed:                                                       # one f, then the fan-out
            arrow(NORM_X + NORM_W / 2, y0, 2.58, y0)
            comm(2.75, y0, "f", "f")
            for y in ys:
                arrow(2.92, y0, left, y)
        for y, name in zip(ys, readers):
            if not fixed:                                               # an f in front of every reader
                arrow(NORM_X + NORM_W / 2, y0, 2.9, y)
                comm(3.07, y, "f", "f")
                arrow(3.24, y, left, y)
            box(READER_X, y, f'{name}\n"colwise"', SPLIT_COLOR)
            arrow(READER_X + 0.65, y, CORE_X - CORE_W / 2, y0)
        box(CORE_X, y0, core, SPLIT_COLOR, w=CORE_W, size=7.5)
        arrow(CORE_X + CORE_W / 2, y0, ROW_X - 0.65, y0)
        box(ROW_X, y0, f'{last}\n"rowwise"', SPLIT_COLOR)
        arrow(ROW_X + 0.65, y0, 9.28, y0)
        comm(9.45, y0, r"$\bar{f}$", "fbar")
        arrow(9.62, y0, RES_X - RES_W / 2, y0)
        box(RES_X, y0, "+ residual", WHOLE_COLOR, w=RES_W)
        ax.text(RES_X + RES_W / 2 + 0.08, y0, ("h" if y0 > 1 else "out") + ": whole\n[b, s, h]", va="center", fontsize=8)

    def path(points, gid):  # a polyline whose last segment ends in an arrow head
        ax.add_line(Line2D([p[0] for p in points[:-1]], [p[1] for p in points[:-1]], lw=0.8, color="black", gid=gid))
        arrow(*points[-2], *points[-1])

    ax.text(-1.2, 2.55, "x: whole\n[b, s, h]", va="center", fontsize=8)             # the layer's input
    arrow(-0.45, 2.55, 0.0, 2.55)
    path([(-0.3, 2.55), (-0.3, 3.45), (RES_X, 3.45), (RES_X, 2.79)], "residual_x")   # x + attention's output
    ax.text(5.3, 3.5, "residual: x, whole, no communication", ha="center", fontsize=7)
    path([(RES_X, 2.31), (RES_X, 0.79)], "residual_h")                                # h + the MLP's output
    path([(RES_X, 1.45), (-0.3, 1.45), (-0.3, 0.55), (0.0, 0.55)], "h_to_norm")       # h into the second norm
    ax.text(5.3, 1.5, "h, whole, into the second half", ha="center", fontsize=7)
    what = ("the input gradient, its readers' summed first: one per PrepareModuleInput, 2 a layer" if fixed
            else "each colwise Linear's own partial input gradient: HF's plan, 5 a layer")
    ax.text(0.05, -0.2, f"f: identity forward; backward, the all-reduce of {what}", fontsize=8)
    ax.text(0.05, -0.5, r"$\bar{f}$: the all-reduce of the partial sums forward; identity backward", fontsize=8)
    ax.legend([Rectangle((0, 0), 1, 1, fc=SPLIT_COLOR, ec="black"), Rectangle((0, 0), 1, 1, fc=WHOLE_COLOR, ec="black")],
              ["split over the t ranks", "whole on every rank"], fontsize=8, loc="lower right", ncol=2)
    default = ("the same layer under the fixed plan: one f per half, at its PrepareModuleInput" if fixed
               else "an HF decoder layer under its own plan: where f and $\\bar{f}$ sit")
    ax.set_title(title or default, fontsize=10)
    return fig

"""Two pictures of notebook 01 that show values and tiles, not only layouts.

``draw_addends`` writes a ``Partial`` out with numbers: each rank's addend is a small grid of its values,
hatched in the rank's colour, and the grids are joined by "+" into the tensor they sum to, drawn grey (whole
on every rank after ``full_tensor()``).  The learner sees that different addends, not copies, make ``X``.

``draw_all_to_all`` draws ``Shard(0) -> Shard(1)`` as the all-to-all it is: the global tensor cut into a
t x t grid of tiles; tile (i, j) sits on rank i before (its row block) and on rank j after (its column
block).  Left, each tile is coloured by the rank it goes *to*; right, by the rank that holds it.  Rank i
keeps its diagonal tile and sends the t - 1 others: (t - 1)/t of its own 1/t of the tensor.

Both return the matplotlib Figure; every tile is a Rectangle whose gid names it (``addend r`` /
``sum``, ``before i->j`` / ``after i->j``), so tests can read what was drawn.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

from .style import PARTIAL_HATCH, RANK_COLORS, SHARED_COLOR


def _grid(ax, values: torch.Tensor, x0: float, color: str, hatch: str | None, gid: str, title: str) -> float:
    # one small grid of numbers at x0 (one unit a cell), framed; returns its right edge
    rows, cols = values.shape
    ax.add_patch(Rectangle((x0, 0), cols, rows, facecolor=color, alpha=0.35, hatch=hatch, edgecolor=color,
                           linewidth=1.5, gid=gid))
    for i in range(rows):
        for j in range(cols):
            v = values[i, j].item()
            ax.text(x0 + j + 0.5, rows - i - 0.5, f"{v:g}", ha="center", va="center", fontsize=9)
    ax.text(x0 + cols / 2, rows + 0.35, title, ha="center", va="bottom", fontsize=9)
    return x0 + cols


def draw_addends(addends: list[torch.Tensor], title: str | None = None):
    """The addends of a ``Partial`` (rank r's is ``addends[r]``, all of one 2-D shape) written out with their
    values, hatched in each rank's colour, then "=" their sum in grey: the tensor the placement stands for."""
    rows, cols = addends[0].shape
    total = sum(addends)
    fig, ax = plt.subplots(figsize=(1.9 * (len(addends) + 1) * cols / 4 + 0.6, 1.0 + 0.45 * rows))
    x = 0.0
    for r, a in enumerate(addends):
        x = _grid(ax, a, x, RANK_COLORS[r % len(RANK_COLORS)], PARTIAL_HATCH, f"addend {r}", f"rank {r}'s addend")
        ax.text(x + 0.5, rows / 2, "=" if r == len(addends) - 1 else "+", ha="center", va="center", fontsize=14)
        x += 1.0
    _grid(ax, total, x, SHARED_COLOR, None, "sum", "the tensor: their sum")
    ax.set_xlim(-0.2, x + cols + 0.2)
    ax.set_ylim(-0.2, rows + 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or "Partial(): the addends differ; the tensor is their sum", fontsize=10)
    fig.tight_layout()
    return fig


def tile_moves(t: int) -> list[tuple[int, int]]:
    """The (source, destination) rank of each tile that an all-to-all of ``Shard(0) -> Shard(1)`` sends over t
    ranks: every (i, j) with i != j (tile (i, i) stays where it is)."""
    return [(i, j) for i in range(t) for j in range(t) if i != j]


def draw_all_to_all(t: int, title: str | None = None):
    """``Shard(0) -> Shard(1)`` over t ranks as tiles: left, rank i's row block cut into t tiles, each in the
    colour of the rank it is sent to; right, rank j's column block, each tile in the colour of its holder j,
    labelled with the rank it came from."""
    fig, axes = plt.subplots(1, 2, figsize=(2.2 * t / 2 + 4.4, 0.7 * t + 1.4))
    for ax, side in zip(axes, ("before", "after")):
        for i in range(t):
            for j in range(t):
                color = RANK_COLORS[j % len(RANK_COLORS)]
                y = t - 1 - i
                ax.add_patch(Rectangle((j, y), 1, 1, facecolor=color, alpha=0.25 if i == j else 0.7,
                                       edgecolor="black", linewidth=0.8, gid=f"{side} {i}->{j}"))
                if side == "before":
                    label = "stays" if i == j else f"to r{j}"
                else:
                    label = "kept" if i == j else f"from r{i}"
                ax.text(j + 0.5, y + 0.5, label, ha="center", va="center", fontsize=8)
        if side == "before":
            for i in range(t):                                    # row blocks: who holds them before
                ax.add_patch(Rectangle((0, t - 1 - i), t, 1, fill=False, edgecolor=RANK_COLORS[i % len(RANK_COLORS)],
                                       linewidth=2.5))
                ax.text(-0.15, t - 0.5 - i, f"rank {i}", ha="right", va="center", fontsize=9)
            ax.set_title("S(0): rank i holds row block i;\neach tile coloured by the rank it goes to", fontsize=9)
        else:
            for j in range(t):                                    # column blocks: who holds them after
                ax.add_patch(Rectangle((j, 0), 1, t, fill=False, edgecolor=RANK_COLORS[j % len(RANK_COLORS)],
                                       linewidth=2.5))
                ax.text(j + 0.5, t + 0.1, f"rank {j}", ha="center", va="bottom", fontsize=9)
            ax.set_title("S(1): rank j holds column block j;\neach tile labelled with the rank it came from", fontsize=9)
        ax.set_xlim(-1.2, t + 0.2)
        ax.set_ylim(-0.2, t + 0.6)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.suptitle(title or f"all-to-all over {t} ranks: each rank keeps 1 tile and sends {t - 1}, "
                 f"({t - 1}/{t} of its 1/{t} of the tensor)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig

"""A Partial written out with numbers (notebook 01): each rank's addend is a small grid of its values,
hatched in the rank's colour, and the grids are joined by "+" into the tensor they sum to, drawn grey (whole
on every rank after ``full_tensor()``).  The learner sees that different addends, not copies, make ``X``.
(An all-to-all's tiles: :mod:`.alltoall`.)

``draw_addends`` returns the matplotlib Figure; every grid is a Rectangle whose gid names it (``addend r`` /
``sum``), so tests can read what was drawn.
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

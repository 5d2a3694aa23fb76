"""What an all-to-all moves, piece by piece (notebook 00, section 3.4).

An all-to-all trades a split by rows for a split by columns. Before it, rank ``r`` holds row block ``r`` of ``B``
and cuts it into ``t`` pieces by columns; piece ``j`` goes to rank ``j``. After it, rank ``j`` holds column block
``j``, stacked from one piece of every rank. :func:`draw_all_to_all` colours every piece, before *and* after, by
the rank it came from (``RANK_COLORS[r]``), so the "after" side shows that each column is assembled from ``t``
sources; a thick frame and a label above each column name the rank that holds it afterwards.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from .style import RANK_COLORS

__all__ = ["draw_all_to_all"]


def draw_all_to_all(world_size: int = 4, shape=(8, 8), name: str = "B", mark_stays: bool = False):
    """Two panels of the tensor called ``name`` (``shape``, both dims divisible by ``world_size``): before, split by rows; after, split by
    columns. Piece ``(r, j)`` (row block ``r``, column block ``j``) is in rank ``r``'s colour on both sides: before it
    is labelled with where it goes (``-> j``), after with where it came from (``from r``). ``mark_stays``: hatch the
    diagonal pieces ``(r, r)``, which never leave their rank, and label them ``stays``. Returns the figure."""
    t, (n_rows, n_cols) = world_size, shape
    if n_rows % t or n_cols % t:
        raise ValueError(f"draw_all_to_all: shape {shape} must divide by world_size {t} in both dims")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for side, ax in zip(("before", "after"), axes):
        for r in range(t):              # row block r: rank r's rows before
            for j in range(t):          # column block j: rank j's columns after
                stays = mark_stays and r == j
                ax.add_patch(Rectangle((j / t, 1 - (r + 1) / t), 1 / t, 1 / t, facecolor=RANK_COLORS[r],
                                       edgecolor="black", linewidth=0.4, hatch="///" if stays else None,
                                       gid=f"{side} piece {r},{j}"))
                label = "stays" if stays else f"-> {j}" if side == "before" else f"from {r}"
                ax.text((j + 0.5) / t, 1 - (r + 0.5) / t, label, ha="center", va="center", fontsize=7,
                        bbox=dict(facecolor="white", edgecolor="none", pad=1) if stays else None)
        for k in range(t):              # the holders: rows before, columns after
            xy, w, h = ((0, 1 - (k + 1) / t), 1, 1 / t) if side == "before" else ((k / t, 0), 1 / t, 1)
            ax.add_patch(Rectangle(xy, w, h, fill=False, edgecolor="black", linewidth=2, gid=f"{side} rank {k}"))
            if side == "before":
                ax.text(-0.03, 1 - (k + 0.5) / t, f"rank {k}", ha="right", va="center", fontsize=8)
            else:
                ax.text((k + 0.5) / t, 1.03, f"rank {k}", ha="center", va="bottom", fontsize=8)
        ax.set_xlim(0, 1), ax.set_ylim(0, 1), ax.set_aspect("equal"), ax.axis("off")
    axes[0].set_title(f"before: {name} {list(shape)} split by rows, S(0)\n(each piece labelled with where it goes)",
                      fontsize=9, pad=6)
    axes[1].set_title("after: split by columns, S(1)\n(each piece coloured by the rank it came from)", fontsize=9,
                      pad=20)
    fig.suptitle("all_to_all: rank r sends its piece j to rank j" + (" (hatched: stays, not sent)" if mark_stays else ""),
                 fontsize=10)
    fig.tight_layout()
    return fig

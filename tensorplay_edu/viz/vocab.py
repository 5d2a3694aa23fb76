"""The vocab-parallel lookup as a sum (notebook 03): each rank's addend ``[b, s, h]`` is non-zero only at the
positions whose token id its rows of the ``[V, h]`` table hold; the ``t`` addends sum to the lookup.

Notation: ``b`` batch, ``s`` sequence, ``t`` ranks; rank ``r`` owns the ids ``starts[r] .. starts[r] + sizes[r] - 1``
(``torch.chunk``'s split).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgba

from .style import RANK_COLORS

__all__ = ["draw_vocab_addends", "id_range"]


def id_range(start: int, size: int) -> str:
    """``"ids 0..2"``, ``"id 9"`` for a single row, ``"no id"`` for none."""
    if size <= 0:
        return "no id"
    return f"id {start}" if size == 1 else f"ids {start}..{start + size - 1}"


def draw_vocab_addends(ids, starts, sizes, title=None):
    """One ``[b, s]`` panel per rank, stacked: the positions the rank fills in its colour, labelled ``W[id]`` (the
    row of the table it looks up), every other position blank (masked: the zero vector); then their sum, the
    lookup, each position in its owner's colour. Axes ``0 .. t-1`` are the ranks' addends, axis ``t`` the sum."""
    ids = np.asarray(ids)
    t, (b, s) = len(sizes), ids.shape
    owns = [(ids >= o) & (ids < o + n) for o, n in zip(starts, sizes)]
    fig, axes = plt.subplots(t + 1, 1, figsize=(0.55 * s + 2.6, 0.62 * b * (t + 1) + 1.0))
    white = to_rgba("white")
    for k, ax in enumerate(axes):
        picture = np.empty((b, s, 4))
        for (i, j), v in np.ndenumerate(ids):
            owner = next(r for r in range(t) if owns[r][i, j])
            filled = k == t or owns[k][i, j]
            picture[i, j] = to_rgba(RANK_COLORS[owner if k == t else k]) if filled else white
            if filled:                                   # W[id]: the row looked up; a masked position stays blank
                ax.text(j, i, f"W[{v}]", ha="center", va="center", fontsize=8, color="white", weight="bold")
        ax.imshow(picture)
        ax.set_xticks(np.arange(s + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(b + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="#cccccc", lw=0.6)
        ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
        name = f"rank {k}: {id_range(starts[k], sizes[k])}" if k < t else "the lookup"
        sign = "" if k == 0 else ("=" if k == t else "+")
        ax.set_ylabel(f"{sign}  {name}" if sign else name, rotation=0, ha="right", va="center", fontsize=9,
                      color=RANK_COLORS[k] if k < t else "black", weight="bold")
    axes[-1].set_xlabel(f"position s (0..{s - 1}); rows: batch b", fontsize=8)
    axes[0].set_title(title or "each rank's addend [b, s, h]: the row W[id] where it holds the id, blank (zeros) elsewhere",
                      fontsize=10)
    fig.tight_layout()
    return fig

"""Where ``torch.chunk`` cuts ``wq`` when the TP degree does not divide the query heads.

:func:`~tensorplay_edu.viz.draw_head_split` draws ``wq``'s rows coloured by the rank that holds them,
a head cut between two ranks outlined in red.  :func:`draw_head_cuts` adds, to the left of the weight,
a dashed red line at every row where one rank's piece ends and the next begins, labelled "cut at row
N", so the reader sees *where* the cut falls, not only which head it spoils: at ``H = 4`` heads of
``hd = 8`` over ``t = 3`` ranks the 32 rows go 11, 11, 10, cut at rows 11 and 22, through heads 1 and 2.
``tests/test_viz_head_cuts.py`` checks the lines against :func:`~tensorplay_edu.viz.row_chunks`.
"""

from __future__ import annotations

from .heads import draw_head_split, row_chunks

__all__ = ["cut_rows", "draw_head_cuts"]


def cut_rows(n_heads: int, head_dim: int, world_size: int) -> list[int]:
    """The rows of ``wq`` ``[H·hd, h]`` where one rank's ``torch.chunk`` piece ends and the next begins."""
    return [stop for _, stop in row_chunks(n_heads * head_dim, world_size)][:-1]


def draw_head_cuts(n_heads: int, n_kv_heads: int, head_dim: int, world_size: int, dim: int | None = None):
    """``wq`` as :func:`~tensorplay_edu.viz.draw_head_split` draws it, with a dashed red line and a
    "cut at row N" label at each of :func:`cut_rows`; a cut head's own label moves to the weight's right.
    Lines: gid ``"cut N"``."""
    dim = n_heads * head_dim if dim is None else dim
    fig = draw_head_split(n_heads, n_kv_heads, head_dim, world_size, dim=dim, weights=("wq",))
    ax = fig.axes[0]
    for stop in cut_rows(n_heads, head_dim, world_size):
        ax.plot([-0.3 * dim, 0], [-stop, -stop], color="red", linestyle="--", linewidth=1, gid=f"cut {stop}")
        ax.text(-0.32 * dim, -stop, f"cut at row {stop}", ha="right", va="center", fontsize=8, color="red")
    for label in ax.texts:                     # a cut head's label beside the weight, so its colour change shows
        if "(cut)" in label.get_text():
            label.set(x=1.03 * dim, ha="left", color="red", fontweight="normal")
    right = ax.get_xlim()[1]
    ax.set_xlim(-0.9 * dim, 1.5 * dim)
    fig.set_figwidth(fig.get_figwidth() * 2.4 * dim / (right + 0.9 * dim))   # the weight keeps its size
    return fig

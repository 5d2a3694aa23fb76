"""The rows of a fused q|k|v Linear (notebook 12's own block), cut in ``t`` equal slices by ``ColwiseParallel``.

A fused ``qkv`` of ``[3h, h]`` has ``3·H`` blocks of ``hd`` rows: one per part (q, k, v) and head.  Its row
order decides what a rank's slice holds.  ``"q|k|v"`` (q of every head, then k, then v) gives rank 0 of 2 all
of q and half of k; ``"per head"`` (q, k, v of head 0, then of head 1, ...) gives it heads ``0 .. H/t - 1``
whole.  :func:`qkv_blocks` lists the blocks in row order; :func:`rank_blocks` says which a rank holds;
:func:`draw_qkv_rows` draws one strip per order, a box per block coloured by part and labelled with its
head, and each rank's slice bracketed in its rank colour below the strip.  ``tests/test_viz_qkv_rows.py``
checks the boxes and brackets against :func:`rank_blocks`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from .heads import row_chunks
from .style import RANK_COLORS

__all__ = ["ORDERS", "PART_COLORS", "qkv_blocks", "rank_blocks", "draw_qkv_rows"]

ORDERS = ("q|k|v", "per head")
PART_COLORS = {"q": "#E3E1F7", "k": "#F7E1E1", "v": "#E1F2E1"}  # pale tints: the rank colours are for ranks


def qkv_blocks(order: str, heads: int) -> list[tuple[str, int]]:
    """The ``(part, head)`` blocks of ``hd`` rows each, in the order of ``qkv``'s output rows."""
    if order == "q|k|v":
        return [(part, head) for part in "qkv" for head in range(heads)]
    if order == "per head":
        return [(part, head) for head in range(heads) for part in "qkv"]
    raise ValueError(f"order must be one of {ORDERS}, got {order!r}")


def rank_blocks(order: str, heads: int, world_size: int, rank: int) -> list[tuple[str, int]]:
    """The blocks in rank ``rank``'s slice: ``ColwiseParallel`` gives it rows ``r·3h/t .. (r+1)·3h/t - 1``."""
    blocks = qkv_blocks(order, heads)
    if len(blocks) % world_size:  # torch.chunk would then cut a block of hd rows in two
        raise ValueError(f"{len(blocks)} blocks do not cut evenly in {world_size}")
    start, stop = row_chunks(len(blocks), world_size)[rank]
    return blocks[start:stop]


def draw_qkv_rows(heads: int = 12, head_dim: int = 4, world_size: int = 2, orders=ORDERS):
    """One strip per order: ``3·heads`` boxes (gid ``"q3"``: part and head) coloured by part, and a bracket per
    rank (gid ``"rank r"``) under the rows it holds.  Returns the Figure."""
    fig, ax = plt.subplots(figsize=(10.8, 0.9 + 0.85 * len(orders)))
    ax.set_axis_off()
    n = 3 * heads
    ax.set(xlim=(-5.5, n + 0.5), ylim=(-1.1 * (len(orders) - 1) - 0.45, 1.0))  # down to the last rank label
    for i, order in enumerate(orders):
        y = -1.1 * i
        ax.text(-0.4, y + 0.35, f'"{order}"', ha="right", va="center", fontsize=9)
        for x, (part, head) in enumerate(qkv_blocks(order, heads)):
            ax.add_patch(Rectangle((x, y), 1, 0.7, facecolor=PART_COLORS[part], edgecolor="black", lw=0.6,
                                   gid=f"{part}{head}"))
            ax.text(x + 0.5, y + 0.35, f"{part}{head}", ha="center", va="center", fontsize=6.5)
        for r, (start, stop) in enumerate(row_chunks(n, world_size)):  # the blocks rank_blocks gives rank r
            x0, x1 = start + 0.1, stop - 0.1
            ax.plot([x0, x0, x1, x1], [y - 0.02, y - 0.14, y - 0.14, y - 0.02], color=RANK_COLORS[r], lw=2,
                    gid=f"rank {r}")
            first, last = start * head_dim, stop * head_dim - 1
            ax.text((x0 + x1) / 2, y - 0.27, f"rank {r}: rows {first}..{last}", ha="center", va="center", fontsize=8,
                    color=RANK_COLORS[r])
    ax.legend(handles=[Patch(facecolor=c, edgecolor="black", label=p) for p, c in PART_COLORS.items()],
              loc="upper right", ncol=3, fontsize=8, frameon=False, bbox_to_anchor=(1.0, 1.12))
    ax.set_title(f"qkv's {n * head_dim} output rows ({n} blocks of {head_dim}: part and head), cut in {world_size}",
                 fontsize=10)
    fig.tight_layout()
    return fig

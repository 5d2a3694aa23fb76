"""Grouped-query attention when the ranks outnumber the key-value heads (t > K): each rank holds its H/t
query heads and a *copy* of the one kv head they read, so every kv head lives on t/K ranks
(:func:`draw_kv_copies`).  Forward, every arrow still stays on one rank; backward, each copy's gradient is
one part of the kv head's, and the copies must be summed (an all-reduce over the t/K ranks)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from .heads import heads_per_rank
from .style import COMM_COLOR, RANK_COLORS

__all__ = ["kv_copy_of_rank", "draw_kv_copies"]


def kv_copy_of_rank(n_heads: int, n_kv_heads: int, world_size: int) -> list[int]:
    """The kv head whose copy rank r holds when t > K: the one its H/t query heads read, ``r // (t/K)``."""
    if world_size <= n_kv_heads or world_size % n_kv_heads or n_heads % world_size:
        raise ValueError(f"kv_copy_of_rank: needs K < t, K dividing t and t dividing H (H = {n_heads}, "
                         f"K = {n_kv_heads}, t = {world_size})")
    group = n_heads // n_kv_heads
    return [heads[0] // group for heads in heads_per_rank(n_heads, world_size)]


def draw_kv_copies(n_heads: int, n_kv_heads: int, world_size: int, show_sum: bool = True):
    """Query heads on top, coloured by rank; below, one kv-head copy per rank, in the rank's colour, named
    ``copy of kv head j``; an arrow from each query head to its rank's copy.  Under the copies of one kv head
    a red bracket says their gradients are summed over the t/K ranks (gid ``sum kv head j``).  With
    ``show_sum=False`` the brackets and the title's backward line are left out (a picture for the question
    whose answer they are); the title starts "Setup: ", else "The fix: "."""
    copy_of = kv_copy_of_rank(n_heads, n_kv_heads, world_size)
    q_heads = heads_per_rank(n_heads, world_size)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.45 * n_heads + 1.2), 2.9))
    q_x = {i: i * 1.2 for i in range(n_heads)}
    for r, heads in enumerate(q_heads):
        colour = RANK_COLORS[r % len(RANK_COLORS)]
        copy_x = (q_x[heads[0]] + q_x[heads[-1]]) / 2                         # the copy sits under its heads
        ax.add_patch(Rectangle((copy_x, 0.9), 1, 0.6, facecolor=colour, edgecolor="black",
                               gid=f"rank {r}: copy of kv head {copy_of[r]}"))
        ax.text(copy_x + 0.5, 1.2, f"kv {copy_of[r]} (copy)", ha="center", va="center", fontsize=7.5,
                color="white", weight="bold")
        for i in heads:
            ax.add_patch(Rectangle((q_x[i], 2.3), 1, 0.6, facecolor=colour, edgecolor="black", gid=f"q head {i}"))
            ax.text(q_x[i] + 0.5, 2.6, f"q head {i}", ha="center", va="center", fontsize=8, color="white",
                    weight="bold")
            ax.add_patch(FancyArrowPatch((q_x[i] + 0.5, 2.3), (copy_x + 0.5, 1.5), arrowstyle="->", mutation_scale=10,
                                         linewidth=1, color="black", gid=f"q head {i} -> rank {r}'s copy"))
    per = world_size // n_kv_heads
    for j in range(n_kv_heads if show_sum else 0):
        ranks = list(range(j * per, (j + 1) * per))
        left, right = q_x[q_heads[ranks[0]][0]], q_x[q_heads[ranks[-1]][-1]] + 1
        ax.add_patch(Rectangle((left, 0.62), right - left, 0.08, facecolor=COMM_COLOR, edgecolor="none",
                               gid=f"sum kv head {j}"))
        ax.text((left + right) / 2, 0.25, f"backward: all-reduce the {per} copies'\ngradients (ranks {', '.join(map(str, ranks))})", ha="center", va="center", fontsize=7.5, color=COMM_COLOR)
    ax.set_xlim(-0.2, n_heads * 1.2)
    ax.set_ylim(0, 3.1)
    ax.axis("off")
    ax.legend(handles=[Patch(color=RANK_COLORS[r % len(RANK_COLORS)], label=f"rank {r}") for r in range(world_size)],
              fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title(("The fix: " if show_sum else "Setup: ") + f"GQA, H = {n_heads}, K = {n_kv_heads}, t = {world_size} > K: each kv head copied on "
                 f"{per} ranks\nforward stays on each rank" + ("; backward sums the copies' gradients" if show_sum else ""),
                 fontsize=9)
    fig.tight_layout()
    return fig

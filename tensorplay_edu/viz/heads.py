"""Pictures of attention heads under tensor parallelism: which rows of ``wq`` / ``wk`` / ``wv`` and columns of
``wo`` each rank holds, head by head (:func:`draw_head_split`), which rank holds which query and key-value heads
and which kv head each query head reads (:func:`draw_gqa`), and how a view cuts one rank's channels into
heads (:func:`draw_head_views`).  ``ColwiseParallel`` on ``wq`` / ``wk`` / ``wv`` gives rank r the r-th
``torch.chunk`` of their rows, i.e. heads ``r·n/t … (r+1)·n/t − 1`` (:func:`heads_per_rank`)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from ..placement import chunk_offset, chunk_sizes
from .style import RANK_COLORS

__all__ = ["heads_per_rank", "draw_gqa", "draw_head_views", "row_chunks", "draw_head_split"]

_HEAD_SHADES = ("#E6E6E6", "#A6A6A6")  # alternate heads in a row of channels (not rank colours)


def heads_per_rank(n_heads: int, world_size: int) -> list[list[int]]:
    """The whole heads each rank holds when the rows of a [n_heads·hd, h] weight are split over t ranks."""
    if n_heads % world_size:
        raise ValueError(f"heads_per_rank: {n_heads} heads do not split into whole heads over {world_size} ranks")
    per = n_heads // world_size
    return [list(range(r * per, (r + 1) * per)) for r in range(world_size)]


def draw_gqa(n_heads: int, n_kv_heads: int, world_size: int):
    """Query heads on top, key-value heads below, each coloured by the rank that holds it; an arrow from
    query head i to the kv head it reads, ``i // (H/K)``.  When t divides both H and K every arrow joins
    two boxes of one colour: no rank reads a kv head it does not hold."""
    group = n_heads // n_kv_heads
    q_rank = {i: r for r, heads in enumerate(heads_per_rank(n_heads, world_size)) for i in heads}
    kv_rank = {j: r for r, heads in enumerate(heads_per_rank(n_kv_heads, world_size)) for j in heads}
    fig, ax = plt.subplots(figsize=(max(7.0, 1.45 * n_heads + 1.2), 2.2))
    q_x = {i: i * 1.2 for i in range(n_heads)}                                # query head i: x of its box
    kv_x = {j: (q_x[j * group] + q_x[(j + 1) * group - 1]) / 2 for j in range(n_kv_heads)}  # under its group
    for i, x in q_x.items():
        ax.add_patch(Rectangle((x, 1.6), 1, 0.6, facecolor=RANK_COLORS[q_rank[i] % len(RANK_COLORS)],
                               edgecolor="black", gid=f"q head {i}"))
        ax.text(x + 0.5, 1.9, f"q head {i}", ha="center", va="center", fontsize=8, color="white", weight="bold")
        ax.add_patch(FancyArrowPatch((x + 0.5, 1.6), (kv_x[i // group] + 0.5, 0.8), arrowstyle="->", mutation_scale=10,
                                     linewidth=1, color="black", gid=f"q head {i} -> kv head {i // group}"))
    for j, x in kv_x.items():
        ax.add_patch(Rectangle((x, 0.2), 1, 0.6, facecolor=RANK_COLORS[kv_rank[j] % len(RANK_COLORS)],
                               edgecolor="black", gid=f"kv head {j}"))
        ax.text(x + 0.5, 0.5, f"kv head {j}", ha="center", va="center", fontsize=8, color="white", weight="bold")
    ax.set_xlim(-0.2, n_heads * 1.2)
    ax.set_ylim(0, 2.4)
    ax.axis("off")
    ax.legend(handles=[Patch(color=RANK_COLORS[r % len(RANK_COLORS)], label=f"rank {r}") for r in range(world_size)],
              fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title(f"GQA, H = {n_heads}, K = {n_kv_heads}, t = {world_size}: every arrow stays on one rank", fontsize=9)
    fig.tight_layout()
    return fig


def draw_head_views(n_heads: int, head_dim: int, world_size: int):
    """Rank 0's query channels, local [b, s, H/t·hd] (its last dim), cut into heads two ways:
    ``view(b, s, -1, hd)`` makes H/t whole heads of hd channels; ``view(b, s, H, -1)`` (the global head
    count) makes H "heads" of hd/t channels, each a t-th of a real head.  Heads alternate two greys."""
    width = n_heads // world_size * head_dim                                 # rank 0's channels
    part = "half" if world_size == 2 else f"1/{world_size}"
    rows = ((f"view(b, s, -1, hd): {n_heads // world_size} heads of hd = {head_dim}", head_dim),
            (f"view(b, s, H, -1): {n_heads} 'heads' of {head_dim // world_size}", head_dim // world_size))
    fig, ax = plt.subplots(figsize=(9, 2.2))
    for row, (label, size) in enumerate(rows):
        y = 1 - row
        for start in range(0, width, size):
            k = start // size
            ax.add_patch(Rectangle((start, y), size, 0.7, facecolor=_HEAD_SHADES[k % 2], edgecolor="black",
                                   gid=f"{'right' if row == 0 else 'wrong'} {k}"))
            name = f"head {k}" if size == head_dim else f"'head' {k}\n({part} of head {start // head_dim})"
            ax.text(start + size / 2, y + 0.35, name, ha="center", va="center", fontsize=8)
        ax.text(-0.5, y + 0.35, label, ha="right", va="center", fontsize=8)
    ax.set_xlim(-0.8 * width, width + 0.5)
    ax.set_ylim(-0.1, 1.8)
    ax.set_xticks(range(0, width + 1, max(head_dim // world_size, 1)))
    ax.tick_params(labelsize=8)
    ax.set_yticks([])
    ax.set_frame_on(False)
    ax.set_xlabel(f"rank 0's q channels, local [b, s, {width}]: the last dim", fontsize=8)
    ax.set_title(f"the same {width} numbers, cut into heads two ways", fontsize=9)
    fig.tight_layout()
    return fig


_WEIGHTS = {"wq": ("q head", "rows"), "wk": ("kv head", "rows"), "wv": ("kv head", "rows"), "wo": ("q head", "columns")}


def row_chunks(n_rows: int, world_size: int) -> list[tuple[int, int]]:
    """The [start, stop) rows of each rank's piece, as ``torch.chunk`` cuts them (``ColwiseParallel``'s Shard(0)):
    pieces of ceil(n/t) rows, the last one shorter (and fewer than t pieces when n is small)."""
    starts = [chunk_offset(n_rows, world_size, r) for r in range(world_size)]
    return [(a, a + size) for a, size in zip(starts, chunk_sizes(n_rows, world_size)) if size]


def draw_head_split(n_heads: int, n_kv_heads: int, head_dim: int, world_size: int, dim: int | None = None,
                    weights=("wq", "wk", "wv", "wo")):
    """The weights of attention as the vanilla plan shards them, drawn to scale: the rows of ``wq``
    ``[H·hd, h]``, ``wk`` and ``wv`` ``[K·hd, h]`` (``ColwiseParallel``, Shard(0)) and the columns of ``wo``
    ``[h, H·hd]`` (``RowwiseParallel``, Shard(1)), each band of hd rows (columns) one head, each piece coloured
    by the rank that holds it (:func:`row_chunks`).  When t divides the head counts every band is one colour:
    rank r holds whole heads.  A head that ``torch.chunk`` cuts is drawn in two colours, outlined in red and
    named in the title.  Patches: gid ``"<weight> rank r"`` (a rank's piece), ``"<weight> q head i"`` (a band)."""
    dim = n_heads * head_dim if dim is None else dim
    fig, ax = plt.subplots(figsize=(2.6 * len(weights) + 1.6, 3.9))
    x0, gap, cut_names = 0.0, 0.3 * dim, []
    for name in weights:
        kind, axis, cut_heads = *_WEIGHTS[name], []
        n = n_heads if kind == "q head" else n_kv_heads
        long, wide = n * head_dim, dim                                   # the sharded dim, the other one
        w, h = (wide, long) if axis == "rows" else (long, wide)          # drawn width, height (rows go down)
        for r, (a, b) in enumerate(row_chunks(long, world_size)):
            xy = (x0, -b) if axis == "rows" else (x0 + a, -h)
            size = (w, b - a) if axis == "rows" else (b - a, h)
            ax.add_patch(Rectangle(xy, *size, facecolor=RANK_COLORS[r % len(RANK_COLORS)], edgecolor="none",
                                   gid=f"{name} rank {r}"))
        for i in range(n):
            a, b = i * head_dim, (i + 1) * head_dim
            owners = [r for r, (c, d) in enumerate(row_chunks(long, world_size)) if c < b and d > a]
            cut = len(owners) > 1
            if cut:
                cut_heads.append(str(i))
            xy, size = ((x0, -b), (w, head_dim)) if axis == "rows" else ((x0 + a, -h), (head_dim, h))
            ax.add_patch(Rectangle(xy, *size, facecolor="none", edgecolor="red" if cut else "black",
                                   linewidth=2.5 if cut else 1, gid=f"{name} {kind} {i}", zorder=3))
            label = f"{kind} {i}{' (cut)' if cut else ''}\n{axis} {a}:{b}"
            centre = (x0 + w / 2, -(a + b) / 2) if axis == "rows" else (x0 + (a + b) / 2, -h / 2)
            ax.text(*centre, label, ha="center", va="center", fontsize=8, color="white", weight="bold",
                    rotation=0 if axis == "rows" else 90, zorder=4)
        shape = f"[H·hd, h] = [{long}, {wide}]" if name in ("wq",) else (
            f"[K·hd, h] = [{long}, {wide}]" if axis == "rows" else f"[h, H·hd] = [{wide}, {long}]")
        ax.text(x0 + w / 2, 0.04 * dim, f"{name}.weight {shape}\n{axis} split: Shard({0 if axis == 'rows' else 1})",
                ha="center", va="bottom", fontsize=8)
        if cut_heads:
            pieces = ", ".join(str(b - a) for a, b in row_chunks(long, world_size))
            cut_names.append(f"{name}'s pieces of {pieces} {axis} cut {kind}{'s' if len(cut_heads) > 1 else ''} "
                             f"{', '.join(cut_heads)}")
        x0 += w + gap
    ax.set_xlim(-0.05 * dim, x0 - gap + 0.05 * dim)
    top = max(n_heads * head_dim, dim)
    ax.set_ylim(-top - 0.05 * dim, 0.3 * dim)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.legend(handles=[Patch(color=RANK_COLORS[r % len(RANK_COLORS)], label=f"rank {r}") for r in range(world_size)],
              fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    sizes = f"H = {n_heads}, K = {n_kv_heads}, hd = {head_dim}, t = {world_size}"
    verdict = ("torch.chunk: " + "; ".join(cut_names) if cut_names else
               "every rank holds whole heads: " + "; ".join(
                   f"rank {r} q heads {', '.join(map(str, q))}" + (f", kv head{'s' if len(kv) > 1 else ''} "
                                                                  f"{', '.join(map(str, kv))}" if kv else "")
                   for r, (q, kv) in enumerate(zip(_heads_of_chunks(n_heads, head_dim, world_size),
                                                   _heads_of_chunks(n_kv_heads, head_dim, world_size)
                                                   if {"wk", "wv"} & set(weights) else [[]] * world_size))))
    ax.set_title(f"{sizes}\n{verdict}", fontsize=9)
    fig.tight_layout()
    return fig


def _heads_of_chunks(n: int, head_dim: int, world_size: int) -> list[list[int]]:
    # the heads (of n) whose rows lie in each rank's torch.chunk piece (used only when no head is cut)
    return [list(range(a // head_dim, b // head_dim)) for a, b in row_chunks(n * head_dim, world_size)]

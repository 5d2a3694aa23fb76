"""Pictures of layouts: what each rank holds (:func:`draw_layout`), what a transition moves
forward and backward (:func:`draw_transition`), and what a collective does (:func:`draw_collective`).
Colours and labels come from :mod:`.style`."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..placement import Partial, Replicate, Shard, chunk_offset, chunk_sizes, normalize
from ..transition import TABLE
from .style import COMM_COLOR, PARTIAL_HATCH, RANK_COLORS, SHARED_COLOR

__all__ = ["pieces", "view_dims", "draw_global", "move_op", "draw_layout", "draw_transition", "draw_collective"]


def _kind(p) -> str:
    return type(p).__name__


def pieces(shape, placements, mesh_shape) -> list[dict]:
    """Per rank (row-major over the mesh): its index range on every dim and whether it is an addend."""
    placements = normalize(placements, len(shape))
    out = []
    for rank, coord in enumerate(itertools.product(*(range(n) for n in mesh_shape))):
        ranges = [(0, n) for n in shape]
        partial = False
        for i, p in enumerate(placements):
            if isinstance(p, Shard):
                n, t = shape[p.dim], mesh_shape[i]
                start = chunk_offset(n, t, coord[i])
                ranges[p.dim] = (start, start + chunk_sizes(n, t)[coord[i]])
            partial = partial or isinstance(p, Partial)
        out.append({"rank": rank, "coord": coord, "ranges": ranges, "partial": partial})
    return out


def view_dims(shape, dims):
    """The two tensor dims a picture draws as rows and columns (a 1-D tensor: one row of blocks)."""
    if dims is not None:
        return tuple(dims)
    return (0, 1) if len(shape) >= 2 else (0, None)


def _span(piece, dim, shape):
    return piece["ranges"][dim] if dim is not None else (0, 1)


def _describe(placements, mesh_dim_names=None) -> str:
    names = mesh_dim_names or [f"mesh dim {i}" for i in range(len(placements))]
    return ", ".join(f"{n}: {p}" for n, p in zip(names, placements)) if len(placements) > 1 else str(placements[0])


_ON_HATCH = dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85)  # text off the hatching


ASPECT_LIMITS = (0.4, 2.5)  # a frame's height / width, at most this flat / this tall


def _frame_aspect(ax, n_rows: int, n_cols: int) -> None:
    """Draw an [n_rows, n_cols] tensor in its own proportions: a [2, 8] tensor wide, an [8, 2] one tall.
    The ratio is softened (its square root) and clamped to :data:`ASPECT_LIMITS`, so that the labels
    inside a [1, 1000] or a [10, 6] tensor still fit."""
    lo, hi = ASPECT_LIMITS
    ax.set_box_aspect(min(max((max(n_rows, 1) / max(n_cols, 1)) ** 0.5, lo), hi))


def draw_global(ax, shape, placements, mesh_shape, dims, mesh_dim_names=None):
    """The global tensor, blocks coloured by owner; returns nothing, draws on ``ax``.

    A block held whole by several ranks (Replicate) is one grey block naming them.  A Partial
    block is drawn as its t addends: one hatched sheet per rank in that rank's colour, stacked
    like cards, because the value is their sum and no rank holds it yet."""
    rows_dim, cols_dim = dims
    n_rows = shape[rows_dim]
    n_cols = shape[cols_dim] if cols_dim is not None else 1
    blocks: dict = {}
    for piece in pieces(shape, placements, mesh_shape):
        r0, r1 = _span(piece, rows_dim, shape)
        c0, c1 = _span(piece, cols_dim, shape)
        if r1 > r0 and c1 > c0:
            blocks.setdefault((r0, r1, c0, c1, piece["partial"]), []).append(piece["rank"])
    for (r0, r1, c0, c1, partial), ranks in blocks.items():
        x, y, w, h = c0, n_rows - r1, c1 - c0, r1 - r0
        if partial:  # t addends: sheet k is shifted by k steps up and right, inside the block
            step = min(w, h) * 0.08
            for k, r in enumerate(ranks):
                off = step * (len(ranks) - 1 - k)
                ax.add_patch(Rectangle((x + off, y + off), w - step * (len(ranks) - 1), h - step * (len(ranks) - 1),
                                       facecolor=RANK_COLORS[r % len(RANK_COLORS)], edgecolor="black",
                                       hatch=PARTIAL_HATCH, alpha=0.9))
        else:
            color = RANK_COLORS[ranks[0] % len(RANK_COLORS)] if len(ranks) == 1 else SHARED_COLOR
            ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", alpha=0.9))
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))
        label = f"{who}\nrows {r0}:{r1}" + (f"\ncols {c0}:{c1}" if cols_dim is not None else "")
        if partial:
            label = ("addends of " + label) + f"\npending sum of {len(ranks)}"
        if (r1 - r0) < 0.2 * n_rows:  # a thin block: one line, and no "cols" when it spans them all
            if (c0, c1) == (0, n_cols) and not partial:
                label = label.replace(f"\ncols {c0}:{c1}", "")
            label = label.replace("\n", "  ")
        text = ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=8,
                       bbox=_ON_HATCH if partial else None)
        text.block = (x, y, w, h)  # the block the label must stay inside (_fit_labels)
    ax.set_xlim(0, n_cols)
    ax.set_ylim(0, max(n_rows, 1))
    ax.set_xticks([])
    ax.set_yticks([])
    _frame_aspect(ax, n_rows, n_cols)
    ax.set_xlabel(f"dim {cols_dim} ({n_cols})" if cols_dim is not None else "")
    ax.set_ylabel(f"dim {rows_dim} ({n_rows})")
    ax.set_title(f"global {list(shape)} as {_describe(placements, mesh_dim_names)}", fontsize=9)


def _fit_labels(fig, ax, smallest: float = 6.0) -> None:
    """Shrink each block label of ``ax`` that is wider or taller than its block until it fits (down to
    ``smallest`` points; below that a one-line label keeps only its rank), measured on the figure as laid
    out."""
    get_renderer = getattr(fig.canvas, "get_renderer", None)
    if get_renderer is None:
        return
    renderer = get_renderer()
    ax.apply_aspect()  # the box aspect moves the axes at draw time: measure where they will be drawn

    def fits(text, width, height):
        box = text.get_window_extent(renderer)
        return box.width <= 0.95 * width and box.height <= height

    for text in ax.texts:
        if not hasattr(text, "block"):
            continue
        x, y, w, h = text.block
        (x0, y0), (x1, y1) = ax.transData.transform([(x, y), (x + w, y + h)])
        width, height = abs(x1 - x0), abs(y1 - y0)
        while not fits(text, width, height) and text.get_fontsize() > smallest:
            text.set_fontsize(text.get_fontsize() - 0.5)
        if not fits(text, width, height) and "\n" not in text.get_text():
            text.set_text(text.get_text().split("  ")[0])  # "rank 6": the rows and cols are its neighbours'
        while not fits(text, width, height) and text.get_fontsize() > 4:
            text.set_fontsize(text.get_fontsize() - 0.5)


def _draw_local(ax, shape, piece, dims):
    """One rank's local tensor, drawn where it sits in the global tensor (the dotted frame)."""
    rows_dim, cols_dim = dims
    n_rows, n_cols = shape[rows_dim], (shape[cols_dim] if cols_dim is not None else 1)
    r0, r1 = _span(piece, rows_dim, shape)
    c0, c1 = _span(piece, cols_dim, shape)
    local = [b - a for a, b in piece["ranges"]]
    color = RANK_COLORS[piece["rank"] % len(RANK_COLORS)]
    ax.add_patch(Rectangle((0, 0), n_cols, max(n_rows, 1), facecolor="none", edgecolor="#888888", linestyle=":"))
    ax.add_patch(Rectangle((c0, n_rows - r1), c1 - c0, r1 - r0, facecolor=color, edgecolor="black",
                           hatch=PARTIAL_HATCH if piece["partial"] else None))
    if piece["partial"]:
        ax.text(n_cols / 2, n_rows / 2, f"addend\n{piece['rank']}", ha="center", va="center", fontsize=8,
                bbox=_ON_HATCH)
    ax.set_xlim(0, n_cols)
    ax.set_ylim(0, max(n_rows, 1))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_frame_on(False)
    _frame_aspect(ax, n_rows, n_cols)
    coord = "" if len(piece["coord"]) == 1 else f" {piece['coord']}"
    ax.set_title(f"rank {piece['rank']}{coord}\nlocal {local}" + (" addend" if piece["partial"] else ""), fontsize=8)


def draw_layout(shape, placements, mesh_shape=None, *, mesh_dim_names=None, dims=None, title=None):
    """The global tensor coloured by owner, and each rank's local piece beside it, drawn
    where it sits in the global tensor (a dotted frame).

    ``mesh_shape`` defaults to ``(4,)`` for one placement; ``dims`` picks the two tensor
    dims to draw for tensors of more than 2 dims (default 0 and 1).
    """
    placements = tuple(placements)
    mesh_shape = tuple(mesh_shape or (4,) * len(placements))
    dims = view_dims(shape, dims)
    parts = pieces(shape, placements, mesh_shape)
    n = len(parts)
    fig = plt.figure(figsize=(3 + 1.6 * n, 3))
    grid = fig.add_gridspec(1, n + 2, width_ratios=[2.4, 0.3] + [1] * n)
    glob = fig.add_subplot(grid[0, 0])
    draw_global(glob, shape, placements, mesh_shape, dims, mesh_dim_names)
    for i, piece in enumerate(parts):
        _draw_local(fig.add_subplot(grid[0, i + 2]), shape, piece, dims)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _fit_labels(fig, glob)
    return fig


def _before_after(row, shape, src, dst, world_size: int, arrow_y: float) -> None:
    """One row of a move's picture: the global tensor before (left) and after (right), an arrow between (middle,
    whose labels the caller writes)."""
    left, mid, right = row
    dims = view_dims(shape, None)
    draw_global(left, shape, (src,), (world_size,), dims)
    draw_global(right, shape, (dst,), (world_size,), dims)
    mid.axis("off")
    mid.add_patch(FancyArrowPatch((0.05, arrow_y), (0.95, arrow_y), arrowstyle="->", mutation_scale=18, color="black"))
    mid.set_xlim(0, 1)
    mid.set_ylim(0, 1)


def draw_transition(shape, src, dst, world_size: int = 4, *, backward: bool = True, grad_placement=None, title=None):
    """Before and after one move of the transition table, with the collective in between,
    and (``backward=True``) the collective its gradient takes on the way back.

    ``grad_placement`` is the gradient's placement when its readers declare one
    (``to_local(grad_placements=[Partial()])``): ``src=dst=Replicate()`` with
    ``grad_placement=Partial()`` draws Megatron's f.
    """
    src_n, dst_n = normalize([src], len(shape))[0], normalize([dst], len(shape))[0]
    forward_op = move_op(src_n, dst_n)
    grad_src = grad_placement or (Replicate() if isinstance(dst_n, Partial) else dst_n)
    back_op = move_op(grad_src, Replicate() if isinstance(src_n, Partial) else src_n)
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(10, 3.2), gridspec_kw={"width_ratios": [3, 1.4, 3]})
    _before_after((left, mid, right), shape, src_n, dst_n, world_size, arrow_y=0.62)
    mid.text(0.5, 0.72, f"forward: {forward_op}" if backward else forward_op, ha="center", fontsize=9)  # a collective alone
    if backward:
        mid.add_patch(FancyArrowPatch((0.95, 0.35), (0.05, 0.35), arrowstyle="->", mutation_scale=18, color=COMM_COLOR))
        mid.text(0.5, 0.22, f"backward: {back_op}", ha="center", fontsize=9, color=COMM_COLOR)
    fig.suptitle(title or f"{src} -> {dst} on {world_size} ranks", fontsize=10)
    fig.tight_layout()
    _fit_labels(fig, left)
    _fit_labels(fig, right)
    return fig


def move_op(src, dst) -> str:
    """The collective the transition table issues for one placement move (a name for a picture)."""
    if src == dst:
        return "nothing"
    key = (_kind(src), _kind(dst))
    return TABLE.get(key, "all_gather, then local") if key != ("Shard", "Partial") else "all_gather, then local"


_COLLECTIVES = {
    "all_gather": (Shard(0), Replicate()), "reduce_scatter": (Partial(), Shard(0)),
    "all_reduce": (Partial(), Replicate()), "all_to_all": (Shard(0), Shard(1)),
}


def draw_collective(op: str, world_size: int = 4, shape=(8, 8)):
    """Before / after pictures of one of the four collectives, as the table's move that issues it."""
    if op not in _COLLECTIVES:
        raise ValueError(f"draw_collective: op must be one of {sorted(_COLLECTIVES)}, got {op!r}")
    src, dst = _COLLECTIVES[op]
    return draw_transition(shape, src, dst, world_size, backward=False, title=f"{op}: {src} -> {dst}")


def draw_collectives(ops, world_size: int = 4, shape=(8, 8)):
    """Several collectives' before / after pictures in one figure, one row each (notebook 00's all-gather and
    reduce-scatter side by side): before on the left, the collective's name in the middle, after on the right."""
    bad = [op for op in ops if op not in _COLLECTIVES]
    if bad:
        raise ValueError(f"draw_collectives: ops must be among {sorted(_COLLECTIVES)}, got {bad!r}")
    fig, axes = plt.subplots(len(ops), 3, figsize=(10, 3.0 * len(ops)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1.4, 3]})
    for row, op in zip(axes, ops):
        raw = _COLLECTIVES[op]
        _before_after(row, shape, *(normalize([p], len(shape))[0] for p in raw), world_size, arrow_y=0.55)
        row[1].text(0.5, 0.65, op, ha="center", fontsize=10, fontweight="bold")
        row[1].text(0.5, 0.4, f"{raw[0]} -> {raw[1]}", ha="center", fontsize=9)
    fig.tight_layout()
    for left, _, right in axes:
        _fit_labels(fig, left)
        _fit_labels(fig, right)
    return fig

"""Pictures of layouts: what each rank holds, what a collective moves, what flows through
a parallelized model, and what CommDebugMode counted.  Matplotlib only; every function
returns the Figure (tests read its patches and texts).

Colours: rank r is ``RANK_COLORS[r]``; a block held whole by several ranks (Replicate)
is grey and names its ranks; a Partial block is hatched and says "pending sum".  A float8
piece (a ``float8_e4m3fn`` / ``float8_e5m2`` tensor or collective, 1 byte per element) is
drawn in a gold box with a dashed edge and tagged ``e4m3`` / ``e5m2``: :data:`FLOAT8_STYLE`.
"""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import FancyArrowPatch, Rectangle

from .debug import CommDebugMode
from .dtensor import DTensor
from .placement import Partial, Replicate, Shard, chunk_offset, chunk_sizes, normalize
from .transition import TABLE

__all__ = ["RANK_COLORS", "SHARED_COLOR", "FLOAT8_COLOR", "FLOAT8_STYLE", "float8_tag", "comm_label", "pieces",
           "draw_layout", "draw_transition", "draw_collective", "trace_flow", "draw_flow", "draw_comm_chart"]

RANK_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
SHARED_COLOR = "#BBBBBB"
PARTIAL_HATCH = "//"
FLOAT8_COLOR = "#F2C14E"  # float8 pieces (not a rank colour)
FLOAT8_STYLE = dict(boxstyle="round,pad=0.25", facecolor=FLOAT8_COLOR, edgecolor="black", linestyle="--", linewidth=1)
_FLOAT8_TAGS = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float8_e4m3fnuz": "e4m3fnuz",
                "float8_e5m2fnuz": "e5m2fnuz"}


def float8_tag(x) -> str | None:
    """``"e4m3"`` / ``"e5m2"`` (...) when ``x`` (a dtype, a dtype's name, or a label naming one) is
    float8, else None."""
    if isinstance(x, torch.dtype):
        x = str(x).replace("torch.", "")
    words = str(x).replace(",", " ").split()
    for word in words:
        if word in _FLOAT8_TAGS:
            return _FLOAT8_TAGS[word]
        if word in _FLOAT8_TAGS.values():
            return word
    return None


def comm_label(record) -> str:
    """A :class:`~tensorplay_edu.debug.CommRecord` as a short label: its op, then the float8
    format it moved (``"all_gather e4m3"``) and ``"(scalar)"`` for a one-number collective."""
    tag = float8_tag(record.dtype)
    return record.op + (f" {tag}" if tag else "") + (" (scalar)" if tuple(record.shape) == () else "")


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


def _view_dims(shape, dims):
    if dims is not None:
        return tuple(dims)
    return (0, 1) if len(shape) >= 2 else (0, None)


def _span(piece, dim, shape):
    return piece["ranges"][dim] if dim is not None else (0, 1)


def _describe(placements, mesh_dim_names=None) -> str:
    names = mesh_dim_names or [f"mesh dim {i}" for i in range(len(placements))]
    return ", ".join(f"{n}: {p}" for n, p in zip(names, placements)) if len(placements) > 1 else str(placements[0])


def _draw_global(ax, shape, placements, mesh_shape, dims, mesh_dim_names=None):
    """The global tensor, blocks coloured by owner; returns nothing, draws on ``ax``."""
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
        color = RANK_COLORS[ranks[0] % len(RANK_COLORS)] if len(ranks) == 1 else SHARED_COLOR
        ax.add_patch(Rectangle((c0, n_rows - r1), c1 - c0, r1 - r0, facecolor=color, edgecolor="black",
                               hatch=PARTIAL_HATCH if partial else None, alpha=0.9))
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))
        label = f"{who}\nrows {r0}:{r1}" + (f"\ncols {c0}:{c1}" if cols_dim is not None else "")
        if partial:
            label += "\npending sum"
        if (r1 - r0) < 0.2 * n_rows:  # a thin block: one line, so the label stays inside
            label = label.replace("\n", "  ")
        ax.text((c0 + c1) / 2, n_rows - (r0 + r1) / 2, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, n_cols)
    ax.set_ylim(0, max(n_rows, 1))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel(f"dim {cols_dim} ({n_cols})" if cols_dim is not None else "")
    ax.set_ylabel(f"dim {rows_dim} ({n_rows})")
    ax.set_title(f"global {list(shape)} as {_describe(placements, mesh_dim_names)}", fontsize=9)


def _draw_local(ax, shape, piece, dims):
    """One rank's local tensor, to the scale of the global one."""
    rows_dim, cols_dim = dims
    r0, r1 = _span(piece, rows_dim, shape)
    c0, c1 = _span(piece, cols_dim, shape)
    local = [b - a for a, b in piece["ranges"]]
    color = RANK_COLORS[piece["rank"] % len(RANK_COLORS)]
    ax.add_patch(Rectangle((0, shape[rows_dim] - (r1 - r0)), c1 - c0, r1 - r0, facecolor=color, edgecolor="black",
                           hatch=PARTIAL_HATCH if piece["partial"] else None))
    ax.set_xlim(0, shape[cols_dim] if cols_dim is not None else 1)
    ax.set_ylim(0, max(shape[rows_dim], 1))
    ax.set_xticks([])
    ax.set_yticks([])
    coord = "" if len(piece["coord"]) == 1 else f" {piece['coord']}"
    ax.set_title(f"rank {piece['rank']}{coord}\nlocal {local}" + (" addend" if piece["partial"] else ""), fontsize=8)


def draw_layout(shape, placements, mesh_shape=None, *, mesh_dim_names=None, dims=None, title=None):
    """The global tensor coloured by owner, and each rank's local piece beside it.

    ``mesh_shape`` defaults to ``(4,)`` for one placement; ``dims`` picks the two tensor
    dims to draw for tensors of more than 2 dims (default 0 and 1).
    """
    placements = tuple(placements)
    mesh_shape = tuple(mesh_shape or (4,) * len(placements))
    dims = _view_dims(shape, dims)
    parts = pieces(shape, placements, mesh_shape)
    n = len(parts)
    fig = plt.figure(figsize=(3 + 1.6 * n, 3))
    grid = fig.add_gridspec(1, n + 2, width_ratios=[2.4, 0.3] + [1] * n)
    _draw_global(fig.add_subplot(grid[0, 0]), shape, placements, mesh_shape, dims, mesh_dim_names)
    for i, piece in enumerate(parts):
        _draw_local(fig.add_subplot(grid[0, i + 2]), shape, piece, dims)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_transition(shape, src, dst, world_size: int = 4, *, backward: bool = True, grad_placement=None, title=None):
    """Before and after one move of the transition table, with the collective in between,
    and (``backward=True``) the collective its gradient takes on the way back.

    ``grad_placement`` is the gradient's placement when its readers declare one
    (``to_local(grad_placements=[Partial()])``): ``src=dst=Replicate()`` with
    ``grad_placement=Partial()`` draws Megatron's f.
    """
    src_n, dst_n = normalize([src], len(shape))[0], normalize([dst], len(shape))[0]
    forward_op = _op(src_n, dst_n)
    grad_src = grad_placement or (Replicate() if isinstance(dst_n, Partial) else dst_n)
    back_op = _op(grad_src, Replicate() if isinstance(src_n, Partial) else src_n)
    dims = _view_dims(shape, None)
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(10, 3.2), gridspec_kw={"width_ratios": [3, 1.4, 3]})
    _draw_global(left, shape, (src_n,), (world_size,), dims)
    _draw_global(right, shape, (dst_n,), (world_size,), dims)
    mid.axis("off")
    mid.add_patch(FancyArrowPatch((0.05, 0.62), (0.95, 0.62), arrowstyle="->", mutation_scale=18, color="black"))
    mid.text(0.5, 0.72, f"forward: {forward_op}", ha="center", fontsize=9)
    if backward:
        mid.add_patch(FancyArrowPatch((0.95, 0.35), (0.05, 0.35), arrowstyle="->", mutation_scale=18, color="#C44E52"))
        mid.text(0.5, 0.22, f"backward: {back_op}", ha="center", fontsize=9, color="#C44E52")
    mid.set_xlim(0, 1)
    mid.set_ylim(0, 1)
    fig.suptitle(title or f"{src} -> {dst} on {world_size} ranks", fontsize=10)
    fig.tight_layout()
    return fig


def _op(src, dst) -> str:
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


def _describe_value(x) -> str:
    scaled = getattr(x, "scaled", None)  # a float8 module input (tensorplay_edu.float8's Float8Input)
    if scaled is not None and isinstance(getattr(scaled, "data", None), torch.Tensor):
        return f"Float8Input {float8_tag(scaled.data.dtype) or scaled.data.dtype} {list(scaled.data.shape)}"
    if isinstance(x, torch.Tensor) and float8_tag(x.dtype):
        return f"tensor {float8_tag(x.dtype)} {list(x.shape)}"
    if isinstance(x, DTensor):
        return f"DTensor {','.join(map(str, x.placements))} {list(x.shape)}"
    if isinstance(x, torch.Tensor):
        return f"tensor {list(x.shape)}"
    if isinstance(x, (tuple, list)) and x:
        return _describe_value(x[0])
    return type(x).__name__


def trace_flow(model, *inputs, depth: int = 3) -> list[tuple[str, str, str, str]]:
    """Run ``model(*inputs)`` once (inside a rank) and list, for each module down to
    ``depth`` dots, what it received and returned and the collectives issued under it
    (forward; :func:`comm_label`: float8 ones name their format, ``"all_gather e4m3"``).
    Plain strings: return them from the rank and draw with :func:`draw_flow`."""
    rows, handles = [], []
    for name, module in model.named_modules():
        if name.count(".") >= depth or not name:
            continue

        def hook(mod, args, out, name=name):
            rows.append([name, _describe_value(args[0] if args else None), _describe_value(out)])

        handles.append(module.register_forward_hook(hook))
    with CommDebugMode() as comm:
        model(*inputs)
    for h in handles:
        h.remove()
    for row in rows:
        ops = [comm_label(r) for r in comm.records
               if r.module == getattr(model.get_submodule(row[0]), "_tp_fqn", row[0])]
        row.append(", ".join(ops))
    return [tuple(r) for r in rows]


def draw_flow(steps, title=None):
    """The layouts through a model: ``steps`` is a list of ``(module, input layout, output
    layout, collectives)`` rows (strings), top to bottom, e.g. from a traced forward.

    A layout or a collective naming a float8 format (``e4m3``, ``e5m2``, ``float8_e4m3fn``...)
    is drawn in a gold dashed box (:data:`FLOAT8_STYLE`); a float8 collective is tagged
    ``1 B/elem``, and a note under the rows says what the box means.
    """
    n = len(steps)
    any_float8 = any(float8_tag(text) for step in steps for text in step[1:])
    fig, ax = plt.subplots(figsize=(9, 0.9 * n + 0.8 + (0.3 if any_float8 else 0)))
    ax.axis("off")
    for i, (module, layout_in, layout_out, comms) in enumerate(steps):
        y = n - i - 0.5
        ax.add_patch(Rectangle((0.3, y - 0.3), 0.4, 0.6, facecolor="#E8EEF7", edgecolor="black"))
        ax.text(0.5, y, module, ha="center", va="center", fontsize=9, weight="bold")
        for x, ha, layout in ((0.28, "right", layout_in), (0.72, "left", layout_out)):
            ax.text(x, y, layout, ha=ha, va="center", fontsize=8, bbox=FLOAT8_STYLE if float8_tag(layout) else None)
        lines = [c for c in comms.split(", ") if c] if comms else []
        if lines and not any(float8_tag(c) for c in lines):  # one collective per line, in the right margin
            ax.text(1.0, y, comms.replace(", ", "\n"), ha="left", va="center", fontsize=8, color="#C44E52")
        else:  # one text per collective, the float8 ones boxed and tagged
            for j, c in enumerate(lines):
                yj = y + 0.22 * ((len(lines) - 1) / 2 - j)
                f8 = float8_tag(c)
                ax.text(1.0, yj, f"{c}  1 B/elem" if f8 else c, ha="left", va="center", fontsize=8,
                        color="black" if f8 else "#C44E52", bbox=FLOAT8_STYLE if f8 else None)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.45 if any_float8 else 0, n)
    if any_float8:
        ax.text(0.5, -0.3, "float8 (e4m3 forward, e5m2 gradients): 1 byte per element", ha="center", va="center",
                fontsize=8, bbox=FLOAT8_STYLE)
    ax.set_title(title or "layouts in -> module -> layouts out   (collectives in red)", fontsize=10)
    fig.tight_layout()
    return fig


def draw_comm_chart(records, title=None):
    """Bytes each rank sent, per module and op, forward and backward side by side."""
    keys = sorted({(r.module or "-", r.op) for r in records})
    fwd = [sum(r.bytes for r in records if (r.module or "-", r.op) == k and r.phase == "forward") for k in keys]
    bwd = [sum(r.bytes for r in records if (r.module or "-", r.op) == k and r.phase == "backward") for k in keys]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(keys) + 1.5))
    ys = range(len(keys))
    ax.barh([y + 0.2 for y in ys], fwd, height=0.4, color="#4C72B0", label="forward")
    ax.barh([y - 0.2 for y in ys], bwd, height=0.4, color="#C44E52", label="backward")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([f"{m}  {op}" for m, op in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("bytes sent per rank")
    ax.legend(fontsize=8)
    ax.set_title(title or f"{len(records)} collectives, {sum(r.bytes for r in records):,} bytes per rank", fontsize=10)
    fig.tight_layout()
    return fig

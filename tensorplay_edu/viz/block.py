"""One transformer block of the Llama in :mod:`tensorplay_edu.models.llama`, drawn as the plans
cut it: f and f̄ (the vanilla plan), or g and ḡ (the full plan, sequence parallel).

:func:`block_steps` lists the block top to bottom: each module, each collective (with its
forward and its backward, Megatron's name beside PyTorch's placements), and the tensor on every
edge with its placement and *this rank's* local shape.  :func:`draw_steps` draws such a list on an axes;
:func:`draw_block_pair` draws the vanilla and the sequence-parallel block side by side, the steps that
sequence parallelism changes in red.
``tests/test_viz.py`` runs the real block under ``parallelize_llama`` and checks the list's
shapes against the tensors the modules return, so the picture cannot drift from the code.

Notation: ``b`` batch, ``s`` sequence, ``h`` model dim, ``H`` / ``K`` query / key-value heads,
``hd = h / H``, ``F`` the FFN hidden size, ``t`` the TP degree.  Every shape drawn is local.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from matplotlib.path import Path

from ..placement import chunk_sizes
from .style import COMM_COLOR, PHASE_COLORS, barred

__all__ = ["block_steps", "block_changes", "draw_steps", "draw_block_pair"]

_FILL = {"module": "#E8EEF7", "local": "#FFFFFF", "comm": "#FBE3E3", "input": "#F4F4F4"}


def block_steps(sp: bool = False, world_size: int = 2, rank: int = 0, *, batch: int = 2, seq: int = 8,
                dim: int = 16, n_heads: int = 4, n_kv_heads: int | None = None, ffn_hidden: int | None = None):
    """The block as a list of steps (dicts): ``kind`` (input / module / comm / local), ``name``,
    ``what`` (the style, or the collective's Megatron name), ``fwd`` / ``bwd`` (collectives),
    ``placement`` and ``shape`` (the tensor leaving the step, this rank's local shape),
    ``also`` (a second reader's shape: wk and wv beside wq) and ``module`` (the fqn whose
    returned tensor that is, where one does)."""
    t, r, kv = world_size, rank, n_kv_heads or n_heads
    if n_heads % t or kv % t:
        raise ValueError(f"block_steps: n_heads={n_heads} and n_kv_heads={kv} must divide by world_size={t}: "
                         "each rank holds whole heads")
    hd, hidden = dim // n_heads, ffn_hidden or 16 * math.ceil(8 * dim / 3 / 16)
    s_local = chunk_sizes(seq, t)[r]
    full, seq_shard = [batch, seq, dim], [batch, s_local, dim]
    block_in = ("Shard(1)", seq_shard) if sp else ("Replicate()", full)

    def step(kind, name, what, placement, shape, fwd="", bwd="", module=None, also=None):
        return dict(kind=kind, name=name, what=what, fwd=fwd, bwd=bwd, placement=placement, shape=list(shape),
                    module=module, also=also)

    def enter(sub):  # the Colwise readers' shared input: f, or g under SP
        if sp:
            return step("comm", f"{sub} input", "g: all-gather / reduce-scatter", "Replicate()", full,
                        "all_gather (dim 1)", "reduce_scatter (dim 1)")
        return step("comm", f"{sub} input", "f: identity / all-reduce", "Replicate()", full,
                    "nothing", "all_reduce")

    def leave(sub, fqn):  # the Rowwise output: f\u0304, or g\u0304 under SP
        if sp:
            return step("comm", f"{sub} output", "g\u0304: reduce-scatter / all-gather", "Shard(1)", seq_shard,
                        "reduce_scatter (dim 1)", "all_gather (dim 1)", module=fqn)
        return step("comm", f"{sub} output", "f\u0304: all-reduce / identity", "Replicate()", full,
                    "all_reduce", "nothing", module=fqn)

    norm_style = "SequenceParallel" if sp else "(replicated, not parallelized)"
    return [
        step("input", "x (block input)", "the residual stream", *block_in),
        step("module", "attention_norm", norm_style, *block_in, module="attention_norm"),
        enter("attention"),
        step("module", "wq | wk, wv", "ColwiseParallel: heads H/t | K/t", "Shard(-1)",
             [batch, seq, n_heads // t * hd], module="attention.wq", also=[batch, seq, kv // t * hd]),
        step("local", "view, RoPE, softmax(qk\u1d40)v", "this rank's heads, no communication", "Shard(2)",
             [batch, seq, n_heads // t, hd]),
        step("local", "reshape", "[b, s, H/t, hd] \u2192 [b, s, h/t]: heads side by side", "Shard(-1)",
             [batch, seq, n_heads // t * hd]),
        step("module", "wo", "RowwiseParallel", "Partial()", full),
        leave("attention", "attention"),
        step("local", "+ x", "residual add: r = x + attention", *block_in),
        step("module", "ffn_norm", norm_style, *block_in, module="ffn_norm"),
        enter("feed_forward"),
        step("module", "w1, w3", "ColwiseParallel: F/t", "Shard(-1)", [batch, seq, chunk_sizes(hidden, t)[r]],
             module="feed_forward.w1"),
        step("local", "silu(w1 x) * w3 x", "elementwise, no communication", "Shard(-1)",
             [batch, seq, chunk_sizes(hidden, t)[r]]),
        step("module", "w2", "RowwiseParallel", "Partial()", full),
        leave("feed_forward", "feed_forward"),
        step("local", "+ r", "residual add: r + feed_forward", *block_in),
    ]


def _residual_skips(ax, steps):
    """The residual stream's two arrows, each skipping its sublayer from its input to its "+ " step."""
    n = len(steps)
    adds = [i for i, st in enumerate(steps) if st["name"].startswith("+ ")]
    for start, add, name in zip([0] + adds[:-1], adds, ("x", "r")):
        y0, y1 = n - 1 - start - 0.1, n - 1 - add + 0.1
        path = Path([(0.4, y0), (-0.1, y0), (-0.1, y1), (0.4, y1)], [Path.MOVETO] + [Path.LINETO] * 3)
        ax.add_patch(FancyArrowPatch(path=path, arrowstyle="->", mutation_scale=12, lw=1.2, color="black",
                                     gid=f"residual {name}"))
        ax.text(-0.2, (y0 + y1) / 2, f"residual: {name}", rotation=90, ha="right", va="center", fontsize=8)


def draw_steps(ax, steps, *, changed=None, moved=(), notes=True, local=True, note_x=8.0):
    """Draw a list of steps (:func:`block_steps`' format) top to bottom on ``ax``, step ``i`` at height
    ``len(steps) - 1 - i``: one box per step (modules blue, local work white, collectives red-filled), an arrow
    to the next step labelled with the tensor leaving this one (``placement · local [shape]``), and, where
    ``notes``, each collective's forward / backward beside it.  ``changed``: the indices whose box gets a thick
    red edge (default: the collectives' boxes); ``moved``: the indices whose tensor label is red; ``local=False``
    drops the word "local" where a title already says every shape is local; ``note_x``: where the notes start."""
    n = len(steps)
    for i, st in enumerate(steps):
        y, comm = n - 1 - i, st["kind"] == "comm"
        red = comm if changed is None else i in changed
        box = FancyBboxPatch((0.4, y - 0.24), 3.9, 0.48, boxstyle="round,pad=0.02", facecolor=_FILL[st["kind"]],
                             edgecolor=COMM_COLOR if red else "black",
                             linewidth=(2.2 if changed is not None else 1.4) if red else 0.8)
        if changed is not None:
            box.set_gid(f"{'changed' if red else 'same'} {st['name']}")
        ax.add_patch(box)
        ax.text(2.35, y + 0.08, barred(st["name"]), ha="center", va="center", fontsize=9, weight="bold")
        ax.text(2.35, y - 0.13, barred(st["what"]), ha="center", va="center", fontsize=8,
                color=COMM_COLOR if comm else "black")
        if comm and notes:
            ax.text(note_x, y, f"forward: {st['fwd']}\nbackward: {st['bwd']}", ha="left", va="center", fontsize=8,
                    bbox=dict(boxstyle="round,pad=0.2", facecolor=PHASE_COLORS["backward"], edgecolor=COMM_COLOR))
        if i + 1 < n:  # the arrow to the next step, labelled with the tensor leaving this one
            ax.add_patch(FancyArrowPatch((2.35, y - 0.25), (2.35, y - 0.75), arrowstyle="->", mutation_scale=12))
        shape = f"{st['shape']} | {st['also']}" if st.get("also") else f"{st['shape']}"
        label = f"{st['placement']} \u00b7 {'local ' if local else ''}{shape}"
        ax.text(4.5, y - 0.5 if i + 1 < n else y - 0.42, label, ha="left",
                va="center", fontsize=8, family="monospace", color=COMM_COLOR if i in moved else "black")


_KEYS = ("what", "fwd", "bwd", "placement", "shape", "also")
# Korthikanti et al. 2022's letters (Shoeybi et al. 2019 called f-bar g): f, f-bar vanilla; g, g-bar under SP.
_LETTERS = {False: "f: identity forward, all-reduce backward\nf\u0304: all-reduce forward, identity backward",
            True: "g: all-gather forward, reduce-scatter backward\ng\u0304: reduce-scatter forward, all-gather backward"}


def block_changes(world_size: int = 2, rank: int = 0, **dims) -> list[int]:
    """The indices of :func:`block_steps` where the sequence-parallel block differs from the vanilla one
    (its style or collective, or the placement or local shape of the tensor leaving it): the residual
    stream, the norms and the four collectives; the inside of attention and of the feed-forward is the same."""
    vanilla, sp = block_steps(False, world_size, rank, **dims), block_steps(True, world_size, rank, **dims)
    return [i for i, (a, b) in enumerate(zip(vanilla, sp)) if any(a[k] != b[k] for k in _KEYS)]


def draw_block_pair(world_size: int = 2, rank: int = 0, title=None, *, compact: bool = False, **dims):
    """The block of :func:`block_steps` twice, side by side: the vanilla plan (f and f-bar) on the
    left, the full plan (sequence parallel: g and g-bar) on the right, box for box.  The steps that
    sequence parallelism changes (:func:`block_changes`) have a thick red edge, and a tensor whose placement
    or local shape changes has a red label;
    the rest, the inside of attention and of the feed-forward, is drawn in black in both.  Each collective
    says its forward / backward in its box; on each arrow the tensor that flows, ``placement · [local
    shape]`` on rank ``rank``.  ``dims``: as :func:`block_steps`.  ``compact=True`` leaves out the local steps
    inside attention and the feed-forward (the same in both plans), marks changes by the red labels only (red
    edges only on the collectives' boxes) and draws a narrower figure, so its text reads larger on a page."""
    keep = [i for i, st in enumerate(block_steps(False, world_size, rank, **dims))
            if not compact or st["kind"] != "local" or st["name"].startswith("+ ")]
    changed = {keep.index(i) for i in block_changes(world_size, rank, **dims) if i in keep}
    steps_of = lambda sp: [block_steps(sp, world_size, rank, **dims)[i] for i in keep]
    pair = list(zip(steps_of(False), steps_of(True)))
    moved = {i for i, (a, b) in enumerate(pair) if (a["placement"], a["shape"]) != (b["placement"], b["shape"])}
    fig, axes = plt.subplots(1, 2, figsize=(12, 9.2) if compact else (14, 10.6))
    t, seq = world_size, dims.get("seq", 8)
    for ax, sp in zip(axes, (False, True)):
        steps = steps_of(sp)
        n = len(steps)
        ax.axis("off")
        ax.set_xlim(-0.7, 8.4)
        ax.set_ylim(-1.5, n - 0.2)
        draw_steps(ax, steps, changed=None if compact else changed, moved=moved, notes=False, local=False)
        _residual_skips(ax, steps)
        ax.text(-0.6, -1.1, barred(_LETTERS[sp]), ha="left", va="center", fontsize=8, color=COMM_COLOR)
        ax.set_title(f"full plan (sequence parallel), s/t = {chunk_sizes(seq, t)[rank]}" if sp
                     else f"vanilla plan (f and $\\bar{{f}}$), s = {seq}", fontsize=10, weight="bold")
    fig.suptitle(title or (f"one block, t = {t}, every shape rank {rank}'s local one (placement \u00b7 [local shape]): "
                           "red, what sequence parallelism changes; black, the same in both"), fontsize=10)
    fig.tight_layout()
    return fig

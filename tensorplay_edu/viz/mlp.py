"""Megatron's MLP (notebook 02, section 4): ``Linear(h, F)`` under ``ColwiseParallel``, a ReLU, ``Linear(F, h)``
under ``RowwiseParallel``, with ``f`` at its input and ``f̄`` at its output, drawn on one rank.

:func:`mlp_steps` lists it top to bottom in :func:`~tensorplay_edu.viz.block.block_steps`' format (each step's
``placement`` and ``shape`` are those of the tensor leaving it, this rank's local shape; ``module`` names the
``nn.Sequential`` index whose returned tensor that is).  :func:`mlp_comms` is what the two red boxes promise
``CommDebugMode`` will record, in issue order: so a notebook checks the picture against a real run.

Notation: ``b`` batch, ``s`` sequence, ``h`` model width, ``F`` the hidden width, ``t`` ranks.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from ..placement import chunk_sizes
from .block import draw_steps
from .style import COMM_COLOR, barred

__all__ = ["mlp_steps", "mlp_comms", "draw_mlp"]

def mlp_steps(b: int, s: int, h: int, ff: int, t: int, rank: int = 0, hooks: bool = False) -> list[dict]:
    """The MLP as a list of steps (dicts): ``kind`` (input / comm / module / local), ``name``, ``what``,
    ``fwd`` / ``bwd`` (a collective, or ``"nothing"``), ``placement`` and ``shape`` (the tensor leaving the step,
    local), ``module`` (the ``nn.Sequential`` index that returns it, or None) and ``under`` (a collective: the
    module ``CommDebugMode`` records it under). ``hooks``: name the style hook each collective runs in (the
    layer ``CommDebugMode`` records it under) beside ``f`` and ``f\u0304``."""
    f_name, fbar_name = ("f (layer 0's input hook)", "f\u0304 (layer 2's output hook)") if hooks else ("f", "f\u0304")
    full, hidden = [b, s, h], [b, s, chunk_sizes(ff, t)[rank]]

    def step(kind, name, what, placement, shape, fwd="", bwd="", module=None, under=None):
        return dict(kind=kind, name=name, what=what, fwd=fwd, bwd=bwd, placement=placement, shape=list(shape),
                    module=module, under=under)

    return [
        step("input", "x", "the MLP's input, the same on every rank", "Replicate()", full),
        step("comm", f_name, "f: identity / all-reduce", "Replicate()", full, "nothing", "all_reduce", under="0"),
        step("module", "0: Linear(h, F)", "ColwiseParallel: F/t output features", "Shard(-1)", hidden, module="0"),
        step("local", "1: ReLU", "elementwise, no communication", "Shard(-1)", hidden, module="1"),
        step("module", "2: Linear(F, h)", "RowwiseParallel: z_r W_r\u1d40, an addend", "Partial()", full),
        step("comm", fbar_name, "f\u0304: all-reduce / identity, then + bias", "Replicate()", full,
             "all_reduce", "nothing", module="2", under="2"),
    ]


def mlp_comms(steps) -> list[tuple[str, str, str, tuple]]:
    """``(op, phase, module, shape)`` of each collective the red boxes draw, in issue order: forward top to
    bottom, then backward bottom to top (the shape is the tensor the collective sums: the full activation)."""
    comms = [st for st in steps if st["kind"] == "comm"]
    forward = [(st["fwd"], "forward", st["under"], tuple(st["shape"])) for st in comms if st["fwd"] != "nothing"]
    backward = [(st["bwd"], "backward", st["under"], tuple(st["shape"])) for st in reversed(comms)
                if st["bwd"] != "nothing"]
    return forward + backward


def draw_mlp(b: int, s: int, h: int, ff: int, t: int, rank: int = 0, title=None, note_x: float = 8.0,
             xmax: float = 10.0, hooks: bool = False):
    """The steps of :func:`mlp_steps` top to bottom, with :func:`~tensorplay_edu.viz.block.draw_steps`, as a
    block is drawn: modules in blue, work without communication in white, the collectives in red with their forward
    and backward on the right (from ``note_x``; 4.5 puts them beside their boxes); on each arrow the tensor that
    flows, ``placement · local [shape]``. ``xmax``: the right edge, the width scaled with it (7.4 crops the blank
    right margin left by ``note_x=4.5``). ``hooks``: as in :func:`mlp_steps`."""
    steps = mlp_steps(b, s, h, ff, t, rank, hooks)
    n = len(steps)
    fig, ax = plt.subplots(figsize=(8.6 * xmax / 10, 4.6))
    ax.axis("off")
    ax.set_xlim(0, xmax)
    ax.set_ylim(-0.9, n - 0.4)
    draw_steps(ax, steps, note_x=note_x)
    ax.text(0.4, -0.75, barred("f: identity forward, all-reduce backward; f\u0304: all-reduce forward, identity backward"),
            ha="left", va="center", fontsize=8, color=COMM_COLOR)
    ax.set_title(barred(title or f"Megatron's MLP, t = {t}: f at its input, f\u0304 at its output "
                                 f"(every shape rank {rank}'s local shape)"), fontsize=9)
    fig.tight_layout()
    return fig

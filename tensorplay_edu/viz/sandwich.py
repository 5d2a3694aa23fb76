"""The sequence-parallel sandwich of ``PrepareModuleInputOutput`` (notebook 03, section 5c): the input's ``g``
(all-gather forward, reduce-scatter backward), the module, the output's ``ḡ`` (reduce-scatter forward,
all-gather backward), on one rank, with each tensor's layout and local shape.

Notation: ``b`` batch, ``s`` sequence, ``h`` model dim, ``out`` the module's output features, ``t`` ranks.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from .style import COMM_COLOR, barred

__all__ = ["draw_prepare_sandwich", "sandwich_steps"]

_STEP_W, _BOX_W = 1.9, 1.6


_MODULE_TEXT = "to_local(grad_placements=\n[Partial()]): its input\ngradient is an addend"


def sandwich_steps(b: int, s: int, h: int, out: int, t: int, module: str = "GatheredSliceLinear",
                   module_text: str = _MODULE_TEXT):
    """The seven boxes, left to right: ``(name, text, face colour, edge colour)``. Tensors are white boxes with
    their layout and local shape; the two conversions are red boxes saying what they do each way;
    ``module_text`` is the module box's text."""
    comm_face = "#FBE3E3"
    return [("x", f"Shard(1)\n[b, s/t, h] = [{b}, {s // t}, {h}]", "white", "black"),
            ("g", "forward: all-gather\nbackward: reduce-scatter", comm_face, COMM_COLOR),
            ("x, gathered", f"Replicate()\n[b, s, h] = [{b}, {s}, {h}]", "white", "black"),
            (module, module_text, "#E8EEF7", "black"),
            ("y, an addend", f"Partial()\n[b, s, out] = [{b}, {s}, {out}]", "white", "black"),
            ("g\u0304", "forward: reduce-scatter\nbackward: all-gather", comm_face, COMM_COLOR),
            ("y", f"Shard(1)\n[b, s/t, out] = [{b}, {s // t}, {out}]", "white", "black")]


def draw_prepare_sandwich(b: int, s: int, h: int, out: int, t: int, module: str = "GatheredSliceLinear",
                          label: str = "The", text_size: float = 7.5, module_text: str = _MODULE_TEXT):
    """The sandwich on rank 0: the boxes of ``sandwich_steps`` joined by arrows, forward left to right above
    them, backward right to left below them (in the collective colour). ``label`` starts the title (e.g. a
    section's name, "5c's"), so no section number is fixed here; ``text_size`` the boxes' text; ``module_text``
    the module box's text (shorter text fits a larger size)."""
    steps = sandwich_steps(b, s, h, out, t, module, module_text)
    width = len(steps) * _STEP_W
    fig, ax = plt.subplots(figsize=(13, 3.3))
    ax.set_xlim(-0.1, width), ax.set_ylim(-1.5, 1.4), ax.axis("off")
    for k, (name, text, face, edge) in enumerate(steps):
        left = k * _STEP_W
        ax.add_patch(FancyBboxPatch((left, -0.55), _BOX_W, 1.1, boxstyle="round,pad=0.03", facecolor=face,
                                    edgecolor=edge))
        ax.text(left + _BOX_W / 2, 0.3, barred(name), ha="center", fontsize=10 if len(name) < 15 else 8.5, weight="bold",
                color=edge)                                  # a long class name: smaller, inside its box
        ax.text(left + _BOX_W / 2, -0.1, text, ha="center", va="center", fontsize=text_size)
        if k:
            ax.add_patch(FancyArrowPatch((left - 0.28, 0), (left + 0.02, 0), arrowstyle="->", mutation_scale=12))
    right = width - 0.4
    ax.add_patch(FancyArrowPatch((0.2, 0.95), (right, 0.95), arrowstyle="->", mutation_scale=14))
    ax.text(width / 2 - 0.05, 1.1, "forward: gather the input, compute, reduce-scatter the addend", ha="center",
            fontsize=9)
    ax.add_patch(FancyArrowPatch((right, -0.95), (0.2, -0.95), arrowstyle="->", mutation_scale=14, color=COMM_COLOR))
    ax.text(width / 2 - 0.05, -1.3, "backward, in reverse: all-gather the output gradient; the input gradient, an "
            "addend as declared, reduce-scattered", ha="center", fontsize=9, color=COMM_COLOR)
    ax.set_title(barred(f"{label} sandwich on rank 0 of t = {t}: g in front of the module, g\u0304 after it"), fontsize=10)
    fig.tight_layout()
    return fig

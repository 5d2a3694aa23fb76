"""A move of the transition table with its gradient drawn as what it is: two rows, the tensors' layouts
forward (black arrow) and the gradients' layouts backward (red arrow), so a ``Partial`` tensor's
``Replicate`` gradient is drawn grey, not as the hatched stack of the tensor itself.

``draw_move_and_gradient(shape, Replicate(), Replicate(), grad_placement=Partial(), note="then rank r
computes X · A_r")`` draws Megatron's f: forward X (R) -> X (R), nothing moves; backward the declared
Partial gradient -> R, an all-reduce."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch

from ..placement import Partial, Replicate, normalize
from .layouts import draw_global, move_op, view_dims
from .style import COMM_COLOR

__all__ = ["draw_move_and_gradient"]


def _gradient_of(p):
    """The default gradient placement (section 3 of notebook 01): the tensor's own, Replicate for a Partial."""
    return Replicate() if isinstance(p, Partial) else p


def draw_move_and_gradient(shape, src, dst, world_size: int = 4, *, grad_placement=None, names=("X", "Y"),
                           note=None, title=None):
    """Forward row: ``names[0]`` in ``src`` -> ``names[1]`` in ``dst`` with the forward collective. Backward row:
    the gradient of ``names[1]`` (``grad_placement`` if its readers declare one, else the default) -> the
    gradient of ``names[0]`` (the default for ``src``), with the backward collective, in red. ``note`` is
    written under the forward arrow (what happens next, e.g. a matmul, which is not part of the move)."""
    src_n, dst_n = normalize([src], len(shape))[0], normalize([dst], len(shape))[0]
    grad_dst = normalize([grad_placement], len(shape))[0] if grad_placement is not None else _gradient_of(dst_n)
    grad_src = _gradient_of(src_n)
    dims = view_dims(shape, None)
    fig, axes = plt.subplots(2, 3, figsize=(10, 6.2), gridspec_kw={"width_ratios": [3, 1.5, 3]})
    rows = ((src_n, dst_n, move_op(src_n, dst_n), "forward", "black", names),
            (grad_src, grad_dst, move_op(grad_dst, grad_src), "backward", COMM_COLOR, tuple("d" + n for n in names)))
    for (left, mid, right), (p_left, p_right, op, phase, color, (n_left, n_right)) in zip(axes, rows):
        draw_global(left, shape, (p_left,), (world_size,), dims)
        draw_global(right, shape, (p_right,), (world_size,), dims)
        left.set_title(f"{n_left}: " + left.get_title(), fontsize=9)
        right.set_title(f"{n_right}: " + right.get_title(), fontsize=9)
        mid.axis("off")
        mid.set_xlim(0, 1)
        mid.set_ylim(0, 1)
        start, end = ((0.05, 0.55), (0.95, 0.55)) if phase == "forward" else ((0.95, 0.55), (0.05, 0.55))
        mid.add_patch(FancyArrowPatch(start, end, arrowstyle="->", mutation_scale=18, color=color, gid=phase))
        mid.text(0.5, 0.65, f"{phase}: {op}", ha="center", fontsize=9, color=color)
        if phase == "forward" and note:
            mid.text(0.5, 0.4, note, ha="center", va="top", fontsize=8, style="italic", wrap=True)
        left.set_ylabel(f"{phase}\n" + left.get_ylabel(), fontsize=9, color=color)
    fig.suptitle(title or f"{src} -> {dst} on {world_size} ranks, and its gradient", fontsize=10)
    fig.tight_layout()
    return fig

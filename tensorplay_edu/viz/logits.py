"""The vocabulary split over ranks: the logits and their gradient cut into the ranks' class blocks
(:func:`draw_logits_and_gradient`).

Notation: ``b`` batch, ``s`` sequence, ``V`` vocabulary (classes), ``t`` ranks; rank ``r`` owns the classes
``starts[r] .. starts[r] + sizes[r] - 1`` (``torch.chunk``'s split).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .style import RANK_COLORS

__all__ = ["draw_logits_and_gradient"]


def draw_logits_and_gradient(logits, grad, target, starts, sizes):
    """Two heat maps of ``[b*s, V]``, cut by black lines into the ranks' class blocks (named on top in
    their rank colour): the logits with each token's target circled, and ``b*s`` times their gradient,
    ``softmax - one-hot`` (blue below zero: the targets)."""
    logits, grad, target = np.asarray(logits), np.asarray(grad), np.asarray(target)
    rows = logits.shape[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
    for ax, data, title, unit in [(axes[0], logits, "logits x  [b*s, V]   (circles: targets)", "logit"),
                                  (axes[1], rows * grad, "b*s * gradient = softmax - one-hot", "b*s * gradient")]:
        lim = float(np.abs(data).max())
        im = ax.imshow(data, cmap="coolwarm", vmin=-lim, vmax=lim, aspect="auto")
        for o in starts[1:]:
            ax.axvline(o - 0.5, color="black", lw=2)
        ax.scatter(target, range(rows), s=160, facecolors="none", edgecolors="black", lw=1.5)
        for r, (o, n) in enumerate(zip(starts, sizes)):
            ax.text(o + n / 2 - 0.5, -0.9, f"rank {r}", ha="center", color=RANK_COLORS[r], weight="bold", fontsize=10)
        ax.set_title(title, pad=20, fontsize=11)
        ax.set_xlabel("class c")
        ax.set_ylabel("token i")
        fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02, label=unit)
    fig.tight_layout()
    return fig


"""The vocabulary split over ranks (notebooks 03 and 05): which rank owns each token id of a batch, the
logits and their gradient cut into the ranks' class blocks, and the bytes the last layer and the loss send.

Notation: ``b`` batch, ``s`` sequence, ``V`` vocabulary (classes), ``t`` ranks; rank ``r`` owns the classes
``starts[r] .. starts[r] + sizes[r] - 1`` (``torch.chunk``'s split).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap

from .style import PHASE_COLORS, RANK_COLORS

__all__ = ["draw_vocab_owners", "draw_logits_and_gradient", "draw_wire_bytes"]


def _owner(ids, starts, sizes):
    """The rank whose rows hold each id (an array of ids' shape)."""
    ids = np.asarray(ids)
    out = np.full(ids.shape, -1)
    for r, (o, n) in enumerate(zip(starts, sizes)):
        out[(ids >= o) & (ids < o + n)] = r
    return out


def draw_vocab_owners(ids, starts, sizes, title=None):
    """The token ids ``[b, s]``, each cell coloured by the rank whose rows of the ``[V, h]`` table hold it
    (rank r: ``RANK_COLORS[r]``), the id written in it; the colour bar names each rank's ids."""
    ids = np.asarray(ids)
    t = len(sizes)
    fig, ax = plt.subplots(figsize=(8, 2.4))
    image = ax.imshow(_owner(ids, starts, sizes), cmap=ListedColormap(RANK_COLORS[:t]),
                      norm=BoundaryNorm(np.arange(t + 1) - 0.5, t))
    for (i, j), v in np.ndenumerate(ids):
        ax.text(j, i, str(v), ha="center", va="center", color="white", fontsize=11, weight="bold")
    ax.set_xticks(range(ids.shape[1]))
    ax.set_yticks(range(ids.shape[0]))
    ax.tick_params(labelsize=9)
    ax.set_xlabel("position s", fontsize=9)
    ax.set_ylabel("batch b", fontsize=9)
    ax.set_title(title or "token ids, coloured by the rank whose rows hold them (all other ranks write zeros there)",
                 fontsize=10)
    bar = fig.colorbar(image, ax=ax, ticks=range(t), fraction=0.05, pad=0.02)
    bar.ax.set_yticklabels([f"rank {r}: ids {starts[r]}..{starts[r] + sizes[r] - 1}" for r in range(t)], fontsize=8)
    bar.ax.invert_yaxis()
    fig.tight_layout()
    return fig


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


def draw_wire_bytes(paths, title=None):
    """Bytes one rank sends, per path and phase, as grouped bars on a log scale, each labelled with its
    bytes: ``paths`` maps a path (``"gather logits"``, ``"loss_parallel"``) to ``{phase: bytes}``
    (``"forward"``, ``"backward"``: the same phases in every path).  The log scale keeps a bar of a few
    hundred bytes visible beside one of a hundred thousand; the labels give the numbers."""
    names = list(paths)
    phases = list(dict.fromkeys(ph for parts in paths.values() for ph in parts))
    width = 0.8 / len(phases)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for k, phase in enumerate(phases):
        xs = [i + (k - (len(phases) - 1) / 2) * width for i in range(len(names))]
        values = [paths[name].get(phase, 0) for name in names]
        color = PHASE_COLORS["backward" if phase.startswith("backward") else "forward"]
        ax.bar(xs, values, width=width * 0.95, color=color, edgecolor="black", label=phase)
        for x, v in zip(xs, values):
            ax.text(x, v, f"{v:,}", ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    values = [v for parts in paths.values() for v in parts.values() if v > 0]
    ax.set_ylim(min(values) / 4, max(values) * 4)
    ax.set_xticks(range(len(names)), names)
    ax.tick_params(labelsize=9)
    ax.set_ylabel("bytes sent per rank (log scale)", fontsize=9)
    ax.set_title(title or "bytes sent per rank", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig

"""The bug zoo's pictures: what an attention ``view`` calls a head on each rank (notebook 08), and the dropout
masks each rank draws under three seedings (notebook 08b).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle

HEAD_COLORS = plt.cm.Pastel2.colors  # one colour per true head (not the rank palette)


def draw_view_groups(views: dict, heads: int, head_dim: int, t: int, title: str | None = None):
    """The query features of one token, in their global order, as each view groups them into heads.

    ``views`` maps a row label to a function from one rank's local features ``[1, 1, heads/t * head_dim]``
    to ``[1, 1, n, d]`` (the view under test). The top row colours each feature by its true head; each
    row below boxes in black the groups the view hands to attention as heads, labelled with their
    index on the head axis (patch gids ``"group <row> <rank> <k> <first> <size>"``)."""
    per_rank = heads // t * head_dim  # features each rank holds
    colors = [HEAD_COLORS[h % len(HEAD_COLORS)] for h in range(heads)]
    fig, ax = plt.subplots(figsize=(9.5, 1.3 + 0.8 * len(views)))
    top = len(views)
    for f in range(heads * head_dim):  # top row: the true head of every global feature
        ax.add_patch(Rectangle((f, top), 1, 0.8, facecolor=colors[f // head_dim], edgecolor="white"))
        ax.text(f + 0.5, top + 0.4, f // head_dim, ha="center", va="center", fontsize=8)
    for i, (label, view) in enumerate(views.items()):
        row = top - 1 - i
        groups = view(torch.arange(per_rank, dtype=torch.float64)[None, None, :])[0, 0]  # [n, d]: local positions
        for r in range(t):
            for k, members in enumerate(groups.long().tolist()):  # k: the index on the view's head axis
                first = r * per_rank + members[0]  # where this rank's group sits in the global tensor
                for f in range(first, first + len(members)):
                    ax.add_patch(Rectangle((f, row), 1, 0.8, facecolor=colors[f // head_dim], edgecolor="white"))
                box = Rectangle((first, row), len(members), 0.8, fill=False, edgecolor="black", linewidth=1.5)
                box.set_gid(f"group {i} {r} {k} {first} {len(members)}")
                ax.add_patch(box)
                ax.text(first + len(members) / 2, row + 0.4, f"head {k}" if len(members) > 2 else k,
                        ha="center", va="center", fontsize=8)
    for r in range(t):
        last = (r + 1) * per_rank - 1
        ax.text((r + 0.5) * per_rank, top + 1.05,
                f"rank {r}: local features 0-{per_rank - 1} = global {r * per_rank}-{last}", ha="center", va="bottom",
                fontsize=9)
        if r:
            ax.axvline(r * per_rank, color="black", linestyle=":", linewidth=1)
    ax.set_xlim(0, heads * head_dim)
    ax.set_ylim(-0.2, top + 1.5)
    ax.set_yticks([top + 0.4] + [top - 1 - i + 0.4 for i in range(len(views))])
    ax.set_yticklabels(["true head\n(one process)", *views], fontsize=9)
    ax.set_xticks(range(0, heads * head_dim + 1, head_dim))
    ax.set_xlabel("query feature (global index); colour = true head", fontsize=9)
    ax.set_title(title or f"what attention treats as a head on each rank (t = {t}, H = {heads}, hd = {head_dim})",
                 fontsize=10)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


MASK_COLORS = ListedColormap(["#d9d9d9", "#2b6cb0"])  # dropped, kept


def draw_dropout_masks(runs: dict, correlations: dict, title: str | None = None):
    """Dropout under TP, one column per seeding: are the ranks' masks one mask a single device could draw?

    A dropout mask must match the tensor it masks. A **sharded** tensor (a colwise output: each rank holds its
    own features) needs an independent mask on each rank; a **replicated** tensor (a rowwise output after its
    all-reduce: every rank holds the whole thing) needs the same mask on every rank, or the replicas drift.

    ``runs`` maps a seeding's label to the per-rank results, each ``{"kept": [N, F/t] bool, "y": [N, out]}``: the
    hidden mask this rank drew on its own features, and its copy of the dropped output (0 where dropped).
    ``correlations`` maps the same labels to the mean correlation between the ranks' hidden masks.

    Top row: the ranks' hidden masks side by side, together one ``[N, F]`` mask (identical blocks: one mask
    repeated over the shards). Bottom row: each rank's mask of the replicated output, side by side (blocks that
    differ: replicas apart). Blue is kept, grey dropped; black lines part the ranks (gids ``"rank edge"``)."""
    t = len(next(iter(runs.values())))
    fig, axes = plt.subplots(2, len(runs), figsize=(11, 5), squeeze=False)
    for col, (how, per_rank) in enumerate(runs.items()):
        hidden = torch.cat([r["kept"] for r in per_rank], dim=1).int()  # [N, F]: rank 0's features first
        output = torch.cat([(r["y"] != 0) for r in per_rank], dim=1).int()  # [N, t * out]: one block per rank
        for row, (mask, what) in enumerate(((hidden, "hidden features (sharded)"), (output, "output (replicated)"))):
            ax, width = axes[row, col], mask.shape[1] // t
            ax.imshow(mask.numpy(), cmap=MASK_COLORS, vmin=0, vmax=1, aspect="auto")
            for k in range(1, t):
                ax.axvline(k * width - 0.5, color="black", linewidth=2, gid="rank edge")
            ax.set_xticks([k * width + (width - 1) / 2 for k in range(t)], [f"rank {k}" for k in range(t)], fontsize=8)
            ax.set_yticks([])
            ax.set_ylabel(f"{what}\ntokens (rows)" if col == 0 else "", fontsize=8)
            ax.set_xlabel("features, by rank" if row == 0 else "output features, one copy per rank", fontsize=8)
        axes[0, col].set_title(f"{how}\nhidden masks' correlation between ranks {correlations[how]:+.2f}", fontsize=9)
    fig.suptitle(title or "dropout masks per rank (blue: kept): each rank's hidden features above, its copy of the "
                 "output below", fontsize=10)
    fig.tight_layout()
    return fig

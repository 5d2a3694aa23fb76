"""Pictures of a sharded checkpoint (``torch.distributed.checkpoint``): which rank wrote which
chunk of a parameter, and which saved chunks each rank of another layout reads back.

Everything drawn is read from the checkpoint's own metadata (the ``.metadata`` file DCP
writes beside one ``__<rank>_0.distcp`` file per writing rank): the whole tensor's size,
each chunk's offsets and sizes, and the file that holds it.
"""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from ..placement import chunk_offset, chunk_sizes
from .style import RANK_COLORS

__all__ = ["saved_chunks", "wanted_chunks", "reads", "draw_checkpoint"]


def saved_chunks(path: str, fqn: str) -> tuple[list[int], list[dict]]:
    """``(whole shape, [{"offsets", "sizes", "rank"}])`` of one entry of the checkpoint at ``path``."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import MetadataIndex

    meta = FileSystemReader(path).read_metadata()
    if fqn not in meta.state_dict_metadata:
        raise KeyError(f"saved_chunks: no entry '{fqn}' in the checkpoint at {path}; it holds "
                       f"{sorted(meta.state_dict_metadata)[:8]}... (a dict saved as {{'model': ...}} prefixes 'model.')")
    entry = meta.state_dict_metadata[fqn]
    chunks = []
    for chunk in entry.chunks:
        where = meta.storage_data[MetadataIndex(fqn, chunk.offsets)].relative_path  # "__<rank>_0.distcp"
        chunks.append({"offsets": list(chunk.offsets), "sizes": list(chunk.sizes),
                       "rank": int(re.match(r"__(\d+)_", where).group(1))})
    return list(entry.size), chunks


def wanted_chunks(shape, dim: int, world_size: int) -> list[dict]:
    """The chunk each of ``world_size`` ranks holds of a tensor sharded on ``dim`` (torch.chunk sizes)."""
    out = []
    for r in range(world_size):  # out[r] is rank r's (possibly empty: 2 rows over 4 ranks)
        offsets, sizes = [0] * len(shape), list(shape)
        offsets[dim], sizes[dim] = chunk_offset(shape[dim], world_size, r), chunk_sizes(shape[dim], world_size)[r]
        out.append({"offsets": offsets, "sizes": sizes, "rank": r})
    return out


def reads(wanted: dict, saved: list[dict]) -> list[dict]:
    """The parts of the saved chunks that a wanted chunk covers: what DCP reads for it, and from
    which rank's file."""
    out = []
    for c in saved:
        lo = [max(a, b) for a, b in zip(wanted["offsets"], c["offsets"])]
        hi = [min(a + n, b + m) for a, n, b, m in zip(wanted["offsets"], wanted["sizes"], c["offsets"], c["sizes"])]
        if all(h > low for low, h in zip(lo, hi)):
            out.append({"offsets": lo, "sizes": [h - low for low, h in zip(lo, hi)], "rank": c["rank"]})
    return out


def _rect(chunk, shape):
    """(x, y, width, height) of a chunk of a 1-D or 2-D tensor: columns across, rows down."""
    off, size = chunk["offsets"] + [0] * (2 - len(shape)), chunk["sizes"] + [1] * (2 - len(shape))
    return off[1], off[0], size[1], size[0]


def _rows(chunk) -> str:
    a, n = chunk["offsets"][0], chunk["sizes"][0]
    return f"row {a}" if n == 1 else f"rows {a}-{a + n - 1}"


def draw_checkpoint(shape, saved: list[dict], loaded: list[dict], *, name: str = "", title=None):
    """Left: the checkpoint, each chunk in the colour of the rank that wrote it.  Right: the same
    tensor at another layout, each rank's chunk with the saved chunks it reads (dashed)."""
    shape = list(shape)
    rows, cols = shape[0], (shape[1] if len(shape) > 1 else 1)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    panels = ((axes[0], saved, f"saved by {len({c['rank'] for c in saved})} ranks: who wrote what"),
              (axes[1], loaded, f"read back by {len(loaded)} ranks: what each reads"))
    for ax, chunks, label in panels:
        for c in (c for c in chunks if all(c["sizes"])):
            x, y, w, h = _rect(c, shape)
            ax.add_patch(Rectangle((x, y), w, h, facecolor=RANK_COLORS[c["rank"] % len(RANK_COLORS)], alpha=0.85,
                                   edgecolor="black", linewidth=1.2))
            if ax is axes[0]:
                text = f"rank {c['rank']} writes\n{_rows(c)}"
            else:
                text = f"rank {c['rank']} reads\n" + "\n".join(f"{_rows(s)} from rank {s['rank']}'s file"
                                                             for s in reads(c, saved))
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8, zorder=5,
                    bbox=dict(boxstyle="round,pad=0.2", facecolor="white", alpha=0.95, edgecolor="none"))
        if ax is axes[1]:  # where the saved chunks end: DCP reads across these lines
            for s in saved:
                x, y, w, h = _rect(s, shape)
                ax.add_patch(Rectangle((x, y), w, h, fill=False, edgecolor="black", linestyle="--", linewidth=0.8, zorder=2))
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)  # row 0 at the top, as the tensor prints
        ax.set_aspect("auto")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel(f"columns (0-{cols - 1})", fontsize=8)
        ax.set_ylabel(f"rows (0-{rows - 1})", fontsize=8)
        ax.tick_params(labelsize=8)
    fig.suptitle(title or f"{name} {shape}".strip(), fontsize=11)
    fig.tight_layout()
    return fig

"""Pictures of a sharded checkpoint (``torch.distributed.checkpoint``): which rank wrote which
chunk of a parameter, and, for each rank of another layout, what it keeps and what it reads.

Everything drawn is read from the checkpoint's own metadata (the ``.metadata`` file DCP
writes beside one ``__<rank>_0.distcp`` file per writing rank): the whole tensor's size,
each chunk's offsets and sizes, and the file that holds it. DCP's ``FileSystemReader`` reads
every saved chunk a rank's piece overlaps **whole** and cuts the overlap out in memory
(``read_data`` and ``narrow_tensor_by_index`` in ``torch/distributed/checkpoint/filesystem.py``):
``keeps`` is the overlap, ``reads`` the whole chunks.
"""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from ..placement import chunk_offset, chunk_sizes
from .style import RANK_COLORS

__all__ = ["saved_chunks", "wanted_chunks", "keeps", "reads", "draw_checkpoint"]


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


def _overlap(wanted: dict, saved: dict) -> dict | None:
    lo = [max(a, b) for a, b in zip(wanted["offsets"], saved["offsets"])]
    hi = [min(a + n, b + m) for a, n, b, m in zip(wanted["offsets"], wanted["sizes"], saved["offsets"], saved["sizes"])]
    if all(h > low for low, h in zip(lo, hi)):
        return {"offsets": lo, "sizes": [h - low for low, h in zip(lo, hi)], "rank": saved["rank"]}
    return None


def keeps(wanted: dict, saved: list[dict]) -> list[dict]:
    """The parts of the saved chunks that a wanted chunk covers: what its rank keeps, and from
    which rank's file."""
    return [part for part in (_overlap(wanted, c) for c in saved) if part is not None]


def reads(wanted: dict, saved: list[dict]) -> list[dict]:
    """The saved chunks a wanted chunk overlaps, each whole: what DCP's ``FileSystemReader`` reads
    for it (it cuts ``keeps`` out of them in memory)."""
    return [c for c in saved if _overlap(wanted, c) is not None]


def _numbers(chunk) -> int:
    n = 1
    for size in chunk["sizes"]:
        n *= size
    return n


def _rect(chunk, shape):
    """(x, y, width, height) of a chunk of a 1-D or 2-D tensor: columns across, rows down."""
    off, size = chunk["offsets"] + [0] * (2 - len(shape)), chunk["sizes"] + [1] * (2 - len(shape))
    return off[1], off[0], size[1], size[0]


def _rows(chunk) -> str:
    a, n = chunk["offsets"][0], chunk["sizes"][0]
    return f"row {a}" if n == 1 else f"rows {a}-{a + n - 1}"


def draw_checkpoint(shape, saved: list[dict], loaded: list[dict], *, name: str = "", title=None, itemsize=None):
    """Left: the checkpoint, each chunk in the colour of the rank that wrote it.  Then one panel per
    rank of another layout: the part it keeps (filled), the rest of the saved chunks it reads whole
    and throws away (hatched), the saved chunks' borders dashed.  In every panel a row's colour is
    the file it comes from (the rank that wrote it); which rank reads is said by the panel's title,
    in numbers, or in bytes when ``itemsize`` (bytes per number, 8 for float64) is given."""
    shape = list(shape)
    rows, cols = shape[0], (shape[1] if len(shape) > 1 else 1)
    fig, axes = plt.subplots(1, 1 + len(loaded), figsize=(4.2 + 3.2 * len(loaded), 4.4),
                             gridspec_kw={"width_ratios": [1.3] + [1] * len(loaded)})
    box = dict(boxstyle="round,pad=0.2", facecolor="white", alpha=0.95, edgecolor="none")
    file_colour = lambda chunk: RANK_COLORS[chunk["rank"] % len(RANK_COLORS)]  # the file it was written to
    left = axes[0]
    for c in (c for c in saved if all(c["sizes"])):
        x, y, w, h = _rect(c, shape)
        left.add_patch(Rectangle((x, y), w, h, facecolor=file_colour(c), alpha=0.85, edgecolor="black", linewidth=1.2))
        left.text(x + w / 2, y + h / 2, f"rank {c['rank']} writes\n{_rows(c)}", ha="center", va="center",
                  fontsize=8, zorder=5, bbox=box)
    left.set_title(f"saved by {len({c['rank'] for c in saved})} ranks: who wrote what\n(colour: the file, in every panel)",
                   fontsize=10)
    for ax, c in zip(axes[1:], loaded):
        read = reads(c, saved) if all(c["sizes"]) else []
        for s in read:  # read whole, thrown away where it is not kept (hatched, in its file's colour)
            ax.add_patch(Rectangle(_rect(s, shape)[:2], *_rect(s, shape)[2:], facecolor="white",
                                   edgecolor=file_colour(s), hatch="///", linewidth=0, zorder=1))
        if all(c["sizes"]):
            for k in keeps(c, saved):  # kept: filled in the colour of the file it was read from
                x, y, w, h = _rect(k, shape)
                ax.add_patch(Rectangle((x, y), w, h, facecolor="white", linewidth=0, zorder=2))  # hides the hatch
                ax.add_patch(Rectangle((x, y), w, h, facecolor=file_colour(k), alpha=0.85, linewidth=0, zorder=3))
            x, y, w, h = _rect(c, shape)
            ax.add_patch(Rectangle((x, y), w, h, fill=False, edgecolor="black", linewidth=1.6, zorder=3.5))  # the piece
            text = f"rank {c['rank']} keeps\n" + "\n".join(f"{_rows(k)} of rank {k['rank']}'s file"
                                                          for k in keeps(c, saved))
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8, zorder=5, bbox=box)
        for s in saved:  # where the saved chunks end: DCP reads each one it needs whole
            ax.add_patch(Rectangle(_rect(s, shape)[:2], *_rect(s, shape)[2:], fill=False, edgecolor="black",
                                   linestyle="--", linewidth=0.8, zorder=4))
        k, unit = (1, "numbers") if itemsize is None else (itemsize, "bytes")
        ax.set_title(f"TP {len(loaded)}, rank {c['rank']}: keeps {k * _numbers(c):,} {unit},\n"
                     f"reads {k * sum(_numbers(s) for s in read):,} (hatched: read, thrown away)", fontsize=9)
    for ax in axes:
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)  # row 0 at the top, as the tensor prints
        ax.set_aspect("auto")
        ax.set_xlabel(f"columns (0-{cols - 1})", fontsize=8)
        ax.set_ylabel(f"rows (0-{rows - 1})", fontsize=8)
        ax.tick_params(labelsize=8)
    fig.suptitle(title or f"{name} {shape}".strip(), fontsize=11)
    fig.tight_layout()
    return fig

"""One step of a ring collective, drawn as bytes per link and direction (notebook 00c, "both ways round").

A ring step is a set of sends ``(sender, receiver, ...)``. :func:`link_bytes` adds up the bytes each directed
link ``(sender, receiver)`` carries in that step; :func:`draw_link_bytes` draws one panel per ring (ranks on a
circle, an arrow per directed link in the sender's colour, labelled with its bytes) and titles each panel with
the two numbers that tell the fabrics apart: the busiest link's bytes one way, which a ring of point-to-point
links pays, and the most bytes one GPU sends, which a GPU's own ports into a switch pay.
"""

from __future__ import annotations

import math
from collections import Counter

import matplotlib.pyplot as plt

from .style import RANK_COLORS

__all__ = ["link_bytes", "draw_link_bytes"]


def link_bytes(sends, nbytes: int) -> Counter:
    """Bytes per directed link ``(sender, receiver)`` in one step: every send carries ``nbytes``."""
    out = Counter()
    for send in sends:
        out[tuple(send[:2])] += nbytes
    return out


def draw_link_bytes(panels: dict, world: int, title: str = ""):
    """One panel per entry of ``panels``, {panel title: Counter {(sender, receiver): bytes}}, on ``world``
    ranks placed on a circle. Each panel's title adds the busiest link's bytes and the most one GPU sends."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4.2), squeeze=False)
    where = {r: (math.sin(2 * math.pi * r / world), math.cos(2 * math.pi * r / world)) for r in range(world)}
    for ax, (name, links) in zip(axes[0], panels.items()):
        for (src, dst), n in links.items():
            (x0, y0), (x1, y1) = where[src], where[dst]
            dx, dy = x1 - x0, y1 - y0
            ox, oy = -dy * 0.08, dx * 0.08                          # each direction on its own side of the link
            ax.annotate("", xy=(x1 - 0.2 * dx + ox, y1 - 0.2 * dy + oy), xytext=(x0 + 0.2 * dx + ox, y0 + 0.2 * dy + oy),
                        arrowprops=dict(arrowstyle="-|>", color=RANK_COLORS[src], lw=2))
            ax.text((x0 + x1) / 2 + 2.6 * ox, (y0 + y1) / 2 + 2.6 * oy, f"{n} B", ha="center", va="center", fontsize=9)
        for r, (x, y) in where.items():
            ax.add_patch(plt.Circle((x, y), 0.15, color=RANK_COLORS[r]))
            ax.text(x, y, str(r), ha="center", va="center", color="white", weight="bold")
        sent = max(sum(n for (src, _), n in links.items() if src == r) for r in range(world))
        ax.set_title(f"{name}\nbusiest link {max(links.values())} B one way; each GPU sends {sent} B", fontsize=10)
        ax.set(xlim=(-1.45, 1.45), ylim=(-1.35, 1.35), aspect="equal")
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig

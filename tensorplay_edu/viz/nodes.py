"""Which ranks of which node form each group of a device mesh.

A cluster is nodes of a few GPUs each: NVLink inside a node, a slower network between nodes. Under
``torchrun --nnodes N --nproc-per-node G``, node ``k`` runs ranks ``k*G ... k*G + G - 1``, and
``init_device_mesh`` fills the mesh row by row, so the **last** dimension holds consecutive ranks.
Name it ``"tp"`` (with a size dividing ``G``) and each TP group sits inside a node, while the DP groups
cross the nodes, which their once-per-step gradient all-reduce can afford. Name the first dimension
``"tp"`` instead and every TP group crosses the network, in every layer.

:func:`node_groups` works the layout out (the same rule as :func:`tensorplay_edu.mesh.tp_across_nodes`);
:func:`draw_nodes` draws it: one frame per node holding its GPUs (one colour per rank), each group a
comb joining its ranks, TP above (solid; dark red when it crosses nodes), the other dimension below
(dashed). Matplotlib only; the Figure is returned.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import FancyBboxPatch, Rectangle

from .style import COMM_COLOR, RANK_COLORS

__all__ = ["node_groups", "draw_nodes", "draw_mesh_grid"]

_GAP = 0.8  # between two nodes' frames, in GPU widths


def _names(ndim: int, mesh_dim_names) -> tuple[str, ...]:
    if ndim not in (1, 2):
        raise ValueError(f"draw_nodes: mesh_shape must be 1-D or 2-D (dp, tp), got {ndim}-D")
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else (("tp",) if ndim == 1 else ("dp", "tp"))
    if len(names) != ndim or "tp" not in names:
        raise ValueError(f"draw_nodes: mesh_dim_names {names} must name each of the {ndim} dimension(s), one 'tp'")
    return names


def node_groups(mesh_shape, gpus_per_node: int, mesh_dim_names=None) -> dict:
    """Where a row-major mesh of ``prod(mesh_shape)`` ranks lands on nodes of ``gpus_per_node``.

    Returns ``{"nodes": [[ranks of node 0], ...], "groups": {name: [(ranks, nodes), ...]}}``: for each
    mesh dimension (``"tp"`` and, on a 2-D mesh, the other), each group's ranks and the sorted nodes
    they sit on. A TP group with more than one node crosses the network.
    """
    shape = tuple(mesh_shape)
    names = _names(len(shape), mesh_dim_names)
    world = math.prod(shape)
    if gpus_per_node < 1 or world % gpus_per_node:
        raise ValueError(f"draw_nodes: gpus_per_node={gpus_per_node} must divide the mesh's {world} ranks")
    mesh = torch.arange(world).view(shape)
    groups = {}
    for dim, name in enumerate(names):
        lines = mesh.movedim(dim, -1).reshape(-1, shape[dim]).tolist()
        groups[name] = [(line, sorted({r // gpus_per_node for r in line})) for line in lines]
    nodes = [list(range(k * gpus_per_node, (k + 1) * gpus_per_node)) for k in range(world // gpus_per_node)]
    return {"nodes": nodes, "groups": groups}


def _levels(spans: list[tuple[float, float]]) -> list[int]:
    """The lowest level for each span where it overlaps no span already there (combs never cross)."""
    taken: list[list[tuple[float, float]]] = []
    out = []
    for lo, hi in spans:
        level = next((i for i, row in enumerate(taken) if all(hi < a or lo > b for a, b in row)), len(taken))
        if level == len(taken):
            taken.append([])
        taken[level].append((lo, hi))
        out.append(level)
    return out


def draw_nodes(mesh_shape, gpus_per_node: int, mesh_dim_names=None, title: str | None = None):
    """Nodes side by side, their GPUs (ranks) inside, and the mesh's groups as combs joining ranks.

    TP groups are drawn above the GPUs, black and solid when inside one node, dark red (``COMM_COLOR``)
    and labelled "crosses nodes" otherwise; the other dimension's groups (DP) below, grey and dashed.
    """
    layout = node_groups(mesh_shape, gpus_per_node, mesh_dim_names)
    world = sum(len(n) for n in layout["nodes"])
    if world > len(RANK_COLORS):
        raise ValueError(f"draw_nodes: at most {len(RANK_COLORS)} ranks (one colour per rank), got {world}")
    x = {r: r + (r // gpus_per_node) * _GAP for r in range(world)}  # left edge of rank r's box
    fig, ax = plt.subplots(figsize=(1.0 + 1.05 * (world + _GAP * len(layout["nodes"])), 4.2))
    for k, ranks in enumerate(layout["nodes"]):
        left, width = x[ranks[0]] - 0.2, len(ranks) + 0.2  # the GPUs, 0.2 of margin either side
        ax.add_patch(FancyBboxPatch((left, -0.25), width, 1.25, boxstyle="round,pad=0.05", fill=False, ec="black",
                                    lw=1.5))
        ax.text(left + width / 2, 0.85, f"node {k} (NVLink inside)", ha="center", fontsize=9)
    for r in range(world):
        ax.add_patch(Rectangle((x[r], 0), 0.8, 0.7, color=RANK_COLORS[r]))
        ax.text(x[r] + 0.4, 0.35, f"rank {r}", ha="center", va="center", color="white", fontsize=8, weight="bold")
    for name, groups in layout["groups"].items():
        tp = name == "tp"
        spans = [(x[min(ranks)], x[max(ranks)]) for ranks, _ in groups]
        for (ranks, nodes), level in zip(groups, _levels(spans)):
            y = 1.35 + 0.42 * level if tp else -0.6 - 0.42 * level
            crosses = len(nodes) > 1
            color = (COMM_COLOR if crosses else "black") if tp else "dimgray"
            style = dict(color=color, lw=2.2 if tp else 1.4, ls="-" if tp else "--")
            centres = [x[r] + 0.4 for r in ranks]
            ax.plot([min(centres), max(centres)], [y, y], **style)
            for c in centres:  # a tooth down (TP) or up (DP) to each member
                ax.plot([c, c], [y, 1.0 if tp else -0.25], **{**style, "lw": 1.0})
            label = f"{name} {ranks}" + (" crosses nodes" if tp and crosses else "")
            ax.text(max(centres) + 0.15, y, label, va="center", fontsize=8, color=color)
    ax.set_xlim(-0.6, x[world - 1] + 3.6)
    ax.autoscale(axis="y")
    ax.set_ylim(min(ax.get_ylim()[0], -1.1), max(ax.get_ylim()[1], 2.0))
    ax.axis("off")
    shape = tuple(mesh_shape)
    names = _names(len(shape), mesh_dim_names)
    ax.set_title(title or f"{len(layout['nodes'])} nodes x {gpus_per_node} GPUs, mesh {shape} named {names}",
                 fontsize=10)
    fig.tight_layout()
    return fig


def draw_mesh_grid(dp: int, tp: int, title=None):
    """A ``(dp, tp)`` mesh as a grid of its ranks, filled row by row as ``init_device_mesh`` does: rank r at
    ``(r // tp, r % tp)``, in its colour. Each row, a TP group (inside one node, every layer), has a solid frame; each
    column, a DP group (its gradients, one all-reduce per bucket in backward), a dashed one."""
    fig, ax = plt.subplots(figsize=(7, 1.8 * dp))
    x0, y0 = (lambda t: t * 2.6), (lambda d: -d * 1.7)  # where rank (d, t) sits
    for r in range(dp * tp):
        d, t = divmod(r, tp)
        ax.add_patch(Rectangle((x0(t), y0(d)), 1.6, 0.9, color=RANK_COLORS[r % len(RANK_COLORS)]))
        ax.text(x0(t) + 0.8, y0(d) + 0.45, f"rank {r}\n(dp {d}, tp {t})", ha="center", va="center",
                color="white", fontsize=10, weight="bold")
    for d in range(dp):  # rows: TP groups, solid frames
        ax.add_patch(FancyBboxPatch((x0(0) - 0.4, y0(d) - 0.12), x0(tp - 1) + 2.4, 1.14, fill=False, lw=2,
                                    ec="black", boxstyle="round,pad=0.02", gid=f"tp {d}"))
        ax.text(x0(tp - 1) + 2.2, y0(d) + 0.45, f"TP group {list(range(d * tp, (d + 1) * tp))}\ninside one node, every layer",
                va="center", fontsize=9)
    for t in range(tp):  # columns: DP groups, dashed frames
        ax.add_patch(FancyBboxPatch((x0(t) - 0.15, y0(dp - 1) - 0.3), 1.9, y0(0) - y0(dp - 1) + 1.5, fill=False,
                                    lw=1.5, ec="dimgray", ls="--", boxstyle="round,pad=0.02", gid=f"dp {t}"))
        ax.text(x0(t) + 0.8, y0(dp - 1) - 0.4,
                f"DP group {list(range(t, dp * tp, tp))}\ngradients, per bucket,\nin backward",
                ha="center", va="top", fontsize=9, color="dimgray")
    ax.set_xlim(-0.6, x0(tp - 1) + 4.4)
    ax.set_ylim(y0(dp - 1) - 1.1, 1.3)
    ax.axis("off")
    ax.set_title(title or f"{dp * tp} ranks as a (dp, tp) = ({dp}, {tp}) mesh: rows are TP groups, columns DP groups",
                 fontsize=10)
    return fig

"""Compute beside transfers, in time: a Gantt chart of a run's intervals (:func:`draw_timeline`), and one
small timeline per ring (:func:`draw_ring_timelines`) where a stretch with no matmul is posting or waiting.
Compute is dark teal and transfers pale teal (``LANE_COLORS``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle
from matplotlib.transforms import blended_transform_factory

from .ring_cuts import bar_labels, idle_stretches, ring_intervals, ring_shares, uncovered
from .style import LANE_COLORS, RANK_COLORS

__all__ = ["draw_timeline", "draw_ring_timelines", "ring_intervals", "ring_shares"]


_RING_OPS = {"all_gather_matmul": "all-gather \u2192 matmul", "matmul_reduce_scatter": "matmul \u2192 reduce-scatter"}


_PHASE_SHADE = {"forward": "#EFEFEF", "backward": "#FFF6DC"}  # timeline backgrounds (not rank or lane colours)


def _ring_name(ring) -> tuple[str, str]:
    """(text, phase) of one ring: a CommRecord-like (``.module``, ``.op``, ``.phase``), a ``(module, phase[, op])``
    tuple or a plain string."""
    if hasattr(ring, "op"):
        module, phase, op = ring.module, ring.phase, ring.op
    elif isinstance(ring, str):
        return ring, ""
    else:
        module, phase, op = (tuple(ring) + ("",))[:3]
    return f"{module or '-'}: {_RING_OPS.get(op, op)}".rstrip(": "), phase


def draw_timeline(per_rank_intervals, title=None, *, rings=None, ring_size=None):
    """A Gantt chart of :class:`~tensorplay_edu.async_tp.timeline.Timeline` intervals.  ``per_rank_intervals[r]``
    lists rank r's ``Interval``s (or plain ``(kind, label, start, end)`` tuples, in seconds).  Each rank,
    top to bottom, gets a compute lane above a transfer lane, marked on the left by a strip in its colour.
    Each interval is a bar labelled with what it is, as much as fits: ``"step 2/3: matmul chunk 1"``
    (a gather ring's matmul), ``"part of sum 1"`` (a reduce-scatter ring's), ``"send chunk 2, get chunk 1"``
    (a transfer), down to the chunk number.  A ring is ``ring_size`` steps (default: the ranks drawn).

    ``rings`` (optional) names the rings in the order each rank ran them: CommRecords of the fused ops
    (``all_gather_matmul`` / ``matmul_reduce_scatter``, with their module and phase), ``(module, phase[, op])``
    tuples or strings.  Then each ring gets a numbered bracket above the lanes, a key beside the chart names
    it, and the forward and the backward are shaded.  Time in ms."""
    rows = [[(i.kind, i.label, i.start, i.end) if hasattr(i, "kind") else tuple(i) for i in ivs]
            for ivs in per_rank_intervals]
    bad = sorted({k for ivs in rows for k, *_ in ivs} - set(LANE_COLORS))
    if bad:
        raise ValueError(f"draw_timeline: interval kinds must be {sorted(LANE_COLORS)}, got {bad}")
    n, t = len(rows), ring_size or len(rows)
    names = [_ring_name(ring) for ring in rings] if rings is not None else []
    lane = lambda r, kind: 3 * (n - 1 - r) + (kind == "compute")  # compute above transfer, a gap between ranks
    span = 1e3 * max((end for ivs in rows for *_, end in ivs), default=0.0) or 1.0  # ms
    top = 3 * n - 1.3 + (0.9 if names else 0)  # room for the ring brackets
    key_lines = max((sum(ph == p for _, ph in names) for p in {ph for _, ph in names}), default=-1) + 1
    fig, ax = plt.subplots(figsize=(10, 0.9 * n + 1.4 + (0.5 + 0.16 * key_lines if names else 0)))
    ax.set_yticks([lane(r, k) for r in range(n) for k in LANE_COLORS],
                  [f"rank {r} {k}" for r in range(n) for k in LANE_COLORS], fontsize=8)
    ax.tick_params(axis="y", length=0, pad=12)
    ax.set(xlim=(0, span * 1.01), ylim=(-0.7, top), xlabel="time (ms)")
    ax.set_title(title or f"compute and transfers on {n} ranks", fontsize=10, loc="left")
    labelled = [bar_labels(ivs, t) for ivs in rows]
    extent: dict = {}  # ring -> (first start, last end) over the ranks, ms
    for ivs, (_, ring_ids) in zip(rows, labelled):
        for (_, _, start, end), ring in zip(ivs, ring_ids):
            if ring is not None and ring < len(names):
                a, b = extent.get(ring, (1e3 * start, 1e3 * end))
                extent[ring] = (min(a, 1e3 * start), max(b, 1e3 * end))
    handles = [Patch(facecolor=c) for c in LANE_COLORS.values()]
    legend = list(LANE_COLORS)
    for phase, shade in _PHASE_SHADE.items():  # one background per phase, from its first ring to its last
        spans = [extent[i] for i, (_, ph) in enumerate(names) if ph == phase and i in extent]
        if spans:
            ax.axvspan(min(a for a, _ in spans), max(b for _, b in spans), color=shade, zorder=0, lw=0)
            handles.append(Patch(facecolor=shade, edgecolor="#999999"))
            legend.append(phase)
    for i, (a, b) in sorted(extent.items()):
        y = 3 * n - 1.25 + 0.3 * (i % 2)  # alternate heights: neighbours' numbers do not collide
        ax.plot([a, a, b, b], [y - 0.12, y, y, y - 0.12], color="black", lw=0.8)
        ax.text((a + b) / 2, y + 0.05, str(i + 1), ha="center", va="bottom", fontsize=8)
    columns = dict.fromkeys(phase for _, phase in names)  # a key under the chart: one column per phase
    for c, phase in enumerate(columns if extent else []):
        key = [f"{i + 1:2d}  {text}" for i, (text, ph) in enumerate(names) if ph == phase]
        ax.annotate("\n".join([f"{phase or 'rings'}:"] + key), (0.53 * c, 0), xycoords="axes fraction",
                    xytext=(0, -32), textcoords="offset points", ha="left", va="top", fontsize=8, family="monospace")
    if names:  # four entries: beside the lanes, clear of the title
        ax.legend(handles, legend, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    else:
        ax.legend(handles, legend, fontsize=8, ncol=2, loc="lower right", bbox_to_anchor=(1, 1), frameon=False)
    fig.tight_layout()
    points_per_ms = ax.get_position().width * fig.get_figwidth() * 72 / (span * 1.01)  # to fit the labels
    strip = blended_transform_factory(ax.transAxes, ax.transData)  # x in axes fractions, y in lanes
    for r, (ivs, (labels, _)) in enumerate(zip(rows, labelled)):
        ax.add_patch(Rectangle((-0.014, lane(r, "transfer") - 0.45), 0.009, 1.9, transform=strip, clip_on=False,
                               facecolor=RANK_COLORS[r % len(RANK_COLORS)]))
        for (kind, _, start, end), texts in zip(ivs, labels):
            x, w, y = 1e3 * start, 1e3 * (end - start), lane(r, kind)
            ax.add_patch(Rectangle((x, y - 0.4), w, 0.8, facecolor=LANE_COLORS[kind], edgecolor="white",
                                   lw=0.5 if w * points_per_ms > 3 else 0))  # a white edge would hide a thin bar
            for text in texts:  # the longest label that fits, else a shorter one, else nothing
                if text and w * points_per_ms >= 4.7 * len(text) + 4:
                    ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=8,
                            color="white" if kind == "compute" else "black")
                    break
    return fig


WAIT_STYLE = dict(facecolor="#F4F4F4", edgecolor="#777777", hatch="///")  # a rank blocked in wait(): no work
POST_STYLE = dict(facecolor="#FBE3D6", edgecolor="#B0705A", hatch="\\\\")  # a rank inside ring_shift: no work yet
_IDLE = {"waiting": ("wait", WAIT_STYLE), "posting": ("post", POST_STYLE)}  # gid and style of an idle stretch


def draw_ring_timelines(per_rank_intervals, rings, title=None, *, ring_size=None, columns=None):
    """One small timeline per ring, each on its own time axis, so that a ring's bars are wide enough to read.
    ``per_rank_intervals[r]`` lists rank r's intervals, as for :func:`draw_timeline` (a rank's rings are ``t``
    matmuls and ``t - 1`` transfers each, in order); ``rings`` names the rings in the order they ran (records,
    ``(module, phase[, op])`` tuples or strings). Panels go in one column per phase (forward left, backward
    right), or ``columns`` of them when the rings name no phase.

    In each panel every rank has a compute lane above a transfer lane. A transfer bar is split in two: pale
    teal where a matmul of the same rank ran at the same time (the transfer in flight **under** a matmul:
    overlap). Every stretch of a rank's ring without a matmul is hatched in its transfer lane: orange from the
    transfer's start to the first matmul under it, the rank **posting** (inside ``ring_shift``); grey elsewhere,
    **waiting** (in ``wait()`` for the bytes). Bars carry the longest label that fits; ms from the ring's start."""
    rows = [[(i.kind, i.label, i.start, i.end) if hasattr(i, "kind") else tuple(i) for i in ivs]
            for ivs in per_rank_intervals]
    n, t = len(rows), ring_size or len(rows)
    names = [_ring_name(ring) for ring in rings]
    labelled = [bar_labels(ivs, t) for ivs in rows]
    phases = list(dict.fromkeys(ph for _, ph in names))
    if phases == [""]:
        ncol = columns or 1
        place = {i: (i // ncol, i % ncol) for i in range(len(names))}
    else:
        ncol = len(phases)
        place = {i: ([j for j, (_, p) in enumerate(names) if p == ph].index(i), phases.index(ph))
                 for i, (_, ph) in enumerate(names)}
    nrow = max(r for r, _ in place.values()) + 1 if place else 1
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.6 * ncol, (0.42 * 2 * n + 0.75) * nrow + 0.9), squeeze=False)
    lane = lambda r, kind: 3 * (n - 1 - r) + (kind == "compute")  # noqa: E731
    panels = {}
    for i, (text, phase) in enumerate(names):
        ax = axes[place[i]]
        mine = [[(iv, lab) for iv, lab, ring in zip(ivs, labels, ring_ids) if ring == i]
                for ivs, (labels, ring_ids) in zip(rows, labelled)]
        spans = [iv[2:] for bars in mine for iv, _ in bars]
        t0 = min((a for a, _ in spans), default=0.0)
        width = 1e3 * (max((b for _, b in spans), default=t0) - t0) or 1.0
        ax.set(xlim=(-0.02 * width, 1.02 * width), ylim=(-0.7, 3 * n - 1.3))
        ax.set_yticks([lane(r, k) for r in range(n) for k in LANE_COLORS],
                      [f"rank {r} {k}" for r in range(n) for k in LANE_COLORS], fontsize=8)
        ax.tick_params(axis="both", labelsize=8, length=2)
        ax.set_title(f"ring {i + 1}" + (f" ({phase})" if phase else "") + f": {text}", fontsize=9, loc="left")
        panels[i] = (ax, mine, t0, width)
    for ax in axes.flat:
        if ax not in [p[0] for p in panels.values()]:
            ax.axis("off")
    for c in range(ncol):  # the time axis named once per column
        used = [r for r in range(nrow) if any(place[i] == (r, c) for i in panels)]
        if used:
            axes[used[-1], c].set_xlabel("ms from the ring's first bar", fontsize=8)
    handles = [Patch(facecolor=LANE_COLORS["compute"]), Patch(facecolor=LANE_COLORS["transfer"]), Patch(**WAIT_STYLE),
               Patch(**POST_STYLE)]
    height = fig.get_figheight()
    fig.suptitle(title or f"each ring on {n} ranks", fontsize=10, x=0.01, ha="left", y=1 - 0.08 / height)
    fig.legend(handles, ["compute: a ring matmul", "transfer in flight under a matmul (overlap)",
                         "waiting: no matmul to run (in wait() for the bytes)",
                         "posting: in ring_shift, before the matmul under it"],
               loc="upper left", ncol=4, fontsize=8, frameon=False, bbox_to_anchor=(0.005, 1 - 0.32 / height))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.7 / height))
    for ax, mine, t0, width in panels.values():
        points_per_ms = ax.get_position().width * fig.get_figwidth() * 72 / (1.04 * width)

        def bar(x0, x1, y, texts, kind, wait=None):
            x, w = 1e3 * (x0 - t0), 1e3 * (x1 - x0)
            gid, style = _IDLE.get(wait) or (kind, dict(facecolor=LANE_COLORS[kind], edgecolor="white"))
            ax.add_patch(Rectangle((x, y - 0.4), w, 0.8, lw=0.5, gid=gid, **style))
            for text in texts:  # the longest label that fits, else a shorter one, else nothing
                if text and w * points_per_ms >= 4.7 * len(text) + 4:
                    ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=8,
                            color="white" if kind == "compute" and not wait else "black")
                    break

        for r, bars in enumerate(mine):
            busy = [(iv[2], iv[3]) for iv, _ in bars if iv[0] == "compute"]
            for (kind, _, start, end), texts in bars:
                if kind == "compute":
                    bar(start, end, lane(r, kind), texts, kind)
                    continue
                flying = uncovered(start, end, uncovered(start, end, busy))  # the parts under a matmul
                for a, b in flying:
                    bar(a, b, lane(r, kind), texts if (a, b) == max(flying, key=lambda s: s[1] - s[0]) else [],
                        kind)
            if bars:  # every stretch of the rank's ring without a matmul: posting, or waiting
                for a, b, what in idle_stretches([iv for iv, _ in bars], busy):
                    bar(a, b, lane(r, "transfer"), [what, what[:4]], "transfer", wait=what)
    return fig

"""The ring algorithm behind all-gather and reduce-scatter, step by step.

A tensor of ``n`` bytes is cut into ``t`` chunks, one per rank.  The ranks form a ring
``0 -> 1 -> ... -> t-1 -> 0``; in each of ``t - 1`` steps every rank sends one chunk to the
next rank and receives one from the previous rank, all at the same time.

* **all-gather**: rank ``r`` starts with chunk ``r``.  At step ``k`` (``k = 0 ... t-2``) it
  sends chunk ``(r - k) mod t``: its own at step 0, then the one it received at the step before.
  After ``t - 1`` steps every rank holds every chunk.
* **reduce-scatter**: rank ``r`` starts with its addend of every chunk.  At step ``k`` it sends
  its running sum of chunk ``(r - 1 - k) mod t``; the next rank adds its own addend to what
  arrives.  The sum of chunk ``d`` starts on rank ``d + 1`` and, ``t - 1`` steps later, is
  complete on rank ``d``.

Either way each rank sends ``t - 1`` chunks, ``(t - 1)/t * n`` bytes.  (The same schedules as
the collective matmul rings of :mod:`tensorplay_edu.async_tp`, notebook 10.)

:func:`ring_steps` runs a ring on *sets of ranks* (whose data a buffer slot holds), and
:func:`draw_ring` draws it, one panel per step. For async TP's rings (notebook 10): :func:`draw_step_grid`
draws a schedule as a grid of steps by ranks, :func:`draw_schedules` schedules side by side on one time
axis, and :func:`draw_ring_step_costs` one step's transfer against its matmul. Matplotlib only; the Figure
is returned.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from .style import LANE_COLORS, RANK_COLORS

__all__ = ["ring_steps", "draw_ring", "draw_schedules", "draw_step_grid", "draw_ring_step_costs"]

_OPS = ("all_gather", "reduce_scatter")
_ON_COLOR = dict(boxstyle="round,pad=0.12", facecolor="white", edgecolor="none", alpha=0.85)  # text over colours


def _check(op: str, world_size: int):
    if op not in _OPS:
        raise ValueError(f"ring: op must be one of {list(_OPS)}, got {op!r}")
    if not 2 <= world_size <= len(RANK_COLORS):
        raise ValueError(f"ring: world_size must be 2 ... {len(RANK_COLORS)} (one colour per rank), got {world_size}")


def ring_steps(op: str, world_size: int = 4) -> list[dict]:
    """The ring, step by step: a list of ``t - 1`` dicts, one per step ``k``, with

    * ``"sends"``: ``[(src, dst, chunk), ...]`` in rank order, ``dst = (src + 1) mod t``;
    * ``"buffers"``: after the step, ``buffers[r][c]`` is the frozenset of ranks whose data of
      chunk ``c`` rank ``r`` holds (empty: nothing yet; all-gather: ``{c}`` once it has arrived;
      reduce-scatter: the ranks whose addends the running sum holds).
    """
    _check(op, world_size)
    t = world_size
    if op == "all_gather":
        buffers = [[frozenset({r}) if c == r else frozenset() for c in range(t)] for r in range(t)]
    else:
        buffers = [[frozenset({r}) for _ in range(t)] for r in range(t)]
    steps = []
    for k in range(t - 1):
        sends = [(r, (r + 1) % t, (r - k) % t if op == "all_gather" else (r - 1 - k) % t) for r in range(t)]
        sent = [buffers[src][c] for src, _, c in sends]  # every rank sends at once: read before anyone writes
        buffers = [row[:] for row in buffers]
        for (src, dst, c), data in zip(sends, sent):
            assert data, "a rank sends only what it holds"
            buffers[dst][c] = data if op == "all_gather" else buffers[dst][c] | data
        steps.append({"sends": sends, "buffers": buffers})
    return steps


def _slot_label(op: str, c: int, held: frozenset) -> str:
    if op == "all_gather":
        return f"c{c}" if held else ""
    return f"c{c}: " + "+".join(str(j) for j in sorted(held))


def draw_ring(op: str, world_size: int = 4):
    """One panel per step of the ring (``t - 1`` panels): each rank is a column of ``t`` chunk
    slots (chunk 0 on top), each slot coloured by the ranks whose data it holds (one stripe per
    rank, in that rank's colour; an empty slot is white with a dashed edge), and labelled
    ``c2`` (all-gather) or ``c2: 1+2`` (reduce-scatter: the running sum of ranks 1 and 2's
    addends of chunk 2).  An arrow is a send of the step, from rank ``r`` to rank ``r+1``; the
    last rank's send wraps around to rank 0.  The slots that received something in the step have
    a thick edge.  Every slot patch has a gid: ``"slot r c j"`` for rank ``j``'s stripe in rank
    ``r``'s slot of chunk ``c``, ``"slot r c empty"`` for an empty slot.
    """
    _check(op, world_size)
    t = world_size
    steps = ring_steps(op, t)
    gap, width = 0.9, 1.6  # between rank columns; one slot's width
    fig, axes = plt.subplots(t - 1, 1, figsize=(1.2 + 2.1 * t, (0.42 * t + 0.75) * (t - 1) + 0.5), squeeze=False)
    for k, (ax, step) in enumerate(zip(axes[:, 0], steps)):
        received = {(dst, c) for _, dst, c in step["sends"]}
        for r in range(t):
            x0 = r * (width + gap)
            ax.text(x0 + width / 2, t + 0.1, f"rank {r}", ha="center", va="bottom", fontsize=9, weight="bold",
                    color=RANK_COLORS[r])
            for c in range(t):
                y = t - 1 - c  # chunk 0 on top
                held = sorted(step["buffers"][r][c])
                edge = dict(edgecolor="black", linewidth=2.2 if (r, c) in received else 0.6)
                if not held:
                    ax.add_patch(Rectangle((x0, y + 0.08), width, 0.84, facecolor="white", edgecolor="#999999",
                                           linestyle="--", linewidth=0.8, gid=f"slot {r} {c} empty"))
                    continue
                stripe = width / len(held)
                for i, j in enumerate(held):
                    ax.add_patch(Rectangle((x0 + i * stripe, y + 0.08), stripe, 0.84, facecolor=RANK_COLORS[j],
                                           edgecolor="none", gid=f"slot {r} {c} {j}"))
                ax.add_patch(Rectangle((x0, y + 0.08), width, 0.84, facecolor="none", **edge))  # the slot's edge
                ax.text(x0 + width / 2, y + 0.5, _slot_label(op, c, frozenset(held)), ha="center", va="center",
                        fontsize=8, bbox=_ON_COLOR)
        for src, dst, c in step["sends"]:
            y = t - 1 - c + 0.5
            start = src * (width + gap) + width
            if dst == src + 1:
                ax.add_patch(FancyArrowPatch((start + 0.03, y), (dst * (width + gap) - 0.03, y), arrowstyle="->",
                                             mutation_scale=12, linewidth=1.4, color="black"))
            else:  # the last rank's send wraps around the ring to rank 0
                ax.add_patch(FancyArrowPatch((start + 0.03, y), (start + gap * 0.6, y), arrowstyle="->",
                                             mutation_scale=12, linewidth=1.4, color="black"))
                ax.text(start + gap * 0.6, y - 0.32, "to 0", ha="center", va="top", fontsize=8)
                ax.add_patch(FancyArrowPatch((-gap * 0.6, y), (-0.03, y), arrowstyle="->", mutation_scale=12,
                                             linewidth=1.4, color="black"))
                ax.text(-gap * 0.6, y - 0.32, f"from {src}", ha="center", va="top", fontsize=8)
        if op == "all_gather":
            what = "chunk r" if k == 0 else f"chunk (r-{k}) mod {t}"
        else:
            what = f"its sum of chunk (r-{k + 1}) mod {t}"
        ax.set_title(f"step {k}: rank r sends {what} to r+1", fontsize=9)
        ax.set_xlim(-gap * 1.1, t * (width + gap) - gap + gap * 1.1)
        ax.set_ylim(-0.05, t + 0.6)
        ax.axis("off")
    if op == "all_gather":
        title = (f"ring all-gather on {t} ranks: rank r starts with chunk r; after {t - 1} steps every rank "
                 "holds every chunk\n(colour: the rank whose chunk a slot holds; thick edge: arrived in this step)")
    else:
        title = (f"ring reduce-scatter on {t} ranks: every rank starts with its addend of every chunk;\n"
                 f"after {t - 1} steps rank d holds the whole sum of chunk d (colour: whose addends a slot holds; "
                 "thick edge: arrived in this step)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def draw_schedules(schedules, totals, xlabel, title=None):
    """Schedules side by side on one time axis: ``schedules[name]`` lists ``(lane, label, start, end)`` bars
    (lane ``"compute"`` or ``"transfer"``); each schedule gets a compute lane above a transfer lane, top to
    bottom in the order given, and a dotted line at ``totals[name]``, its end."""
    names = list(schedules)
    y_of = {(name, lane): 3 * (len(names) - 1 - i) + (lane == "compute") for i, name in enumerate(names)
            for lane in ("compute", "transfer")}
    fig, ax = plt.subplots(figsize=(10, 1.3 * len(names)))
    for name, bars in schedules.items():
        for lane, label, start, end in bars:
            y = y_of[(name, lane)]
            ax.add_patch(Rectangle((start, y - 0.38), end - start, 0.76, facecolor=LANE_COLORS[lane],
                                   edgecolor="white"))
            ax.text((start + end) / 2, y, label, ha="center", va="center", fontsize=8,
                    color="white" if lane == "compute" else "black")
        ax.vlines(totals[name], y_of[(name, "transfer")] - 0.5, y_of[(name, "compute")] + 0.5, color="black", lw=1,
                  ls=":")  # across this schedule's lanes only
        ax.text(totals[name] + 0.08, y_of[(name, "compute")] + 0.25, f"{name}: {totals[name]:.1f}", fontsize=8,
                va="center")
    ax.set_yticks(list(y_of.values()), [f"{name}, {lane}" for name, lane in y_of], fontsize=8)
    ax.set(xlim=(0, max(totals.values()) + 1.6), ylim=(-0.6, max(y_of.values()) + 0.6), xlabel=xlabel)
    ax.set_title(title or "schedules", fontsize=10)
    fig.tight_layout()
    return fig


def draw_step_grid(grid, text, owner, title):
    """A ring schedule as a grid: ``grid[k][r]`` (what rank r works on at step k) drawn at row k, column r,
    coloured by rank ``owner(grid[k][r])`` and labelled ``text(k, r, grid[k][r])``; an arrow from each cell to
    rank r+1's cell one step down (the last rank's wraps around to rank 0): a transfer made during the step."""
    n_steps, t = len(grid), len(grid[0])
    fig, ax = plt.subplots(figsize=(10, 1.0 * n_steps + 0.9))
    for k, row in enumerate(grid):
        y = n_steps - 1 - k
        ax.text(-0.1, y + 0.5, f"step {k}", ha="right", va="center", fontsize=9)
        for r, c in enumerate(row):
            ax.add_patch(Rectangle((r + 0.05, y + 0.15), 0.7, 0.7, facecolor=RANK_COLORS[owner(c)],
                                   edgecolor="black", alpha=0.8))
            ax.text(r + 0.4, y + 0.5, text(k, r, c), ha="center", va="center", fontsize=8)
            if k < n_steps - 1:
                end = (r + 1 + 0.05, y - 0.15) if r < t - 1 else (t + 0.05, y - 0.15)
                ax.add_patch(FancyArrowPatch((r + 0.75, y + 0.2), end, arrowstyle="->", mutation_scale=12, lw=1.2,
                                             gid=f"step {k} rank {r}"))
                if r == t - 1:
                    ax.text(t + 0.08, y - 0.15, "to rank 0", fontsize=8, va="center")
                    ax.add_patch(FancyArrowPatch((-0.05, y - 0.15), (0.05, y - 0.15), arrowstyle="->",
                                                 mutation_scale=12))                # ... arriving at rank 0
    for r in range(t):
        ax.text(r + 0.4, n_steps + 0.1, f"rank {r}", ha="center", fontsize=9, weight="bold", color=RANK_COLORS[r])
    ax.set(xlim=(-0.75, t + 0.6), ylim=(-0.2, n_steps + 0.45))
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_ring_step_costs(tokens_per_rank, transfer, matmuls, hides_from, title=None, colors=None, marks=None,
                         shade_label="the transfer hides (solid line)"):
    """One ring step's cost against the chunk's tokens per rank, on log-log axes: ``transfer`` (µs per step, pale
    teal, thick) and each of ``matmuls[label] = µs per step`` (dark teal, or ``colors[i]`` for the i-th: the first
    solid, the next dashed); shaded from ``hides_from`` on, where the transfer hides under the first (solid) matmul,
    labelled ``shade_label``; a red vertical line at each ``marks[label] = s_r`` (solid, then dash-dotted)."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.loglog(tokens_per_rank, transfer, color=LANE_COLORS["transfer"], lw=3, label="transfer of one chunk")
    colors = list(colors or [LANE_COLORS["compute"]] * len(matmuls))
    for (label, values), style, colour in zip(matmuls.items(), ("-", "--", ":", "-."), colors):
        ax.loglog(tokens_per_rank, values, style, color=colour, lw=2, label=f"matmul of one chunk: {label}")
    if hides_from < tokens_per_rank[-1]:
        ax.axvspan(hides_from, tokens_per_rank[-1], color=LANE_COLORS["transfer"], alpha=0.4, lw=0, label=shade_label)
    for (label, s_r), style in zip((marks or {}).items(), ("-", "-.", ":")):
        ax.axvline(s_r, color="#C44E52", lw=1, ls=style, label=label)
    ax.set(xlabel="tokens per rank, s_r", ylabel="µs per ring step")
    ax.set_title(title or "one ring step: transfer against matmul", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig

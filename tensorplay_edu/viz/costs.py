"""What a step costs at scale (notebook 07c; what TP adds on a CPU: :mod:`.overhead`, 07b): memory and
step time of a few setups; compute time over TP traffic time per link (07c's ratio); and the planner's best
layouts with their error bands.

Every function takes numbers already computed (by ``tensorplay_edu.cluster`` or a measurement) and only
draws them; bars carry gids (``"<kind> <i> ..."``) so that tests can read them back.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .style import COMM_COLOR, LANE_COLORS

GIB = 2**30
PART_COLORS = ["#4C72B0", "#8172B3", "#937860", "#64B5CD", "#DD8452", "#CCB974", "#C44E52"]
MODEL_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]


def _memory_by_part(ax, memory: list):
    """Horizontal stacked bars, one row per ``memory[i] = {part: bytes}`` (in GiB), each part in its colour
    (gids ``"memory <i> <part>"``, legend from the first row)."""
    colors = dict(zip(memory[0], PART_COLORS))
    for i, parts in enumerate(memory):
        left = 0.0
        for part, nbytes in parts.items():
            ax.barh(i, nbytes / GIB, left=left, color=colors[part], label=part if i == 0 else None,
                    gid=f"memory {i} {part}")
            left += nbytes / GIB


def draw_setups(memory: dict, times: dict, hbm_bytes: float, usable_bytes: float, title: str,
                risky_bytes: float | None = None):
    """Left: memory per GPU by part (``memory[name] = {part: bytes}``), with the HBM (dashed), what a plan
    may use (dotted) and, if given, where the planner's *risky* begins (dash-dot). Right: the step per GPU,
    ``times[name]`` as ``cluster.step_time`` returns it: compute,
    TP traffic on the critical path, FSDP traffic not hidden plus the optimizer. Bar gids:
    ``"memory <i> <part>"`` and ``"time <i> <lane>"``."""
    names = list(memory)
    fig, (ax_m, ax_t) = plt.subplots(1, 2, figsize=(12, 3.4))
    _memory_by_part(ax_m, [memory[name] for name in names])
    for i, name in enumerate(names):
        t = times[name]
        lanes = [("compute", t["compute"], LANE_COLORS["compute"], "compute"),
                 ("tp", t["tp_exposed"], COMM_COLOR, "TP communication on the critical path"),
                 ("rest", t["dp_exposed"] + t["optimizer"], "#BBBBBB", "FSDP traffic not hidden, optimizer step")]
        left = 0.0
        for lane, seconds, color, label in lanes:
            ax_t.barh(i, seconds, left=left, color=color, label=label if i == 0 else None, gid=f"time {i} {lane}")
            left += seconds
    ax_m.axvline(hbm_bytes / GIB, color="black", ls="--", lw=1)
    ax_m.text(hbm_bytes / GIB, -0.6, f" {hbm_bytes / GIB:.1f} GiB of HBM", fontsize=8)
    ax_m.axvline(usable_bytes / GIB, color="black", ls=":", lw=1, label=f"usable ({usable_bytes / GIB:.1f} GiB)")
    _risky_line(ax_m, risky_bytes)
    ax_m.set(title=f"{title}: memory per GPU", xlabel="GiB")
    ax_t.set(title="step time per GPU", xlabel="seconds")
    for ax, cols in ((ax_m, 4), (ax_t, 3)):
        ax.set_yticks(range(len(names)), names)
        ax.set_ylim(len(names) - 0.5, -0.9)  # top to bottom, room for the label
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=cols, frameon=False)
    fig.tight_layout()
    return fig


def draw_tp_intensity(curves: dict, degrees, title: str):
    """Compute time over TP traffic time against the TP degree, log-log, one line per (model, link):
    ``curves[(model, link)] = (degrees, ratios)``, link ``"nvlink"`` (solid) or ``"ib"`` (dashed). A line
    at 1: below it the GPUs wait on the wire. Line gids: ``"<model> <link>"``."""
    models = list(dict.fromkeys(model for model, _ in curves))
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for (model, link), (ts, ratios) in curves.items():
        where = "NVLink (inside a node)" if link == "nvlink" else "InfiniBand (across nodes)"
        ax.plot(ts, ratios, "o-" if link == "nvlink" else "s--", color=MODEL_COLORS[models.index(model)],
                label=f"{model}, {where}", gid=f"{model} {link}")
    ax.axhline(1, color="black", lw=1)
    ax.text(degrees[0], 1.12, "TP traffic = compute: below, the GPUs wait on the wire", fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="TP degree t", ylabel="compute time / TP traffic time", title=title)
    ax.set_xticks(list(degrees), [str(t) for t in degrees])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.tight_layout()
    return fig


def _risky_line(ax, risky_bytes):
    if risky_bytes is not None:
        ax.axvline(risky_bytes / GIB, color="#C44E52", ls="-.", lw=1.2, gid="risky",
                   label=f"risky above ({risky_bytes / GIB:.1f} GiB)")


def draw_layouts(names, steps, band, memory: list, usable_bytes: float, title: str, risky_bytes: float | None = None):
    """The planner's layouts, one row each: left, the predicted step (s) with the model's error band
    ``band = (lo, hi)`` (a step between ``step * lo`` and ``step * hi``); right, memory per GPU by part
    (``memory[i] = {part: bytes}``) against what a plan may use (dotted, in the legend). Bar gids: ``"step <i>"`` and
    ``"memory <i> <part>"``. ``risky_bytes``: where the planner's *risky* begins (dash-dot), if given."""
    fig, (ax_s, ax_m) = plt.subplots(1, 2, figsize=(12, 3.2), sharey=True)
    y = list(range(len(names)))
    lo, hi = band
    bars = ax_s.barh(y, steps, color=LANE_COLORS["compute"])
    for i, bar in enumerate(bars):
        bar.set_gid(f"step {i}")
    ax_s.errorbar(steps, y, xerr=[[s - s * lo for s in steps], [s * hi - s for s in steps]], fmt="none",
                  color="black", capsize=3)
    ax_s.set(title="predicted step (s), with the tokens/s error band", yticks=y, yticklabels=list(names))
    _memory_by_part(ax_m, memory)
    ax_m.axvline(usable_bytes / GIB, color="black", ls=":", lw=1, gid="usable",
                 label=f"usable ({usable_bytes / GIB:.1f} GiB)")
    _risky_line(ax_m, risky_bytes)
    ax_m.set(title="memory per GPU (GiB)")
    ax_m.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=5, frameon=False)
    ax_s.invert_yaxis()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig

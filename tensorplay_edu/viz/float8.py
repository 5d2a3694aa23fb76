"""Pictures of float8: every value each format can hold (:func:`draw_float8_values`) and why the amax must
be global (:func:`draw_amax_slices`). Reached as ``tensorplay_edu.viz.*``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from .style import RANK_COLORS

__all__ = ["draw_float8_values", "draw_amax_slices"]


def draw_float8_values(gaps, props, mantissa_bits, colors):
    """Every positive value of each float8 format on a log axis (one tick per value, the subnormals shaded,
    the saturation point marked), and below it the largest relative rounding error, half the gap to the next value,
    with each format's rounding bound ``2^-(M+1)``: in the normal range the curve peaks on that line. ``gaps[name] = (values, relative gaps)``, ``props[name]`` holds ``"max"``,
    ``"smallest normal"``, ``"smallest subnormal"`` and ``"positive values"``; ``colors[name]`` the format's."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 5.2), sharex=True, gridspec_kw={"height_ratios": [1, 1.4]})
    for row, (name, (pos, rel)) in enumerate(gaps.items()):
        y, color, p, m = 1 - row, colors[name], props[name], mantissa_bits[name]
        top.vlines(pos.numpy(), y - 0.3, y + 0.3, color=color, linewidth=0.8)
        top.axvspan(p["smallest subnormal"], p["smallest normal"], ymin=(y + 0.1) / 2.2, ymax=(y + 1.1) / 2.2,
                    color=color, alpha=0.12, lw=0)
        top.plot([p["max"]], [y + 0.42], "v", color="black", markersize=7)
        top.text(p["max"] * 1.4, y, f"FP8_MAX = {p['max']:g}", va="center", fontsize=9)
        top.text(p["smallest subnormal"] / 1.4, y, f"{name}\n{p['positive values']} values", ha="right", va="center",
                 fontsize=9, color=color, weight="bold")
        bottom.step(pos[:-1].numpy(), rel.numpy() / 2, where="post", color=color,
                    label=f"{name}: half the gap / value")  # the largest error of rounding to nearest
        bottom.axhline(2.0 ** -(m + 1), color=color, ls=":", lw=1)
        bottom.text(2e-7, 2.0 ** -(m + 1) * 1.15, f"{name} rounding bound 2^-{m + 1}", fontsize=8, color=color)
    top.set_xscale("log")
    top.set(ylim=(-0.6, 1.6), yticks=[], xlim=(3e-8, 8e6))
    top.set_title("every positive float8 value (shaded: subnormals; triangle: the saturation point)", fontsize=10)
    bottom.set_yscale("log")
    bottom.set(xlabel="value (log scale)", ylabel="largest rounding error\n(half the gap, relative)")
    bottom.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def draw_amax_slices(x, rel_local, rel_global, world, color_global):
    """Left: ``|x|`` of an ``[s, h]`` tensor split by sequence rows over ``world`` ranks, each rank's local amax
    (dashed, its colour) and the global one (black). Right: the relative error of each element after the
    float8 gather, read with rank 0's scale: with local amaxes (crosses) and with the global amax (dots),
    beside e4m3's rounding bound 1/16. Zeros are drawn at 1e-4."""
    s, h = x.shape
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 3.4))
    rows = torch.arange(s).repeat_interleave(h).float() + torch.linspace(-0.21, 0.21, h).repeat(s)
    owner = torch.arange(s).repeat_interleave(h) // (s // world)             # [s*h] rank of each element
    for r in range(world):
        keep, mine = owner == r, slice(r * s // world, (r + 1) * s // world)
        left.scatter(rows[keep], x.flatten().abs()[keep], s=14, color=RANK_COLORS[r], label=f"rank {r}'s rows")
        left.hlines(x[mine].abs().max(), mine.start - 0.4, mine.stop - 0.6, color=RANK_COLORS[r], ls="--",
                    label=f"rank {r}'s local amax")
    left.axhline(x.abs().max(), color="black", lw=1, label="global amax")
    left.set_yscale("log")
    left.set(xlabel="sequence row", ylabel="|x|")
    left.set_title("one tensor, two slices, maxima 500x apart" if world == 2 else "one tensor, its slices", fontsize=10)
    left.legend(fontsize=8, loc="center right")
    right.scatter(rows, rel_local.flatten().clamp(min=1e-4), s=14, marker="x", color="black",
                  label="local amaxes, read with rank 0's scale")
    right.scatter(rows, rel_global.flatten().clamp(min=1e-4), s=14, color=color_global, label="global amax")
    right.axhline(2 ** -4, color="black", ls=":", lw=1, label="1/16: e4m3's rounding bound")
    right.set_yscale("log")
    top = max(3.0, 2 * max(rel_local.max().item(), rel_global.max().item()))  # room above the largest error, no more
    right.set(ylim=(5e-5, top), xlabel="sequence row", ylabel="relative error after the gather\n(0 shown as 1e-4)")
    right.set_title("rank 0's view of the gathered e4m3 tensor", fontsize=10)
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the panel, off the points
    fig.tight_layout()
    return fig


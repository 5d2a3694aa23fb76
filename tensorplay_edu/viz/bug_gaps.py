"""The gap each bug opens (notebook 08c): per bug, its relative error once fixed and with the bug, two dots on
one log axis joined by a line, so the distance from float64 rounding to the bug is what the eye reads.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

BUG_COLOR = "#B2182B"
FIXED_COLOR = "#2166AC"


def draw_bug_gaps(rows: dict, floor: float = 1e-17, bound: float = 1e-12, title: str | None = None):
    """One row per bug: a dot at its relative error once fixed, a dot at its relative error with the bug, and a
    line between them, on one log axis from ``floor`` to 10.

    ``rows`` maps a bug's name to ``{"quantity": str, "bug": float, "fixed": float}``, both errors already
    relative (error / the largest one-process value of the quantity the bug spoils). A fixed error of exactly 0
    has no place on a log axis: its dot sits at ``floor``, hollow, labelled "0". A dashed line marks ``bound``,
    the checks' tolerance. Gids: ``"fixed <name>"``, ``"bug <name>"``, ``"gap <name>"``."""
    names = list(rows)
    fig, ax = plt.subplots(figsize=(9.5, 0.55 * len(names) + 1.5))
    for y, name in enumerate(names):
        bug, fixed = rows[name]["bug"], rows[name]["fixed"]
        at = max(fixed, floor)
        (line,) = ax.plot([at, bug], [y, y], color="#999999", linewidth=2, zorder=1)
        line.set_gid(f"gap {name}")
        dot = ax.scatter([at], [y], s=60, zorder=2, edgecolors=FIXED_COLOR,
                         facecolors="white" if fixed == 0 else FIXED_COLOR)
        dot.set_gid(f"fixed {name}")
        dot = ax.scatter([bug], [y], s=60, color=BUG_COLOR, zorder=2)
        dot.set_gid(f"bug {name}")
        ax.text(bug * 1.6, y, f"{bug:.1%}", va="center", fontsize=9)
        ax.text(at / 1.6, y, "0" if fixed == 0 else f"{fixed:.0e}", va="center", ha="right", fontsize=8.5)
    ax.axvline(bound, color="black", linestyle="--", linewidth=1)
    ax.text(bound * 1.3, len(names) - 0.45, f"the checks' bound, {bound:.0e}", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(floor / 10, 10)
    ax.set_ylim(len(names) - 0.3, -0.7)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([f"{n}\nspoils {rows[n]['quantity']}" for n in names], fontsize=8.5)
    ax.tick_params(axis="y", length=0, pad=6)
    ax.set_xlabel("relative error of the quantity the bug spoils (log axis): blue once fixed, red with the bug",
                  fontsize=9)
    ax.set_title(title or "the gap each bug opens: from float64 rounding (fixed) to the bug", fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig

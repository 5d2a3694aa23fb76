"""A model's predicted gain beside the measured one, pair by pair (notebook 10c).

``draw_gain_pairs``: one pair of horizontal bars per run pair (a run with and without a feature), the
model's gain on top in dark teal, the measured one below in pale teal, each with its percentage written at
its end. Where the dark bar is longer the model promises more than the run delivered. The caller computes
the gains (nothing is priced here, so the picture cannot disagree with the table beside it).
Returns the matplotlib Figure, whose patches and texts the tests read.
"""

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from .style import LANE_COLORS

OURS_COLOR, THEIRS_COLOR = LANE_COLORS["compute"], LANE_COLORS["transfer"]


def draw_gain_pairs(gains: dict, title: str, labels=("model", "measured")):
    """``gains``: pair label -> (the model's gain, the measured gain), as fractions (0.19 = 19 %)."""
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(gains) + 1.0))
    top = max(max(pair) for pair in gains.values()) * 100
    for i, (ours, theirs) in enumerate(gains.values()):
        for dy, value, color in ((-0.2, ours, OURS_COLOR), (0.2, theirs, THEIRS_COLOR)):
            ax.barh(i + dy, value * 100, height=0.38, color=color, edgecolor="black", linewidth=0.5)
            ax.text(value * 100 + top * 0.01, i + dy, f"{value:.0%}", va="center", fontsize=7)
    ax.set_yticks(range(len(gains)), list(gains), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.12)
    ax.set_xlabel("gain in tokens/s (%)", fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(facecolor=OURS_COLOR, label=labels[0]), Patch(facecolor=THEIRS_COLOR, label=labels[1])],
              fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig

import matplotlib
import matplotlib.colors as mcolors
import matplotlib.pyplot as plt

from tensorplay_edu.viz import draw_gain_pairs
from tensorplay_edu.viz.gains import OURS_COLOR, THEIRS_COLOR

matplotlib.use("Agg")


def test_gain_pairs_draw_model_then_measured_per_pair():
    fig = draw_gain_pairs({"a": (0.19, 0.10), "b": (0.12, 0.16)}, "gains")
    ax = fig.axes[0]
    bars = [p for p in ax.patches if abs(p.get_height() - 0.38) < 1e-9]
    assert [round(p.get_width(), 6) for p in bars] == [19, 10, 12, 16]        # percent, model first
    assert [mcolors.to_hex(p.get_facecolor()) for p in bars] == [OURS_COLOR.lower(), THEIRS_COLOR.lower()] * 2
    assert [t.get_text() for t in ax.texts] == ["19%", "10%", "12%", "16%"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    plt.close(fig)

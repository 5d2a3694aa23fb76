"""viz.plans: the overhead ratios (structure, not pixels)."""


import matplotlib.colors as mcolors
import pytest

from tensorplay_edu.viz import draw_overhead_ratios
from tensorplay_edu.viz.plans import TURNS_COLOR
from figures import texts as _texts


def test_overhead_ratios_bars_run_from_one_to_the_ratio_with_their_interval():
    rows = [{"label": "medium full 2", "ratio": 0.963, "interval": (0.856, 1.046), "apart": 1.03,
             "apart range": (0.99, 1.09)},
            {"label": "small full 2", "ratio": 1.047, "interval": (1.029, 1.070)}]
    fig = draw_overhead_ratios(rows)
    ax, = fig.axes
    bars = [p for p in ax.patches if mcolors.to_hex(p.get_facecolor()) == TURNS_COLOR.lower()]
    assert len(bars) == 2
    for bar, row in zip(bars, rows):  # from 1 to the ratio: left of 1 when ours was faster
        assert min(bar.get_x(), bar.get_x() + bar.get_width()) == pytest.approx(min(1, row["ratio"]))
        assert max(bar.get_x(), bar.get_x() + bar.get_width()) == pytest.approx(max(1, row["ratio"]))
    assert _texts(ax) == ["0.963", "1.047"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["medium full 2", "small full 2"]
    diamonds = [line for line in ax.get_lines() if line.get_marker() == "D" and len(line.get_xdata())]
    assert [list(line.get_xdata()) for line in diamonds] == [[1.03]]  # only the row that has one
    assert any(list(line.get_xdata()) == [0.99, 1.09] for line in ax.get_lines())  # its range
    assert any(list(line.get_xdata()) == [1, 1] for line in ax.get_lines())  # the hand-written step, 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "in turns, median of the per-step ratios", "its 95 % interval", "launched apart, and its range"]

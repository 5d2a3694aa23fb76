"""viz.plans: the loss-gap picture, the overhead ratios (structure, not pixels)."""

import math

import matplotlib.colors as mcolors
import pytest

from tensorplay_edu.viz import draw_loss_gaps, draw_overhead_ratios
from tensorplay_edu.viz.plans import LOSS_GAP_FLOOR, PLAN_COLORS, TURNS_COLOR
from figures import texts as _texts


def test_loss_gaps_draw_nonzero_gaps_as_dots_and_zeros_on_the_bottom_edge():
    ref = [4.0, 2.0, 1.0]
    gaps = {"apply_tp": [0.0, 2e-16, 0.0], "vanilla": [4e-16, 0.0, 0.0], "full": [0.0, 0.0, 1e-16]}
    fig = draw_loss_gaps(gaps, ref)
    ax, = fig.axes
    assert ax.get_yscale() == "log" and ax.get_ylim()[0] == pytest.approx(LOSS_GAP_FLOOR)
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["one float64 step at the loss (ulp)"].get_ydata()) == [math.ulp(x) for x in ref]
    for name, gap in gaps.items():  # a dot per nonzero gap, in the plan's colour
        dots = lines[name]
        assert list(dots.get_ydata()) == [d for d in gap if d > 0]
        assert mcolors.to_hex(dots.get_color()) == PLAN_COLORS[name]
    zeros = [line for line in ax.get_lines() if line.get_marker() == "v" and len(line.get_xdata())]
    assert sum(len(line.get_xdata()) for line in zeros) == sum(d == 0 for gap in gaps.values() for d in gap)
    assert all(y == pytest.approx(1.5 * LOSS_GAP_FLOOR) for line in zeros for y in line.get_ydata())
    assert any(line.get_ydata()[0] == 1e-12 for line in ax.get_lines() if line.get_linestyle() == ":")
    assert "the check's bound, 1e-12" in _texts(ax)


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

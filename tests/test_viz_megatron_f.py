"""Megatron's f drawn (viz.layouts.draw_megatron_f): structure, colours and labels of the figure (not pixels)."""

import matplotlib
import matplotlib.colors as mcolors
import pytest

from figures import by_gid as _by_gid
from tensorplay_edu.viz import COMM_COLOR, PARTIAL_HATCH, RANK_COLORS, SHARED_COLOR, draw_megatron_f


@pytest.mark.parametrize("t", [2, 4])
def test_x_is_drawn_once_and_every_tensor_box_has_one_size(t):
    ax = draw_megatron_f((4, 6), (6, 8), t).axes[0]
    boxes = _by_gid(ax)
    assert [gid for gid in boxes if gid.startswith("X")] == ["X"]                  # X once, grey: Replicate
    assert mcolors.to_hex(boxes["X"].get_facecolor()) == mcolors.to_hex(boxes["dX"].get_facecolor()) == SHARED_COLOR.lower()
    assert boxes["X"].get_width() == boxes["dX"].get_width() == pytest.approx(sum(boxes[f"A_{k}"].get_width()
                                                                                   for k in range(t)))
    assert boxes["X"].get_height() == boxes["dX"].get_height() == boxes["A_0"].get_height()


@pytest.mark.parametrize("t", [2, 4])
def test_a_is_split_by_columns_and_the_gradient_is_t_hatched_addends(t):
    ax = draw_megatron_f((4, 6), (6, 8), t).axes[0]
    boxes = _by_gid(ax)
    assert [mcolors.to_hex(boxes[f"A_{k}"].get_facecolor()) for k in range(t)] == [c.lower() for c in RANK_COLORS[:t]]
    addends = [boxes[f"dX addend {k}"] for k in range(t)]
    assert [p.get_hatch() for p in addends] == [PARTIAL_HATCH] * t
    assert [mcolors.to_hex(p.get_facecolor()) for p in addends] == [c.lower() for c in RANK_COLORS[:t]]
    texts = {tx.get_text(): tx for tx in ax.texts}
    assert "X [4, 6]: Replicate\nevery rank, the same X" in texts and "A [6, 8]: rank r holds the columns A_r" in texts
    assert [f"A_{k}" in texts for k in range(t)] == [True] * t
    assert any("Partial: sum pending" in s for s in texts)
    assert f"t = {t}" in ax.get_title()


def test_forward_moves_nothing_and_backward_is_one_red_all_reduce():
    ax = draw_megatron_f((4, 6), (6, 8), 4).axes[0]
    texts = {tx.get_text(): mcolors.to_hex(tx.get_color()) for tx in ax.texts}
    forward = [s for s in texts if s.startswith("forward:")]
    backward = [s for s in texts if s.startswith("backward:")]
    assert forward == ["forward: identity (nothing moves)\nrank r computes X · A_r"] and texts[forward[0]] == "#000000"
    assert backward == ["backward: all_reduce\n(sums the t addends)"] and texts[backward[0]] == COMM_COLOR.lower()


def test_fonts_of_at_least_8_points():
    fig = draw_megatron_f((4, 6), (6, 8), 4)
    for text in fig.findobj(matplotlib.text.Text):
        if text.get_text():
            assert text.get_fontsize() >= 8, (text.get_text(), text.get_fontsize())

"""viz.qkv_rows: a fused q|k|v Linear's rows under both orders, cut in t by ColwiseParallel."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors
import pytest
from matplotlib.patches import Rectangle

from tensorplay_edu.viz.qkv_rows import PART_COLORS, draw_qkv_rows, qkv_blocks, rank_blocks
from tensorplay_edu.viz.style import RANK_COLORS


def test_rank_0_of_2_holds_q_and_half_of_k_or_whole_heads():
    assert rank_blocks("q|k|v", 12, 2, 0) == [("q", h) for h in range(12)] + [("k", h) for h in range(6)]
    assert sorted(rank_blocks("per head", 12, 2, 0)) == sorted((p, h) for p in "qkv" for h in range(6))
    assert rank_blocks("per head", 12, 2, 1)[0] == ("q", 6)
    with pytest.raises(ValueError):
        qkv_blocks("k|q|v", 12)


def test_a_box_per_block_coloured_by_part_and_a_bracket_per_rank():
    fig = draw_qkv_rows(heads=12, head_dim=4, world_size=2)
    ax, = fig.axes
    boxes = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_gid()]
    assert len(boxes) == 2 * 36
    for order_index, order in enumerate(("q|k|v", "per head")):
        strip = sorted((b for b in boxes if abs(b.get_y() + 1.1 * order_index) < 1e-9), key=lambda b: b.get_x())
        assert [b.get_gid() for b in strip] == [f"{p}{h}" for p, h in qkv_blocks(order, 12)]
        assert all(mcolors.to_hex(b.get_facecolor()) == PART_COLORS[b.get_gid()[0]].lower() for b in strip)
        rank0 = {b.get_gid() for b in strip[:18]}
        assert rank0 == {f"{p}{h}" for p, h in rank_blocks(order, 12, 2, 0)}
    brackets = [line for line in ax.lines if (line.get_gid() or "").startswith("rank")]
    assert len(brackets) == 2 * 2
    assert {mcolors.to_hex(line.get_color()) for line in brackets} == {c.lower() for c in RANK_COLORS[:2]}
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("rank 0: rows 0..71") == 2 and texts.count("rank 1: rows 72..143") == 2


def test_no_empty_band_below_the_last_strip():
    ax, = draw_qkv_rows(heads=12, head_dim=4, world_size=2).axes
    lowest = min(t.get_position()[1] for t in ax.texts)  # the last strip's rank labels
    assert ax.get_ylim()[0] > lowest - 0.25

"""The pictures: structure, colours and labels of the returned figures (not pixels)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import pytest  # noqa: E402

from tensorplay_edu import Partial, Replicate, Shard  # noqa: E402
from tensorplay_edu.debug import CommRecord  # noqa: E402
from tensorplay_edu.viz import (RANK_COLORS, SHARED_COLOR, draw_collective, draw_comm_chart, draw_flow,  # noqa: E402
                                draw_layout, draw_transition, pieces)


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def _colors(ax):
    return [mcolors.to_hex(p.get_facecolor()) for p in ax.patches]


def test_pieces_follow_torch_chunk():
    got = [p["ranges"][0] for p in pieces((10, 3), [Shard(0)], (4,))]
    assert got == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [p["ranges"][1] for p in pieces((10, 3), [Shard(0)], (4,))] == [(0, 3)] * 4
    assert all(p["partial"] for p in pieces((2, 2), [Partial()], (3,)))


def test_shard_blocks_are_coloured_by_rank_and_labelled():
    fig = draw_layout((10, 7), [Shard(0)], (4,))
    glob, *ranks = fig.axes
    assert _colors(glob) == [c.lower() for c in RANK_COLORS[:4]]
    assert _texts(glob)[0] == "rank 0\nrows 0:3\ncols 0:7" and _texts(glob)[3] == "rank 3  rows 9:10  cols 0:7"  # a thin block: one line
    assert [ax.get_title() for ax in ranks] == [f"rank {r}\nlocal [{n}, 7]" for r, n in enumerate([3, 3, 3, 1])]
    assert "S(0)" in glob.get_title()


def test_replicate_is_one_shared_block_and_every_rank_holds_it_whole():
    fig = draw_layout((4, 6), [Replicate()], (3,))
    glob, *ranks = fig.axes
    assert _colors(glob) == [SHARED_COLOR.lower()] and _texts(glob) == ["ranks 0,1,2\nrows 0:4\ncols 0:6"]
    assert [ax.get_title() for ax in ranks] == [f"rank {r}\nlocal [4, 6]" for r in range(3)]


def test_partial_is_hatched_and_says_pending_sum():
    fig = draw_layout((4, 6), [Partial()], (2,))
    glob, *ranks = fig.axes
    assert glob.patches[0].get_hatch() == "//" and "pending sum" in _texts(glob)[0]
    assert all(ax.patches[0].get_hatch() == "//" and "addend" in ax.get_title() for ax in ranks)


def test_two_d_mesh_names_its_axes_and_three_d_tensors_pick_two_dims():
    fig = draw_layout((6, 8), [Shard(0), Shard(1)], (2, 2), mesh_dim_names=("dp", "tp"))
    assert "dp: S(0), tp: S(1)" in fig.axes[0].get_title() and len(fig.axes[0].patches) == 4
    assert fig.axes[4].get_title() == "rank 3 (1, 1)\nlocal [3, 4]"
    fig = draw_layout((2, 12, 5), [Shard(1)], (4,), dims=(1, 2))
    assert fig.axes[0].get_ylabel() == "dim 1 (12)" and fig.axes[0].get_xlabel() == "dim 2 (5)"


@pytest.mark.parametrize("op,forward", [("all_gather", "all_gather"), ("reduce_scatter", "reduce_scatter"),
                                        ("all_reduce", "all_reduce"), ("all_to_all", "all_to_all")])
def test_collective_pictures(op, forward):
    fig = draw_collective(op)
    assert f"forward: {forward}" in _texts(fig.axes[1]) and op in fig._suptitle.get_text()


def test_transition_shows_forward_and_backward_collectives():
    fig = draw_transition((8, 6), Partial(), Shard(0), 4)
    assert _texts(fig.axes[1]) == ["forward: reduce_scatter", "backward: all_gather"]
    fig = draw_transition((8, 6), Shard(1), Replicate(), 4)
    assert _texts(fig.axes[1]) == ["forward: all_gather", "backward: local chunk"]
    fig = draw_transition((8, 6), Replicate(), Replicate(), 4, grad_placement=Partial())  # Megatron's f
    assert _texts(fig.axes[1]) == ["forward: nothing", "backward: all_reduce"]


def test_flow_and_comm_chart():
    fig = draw_flow([("tok_embeddings", "tensor [2, 8]", "tensor [2, 4, 16]", "reduce_scatter"),
                     ("norm", "tensor [2, 4, 16]", "DTensor S(1) [2, 8, 16]", "")])
    assert {"tok_embeddings", "norm", "reduce_scatter", "DTensor S(1) [2, 8, 16]"} <= set(_texts(fig.axes[0]))
    recs = [CommRecord("all_gather", "forward", (8, 4), "float32", 4, 96, "attention"),
            CommRecord("reduce_scatter", "backward", (8, 4), "float32", 4, 96, "attention"),
            CommRecord("all_gather", "forward", (8, 4), "float32", 4, 96, "attention")]
    fig = draw_comm_chart(recs)
    ax = fig.axes[0]
    widths = [p.get_width() for p in ax.patches]
    assert sorted(widths) == [0, 0, 96, 192]  # forward all_gather 2 x 96, backward reduce_scatter 96
    assert [t.get_text() for t in ax.get_yticklabels()] == ["attention  all_gather", "attention  reduce_scatter"]
    assert "3 collectives" in ax.get_title()
    with pytest.raises(ValueError, match="draw_collective"):
        draw_collective("broadcast")

"""The all-to-all picture: every piece keeps its source rank's colour on both sides (tensorplay_edu.viz.alltoall)."""

import matplotlib
import pytest

matplotlib.use("Agg")

from tensorplay_edu.viz.alltoall import draw_all_to_all
from tensorplay_edu.viz.style import RANK_COLORS


def test_after_side_is_assembled_from_every_rank():
    fig = draw_all_to_all(4, (8, 8))
    patches = {p.get_gid(): p for ax in fig.axes for p in ax.patches}
    for r in range(4):
        for j in range(4):
            for side in ("before", "after"):
                color = patches[f"{side} piece {r},{j}"].get_facecolor()
                assert color == pytest.approx(matplotlib.colors.to_rgba(RANK_COLORS[r])), (side, r, j)
    after = [t.get_text() for t in fig.axes[1].texts]
    # after: each column (rank j) holds one piece from every rank, 4 columns of 4
    assert sorted(after) == sorted([f"from {r}" for r in range(4) for _ in range(4)] + [f"rank {j}" for j in range(4)])
    assert [t.get_text() for t in fig.axes[0].texts].count("-> 2") == 4   # every rank sends a piece to rank 2
    matplotlib.pyplot.close(fig)


def test_shape_must_divide():
    with pytest.raises(ValueError, match="draw_all_to_all"):
        draw_all_to_all(4, (6, 8))


def test_the_tensor_is_named_as_the_notebook_names_it():
    fig = draw_all_to_all(4, (8, 8), name="X8")
    assert fig.axes[0].get_title().startswith("before: X8 [8, 8]")
    matplotlib.pyplot.close(fig)


def test_mark_stays_labels_the_diagonal_only():
    fig = draw_all_to_all(4, (8, 8), mark_stays=True)
    before = [t.get_text() for t in fig.axes[0].texts]
    assert before.count("stays") == 4 and before.count("-> 2") == 3   # rank r sends t - 1 pieces
    patches = {p.get_gid(): p for ax in fig.axes for p in ax.patches}
    assert patches["before piece 1,1"].get_hatch() == "///" and not patches["before piece 1,2"].get_hatch()
    matplotlib.pyplot.close(fig)

"""viz.draw_kv_copies: t > K, each rank's query heads read its own copy of their kv head, and the copies of
one kv head are bracketed for the gradient sum."""

import pytest

from figures import by_gid, hex_color, texts
from tensorplay_edu.viz import RANK_COLORS, draw_kv_copies, kv_copy_of_rank


def test_each_rank_copies_the_kv_head_its_query_heads_read():
    assert kv_copy_of_rank(4, 2, 4) == [0, 0, 1, 1]
    assert kv_copy_of_rank(8, 1, 4) == [0, 0, 0, 0]
    assert kv_copy_of_rank(8, 2, 8) == [0, 0, 0, 0, 1, 1, 1, 1]
    for H, K, t in ((4, 2, 2), (4, 2, 3), (4, 4, 8)):
        with pytest.raises(ValueError):
            kv_copy_of_rank(H, K, t)


@pytest.mark.parametrize("H, K, t", [(4, 2, 4), (8, 1, 4), (8, 2, 8)])
def test_arrows_stay_on_one_rank_and_copies_are_summed(H, K, t):
    ax = draw_kv_copies(H, K, t).axes[0]
    boxes = by_gid(ax)
    copy_of = kv_copy_of_rank(H, K, t)
    for r in range(t):                                           # one copy per rank, in the rank's colour
        assert hex_color(boxes[f"rank {r}: copy of kv head {copy_of[r]}"]) == RANK_COLORS[r].lower()
    for i in range(H):                                           # query head i: rank i // (H/t), reading kv i // (H/K)
        r = i // (H // t)
        assert hex_color(boxes[f"q head {i}"]) == RANK_COLORS[r].lower()
        assert f"q head {i} -> rank {r}'s copy" in boxes
        assert copy_of[r] == i // (H // K)
    assert sorted(gid for gid in boxes if gid.startswith("sum")) == [f"sum kv head {j}" for j in range(K)]
    assert sum("all-reduce the" in s for s in texts(ax)) == K
    assert f"t = {t} > K" in ax.get_title() and ax.get_title().startswith("The fix: ")
    assert [x.get_text() for x in ax.get_legend().get_texts()] == [f"rank {r}" for r in range(t)]


def test_without_the_sum_the_answer_is_not_drawn():
    ax = draw_kv_copies(8, 2, 4, show_sum=False).axes[0]
    boxes = by_gid(ax)
    assert not [gid for gid in boxes if gid.startswith("sum")]
    assert not any("all-reduce" in s for s in texts(ax)) and "backward" not in ax.get_title()
    assert ax.get_title().startswith("Setup: ")
    assert [f"rank {r}: copy of kv head {j}" in boxes for r, j in enumerate([0, 0, 1, 1])] == [True] * 4

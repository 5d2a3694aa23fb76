"""The both-ways picture (tensorplay_edu.viz.link_bytes): bytes per directed link in one ring step."""

import matplotlib

matplotlib.use("Agg")

from tensorplay_edu.viz.link_bytes import draw_link_bytes, link_bytes


def test_one_way_and_both_ways_on_five_ranks():
    one_way = link_bytes([(r, (r + 1) % 5, r) for r in range(5)], 32)
    both = link_bytes([(r, (r + 1) % 5, r) for r in range(5)], 16) + link_bytes([(r, (r - 1) % 5, r) for r in range(5)], 16)
    assert set(one_way.values()) == {32} and len(one_way) == 5
    assert set(both.values()) == {16} and len(both) == 10
    fig = draw_link_bytes({"one way": one_way, "both ways": both}, 5, "one step")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["one way\nbusiest link 32 B one way; each GPU sends 32 B",
                      "both ways\nbusiest link 16 B one way; each GPU sends 32 B"]   # the link halves, the GPU does not
    assert sum(t.get_text() == "16 B" for t in fig.axes[1].texts) == 10
    matplotlib.pyplot.close(fig)


def test_sends_add_up_on_a_shared_link():
    assert link_bytes([(0, 1, 0), (0, 1, 2)], 8) == {(0, 1): 16}

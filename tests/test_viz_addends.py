"""Notebook 01's value and tile pictures: the addends drawn are the given ones and sum to the tensor drawn;
the all-to-all's tiles go where Shard(0) -> Shard(1) sends them."""

import matplotlib.pyplot as plt
import torch

from tensorplay_edu.viz.addends import draw_addends, draw_all_to_all, tile_moves
from tensorplay_edu.viz.style import RANK_COLORS
from matplotlib.colors import to_rgba


def test_addends_show_their_values_and_their_sum():
    addends = [torch.tensor([[1.0, -2.0], [3.0, 0.0]]), torch.tensor([[4.0, 0.0], [-1.0, 2.0]])]
    fig = draw_addends(addends)
    ax = fig.axes[0]
    gids = [p.get_gid() for p in ax.patches]
    assert gids == ["addend 0", "addend 1", "sum"]
    numbers = [t.get_text() for t in ax.texts]
    for value in ("1", "-2", "3", "0", "4", "-1", "2"):      # every addend's values are written
        assert value in numbers
    for value in ("5", "-2", "2", "2"):                        # and their sum: [[5, -2], [2, 2]]
        assert value in numbers
    assert "+" in numbers and "=" in numbers
    assert ax.patches[0].get_hatch() and not ax.patches[2].get_hatch()   # addends hatched, the sum not
    plt.close(fig)


def test_all_to_all_tiles_go_to_their_column_owner():
    t = 4
    assert len(tile_moves(t)) == t * (t - 1) and all(i != j for i, j in tile_moves(t))
    fig = draw_all_to_all(t)
    for ax, side in zip(fig.axes, ("before", "after")):
        tiles = {p.get_gid(): p for p in ax.patches if p.get_gid()}
        assert len(tiles) == t * t
        for i in range(t):
            for j in range(t):
                face = tiles[f"{side} {i}->{j}"].get_facecolor()
                assert face[:3] == to_rgba(RANK_COLORS[j])[:3]          # coloured by destination / holder j
    texts = [x.get_text() for x in fig.axes[0].texts]
    assert texts.count("stays") == t and sum(x.startswith("to r") for x in texts) == t * (t - 1)
    assert "3/4 of its 1/4" in fig._suptitle.get_text()
    plt.close(fig)

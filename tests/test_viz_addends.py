"""Notebook 01's addends picture: the addends drawn are the given ones and sum to the tensor drawn."""

import matplotlib.pyplot as plt
import torch

from tensorplay_edu.viz.addends import draw_addends


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

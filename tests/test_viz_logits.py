"""The vocabulary picture: logits and gradient cut into the ranks' class blocks; the structure, colours and
labels of the returned figure (not pixels)."""

import matplotlib.colors as mcolors
import numpy as np

from tensorplay_edu.viz import RANK_COLORS, draw_logits_and_gradient


def test_logits_and_gradient_cut_into_rank_blocks_with_targets_circled():
    logits = np.arange(12.0).reshape(2, 6) - 5
    grad = np.full((2, 6), 0.1)
    fig = draw_logits_and_gradient(logits, grad, [1, 4], [0, 2, 4], [2, 2, 2])
    for ax in fig.axes[:2]:
        assert [line.get_xdata()[0] for line in ax.lines] == [1.5, 3.5]           # the rank boundaries
        names = {t.get_text(): mcolors.to_hex(t.get_color()) for t in ax.texts}
        assert names == {f"rank {r}": RANK_COLORS[r].lower() for r in range(3)}
        assert ax.collections[0].get_offsets().tolist() == [[1, 0], [4, 1]]        # the targets
    assert np.allclose(fig.axes[1].images[0].get_array(), 2 * grad)               # b*s times the gradient


"""The vocabulary pictures (notebooks 03 and 05): ids by owner, logits and gradient blocks, bytes on the wire;
the structure, colours and labels of the returned figures (not pixels)."""

import matplotlib
import matplotlib.colors as mcolors
import numpy as np

from tensorplay_edu.viz import (PHASE_COLORS, RANK_COLORS, draw_logits_and_gradient, draw_vocab_owners,
                                draw_wire_bytes)


def test_vocab_owners_colours_each_id_by_its_rank_and_names_the_ranges():
    ids = np.array([[0, 3, 9, 4], [2, 6, 5, 8]])
    fig = draw_vocab_owners(ids, [0, 3, 6, 9], [3, 3, 3, 1])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == [str(v) for v in ids.ravel()]
    owners = ax.images[0].get_array()
    assert owners.tolist() == [[0, 1, 3, 1], [0, 2, 1, 2]]
    cmap = ax.images[0].get_cmap()
    assert [mcolors.to_hex(cmap(i)) for i in range(4)] == [c.lower() for c in RANK_COLORS[:4]]
    ticks = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert ticks == ["rank 0: ids 0..2", "rank 1: ids 3..5", "rank 2: ids 6..8", "rank 3: ids 9..9"]


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


def test_wire_bytes_log_scale_labels_every_bar_so_a_small_one_shows():
    fig = draw_wire_bytes({"gather logits": {"forward": 96384, "backward": 3072},
                           "loss_parallel": {"forward": 576, "backward": 3072}})
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert [p.get_height() for p in ax.patches] == [96384, 576, 3072, 3072]
    assert ax.get_ylim()[0] < 576                                                  # the small bar stands out
    assert [t.get_text() for t in ax.texts] == ["96,384", "576", "3,072", "3,072"]
    colors = [mcolors.to_hex(p.get_facecolor()) for p in ax.patches]
    assert colors == [PHASE_COLORS["forward"].lower()] * 2 + [PHASE_COLORS["backward"].lower()] * 2
    for text in fig.findobj(matplotlib.text.Text):
        if text.get_text():
            assert text.get_fontsize() >= 8, (text.get_text(), text.get_fontsize())

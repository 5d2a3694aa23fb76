"""The vocab-parallel lookup as a sum of addends (notebook 03): panels, colours and labels (not pixels)."""

import matplotlib
import matplotlib.colors as mcolors
import numpy as np

from tensorplay_edu.viz import RANK_COLORS, draw_vocab_addends
from tensorplay_edu.viz.vocab import id_range

IDS = np.array([[0, 3, 9, 4], [2, 6, 5, 8]])
STARTS, SIZES = [0, 3, 6, 9], [3, 3, 3, 1]


def test_id_range_names_one_row_as_one_id():
    assert [id_range(o, n) for o, n in zip(STARTS, SIZES)] == ["ids 0..2", "ids 3..5", "ids 6..8", "id 9"]
    assert id_range(6, 0) == "no id"


def test_each_rank_panel_labels_only_its_rows_and_the_last_panel_is_their_sum():
    fig = draw_vocab_addends(IDS, STARTS, SIZES)
    assert len(fig.axes) == len(SIZES) + 1
    for r, ax in enumerate(fig.axes[:-1]):
        owned = (IDS >= STARTS[r]) & (IDS < STARTS[r] + SIZES[r])
        want = [f"W[{v}]" for v, o in zip(IDS.ravel(), owned.ravel()) if o]   # masked positions: no label
        assert [t.get_text() for t in ax.texts] == want
        picture = ax.images[0].get_array()
        for (i, j), o in np.ndenumerate(owned):
            colour = mcolors.to_hex(picture[i, j][:3])
            assert colour == (RANK_COLORS[r].lower() if o else "#ffffff"), (r, i, j, colour)
        assert ax.get_ylabel().endswith(f"rank {r}: {id_range(STARTS[r], SIZES[r])}")
    total = fig.axes[-1]
    assert [t.get_text() for t in total.texts] == [f"W[{v}]" for v in IDS.ravel()]
    assert total.get_ylabel().startswith("=") and "lookup" in total.get_ylabel()
    matplotlib.pyplot.close(fig)

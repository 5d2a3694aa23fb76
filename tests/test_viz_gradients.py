"""viz.gradients.draw_move_and_gradient: a move forward and its gradient's move backward, as layouts."""

import matplotlib
import matplotlib.colors as mcolors

from tensorplay_edu import Partial, Replicate, Shard
from tensorplay_edu.viz import COMM_COLOR, PARTIAL_HATCH, SHARED_COLOR, draw_move_and_gradient


def _rects(ax):
    return [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle)]


def test_partial_to_shard_draws_a_grey_replicate_gradient():
    fig = draw_move_and_gradient((8, 8), Partial(), Shard(0), 4)
    (x, mid, y), (dx, back, dy) = [fig.axes[:3], fig.axes[3:]]
    assert sum(p.get_hatch() == PARTIAL_HATCH for p in _rects(x)) == 4          # X: 4 addends, hatched
    assert [mcolors.to_hex(p.get_facecolor()) for p in _rects(dx)] == [SHARED_COLOR.lower()]   # dX: R, one grey block
    assert len(_rects(y)) == len(_rects(dy)) == 4                                   # Y and dY: S(0), 4 row blocks
    texts = {t.get_text(): mcolors.to_hex(t.get_color()) for t in mid.texts + back.texts}
    assert texts["forward: reduce_scatter"] == "#000000"
    assert texts["backward: all_gather"] == COMM_COLOR.lower()
    assert dx.get_title().startswith("dX: ") and dy.get_title().startswith("dY: ")


def test_f_forward_identity_backward_all_reduce_with_a_note():
    fig = draw_move_and_gradient((4, 6), Replicate(), Replicate(), 4, grad_placement=Partial(),
                                 note="then rank r computes X · A_r")
    (x, mid, y), (dx, back, dy) = [fig.axes[:3], fig.axes[3:]]
    assert len(_rects(x)) == len(_rects(y)) == len(_rects(dx)) == 1                 # X, Y, dX: one grey block
    assert sum(p.get_hatch() == PARTIAL_HATCH for p in _rects(dy)) == 4             # the declared Partial gradient
    texts = [t.get_text() for t in mid.texts + back.texts]
    assert "forward: nothing" in texts and "backward: all_reduce" in texts and "then rank r computes X · A_r" in texts


def test_fonts_of_at_least_8_points():
    fig = draw_move_and_gradient((8, 8), Shard(0), Shard(1), 4)
    for text in fig.findobj(matplotlib.text.Text):
        if text.get_text():
            assert text.get_fontsize() >= 8, (text.get_text(), text.get_fontsize())

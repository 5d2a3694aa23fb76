"""viz.hf_layer: HF's decoder layer under HF's plan and under the fixed plan, from one function."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors
import pytest
from matplotlib.patches import Circle, Rectangle

from tensorplay_edu.viz import COMM_COLOR
from tensorplay_edu.viz.hf_layer import draw_layer_plan


@pytest.mark.parametrize("fixed, n_f", [(False, 5), (True, 2)])
def test_an_f_per_colwise_linear_or_one_per_half(fixed, n_f):
    ax, = draw_layer_plan(fixed).axes
    circles = [p for p in ax.patches if isinstance(p, Circle)]
    assert all(mcolors.to_hex(c.get_facecolor()) == COMM_COLOR.lower() for c in circles)
    assert sum(c.get_gid() == "f" for c in circles) == n_f and sum(c.get_gid() == "fbar" for c in circles) == 2
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("f") == n_f and sum('"colwise"' in t for t in texts) == 5 and sum('"rowwise"' in t for t in texts) == 2
    assert len([p for p in ax.patches if isinstance(p, Rectangle)]) == 2 * 2 + 5 + 2 * 2
    if fixed:  # the one f of a half sits between its norm and its readers, on the norm's row
        norms = sorted(p.get_x() + p.get_width() for p in ax.patches if isinstance(p, Rectangle) and "layernorm" in
                       next(t.get_text() for t in ax.texts if t.get_position() == (p.get_x() + p.get_width() / 2, p.get_y() + 0.24)))
        readers_left = min(p.get_x() for p in ax.patches if isinstance(p, Rectangle) and p.get_facecolor() != (0, 0, 0, 0)
                           and p.get_width() == 1.3)
        for c in (c for c in circles if c.get_gid() == "f"):
            assert norms[0] < c.center[0] < readers_left and c.center[1] in (2.55, 0.55)


@pytest.mark.parametrize("fixed", [False, True])
def test_every_label_fits_inside_its_box(fixed):
    fig = draw_layer_plan(fixed)
    ax, = fig.axes
    renderer = fig.canvas.get_renderer()
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    labels = [t for t in ax.texts if t.get_gid() == "label"]
    assert len(labels) == len(boxes)
    for text in labels:
        inside = text.get_window_extent(renderer)
        box = next(b for b in boxes if b.get_window_extent(renderer).contains(*inside.get_points().mean(axis=0)))
        outer = box.get_window_extent(renderer)
        assert outer.x0 <= inside.x0 and inside.x1 <= outer.x1 and outer.y0 <= inside.y0 and inside.y1 <= outer.y1, text.get_text()
        assert "\n" not in text.get_text() or "_\n" not in text.get_text()  # no name broken at an underscore


def test_the_residual_stream_runs_as_the_data_flows():
    ax, = draw_layer_plan().axes
    lines = {line.get_gid(): list(zip(line.get_xdata(), line.get_ydata())) for line in ax.lines if line.get_gid()}
    assert set(lines) == {"residual_x", "h_to_norm", "residual_h"}
    assert lines["residual_x"][0] == (-0.3, 2.55) and lines["h_to_norm"][-1] == (-0.3, 0.55)

"""PrepareModuleInputOutput's sandwich (notebook 03, section 5c): boxes, labels and shapes (not pixels)."""

import matplotlib
from matplotlib.patches import FancyBboxPatch

from tensorplay_edu.viz import COMM_COLOR, draw_prepare_sandwich, sandwich_steps


def test_steps_name_the_two_conversions_and_the_local_shapes():
    steps = sandwich_steps(2, 8, 6, 5, 4)
    assert [name for name, *_ in steps] == ["x", "g", "x, gathered", "GatheredSliceLinear", "y, an addend", "g\u0304", "y"]
    texts = dict((name, text) for name, text, *_ in steps)
    assert texts["x"] == "Shard(1)\n[b, s/t, h] = [2, 2, 6]" and texts["y"].endswith("[2, 2, 5]")
    assert "[2, 8, 6]" in texts["x, gathered"] and texts["y, an addend"].startswith("Partial()")
    assert texts["g"] == "forward: all-gather\nbackward: reduce-scatter"
    assert texts["g\u0304"] == "forward: reduce-scatter\nbackward: all-gather"
    assert [edge for *_, edge in steps].count(COMM_COLOR) == 2


def test_picture_draws_one_box_per_step_and_bars_g():
    fig = draw_prepare_sandwich(2, 8, 6, 5, 4, label="6c's")
    ax = fig.axes[0]
    assert sum(isinstance(p, FancyBboxPatch) for p in ax.patches) == 7
    labels = [t.get_text() for t in ax.texts]
    assert r"$\bar{g}$" in labels and "g" in labels
    assert "t = 4" in ax.get_title() and r"$\bar{g}$" in ax.get_title() and ax.get_title().startswith("6c's sandwich")
    assert "GatheredSliceLinear" in labels
    matplotlib.pyplot.close(fig)


def test_text_size_sets_the_boxes_text():
    fig = draw_prepare_sandwich(2, 8, 6, 5, 4, text_size=8)
    texts = {t.get_text(): t.get_fontsize() for t in fig.axes[0].texts}
    assert texts["forward: all-gather\nbackward: reduce-scatter"] == 8
    matplotlib.pyplot.close(fig)


def test_module_text_replaces_the_module_box_text():
    steps = dict((name, text) for name, text, *_ in sandwich_steps(2, 8, 6, 5, 4, module_text="x.to_local(\n...)"))
    assert steps["GatheredSliceLinear"] == "x.to_local(\n...)"
    assert "grad_placements" in dict((name, text) for name, text, *_ in sandwich_steps(2, 8, 6, 5, 4))["GatheredSliceLinear"]

"""viz.overhead: the prediction of TP's overhead stacked in its parts, beside the overhead measured (notebook 07b)."""
import matplotlib

matplotlib.use("Agg")

from tensorplay_edu.viz.overhead import OVERHEAD_PARTS, draw_overhead_parts  # noqa: E402


def test_stacked_parts_and_measured_range():
    alpha, beta, other = [0.050, 0.050], [0.002, 0.010], [0.001, -0.004]
    fig = draw_overhead_parts(["h = 64", "h = 256"], alpha, beta, other, [0.042, 0.070], [0.029, 0.056], [0.056, 0.089])
    ax = fig.axes[0]
    bars = {p.get_gid(): p for p in ax.patches}
    assert sorted(bars) == sorted(f"{part} {i}" for part in OVERHEAD_PARTS for i in range(2))
    assert abs(bars["alpha 1"].get_height() - 50) < 1e-9 and bars["alpha 1"].get_y() == 0
    assert abs(bars["beta 1"].get_y() - 50) < 1e-9 and abs(bars["beta 1"].get_height() - 10) < 1e-9
    assert abs(bars["other 1"].get_y() - 60) < 1e-9 and abs(bars["other 1"].get_height() + 4) < 1e-9  # drawn down
    assert bars["other 1"].get_hatch() == "///" and bars["other 0"].get_hatch() is None
    dash = next(c for c in ax.collections if c.get_gid() == "predicted")
    assert [round(seg[0][1]) for seg in dash.get_segments()] == [53, 56]  # the whole prediction, in ms
    dots = ax.lines[0]
    assert [round(y) for y in dots.get_ydata()] == [42, 70]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert sorted(labels) == sorted([label for _, label in OVERHEAD_PARTS.values()] + ["predicted: the whole",
                                                                                         labels[-1]])
    assert labels[-1].startswith("measured")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["h = 64", "h = 256"]
    matplotlib.pyplot.close(fig)


def test_a_floor_clips_an_outlier_round_and_says_where_it_went():
    alpha, beta, other = [0.050, 0.050], [0.002, 0.010], [0.001, 0.002]
    low = [-0.414, 0.030]  # one round far below zero would set the scale
    fig = draw_overhead_parts(["h = 64", "h = 256"], alpha, beta, other, [0.04, 0.07], low, [0.06, 0.09], floor=-0.1)
    ax = fig.axes[0]
    assert -101 < ax.get_ylim()[0] < -90  # clipped near the floor, not at -414 ms
    assert [t.get_text() for t in ax.texts if "off scale" in t.get_text()] == ["↓ -414 ms, off scale"]
    matplotlib.pyplot.close(fig)
    fig = draw_overhead_parts(["h = 64", "h = 256"], alpha, beta, other, [0.04, 0.07], low, [0.06, 0.09])
    assert fig.axes[0].get_ylim()[0] < -414 and not [t for t in fig.axes[0].texts if "off scale" in t.get_text()]
    matplotlib.pyplot.close(fig)

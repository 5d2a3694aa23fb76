"""viz.fit_panels: bars of GB per GPU in panels on one shared y-axis, the GPU and the budget as lines (notebook 04b)."""
import matplotlib

matplotlib.use("Agg")

from tensorplay_edu import viz

PANELS = {"torchtitan's kernels, no AC": {"TP 8": 64.8, "TP 8 + SP": 46.0},
          "this package's kernels, with AC": {"TP 8, selective": 30.2, "TP 8, full": 11.8, "recipe, no SP": 94.8}}


def test_one_bar_per_value_in_its_panel_at_its_height():
    fig = viz.draw_fit_panels(PANELS, 85.5, 66.9, spare=("torchtitan's kernels, no AC",), colors={
        "this package's kernels, with AC": "#8c2d2d"}, note="kept", title="t")
    assert len(fig.axes) == 2
    for ax, (name, bars) in zip(fig.axes, PANELS.items()):
        assert ax.get_title() == name
        assert [round(p.get_height(), 6) for p in ax.patches] == list(bars.values())
        assert [t.get_text() for t in ax.get_xticklabels()] == list(bars)
        assert sorted(round(line.get_ydata()[0], 6) for line in ax.lines) == [66.9, 85.5]
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["64.8 GB\n(2.1 to spare)", "46.0 GB\n(20.9 to spare)"]
    assert [t.get_text() for t in fig.axes[1].texts] == ["30.2 GB", "11.8 GB", "94.8 GB"]
    assert fig.axes[1].patches[0].get_facecolor()[:3] == matplotlib.colors.to_rgb("#8c2d2d")
    matplotlib.pyplot.close(fig)


def test_panels_share_one_y_axis_above_every_bar_and_the_gpu():
    fig = viz.draw_fit_panels(PANELS, 85.5, 66.9)
    limits = {ax.get_ylim() for ax in fig.axes}
    assert len(limits) == 1                                     # one scale: equal GB, equal height
    assert limits.pop()[1] > 94.8 > 85.5
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["an H100: 85.5 GB (79.6 GiB)", "left for activations: 66.9 GB"]
    matplotlib.pyplot.close(fig)


def test_the_budget_line_says_what_it_assumed():
    fig = viz.draw_fit_panels(PANELS, 85.5, 66.9, left_label="left for activations (one sequence)")
    assert [t.get_text() for t in fig.legends[0].get_texts()][1] == "left for activations (one sequence): 66.9 GB"
    matplotlib.pyplot.close(fig)


def test_left_bars_stops_the_budget_line_at_the_bars_it_applies_to():
    fig = viz.draw_fit_panels(PANELS, 85.5, 66.9, left_bars={"this package's kernels, with AC": 2})
    (segments,) = fig.axes[1].collections                                 # the dotted line: one segment
    (((x0, y0), (x1, y1)),) = segments.get_segments()
    assert (x0, x1) == (-0.4, 1.4) and y0 == y1 == 66.9                   # bars 0 and 1's edges, not the third
    assert not fig.axes[0].collections                                    # elsewhere: across the panel
    matplotlib.pyplot.close(fig)

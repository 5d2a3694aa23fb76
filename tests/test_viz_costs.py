"""Notebook 07's cost pictures (structure and labels of the returned figures, not pixels)."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from tensorplay_edu.viz import draw_layouts, draw_setups, draw_tp_intensity  # noqa: E402

GIB = 2**30


def _bars(ax, kind):
    return {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith(kind)}


def test_setups_stack_memory_parts_and_time_lanes():
    memory = {"a": {"weights": 4 * GIB, "activations": 40 * GIB}, "b": {"weights": 4 * GIB, "activations": 20 * GIB}}
    times = {n: {"compute": 1.0, "tp_exposed": 0.2, "dp_exposed": 0.1, "optimizer": 0.05} for n in memory}
    fig = draw_setups(memory, times, 80 * GIB, 76 * GIB, "test")
    ax_m, ax_t = fig.axes[0], fig.axes[1]
    mem = _bars(ax_m, "memory")
    assert mem["memory 0 activations"].get_x() == pytest.approx(4) and mem["memory 0 activations"].get_width() == 40
    assert mem["memory 1 activations"].get_width() == pytest.approx(20)
    lanes = _bars(ax_t, "time")
    assert lanes["time 0 tp"].get_x() == pytest.approx(1.0) and lanes["time 0 rest"].get_width() == pytest.approx(0.15)
    assert [t.get_text() for t in ax_m.get_yticklabels()] == ["a", "b"]
    assert any("80.0 GiB of HBM" in t.get_text() for t in ax_m.texts)


def test_intensity_draws_one_line_per_model_and_link_and_the_line_at_one():
    curves = {("8b", "nvlink"): ([2, 4, 8], [8.0, 3.0, 1.5]), ("8b", "ib"): ([2, 4, 8, 16], [1.2, 0.4, 0.2, 0.1])}
    ax = draw_tp_intensity(curves, [2, 4, 8, 16], "t").axes[0]
    lines = {line.get_gid(): line for line in ax.lines if line.get_gid()}
    assert set(lines) == {"8b nvlink", "8b ib"}
    assert list(lines["8b ib"].get_ydata()) == [1.2, 0.4, 0.2, 0.1] and lines["8b ib"].get_linestyle() == "--"
    assert any(list(line.get_ydata()) == [1, 1] for line in ax.lines)  # the line at 1
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_layouts_draw_steps_with_their_band_and_memory():
    fig = draw_layouts(["TP 1", "TP 8"], [9.0, 8.0], (0.8, 1.2),
                       [{"weights": GIB, "activations": 50 * GIB}, {"weights": GIB, "activations": 40 * GIB}],
                       70 * GIB, "title")
    ax_s, ax_m = fig.axes[0], fig.axes[1]
    steps = _bars(ax_s, "step")
    assert [steps[f"step {i}"].get_width() for i in range(2)] == [9.0, 8.0]
    assert _bars(ax_m, "memory")["memory 1 activations"].get_width() == pytest.approx(40)
    assert [t.get_text() for t in ax_s.get_yticklabels()] == ["TP 1", "TP 8"]
    assert fig._suptitle.get_text() == "title"
    assert not [line for line in ax_m.lines if line.get_gid() == "risky"]
    usable = [line for line in ax_m.lines if line.get_gid() == "usable"]  # the dotted line, named in the legend
    assert len(usable) == 1 and usable[0].get_label() in [t.get_text() for t in ax_m.get_legend().get_texts()]


def test_risky_line_drawn_where_given():
    fig = draw_layouts(["TP 8"], [8.0], (0.8, 1.2), [{"weights": 50 * GIB}], 70 * GIB, "title", risky_bytes=58 * GIB)
    risky = [line for line in fig.axes[1].lines if line.get_gid() == "risky"]
    assert len(risky) == 1 and list(risky[0].get_xdata()) == [58, 58]
    times = {"a": {"compute": 1.0, "tp_exposed": 0.2, "dp_exposed": 0.1, "optimizer": 0.05}}
    fig = draw_setups({"a": {"weights": 4 * GIB}}, times, 80 * GIB, 76 * GIB, "test", risky_bytes=63 * GIB)
    assert [list(line.get_xdata()) for line in fig.axes[0].lines if line.get_gid() == "risky"] == [[63, 63]]

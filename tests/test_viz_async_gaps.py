"""viz.async_gaps: the gains of each pair as bars, and the gap against the ring steps with its fitted line (10c)."""
import matplotlib

matplotlib.use("Agg")

from tensorplay_edu.viz.async_gaps import draw_async_tp_gaps

GAINS = {"8B, bf16": (0.192, 0.098), "70B, bf16": (0.147, 0.092), "70B, float8 tensorwise": (0.123, 0.164)}
GAPS = {"8B, bf16": (1792, 0.201), "70B, bf16": (5600, 1.772), "70B, float8 tensorwise": (5600, -0.142)}


def test_bars_are_the_gains_in_percent():
    fig = draw_async_tp_gaps(GAINS, GAPS, 188e-6)
    left = fig.axes[0]
    for k, gid in enumerate(("ours", "theirs")):
        widths = [p.get_width() for p in left.patches if p.get_gid() == gid]
        assert [round(w, 6) for w in widths] == [round(100 * g[k], 6) for g in GAINS.values()]
    assert [t.get_text() for t in left.get_yticklabels()] == list(GAINS)
    matplotlib.pyplot.close(fig)


def test_dots_are_the_gaps_and_the_line_is_c_n():
    fig = draw_async_tp_gaps(GAINS, GAPS, 188e-6)
    right = fig.axes[1]
    (dots,) = [col for col in right.collections if col.get_gid() == "pairs"]
    assert [tuple(round(v, 6) for v in xy) for xy in dots.get_offsets()] == [(n, round(1e3 * g, 6)) for n, g in GAPS.values()]
    (line,) = [ln for ln in right.lines if ln.get_gid() == "c n"]
    (x0, x1), (y0, y1) = line.get_xdata(), line.get_ydata()
    assert x0 == y0 == 0 and abs(y1 / x1 - 1e3 * 188e-6) < 1e-12
    assert len(right.texts) == len(GAPS)
    matplotlib.pyplot.close(fig)


def test_gains_alone_draw_one_panel():
    fig = draw_async_tp_gaps(GAINS)
    assert len(fig.axes) == 1 and len([p for p in fig.axes[0].patches if p.get_gid() == "ours"]) == len(GAINS)

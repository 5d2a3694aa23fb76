"""viz.async_gaps: the gains of each pair as bars, in percent (10c)."""
import matplotlib

matplotlib.use("Agg")

from tensorplay_edu.viz.async_gaps import draw_async_tp_gaps

GAINS = {"8B, bf16": (0.192, 0.098), "70B, bf16": (0.147, 0.092), "70B, float8 tensorwise": (0.123, 0.164)}


def test_bars_are_the_gains_in_percent():
    fig = draw_async_tp_gaps(GAINS)
    (ax,) = fig.axes
    for k, gid in enumerate(("ours", "theirs")):
        widths = [p.get_width() for p in ax.patches if p.get_gid() == gid]
        assert [round(w, 6) for w in widths] == [round(100 * g[k], 6) for g in GAINS.values()]
    assert [t.get_text() for t in ax.get_yticklabels()] == list(GAINS)
    matplotlib.pyplot.close(fig)

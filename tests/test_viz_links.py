"""viz.links: the α–β curves per link, and a layer's compute against its TP traffic (notebook 00b)."""
import matplotlib
import matplotlib.colors as mcolors
import matplotlib.pyplot as plt

from tensorplay_edu.viz.links import COMPUTE_COLOR, TRAFFIC_COLOR, draw_alpha_beta, draw_layer_verdict

matplotlib.use("Agg")


def test_alpha_beta_draws_each_curve_its_floor_and_the_marked_size():
    sizes = [1e3, 1e6, 1e9]
    curves = {"fast": ([2e-5, 3e-5, 3e-3], 2e-5), "slow": ([1e-4, 1.2e-4, 2e-2], 1e-4)}
    fig = draw_alpha_beta(sizes, curves, "t", marks={"one activation": 1e8})
    ax = fig.axes[0]
    lines = ax.get_lines()
    drawn = [line for line in lines if len(line.get_xdata()) == len(sizes)]
    assert [list(line.get_ydata()) for line in drawn] == [[x * 1e3 for x in s] for s, _ in curves.values()]  # in ms
    floors = [line.get_ydata()[0] for line in lines if list(line.get_xdata()) == [0, 1]]
    assert floors == [0.02, 0.1]                                  # each link's latency floor, ms
    assert [line.get_xdata()[0] for line in lines if list(line.get_ydata()) == [0, 1]] == [1e8]   # the mark
    texts = [t.get_text() for t in ax.texts]
    assert "latency alone: α₀ + (t-1)α = 20 µs" in texts and "one activation" in texts
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fast", "slow"]
    plt.close(fig)


def test_layer_verdict_bars_compute_blue_then_traffic_red_in_ms():
    bars = {"compute": 0.0158, "NVLink": 0.0022, "InfiniBand": 0.0212}
    fig = draw_layer_verdict(bars, "one layer")
    ax = fig.axes[0]
    assert [round(p.get_width(), 1) for p in ax.patches] == [15.8, 2.2, 21.2]
    assert [mcolors.to_hex(p.get_facecolor()) for p in ax.patches] == [COMPUTE_COLOR.lower()] + [TRAFFIC_COLOR.lower()] * 2
    assert [t.get_text() for t in ax.texts] == ["15.8 ms", "2.2 ms", "21.2 ms"]
    assert [t.get_text() for t in ax.get_yticklabels()] == list(bars)
    plt.close(fig)

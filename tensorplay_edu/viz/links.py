"""What a collective costs on a link, and a layer's compute against its TP traffic (notebook 00b).

Two pictures, both drawn from numbers the caller computes with ``tensorplay_edu.cluster`` (nothing is
priced here, so a picture can never disagree with the table printed beside it):

* ``draw_alpha_beta``: the α–β model's time of one collective against the bytes of the full tensor, one
  log-log curve per link, each with its latency floor ``α₀ + (t-1)α`` as a dotted line. Left of where a
  curve leaves its floor the collective is latency-bound, right of it bandwidth-bound.
* ``draw_layer_verdict``: one bar per cost of one transformer layer (milliseconds, forward + backward),
  the compute first in blue, each link's TP traffic after it in red, the value written at the bar's end.
  A red bar shorter than the blue one can hide behind the compute (or costs little beside it); a longer
  one cannot.

Both return the matplotlib Figure, whose lines, patches and texts the tests read.
"""

import matplotlib.pyplot as plt

COMPUTE_COLOR = "#4C72B0"   # compute: blue
TRAFFIC_COLOR = "#C44E52"   # communication: red
FLOOR_COLOR = "#777777"     # a latency floor, a marked size


def draw_alpha_beta(sizes, curves: dict, title: str, marks: dict | None = None):
    """``curves``: label -> (seconds for each of ``sizes``, the latency floor in seconds); ``sizes``: bytes of
    the full tensor; ``marks``: label -> bytes, a size to mark with a dotted vertical line."""
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for (label, (seconds, floor)), style in zip(curves.items(), ("-", "--", "-.", ":")):
        ax.loglog(sizes, [x * 1e3 for x in seconds], style, color="black", label=label)
        ax.axhline(floor * 1e3, color=FLOOR_COLOR, linewidth=0.8, linestyle=":")
        ax.text(sizes[0] * 2, floor * 1e3 * 1.12, f"latency alone: α₀ + (t-1)α = {floor * 1e6:.0f} µs",
                fontsize=7, color="#555555")
    low = min(min(seconds) for seconds, _ in curves.values()) * 1e3
    high = max(max(seconds) for seconds, _ in curves.values()) * 1e3
    for label, n in (marks or {}).items():
        ax.axvline(n, color=FLOOR_COLOR, linewidth=0.8, linestyle=":")
        ax.text(n * 1.3, (low * high) ** 0.5, label, fontsize=8, ha="left", va="center")
    ax.set_xlabel("n: bytes of the full tensor", fontsize=9)
    ax.set_ylabel("time (ms)", fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def draw_layer_verdict(bars: dict, title: str):
    """``bars``: label -> seconds; the first is the compute, the others are TP traffic on some link."""
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(bars) + 0.6))
    ms = [v * 1e3 for v in bars.values()]
    ax.barh(range(len(bars)), ms, color=[COMPUTE_COLOR] + [TRAFFIC_COLOR] * (len(bars) - 1), edgecolor="black",
            linewidth=0.5)
    for y, v in enumerate(ms):
        ax.text(v + max(ms) * 0.01, y, f"{v:.1f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), list(bars), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per layer, forward + backward", fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, max(ms) * 1.15)
    fig.tight_layout()
    return fig

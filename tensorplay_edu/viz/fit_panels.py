"""Does one GPU hold the activations? Bars of GB per GPU in panels that share one y-axis (notebook 04b).

Each panel is one group of bars, e.g. one kernel basis or one recomputation mode; because the panels share the
y-axis, a bar of 20 GB stands as high in every panel and the two lines, one GPU (dashed) and what the rest of
the step leaves for activations (dotted), run across all panels at one height. A bar's label says what it
counts, so a reader comparing two bars across panels sees when they count different things.

    fig = draw_fit_panels({"torchtitan's kernels": {"TP 8": 64.8, "TP 8 + SP": 46.0}}, gpu_gb=85.5,
                          left_gb=66.9, spare=("torchtitan's kernels",))

In a panel named in ``spare`` each bar writes its GB and what ``left_gb`` leaves beside it ("2.1 to spare");
elsewhere a bar writes its GB above it.
"""

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

__all__ = ["draw_fit_panels"]


def draw_fit_panels(panels: dict, gpu_gb: float, left_gb: float, *, colors: dict | None = None, spare=(),
                    note: str | None = None, title: str = "", gpu_name: str = "H100",
                    left_label: str = "left for activations", left_bars: dict | None = None):
    """One subplot per panel of ``panels`` ({panel title: {bar label: GB}}), widths in proportion to their bars,
    one shared y-axis from 0 to 1.15 x the highest of the bars and ``gpu_gb``. A dashed line at ``gpu_gb``
    (labelled ``gpu_name`` with its GB and GiB), a dotted one at ``left_gb`` (labelled ``left_label``: say what
    the budget assumed, e.g. one sequence's logits; ``left_bars`` ({panel title: n}: the dotted line spans only
    that panel's first n bars, where the budget applies); ``colors`` ({panel title: colour},
    light grey by default); ``note``: one more legend entry (a patch in the last panel's colour); the legend sits under the panels. Returns the Figure."""
    colors = colors or {}
    top = 1.15 * max(gpu_gb, *(v for bars in panels.values() for v in bars.values()))
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 4.1), sharey=True, squeeze=False,
                             gridspec_kw={"width_ratios": [len(bars) for bars in panels.values()]})
    axes = axes[0]
    for ax, (name, bars) in zip(axes, panels.items()):
        colour = colors.get(name, "lightgrey")
        drawn = ax.bar(list(bars), list(bars.values()), color=colour, edgecolor="black", linewidth=0.5)
        for x, v in enumerate(bars.values()):
            if name in spare:                       # what the budget leaves beside the bar, written inside it
                ax.text(x, v - 1, f"{v:.1f} GB\n({left_gb - v:.1f} to spare)", ha="center", va="top", fontsize=8)
            else:
                ax.text(x, v, f"{v:.1f} GB", ha="center", va="bottom", fontsize=8)
        ax.axhline(gpu_gb, color="black", linestyle="--", linewidth=1)
        n = (left_bars or {}).get(name)
        if n is None:
            ax.axhline(left_gb, color="black", linestyle=":", linewidth=1)
        else:                                       # from the first bar's left edge to the n-th's right
            ax.hlines(left_gb, drawn[0].get_x(), drawn[n - 1].get_x() + drawn[n - 1].get_width(),
                      color="black", linestyle=":", linewidth=1)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
    axes[0].set(ylabel="GB per GPU", ylim=(0, top))
    handles = [plt.Line2D([], [], color="black", linestyle="--", linewidth=1,
                          label=f"an {gpu_name}: {gpu_gb:.1f} GB ({gpu_gb * 1e9 / 2**30:.1f} GiB)"),
               plt.Line2D([], [], color="black", linestyle=":", linewidth=1, label=f"{left_label}: {left_gb:.1f} GB")]
    if note:
        handles.append(Patch(facecolor=colors.get(list(panels)[-1], "lightgrey"), edgecolor="black", label=note))
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=len(handles), frameon=False)   # below: clear of bars
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig

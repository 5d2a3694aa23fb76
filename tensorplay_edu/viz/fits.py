"""What fits on one GPU: a training layout's memory per GPU in four groups, against the GPU (notebooks 00, 00b).

The groups gather ``cluster.memory``'s parts: the **training state** (fp32 weights, gradients, AdamW's moments),
the **bf16 weights** the matmuls read (``working``; with FSDP, the unit it gathers and its buffers), the
**activations** (with ``backward``, one block's activation gradients during backward) and the **logits** at the
loss's peak. The legend says what a group may hold (``MEMORY_GROUP_LABELS``); a cut bar's text names the group only,
so a layout without FSDP is never labelled with FSDP's buffers.
"""

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

__all__ = ["MEMORY_GROUPS", "MEMORY_GROUP_COLORS", "MEMORY_GROUP_LABELS", "memory_groups", "draw_memory_parts"]

MEMORY_GROUPS = {"training state": ("weights", "gradients", "optimizer"), "bf16 weights": ("working",),
                 "activations": ("activations", "backward"), "logits": ("logits",)}
MEMORY_GROUP_COLORS = {"training state": "#4C72B0", "bf16 weights": "#8172B3", "activations": "#C44E52",
                       "logits": "#DA8BC3"}
MEMORY_GROUP_LABELS = {"training state": "training state (weights, gradients, AdamW)",   # the legend's words
                       "bf16 weights": "bf16 weights (with FSDP: + its buffers)",
                       "activations": "activations (+ backward)", "logits": "logits"}


def memory_groups(parts: dict) -> dict:
    """{group: GB}: ``cluster.memory``'s parts (in GB) summed into ``MEMORY_GROUPS``."""
    return {group: sum(parts[p] for p in members) for group, members in MEMORY_GROUPS.items()}


def draw_memory_parts(plans: dict, gpu_gb: float, title: str, *, horizontal: bool = False, top: float | None = None,
                      usable_gb: float | None = None, gpu_name: str = "H100", fsdp: bool = True,
                      cut_text: str = "inside", cut_shares: bool = True):
    """Stacked bars of memory per GPU, one per layout of ``plans`` ({name: {cluster.memory part: GB}}), in the four
    groups, with a dashed line at one GPU (``gpu_gb``, labelled with ``gpu_name``) and, if given, a dotted one at what a plan may use
    (``usable_gb``). ``fsdp=False``: no layout shards with FSDP, so the legend's bf16 weights say nothing of its buffers.
    Vertical bars by default: a bar over ``top`` GB is cut there, its total marked "(cut)", its four groups drawn
    in proportion to its total and hatched (their share, not their GB) and written inside it, black on a white box;
    a total that would cross a line is written above the lines, in black; ``cut_text="right"`` writes those GB in the
    right margin, under the legend, leaving the hatching clear; ``cut_shares=False`` draws a cut bar as one plain hatched
    bar with an arrow at ``top`` (no segments on a GB axis they do not obey). ``horizontal=True``: one row per layout, totals to the right, clear of the lines."""
    names = list(plans)
    groups = {name: memory_groups(parts) for name, parts in plans.items()}
    totals = {name: sum(parts.values()) for name, parts in plans.items()}
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 0.85) if horizontal else (7, 4))
    low = [0.0] * len(names)
    cut = [top is not None and totals[name] > top for name in names]   # drawn in proportion, hatched
    for group, color in MEMORY_GROUP_COLORS.items():
        size = [(top * groups[name][group] / totals[name] if cut_shares else 0.0) if c else groups[name][group]
                for name, c in zip(names, cut)]
        draw = ax.barh if horizontal else ax.bar
        label = MEMORY_GROUP_LABELS[group] if fsdp or group != "bf16 weights" else "bf16 weights"
        bars = draw(range(len(names)), size, color=color, edgecolor="black", linewidth=0.5, label=label,
                    **({"left": low, "height": 0.7} if horizontal else {"bottom": low, "width": 0.6}))
        for bar, c in zip(bars, cut):
            bar.set_hatch("//" if c else None)
        low = [base + v for base, v in zip(low, size)]
    for x, c in enumerate(cut if not cut_shares and not horizontal else []):
        if c:   # one plain bar to the axis top, an arrow: "goes on"
            ax.bar(x, top, width=0.6, color="white", edgecolor="black", linewidth=0.5, hatch="//")
            ax.annotate("", (x, 0.97 * top), (x, 0.72 * top), arrowprops={"arrowstyle": "->", "lw": 1.5})
    lines = [(gpu_gb, f"one {gpu_name}: {gpu_gb:.1f} GB", "--")] + ([(usable_gb, f"usable: {usable_gb:.1f}", ":")] if usable_gb else [])
    if horizontal:
        near = (min(x for x, _, _ in lines) - 12, max(x for x, _, _ in lines) + 5)   # a total here would touch a line
        for y, name in enumerate(names):
            x = near[1] if near[0] < totals[name] < near[1] else totals[name] + 3
            ax.text(x, y, f"{totals[name]:,.0f} GB", va="center", fontsize=8)
        for x, label, style in lines:
            ax.axvline(x, color="black", linestyle=style, linewidth=1)
            right = style == "--"
            ax.text(x + (2 if right else -2), 1.01, label, transform=ax.get_xaxis_transform(), ha="left" if right else "right",
                    va="bottom", fontsize=8)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_ylim(len(names) - 0.4, -0.6)
        ax.set_xlabel("GB per GPU", fontsize=9)
        ax.set_title(title, fontsize=10, pad=16)
        ax.legend(fontsize=8, loc="lower right", frameon=False)
    else:
        for x, name in enumerate(names):
            total = totals[name]
            if top is not None and total > top:   # a cut bar: its four groups written inside it
                text = [("activations\n+ backward" if g == "activations" else g) + f":\n{v:,.0f} GB"
                        for g, v in groups[name].items()]
                if cut_text == "right":   # beside the plot, under the legend: the hatched shares stay visible
                    ax.text(1.03, 0.68, f"{name} (cut bar):\n" + "\n".join(t.replace(":\n", ": ").replace("\n+", " +")
                            for t in text), transform=ax.transAxes, ha="left", va="top", fontsize=8)
                else:
                    ax.text(x, 0.42 * top, "\n".join(text), ha="center", va="center", fontsize=7, color="black",
                            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9})   # readable over the hatching
            shown = total if top is None else min(total, top)
            highest = max(y for y, _, _ in lines)
            crowded = min(y for y, _, _ in lines) - 15 < shown < highest + 5   # its label would cross a line: above them
            ax.text(x, (highest if crowded else shown) + 4, f"{total:,.0f} GB" + (" (cut)" if shown < total else ""),
                    ha="center", va="bottom", fontsize=8)
        for y, label, style in lines:   # the highest line's label above it, the other's below: never on each other
            ax.axhline(y, color="black", linestyle=style, linewidth=1)
            ax.text(1.01, y, label, transform=ax.get_yaxis_transform(), fontsize=8,
                    va="bottom" if y == max(z for z, _, _ in lines) else "top")
        ax.set_xticks(range(len(names)), [name.replace(" + ", "\n+ ") for name in names], fontsize=8)
        ax.set(ylim=(0, (top or max(totals.values())) * 1.1), ylabel="GB per GPU")
        ax.set_title(title, fontsize=10)
        handles, labels = ax.get_legend_handles_labels()
        handles = [Patch(facecolor=h.patches[0].get_facecolor(), edgecolor="black", linewidth=0.5) for h in handles]
        ax.legend(handles[::-1], labels[::-1], fontsize=8, loc="upper left", frameon=False,
                  bbox_to_anchor=(1.01, 1.0 if cut_text == "right" else 0.8))
    fig.tight_layout()
    return fig

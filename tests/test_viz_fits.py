"""viz.fits: a layout's memory per GPU in four groups, against one GPU (notebooks 00 and 00b)."""
import matplotlib

matplotlib.use("Agg")

from tensorplay_edu import cluster, viz

LLAMA, H100 = cluster.MODELS["llama3-70b"], cluster.GPUS["h100"]
SETUPS = {"no TP": cluster.Setup(), "FSDP 64 + full AC": cluster.Setup(dp=64, fsdp=True, ac="full"),
          "TP 8 + SP + FSDP 8 + loss_parallel": cluster.Setup(tp=8, sp=True, dp=8, fsdp=True, loss_parallel=True)}
PLANS = {name: {part: n / 1e9 for part, n in cluster.memory(LLAMA, setup).items()} for name, setup in SETUPS.items()}
GPU_GB = H100.hbm_bytes / 1e9


def test_groups_sum_to_the_parts():
    for parts in PLANS.values():
        groups = viz.memory_groups(parts)
        assert list(groups) == list(viz.MEMORY_GROUPS)
        assert abs(sum(groups.values()) - sum(parts.values())) < 1e-9
    assert round(viz.memory_groups(PLANS["no TP"])["training state"]) == 1129


def test_vertical_cut_bar_writes_its_groups():
    fig = viz.draw_memory_parts(PLANS, GPU_GB, "t", top=300)
    ax = fig.axes[0]
    assert len(ax.patches) == 4 * len(PLANS)
    assert max(p.get_y() + p.get_height() for p in ax.patches) <= 300 + 1e-9          # cut at top
    texts = [t.get_text() for t in ax.texts]
    assert "1,544 GB (cut)" in texts and "58 GB" in texts and "72 GB" in texts
    inside = next(t for t in texts if t.startswith("training state"))
    assert "1,129 GB" in inside and "261 GB" in inside and "13 GB" in inside
    matplotlib.pyplot.close(fig)


def test_horizontal_lines_and_labels_clear_of_them():
    plans = {name: parts for name, parts in PLANS.items() if name != "no TP"}
    fig = viz.draw_memory_parts(plans, GPU_GB, "t", horizontal=True, usable_gb=0.95 * GPU_GB)
    ax = fig.axes[0]
    assert len(ax.patches) == 4 * len(plans) and len(ax.lines) == 2
    totals = [t for t in ax.texts if t.get_text().endswith(" GB") and not t.get_text().startswith("one")]
    assert all(t.get_position()[0] > GPU_GB or t.get_position()[0] < 0.95 * GPU_GB - 9 for t in totals)
    assert any(t.get_text().startswith("usable") for t in ax.texts)
    matplotlib.pyplot.close(fig)


def test_vertical_totals_clear_of_the_lines():
    # A total just under the lines (72 GB, under 81.2 and 85.5) is written above them, never across one.
    fig = viz.draw_memory_parts(PLANS, GPU_GB, "t", top=300, usable_gb=0.95 * GPU_GB)
    ax = fig.axes[0]
    label = next(t for t in ax.texts if t.get_text() == "72 GB")
    assert label.get_position()[1] > GPU_GB and label.get_va() == "bottom" and label.get_color() == "black"
    matplotlib.pyplot.close(fig)


def test_vertical_line_labels_apart():
    # The two lines' labels, 4 GB apart on a 300 GB axis: one above its line, the other below its own.
    fig = viz.draw_memory_parts(PLANS, GPU_GB, "t", top=300, usable_gb=0.95 * GPU_GB)
    ax = fig.axes[0]
    one, usable = (next(t for t in ax.texts if t.get_text().startswith(p)) for p in ("one H100", "usable"))
    assert (one.get_va(), usable.get_va()) == ("bottom", "top")
    matplotlib.pyplot.close(fig)


def test_no_fsdp_bar_is_not_labelled_with_fsdp():
    # The cut 1-GPU bar (no FSDP) names its groups only; the legend says what each group may hold.
    from tensorplay_edu.viz.fits import MEMORY_GROUP_LABELS
    fig = viz.draw_memory_parts(PLANS, GPU_GB, "t", top=300)
    ax = fig.axes[0]
    inside = next(t.get_text() for t in ax.texts if t.get_text().startswith("training state"))
    assert "FSDP" not in inside and "bf16 weights:\n141 GB" in inside and "+ backward:\n261 GB" in inside
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert sorted(legend) == sorted(MEMORY_GROUP_LABELS.values())
    matplotlib.pyplot.close(fig)


def test_legend_without_fsdp_names_no_buffers():
    # fsdp=False (notebook 00b's first picture: no layout with FSDP): the legend's bf16 weights say nothing of FSDP.
    fig = viz.draw_memory_parts(PLANS, GPU_GB, "t", top=300, fsdp=False)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "bf16 weights" in legend and not any("FSDP" in text for text in legend), legend
    matplotlib.pyplot.close(fig)


def test_the_gpu_line_names_the_gpu_given():
    # An H200's 141 GB is not labelled "one H100"; H100 stays the default (notebook 00b).
    h200 = cluster.GPUS["h200"]
    for horizontal in (False, True):
        fig = viz.draw_memory_parts(PLANS, h200.hbm_bytes / 1e9, "t", horizontal=horizontal, gpu_name="H200")
        texts = [t.get_text() for t in fig.axes[0].texts]
        assert f"one H200: {h200.hbm_bytes / 1e9:.1f} GB" in texts and not any("H100" in t for t in texts), texts
        matplotlib.pyplot.close(fig)


def test_cut_bar_shows_its_mix_hatched():
    # A bar over top is drawn in its groups' shares of its total, hatched (not to scale); the others as they are.
    fig = viz.draw_memory_parts(PLANS, GPU_GB, "t", top=300)
    ax = fig.axes[0]
    n = len(PLANS)
    bars = [ax.patches[n * i:n * i + n] for i in range(4)]   # per group, one bar per layout
    cut = [group[0] for group in bars]                          # "no TP", the cut one, in each group
    shares = viz.memory_groups(PLANS["no TP"])
    total = sum(shares.values())
    for patch, gb in zip(cut, shares.values()):
        assert abs(patch.get_height() - 300 * gb / total) < 1e-9 and patch.get_hatch() == "//"
    assert all(not group[1].get_hatch() for group in bars)
    matplotlib.pyplot.close(fig)


def test_cut_bar_text_is_black_on_white():
    # the cut bar's group text sits in black on a white box, readable over the hatching
    fig = viz.draw_memory_parts(PLANS, GPU_GB, "t", top=300)
    inside = [t for t in fig.axes[0].texts if "training state" in t.get_text()]
    assert len(inside) == 1 and inside[0].get_color() == "black" and inside[0].get_bbox_patch() is not None
    matplotlib.pyplot.close(fig)


def test_cut_text_right_leaves_the_bar_clear():
    # cut_text="right" (notebook 00b): the cut bar's GB in the right margin, none written over the bar.
    fig = viz.draw_memory_parts(PLANS, GPU_GB, "t", top=300, fsdp=False, cut_text="right")
    ax = fig.axes[0]
    beside = next(t for t in ax.texts if t.get_text().startswith("no TP (cut bar)"))
    assert beside.get_position()[0] > 1 and "training state: 1,129 GB" in beside.get_text() and "logits: 13 GB" in beside.get_text()
    assert not any(t.get_text().startswith("training state") for t in ax.texts)
    matplotlib.pyplot.close(fig)


def test_cut_shares_false_draws_one_plain_bar():
    # cut_shares=False (notebook 00b): the cut bar has no coloured segments, only one hatched bar up to top.
    fig = viz.draw_memory_parts(PLANS, GPU_GB, "t", top=300, fsdp=False, cut_text="right", cut_shares=False)
    ax = fig.axes[0]
    n = len(PLANS)
    assert all(ax.patches[n * i].get_height() == 0 for i in range(4))       # "no TP"'s four groups: not drawn
    plain = ax.patches[4 * n]
    assert plain.get_height() == 300 and plain.get_hatch() == "//"
    assert any(t.get_text().startswith("no TP (cut bar)") for t in ax.texts)
    matplotlib.pyplot.close(fig)

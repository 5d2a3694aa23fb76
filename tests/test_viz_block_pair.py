"""The vanilla and the sequence-parallel block side by side (notebook 04): the structure, colours and labels of
the returned figure (not pixels)."""

import matplotlib
import matplotlib.colors as mcolors

from tensorplay_edu.viz import COMM_COLOR, block_changes, block_steps, draw_block_pair

DIMS = dict(batch=2, seq=16, dim=32, n_heads=4, ffn_hidden=96)


def test_changes_are_between_the_sub_blocks_and_the_inside_stays():
    names = [s["name"] for s in block_steps(False, 4, 0, **DIMS)]
    changed = {names[i] for i in block_changes(4, 0, **DIMS)}
    assert changed == {"x (block input)", "attention_norm", "attention input", "attention output", "+ x",
                       "ffn_norm", "feed_forward input", "feed_forward output", "+ r"}
    assert not changed & {"wq | wk, wv", "view, RoPE, softmax(qk\u1d40)v", "reshape", "wo", "w1, w3",
                          "silu(w1 x) * w3 x", "w2"}


def test_pair_draws_both_plans_box_for_box_with_only_the_changed_boxes_red():
    fig = draw_block_pair(4, 0, **DIMS)
    assert len(fig.axes) == 2
    names = [s["name"] for s in block_steps(False, 4, 0, **DIMS)]
    want = {("changed " if i in block_changes(4, 0, **DIMS) else "same ") + name for i, name in enumerate(names)}
    red = mcolors.to_hex(COMM_COLOR)
    for ax in fig.axes:
        boxes = {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith(("changed ", "same "))}
        assert set(boxes) == want
        for gid, box in boxes.items():
            assert (mcolors.to_hex(box.get_edgecolor()) == red) == gid.startswith("changed "), gid
        assert sorted(p.get_gid() for p in ax.patches if (p.get_gid() or "").startswith("residual")) == \
            ["residual r", "residual x"]


def test_pair_labels_local_shapes_and_the_four_letters():
    fig = draw_block_pair(4, 0, **DIMS)
    vanilla, sp = ([t.get_text() for t in ax.texts] for ax in fig.axes)
    assert "Replicate() \u00b7 [2, 16, 32]" in vanilla and "Shard(1) \u00b7 [2, 4, 32]" in sp
    # f-bar and g-bar as mathtext: a combining overline would not show, and f-bar would read as f
    assert r"$\bar{f}$: all-reduce / identity" in vanilla and "f: identity / all-reduce" in vanilla
    assert "g: all-gather / reduce-scatter" in sp and r"$\bar{g}$: reduce-scatter / all-gather" in sp
    assert not any("\u0304" in t for t in vanilla + sp)
    assert not any(t.startswith(("g:", r"$\bar{g}$")) for t in vanilla)  # one pair of letters per plan
    assert not any(t.startswith(("f:", r"$\bar{f}$")) for t in sp)
    red = mcolors.to_hex(COMM_COLOR)
    shape_colors = {t.get_text(): mcolors.to_hex(t.get_color()) for t in fig.axes[1].texts if "\u00b7 [" in t.get_text()}
    assert shape_colors["Shard(1) \u00b7 [2, 4, 32]"] == red                     # the residual stream: changed
    assert shape_colors["Shard(-1) \u00b7 [2, 16, 24]"] == "#000000"             # w1's output: the same
    assert shape_colors["Replicate() \u00b7 [2, 16, 32]"] == "#000000"           # what SP's g returns: as f's
    for text in fig.findobj(matplotlib.text.Text):
        if text.get_text():
            assert text.get_fontsize() >= 8, (text.get_text(), text.get_fontsize())


def test_compact_pair_drops_the_same_local_steps_and_keeps_the_red_labels():
    fig = draw_block_pair(4, 0, compact=True, **DIMS)
    vanilla, sp = ([t.get_text() for t in ax.texts] for ax in fig.axes)
    for texts in (vanilla, sp):
        assert "reshape" not in texts and "silu(w1 x) * w3 x" not in texts and "wo" in texts and "+ r" in texts
    red = mcolors.to_hex(COMM_COLOR)
    colors = {t.get_text(): mcolors.to_hex(t.get_color()) for t in fig.axes[1].texts if "\u00b7 [" in t.get_text()}
    assert colors["Shard(1) \u00b7 [2, 4, 32]"] == red and colors["Shard(-1) \u00b7 [2, 16, 24]"] == "#000000"
    assert fig.get_size_inches()[0] < draw_block_pair(4, 0, **DIMS).get_size_inches()[0]

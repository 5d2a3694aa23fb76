"""The bug zoo's pictures (notebook 08): the heads each view hands to attention, and the bars of each
bug's relative error (structure and labels of the returned figures, not pixels)."""

import pytest

from tensorplay_edu.viz import draw_bug_sizes, draw_view_groups


def _groups(ax):
    """{row: [(rank, k, first, size)]} from the gids of the black boxes."""
    out = {}
    for p in ax.patches:
        gid = p.get_gid() or ""
        if gid.startswith("group "):
            row, rank, k, first, size = map(int, gid.split()[1:])
            out.setdefault(row, []).append((rank, k, first, size))
    return out


def test_head_views_box_whole_heads_for_minus_one_and_cut_heads_for_the_global_count():
    heads, hd, t = 4, 4, 2
    views = {"-1": lambda y: y.view(1, 1, -1, hd), "H": lambda y: y.view(1, 1, heads, -1)}
    ax = draw_view_groups(views, heads, hd, t).axes[0]
    groups = _groups(ax)
    # -1: each rank names H/t heads of hd features, each one whole true head (first feature a multiple of hd)
    assert sorted(groups[0]) == [(r, k, r * 8 + k * hd, hd) for r in range(t) for k in range(heads // t)]
    # H: each rank names H heads of hd/t features, so every true head is cut in t pieces
    assert sorted(groups[1]) == [(r, k, r * 8 + k * 2, 2) for r in range(t) for k in range(heads)]
    labels = [x.get_text() for x in ax.get_yticklabels()]
    assert labels == ["true head\n(one process)", "-1", "H"]
    texts = [x.get_text() for x in ax.texts]
    assert "rank 1: local features 0-7 = global 8-15" in texts
    assert texts.count("head 0") == t  # the whole heads are labelled "head k", once per rank


def test_bug_sizes_draw_the_relative_error_of_what_each_bug_spoils_on_one_labelled_log_axis():
    rows = {"a bug": {"quantity": "the loss", "bug": 0.06, "scale": 2.0, "fixed": 0.0},
            "another": {"quantity": "a gradient", "bug": 7.0, "scale": 10.0, "fixed": 3e-16}}
    ax = draw_bug_sizes(rows).axes[0]
    assert ax.get_xscale() == "log"
    bars = {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith("bug ")}
    assert set(bars) == {"bug a bug", "bug another"}
    for name, row in rows.items():  # each bar ends at error / scale
        bar = bars[f"bug {name}"]
        assert bar.get_x() + bar.get_width() == pytest.approx(row["bug"] / row["scale"])
    texts = [x.get_text() for x in ax.texts]
    assert "3.0%" in texts and "70.0%" in texts
    labels = [x.get_text() for x in ax.get_yticklabels()]
    assert labels == ["a bug\nspoils the loss; fixed: 0", "another\nspoils a gradient; fixed: 3e-16"]
    # one meaning for the whole axis, whatever each bug spoils
    assert ax.get_xlabel().startswith("relative error of the quantity the bug spoils (log axis)")
    assert "under 1e-12" in ax.get_title()  # the checks' bound is named
    lo, hi = ax.get_xlim()
    assert lo < 0.03 and 0.7 < hi

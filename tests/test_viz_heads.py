"""The head pictures (viz.heads): which rank holds which query and kv heads, what each query head reads, and
how a view cuts a rank's channels into heads; structure, colours and labels of the figures (not pixels)."""

import matplotlib
import matplotlib.colors as mcolors
import pytest

import torch

from tensorplay_edu.viz import RANK_COLORS, draw_gqa, draw_head_split, draw_head_views, heads_per_rank, row_chunks
from figures import by_gid as _by_gid


def test_heads_per_rank_are_whole_contiguous_heads():
    assert heads_per_rank(4, 2) == [[0, 1], [2, 3]]
    assert heads_per_rank(2, 2) == [[0], [1]]
    with pytest.raises(ValueError, match="3 ranks"):
        heads_per_rank(4, 3)


@pytest.mark.parametrize("H, K, t", [(4, 2, 2), (8, 4, 2), (8, 2, 2), (8, 4, 4)])
def test_gqa_every_query_head_reads_its_group_kv_head_on_its_own_rank(H, K, t):
    ax = draw_gqa(H, K, t).axes[0]
    boxes = _by_gid(ax)
    colour = {gid: mcolors.to_hex(p.get_facecolor()) for gid, p in boxes.items()}
    for r, heads in enumerate(heads_per_rank(H, t)):
        assert all(colour[f"q head {i}"] == RANK_COLORS[r].lower() for i in heads)
    for r, heads in enumerate(heads_per_rank(K, t)):
        assert all(colour[f"kv head {j}"] == RANK_COLORS[r].lower() for j in heads)
    arrows = sorted(gid for gid in boxes if "->" in gid)
    assert arrows == sorted(f"q head {i} -> kv head {i // (H // K)}" for i in range(H))
    for gid in arrows:                                                    # every arrow stays on one rank
        q, kv = gid.split(" -> ")
        assert colour[q] == colour[kv], gid
    assert f"H = {H}, K = {K}, t = {t}" in ax.get_title()
    assert [t_.get_text() for t_ in ax.get_legend().get_texts()] == [f"rank {r}" for r in range(t)]


def test_gqa_refuses_a_kv_head_cut_over_ranks():
    with pytest.raises(ValueError):
        draw_gqa(4, 2, 4)


@pytest.mark.parametrize("t", [2, 4])
def test_head_views_cut_the_same_channels_into_whole_heads_or_t_th_of_heads(t):
    H, hd = 4, 8
    ax = draw_head_views(H, hd, t).axes[0]
    boxes = _by_gid(ax)
    width = H // t * hd
    right = [boxes[g] for g in sorted(boxes) if g.startswith("right")]
    wrong = [boxes[f"wrong {k}"] for k in range(H)]
    assert [p.get_width() for p in right] == [hd] * (H // t) and [p.get_width() for p in wrong] == [hd // t] * H
    assert sum(p.get_width() for p in right) == sum(p.get_width() for p in wrong) == width   # the same channels
    texts = [tx.get_text() for tx in ax.texts]
    part = "half" if t == 2 else f"1/{t}"
    assert [s for s in texts if s.startswith("'head'")] == [f"'head' {k}\n({part} of head {k // t})" for k in range(H)]
    assert f"view(b, s, H, -1): {H} 'heads' of {hd // t}" in texts
    assert {mcolors.to_hex(p.get_facecolor()) for p in right + wrong}.isdisjoint({c.lower() for c in RANK_COLORS})


@pytest.mark.parametrize("n, t", [(32, 2), (32, 3), (16, 3), (16, 4), (6, 4), (64, 8)])
def test_row_chunks_are_torch_chunk(n, t):
    assert row_chunks(n, t) == [(int(c[0]), int(c[-1]) + 1) for c in torch.arange(n).chunk(t)]


@pytest.mark.parametrize("H, K, t", [(4, 2, 2), (8, 4, 4), (8, 2, 2)])
def test_head_split_bands_are_whole_heads_in_one_rank_colour(H, K, t):
    hd = 8
    ax = draw_head_split(H, K, hd, t).axes[0]
    boxes = _by_gid(ax)
    for name, kind, n in (("wq", "q head", H), ("wk", "kv head", K), ("wv", "kv head", K), ("wo", "q head", H)):
        pieces = [boxes[f"{name} rank {r}"] for r in range(t)]
        assert [mcolors.to_hex(p.get_facecolor()) for p in pieces] == [c.lower() for c in RANK_COLORS[:t]]
        sharded = [p.get_height() if name != "wo" else p.get_width() for p in pieces]
        assert sharded == [n * hd // t] * t, (name, sharded)                     # to scale: n·hd/t rows (columns) each
        for r, heads in enumerate(heads_per_rank(n, t)):                     # rank r's piece covers its heads' bands
            for i in heads:
                band = boxes[f"{name} {kind} {i}"]
                assert band.get_edgecolor()[:3] == (0.0, 0.0, 0.0), (name, i)  # not cut
                lo, hi = (band.get_y(), band.get_y() + band.get_height()) if name != "wo" else (
                    band.get_x(), band.get_x() + band.get_width())
                p = pieces[r]
                plo, phi = (p.get_y(), p.get_y() + p.get_height()) if name != "wo" else (p.get_x(), p.get_x() + p.get_width())
                assert plo <= lo and hi <= phi, (name, i, r)
    title = ax.get_title()
    assert f"H = {H}, K = {K}, hd = {hd}, t = {t}" in title and "whole heads" in title
    assert "rank 0 q heads " + ", ".join(map(str, heads_per_rank(H, t)[0])) in title


def test_head_split_names_the_heads_torch_chunk_cuts():
    ax = draw_head_split(4, 2, 8, 3, weights=("wq", "wk")).axes[0]
    boxes = _by_gid(ax)
    red = {gid for gid, p in boxes.items() if p.get_edgecolor()[:3] == (1.0, 0.0, 0.0)}
    assert red == {"wq q head 1", "wq q head 2", "wk kv head 0", "wk kv head 1"}
    assert [boxes[f"wq rank {r}"].get_height() for r in range(3)] == [11, 11, 10]
    assert "wq's pieces of 11, 11, 10 rows cut q heads 1, 2; wk's pieces of 6, 6, 4 rows cut kv heads 0, 1" in ax.get_title()
    assert "q head 1 (cut)\nrows 8:16" in [tx.get_text() for tx in ax.texts]


def test_fonts_of_at_least_8_points():
    for fig in (draw_gqa(4, 2, 2), draw_head_views(4, 8, 2), draw_head_split(4, 2, 8, 2)):
        for text in fig.findobj(matplotlib.text.Text):
            if text.get_text():
                assert text.get_fontsize() >= 8, (text.get_text(), text.get_fontsize())

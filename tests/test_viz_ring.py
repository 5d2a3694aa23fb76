"""The ring pictures: the schedule (who sends which chunk at each step) and the structure, colours and
labels of the returned figure (not pixels)."""

import matplotlib
import matplotlib.colors as mcolors
import pytest

from tensorplay_edu.viz import RANK_COLORS, draw_ring, ring_steps


def _slots(ax):
    """{(rank, chunk): [stripe owners]} from the gids of one panel's slot patches ('empty' -> [])."""
    out = {}
    for p in ax.patches:
        gid = p.get_gid() or ""
        if gid.startswith("slot "):
            _, r, c, j = gid.split()
            out.setdefault((int(r), int(c)), [])
            if j != "empty":
                out[(int(r), int(c))].append(int(j))
    return out


@pytest.mark.parametrize("t", [2, 3, 4, 5, 8])
def test_all_gather_ring_sends_chunk_r_minus_k_and_ends_with_everything_everywhere(t):
    steps = ring_steps("all_gather", t)
    assert len(steps) == t - 1
    for k, step in enumerate(steps):
        assert step["sends"] == [(r, (r + 1) % t, (r - k) % t) for r in range(t)]
    for r in range(t):  # each rank sends t - 1 distinct chunks, never the same twice
        assert len({step["sends"][r][2] for step in steps}) == t - 1
    assert steps[-1]["buffers"] == [[frozenset({c}) for c in range(t)] for _ in range(t)]


@pytest.mark.parametrize("t", [2, 3, 4, 5, 8])
def test_reduce_scatter_ring_completes_chunk_d_on_rank_d(t):
    steps = ring_steps("reduce_scatter", t)
    assert len(steps) == t - 1
    for k, step in enumerate(steps):
        assert step["sends"] == [(r, (r + 1) % t, (r - 1 - k) % t) for r in range(t)]
    final = steps[-1]["buffers"]
    assert [final[d][d] for d in range(t)] == [frozenset(range(t))] * t
    for d in range(t):  # the sum of chunk d starts on rank d+1 and gains one addend per step
        for k, step in enumerate(steps):
            holder = (d + 1 + k + 1) % t
            assert step["buffers"][holder][d] == frozenset((d + 1 + i) % t for i in range(k + 2))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="all_reduce"):
        ring_steps("all_reduce")
    with pytest.raises(ValueError, match="world_size"):
        draw_ring("all_gather", 1)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_one_panel_per_step_with_the_schedule_drawn(op):
    t = 4
    fig = draw_ring(op, t)
    steps = ring_steps(op, t)
    assert len(fig.axes) == t - 1
    for k, (ax, step) in enumerate(zip(fig.axes, steps)):
        assert ax.get_title().startswith(f"step {k}: rank r sends")
        texts = [x.get_text() for x in ax.texts]
        assert [x for x in texts if x.startswith("rank ")] == [f"rank {r}" for r in range(t)]
        assert f"from {t - 1}" in texts and "to 0" in texts  # the wrap-around send, last rank -> rank 0
        slots = _slots(ax)
        assert len(slots) == t * t  # every rank draws all t chunk slots
        for r in range(t):
            for c in range(t):  # each slot's stripes are the ranks whose data it holds, in their colours
                assert slots[(r, c)] == sorted(step["buffers"][r][c])
        thick = [p for p in ax.patches if p.get_facecolor()[3] == 0 and p.get_linewidth() > 2]
        assert len(thick) == t  # one slot arrives on every rank in every step
        arrows = [p for p in ax.patches if type(p).__name__ == "FancyArrowPatch"]
        assert len(arrows) == t + 1  # t - 1 neighbour sends, plus the wrap-around drawn as out + in
    last = [x.get_text() for x in fig.axes[-1].texts]
    if op == "reduce_scatter":  # the last panel: rank d's slot d holds the whole sum
        assert {f"c{d}: 0+1+2+3" for d in range(t)} <= set(last)
    else:
        assert all(last.count(f"c{c}") == t for c in range(t))


def test_stripes_use_the_rank_colour_of_their_rank_and_only_rank_colours():
    fig = draw_ring("reduce_scatter", 4)
    for ax in fig.axes:
        for p in ax.patches:
            gid = p.get_gid() or ""
            if gid.startswith("slot ") and not gid.endswith("empty"):
                assert mcolors.to_hex(p.get_facecolor()) == RANK_COLORS[int(gid.split()[3])].lower()
    fig = draw_ring("all_gather", 4)
    first = _slots(fig.axes[0])
    assert first[(0, 0)] == [0] and first[(1, 0)] == [0] and first[(2, 0)] == []  # step 0: rank 1 got c0
    labels = [x.get_text() for x in fig.axes[0].texts]
    assert labels.count("c0") == 2 and labels.count("c3") == 2


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("t", [2, 3, 4])
def test_fonts_are_at_least_8_points(op, t):
    fig = draw_ring(op, t)
    for text in fig.findobj(matplotlib.text.Text):
        if text.get_text():
            assert text.get_fontsize() >= 8, (text.get_text(), text.get_fontsize())

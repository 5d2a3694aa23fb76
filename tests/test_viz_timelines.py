"""viz.timelines' numbers behind the ring picture: ring_intervals cuts a rank's intervals into rings, ring_shares
adds up what the picture shades (transfer under a matmul, posting, waiting)."""
import pytest

from tensorplay_edu import viz
from tensorplay_edu.viz.timelines import ring_intervals, ring_shares


def _rank(me):  # as test_viz_runs_more: a gather ring (0-10 ms), then a scatter ring (15-26 ms)
    return [("transfer", f"chunk {1 - me}", 0.0, 0.006), ("compute", f"chunk {me}", 0.0, 0.004),
            ("compute", f"chunk {1 - me}", 0.006, 0.010), ("compute", f"chunk {1 - me}", 0.015, 0.019),
            ("transfer", f"sum {me}", 0.020, 0.026), ("compute", f"chunk {me}", 0.020, 0.024)]


def test_ring_intervals_cuts_each_rank_into_its_rings():
    rings = ring_intervals([_rank(0), _rank(1)], 2)
    assert [len(r) for r in rings] == [2, 2]
    assert [iv[0] for iv in rings[0][0]] == ["transfer", "compute", "compute"]
    assert [iv[2] for iv in rings[1][1]] == [0.015, 0.020, 0.020]


def test_ring_intervals_refuses_counts_that_are_not_whole_rings():
    with pytest.raises(ValueError, match="not whole rings"):
        ring_intervals([_rank(0)[:-1]], 2)


def test_ring_shares_are_the_shaded_lengths():
    (share, _) = ring_shares([_rank(0), _rank(1)], 2)
    # transfers 6 + 6 ms; under a matmul 4 (gather) + 4 (scatter); waiting 2 (gather 4-6) + 1 (19-20) + 2 (24-26)
    assert share["transfer"] == pytest.approx(0.012)
    assert share["under a matmul"] == pytest.approx(0.008)
    assert share["waiting"] == pytest.approx(0.005)


def test_posting_is_the_stretch_from_a_transfer_start_to_the_first_matmul_under_it():
    # a scatter ring as ring_reduce_scatter runs it: a matmul 0-4 ms, ring_shift posted at 4 and returning at 7,
    # the second matmul 7-9 under the transfer, wait() until 12
    ring = [("compute", "chunk 1", 0.0, 0.004), ("transfer", "sum 0", 0.004, 0.012),
            ("compute", "chunk 0", 0.007, 0.009)]
    (share,) = ring_shares([ring], 2)
    assert share["posting"] == pytest.approx(0.003) and share["waiting"] == pytest.approx(0.003)
    assert share["under a matmul"] == pytest.approx(0.002) and share["transfer"] == pytest.approx(0.008)
    fig = viz.draw_ring_timelines([ring], [("layers.0.attention.wo", "forward", "matmul_reduce_scatter")], ring_size=2)
    spans = lambda gid: sorted((round(p.get_x(), 6), round(p.get_width(), 6)) for p in fig.axes[0].patches  # noqa: E731
                               if p.get_gid() == gid)
    assert spans("post") == [(4, 3)] and spans("wait") == [(9, 3)]
    assert [t.get_text() for t in fig.legends[0].get_texts()][3].startswith("posting")


def test_ring_shares_split_wall_time_from_cpu_time_where_the_intervals_carry_it():
    # the scatter ring above with the thread's CPU times: the posting stretch (4-7 ms) ran 0.5 ms on the CPU, the
    # matmuls 4 of their 4 ms and 1 of their 2 ms (descheduled for 1 ms inside the second)
    ring = [("compute", "chunk 1", 0.0, 0.004, 0.0, 0.004), ("transfer", "sum 0", 0.004, 0.012, 0.004, 0.0055),
            ("compute", "chunk 0", 0.007, 0.009, 0.0045, 0.0055)]
    (share,) = ring_shares([ring], 2)
    assert share["posting"] == pytest.approx(0.003) and share["posting on the CPU"] == pytest.approx(0.0005)
    assert share["compute"] == pytest.approx(0.006) and share["compute on the CPU"] == pytest.approx(0.005)
    (plain,) = ring_shares([[iv[:4] for iv in ring]], 2)  # no CPU times: the wall-time shares only
    assert "compute on the CPU" not in plain and plain["posting"] == share["posting"]

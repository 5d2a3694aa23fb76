"""DTensor API, placements and CommDebugMode."""

import pytest
import torch

import rank_dtensor
from checks import clean
from tensorplay_edu import CommDebugMode, Partial, Replicate, Shard, launch
from tensorplay_edu.debug import backward_scope, module_scope, record
from tensorplay_edu.placement import chunk_offset, chunk_sizes
from tensorplay_edu.transition import TABLE


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_dtensor_api_against_single_process(world_size):
    results = launch(rank_dtensor.dtensor_api, world_size)
    clean(results, at_least=104)
    assert all(n == 104 for _, n in results)  # exactly: no check skipped, none added unnoticed


def test_comm_records_carry_when_each_rank_issued_and_left_the_collective():
    """No rank leaves an all-reduce before the last one has entered it: the clock in CommRecord sees the
    late rank's delay as the others' waiting (07b splits a step's collectives this way). No duration is
    asserted: only the order that a blocking collective guarantees on one machine's clock."""
    (a,), (b,) = launch(rank_dtensor.clocked_all_reduce, 2)
    assert a[0] == b[0] == "all_reduce"
    assert a[1] <= a[2] and b[1] <= b[2] and max(a[1], b[1]) <= min(a[2], b[2]), (a, b)


@pytest.mark.parametrize("n,t", [(10, 4), (7, 4), (2, 4), (0, 3), (12, 3), (5, 1), (1, 2)])
def test_chunk_sizes_follow_torch_chunk(n, t):
    pieces = torch.chunk(torch.arange(n), t) if n else ()
    want = [len(p) for p in pieces] + [0] * (t - len(pieces))
    assert chunk_sizes(n, t) == want
    starts = [int(p[0]) for p in pieces if len(p)]
    assert [chunk_offset(n, t, r) for r in range(len(starts))] == starts


def test_documented_uneven_sizes():
    assert chunk_sizes(10, 4) == [3, 3, 3, 1]
    assert chunk_sizes(7, 4) == [2, 2, 2, 1]
    assert chunk_sizes(2, 4) == [1, 1, 0, 0]


def test_placements_equality_repr_and_normalisation():
    assert Shard(1) == Shard(1) and Shard(1) != Shard(0) and Shard(-1) != Shard(2)
    assert Shard(-1).normalized(3) == Shard(2)
    assert Replicate() == Replicate() and Partial() == Partial("sum") and Partial("max") != Partial()
    assert {Shard(0), Shard(0), Replicate(), Replicate()} == {Shard(0), Replicate()}
    assert repr(Shard(-1)) == "Shard(dim=-1)" and repr(Replicate()) == "Replicate()" and repr(Partial()) == "Partial(sum)"
    assert Shard(0).is_shard() and Shard(0).is_shard(0) and not Shard(0).is_shard(1)
    assert Replicate().is_replicate() and Partial().is_partial()
    with pytest.raises(ValueError, match="Shard\\(3\\)"):
        Shard(3).normalized(2)
    with pytest.raises(ValueError, match="reduce_op"):
        Partial("mean")
    with pytest.raises(TypeError):
        Shard(0.5)


def test_table_names_the_six_moves():
    assert TABLE[("Shard", "Replicate")] == "all_gather"
    assert TABLE[("Partial", "Replicate")] == "all_reduce"
    assert TABLE[("Partial", "Shard")] == "reduce_scatter"
    assert TABLE[("Shard", "Shard")] == "all_to_all"
    assert "chunk" in TABLE[("Replicate", "Shard")]
    assert "zero" in TABLE[("Replicate", "Partial")]


def test_comm_debug_mode_counts_bytes_modules_and_table():
    with CommDebugMode() as outer:
        with module_scope("layers.0.attention"):
            record("all_gather", (8, 4), torch.float32, 4, 96)
            with backward_scope("layers.0.attention"):
                record("reduce_scatter", (8, 4), torch.float32, 4, 96)
        with CommDebugMode() as inner:
            record("all_reduce", (3,), torch.float64, 2, 24)
    record("all_reduce", (3,), torch.float64, 2, 24)  # outside: recorded nowhere
    assert outer.get_comm_counts() == {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 1}
    assert outer.get_comm_counts("forward") == {"all_gather": 1, "all_reduce": 1}
    assert outer.get_comm_counts("backward") == {"reduce_scatter": 1}
    assert outer.get_total_counts() == 3 and inner.get_total_counts() == 1
    assert outer.get_comm_bytes() == {"all_gather": 96, "reduce_scatter": 96, "all_reduce": 24}
    assert outer.get_total_bytes("backward") == 96
    assert outer.get_comm_module_counts() == {
        "layers.0.attention": {"forward": {"all_gather": 1}, "backward": {"reduce_scatter": 1}},
        "": {"forward": {"all_reduce": 1}, "backward": {}},
    }
    rec = outer.records[0]
    assert (rec.op, rec.phase, rec.shape, rec.dtype, rec.group_size, rec.module) == (
        "all_gather", "forward", (8, 4), "float32", 4, "layers.0.attention")
    table = outer.table()
    assert "layers.0.attention" in table and "reduce_scatter" in table and "8x4" in table
    assert table.splitlines()[-1].split()[:2] == ["total", "3"] and "216" in table.splitlines()[-1]
    assert str(outer) == table
    with pytest.raises(ValueError, match="phase"):
        outer.get_comm_counts("sideways")

"""The transition table, forward and backward, against single-process math.

One launch per world size runs every check (a launch is the cost); each rank returns
its failures and how many checks it made.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rank_transitions
from checks import clean
from tensorplay_edu import Partial, Replicate, Shard, launch


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_transition_forward_backward_counts_and_bytes(world_size):
    # 6 shapes (even, uneven, empty ranks, 3-D, 1-D, empty) x all placement pairs x 2 dtypes x grad kinds
    clean(launch(rank_transitions.exhaustive_transitions, world_size), at_least=424)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_three_partial_readers_cost_one_reduce_scatter(world_size):
    for res in launch(rank_transitions.three_consumers, world_size):
        assert res == {"forward": {"all_gather": 1}, "backward": {"reduce_scatter": 1}, "grad_ok": True}


def test_three_partial_readers_single_rank_moves_nothing():
    assert launch(rank_transitions.three_consumers, 1) == [{"forward": {}, "backward": {}, "grad_ok": True}]


def test_two_d_mesh_moves_and_submeshes():
    clean(launch(rank_transitions.two_d_mesh, 4), at_least=29)


@st.composite
def case(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    placements = st.sampled_from([Shard(d) for d in range(-ndim, ndim)] + [Replicate(), Partial()])
    src, dst = draw(placements), draw(placements)
    partial_grad = draw(st.booleans()) if not isinstance(dst, Shard) else False
    return shape, src, dst, draw(st.sampled_from(["float32", "float64"])), partial_grad


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(world_size=st.integers(1, 4), cases=st.lists(case(), min_size=10, max_size=10))
def test_random_shapes_and_placements(world_size, cases):
    clean(launch(rank_transitions.listed_transitions, world_size, cases), at_least=10)


def _collectives_under_grad_mode():
    import torch
    import torch.distributed as dist

    from tensorplay_edu import collectives as C

    t, r = dist.get_world_size(), dist.get_rank()
    x = torch.arange(6.0).reshape(2, 3).requires_grad_(True) * (r + 1)  # [2, 3], in the graph
    gathered = C.all_gather(x, 0, [2] * t, dist.group.WORLD)  # [2t, 3]
    summed = C.all_reduce(x, dist.ReduceOp.SUM, dist.group.WORLD)
    want = torch.arange(6.0).reshape(2, 3)
    return (gathered.requires_grad, summed.requires_grad, torch.is_grad_enabled(),
            torch.equal(gathered, torch.cat([want * (k + 1) for k in range(t)])),
            torch.equal(summed, want * sum(range(1, t + 1))))


@pytest.mark.parametrize("world_size", [2, 3])
def test_collectives_called_with_grad_on_stay_outside_autograd(world_size):
    """Called outside an autograd Function (grad mode on, an input in the graph), a collective still runs
    under no_grad: a result with no graph (the table's Function supplies the gradient), grad mode restored."""
    assert launch(_collectives_under_grad_mode, world_size) == [(False, False, True, True, True)] * world_size

"""loss_parallel on 2-D meshes (DP x TP, TP x DP, replicated x TP, CP x TP) against one process.

The behaviours of PyTorch 2.13's multi-dim loss_parallel tests, plus "mean" with the global
denominator (PyTorch refuses it), collectives per group, nesting, and 1-D left as it was.
"""

import pytest

import rank_loss_parallel
from checks import clean
from tensorplay_edu import launch


@pytest.mark.parametrize("names", list(rank_loss_parallel.LAYOUTS), ids="-".join)
def test_cross_entropy_float64(names):
    cases = 24 * len(rank_loss_parallel.SHAPES[names])
    clean(launch(rank_loss_parallel.multi_dim_cross_entropy, 4, names, "float64"), at_least=6 * cases)
    clean(launch(rank_loss_parallel.none_through_full_tensor, 4, names), at_least=3)


@pytest.mark.parametrize("names", list(rank_loss_parallel.LAYOUTS), ids="-".join)
def test_cross_entropy_float32(names):
    clean(launch(rank_loss_parallel.multi_dim_cross_entropy, 4, names, "float32"), at_least=6 * 12 * 2)


def test_mean_uses_the_global_denominator():
    clean(launch(rank_loss_parallel.global_mean_denominator, 4), at_least=2)


@pytest.mark.parametrize("shape", [(1, 4), (4, 1)])
def test_one_rank_mesh_dims_issue_nothing(shape):
    clean(launch(rank_loss_parallel.degenerate_meshes, 4, shape, ("dp", "tp")), at_least=2)


def test_log_softmax_nll_loss_and_module():
    clean(launch(rank_loss_parallel.multi_dim_log_softmax_paths, 4), at_least=12)


def test_errors():
    clean(launch(rank_loss_parallel.multi_dim_errors, 4), at_least=8)


@pytest.mark.parametrize("world_size", [1, 2])
def test_nested_contexts(world_size):
    clean(launch(rank_loss_parallel.nested_contexts, world_size), at_least=4)


@pytest.mark.parametrize("world_size", [2, 4])
def test_one_dim_unchanged(world_size):
    clean(launch(rank_loss_parallel.one_dim_unchanged, world_size), at_least=12)

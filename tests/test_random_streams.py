"""Random streams by region, at 2-4 ranks: dropout on sharded activations (after a Colwise
Linear, scaled_dot_product_attention's dropout_p on this rank's heads, F.dropout inside a
SequenceParallel module, the residual dropout after a sequence-sharded Rowwise output) draws a
mask of its own on each rank; on replicated activations the same mask everywhere.  Masks are
independent between ranks, change every step, repeat under the same seed, are recomputed
identically by activation checkpointing, and eval mode draws nothing.

On main before issue 17 every sharded region but a SequenceParallel module holding an
nn.Dropout drew the same mask on every rank (the "ranks draw their own masks" checks)."""

import pytest

import rank_streams
from tensorplay_edu import launch


def _clean(results, at_least):
    fails = sorted({f for rank_fails, _ in results for f in rank_fails})
    assert not fails, "\n".join(fails[:30])
    assert min(n for _, n in results) >= at_least, [n for _, n in results]


@pytest.mark.parametrize("sp", [False, True], ids=["replicated-io", "sequence-parallel"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_dropout_masks_follow_the_layout(world_size, sp):
    _clean(launch(rank_streams.regions, world_size, sp), at_least=22)


@pytest.mark.parametrize("world_size", [2, 3])
def test_functional_dropout_in_a_sequence_parallel_module(world_size):
    _clean(launch(rank_streams.sequence_parallel_functional, world_size), at_least=2)


@pytest.mark.parametrize("sp", [False, True], ids=["replicated-io", "sequence-parallel"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_checkpointing_recomputes_the_same_masks(world_size, sp):
    _clean(launch(rank_streams.checkpointed, world_size, sp), at_least=2)


def test_training_with_dropout_is_reproducible_run_to_run():
    first, second = launch(rank_streams.reproducible_training, 2), launch(rank_streams.reproducible_training, 2)
    assert first == second
    assert first[0] == first[1]  # the loss is replicated: every rank computed the same number

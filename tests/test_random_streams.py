"""Random streams by region, at 2-4 ranks: dropout on sharded activations (after a Colwise
Linear, scaled_dot_product_attention's dropout_p on this rank's heads, F.dropout inside a
SequenceParallel module, the residual dropout after a sequence-sharded Rowwise output) draws a
mask of its own on each rank; on replicated activations the same mask everywhere.  Masks are
independent between ranks, change every step, repeat under the same seed, are recomputed
identically by activation checkpointing, and eval mode draws nothing.

On main before issue 17 every sharded region but a SequenceParallel module holding an
nn.Dropout drew the same mask on every rank (the "ranks draw their own masks" checks)."""

import hashlib

import pytest
import torch

import rank_streams
from checks import clean
from tensorplay_edu import launch
from tensorplay_edu.parallel import rng


@pytest.mark.parametrize("sp", [False, True], ids=["replicated-io", "sequence-parallel"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_dropout_masks_follow_the_layout(world_size, sp):
    clean(launch(rank_streams.regions, world_size, sp), at_least=22)


@pytest.mark.parametrize("world_size", [2, 3])
def test_functional_dropout_in_a_sequence_parallel_module(world_size):
    clean(launch(rank_streams.sequence_parallel_functional, world_size), at_least=2)


@pytest.mark.parametrize("sp", [False, True], ids=["replicated-io", "sequence-parallel"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_checkpointing_recomputes_the_same_masks(world_size, sp):
    clean(launch(rank_streams.checkpointed, world_size, sp), at_least=2)


def test_training_with_dropout_is_reproducible_run_to_run():
    first, second = launch(rank_streams.reproducible_training, 2), launch(rank_streams.reproducible_training, 2)
    assert first == second
    assert first[0] == first[1]  # the loss is replicated: every rank computed the same number


def _regions(start_seed: int, rank: int, regions: int) -> tuple[list[int], list[int]]:
    """``regions`` sharded regions in a row on one rank's generator, nothing drawn between them: the
    32 bits mt19937 reads of this rank's stream in each region, and of the shared stream after each."""
    gen = torch.Generator().manual_seed(start_seed)
    mine, shared = [], []
    for _ in range(regions):
        rng.to_rank_stream(gen, rank)
        mine.append(gen.initial_seed() % 2**32)
        rng.to_shared_stream(gen)
        shared.append(gen.initial_seed())
    return mine, shared


def test_no_stream_comes_back_for_many_regions():
    """4 ranks, 20,000 regions from seed 0: every rank agrees on the shared stream, and no stream, a rank's
    or the shared one, is seeded twice.  The state hash this module used before came back to an earlier
    number after 14,404 regions from seed 0 (a random map of 2^32 numbers), and its masks repeated after."""
    runs = [_regions(0, rank, 20_000) for rank in range(4)]
    assert all(shared == runs[0][1] for _, shared in runs)  # the same on every rank
    seeds = [s for mine, _ in runs for s in mine] + runs[0][1]
    assert len(set(seeds)) == len(seeds) == 5 * 20_000

    def state_hash(gen):  # the old _draw on the CPU: blake2b of mt19937's state
        return int.from_bytes(hashlib.blake2b(gen.get_state().numpy(), digest_size=4).digest(), "little")

    gen, s, seen = torch.Generator(), 0, {}
    while s not in seen:
        seen[s] = len(seen)
        s = state_hash(gen.manual_seed(s))
    assert len(seen) == 14_404


def test_the_first_stream_used_twice_is_millions_of_regions_away():
    """Rank r of region k and rank r' of region k + m share a stream when m STEP = (r - r') MIX (mod 2^32),
    the shared stream (r = -1) included: the smallest such m for each number of ranks, as rng's docstring
    gives them."""
    def first_reuse(ranks):
        inverse = pow(rng._STEP, -1, 2**32)
        return min(min(d * rng._MIX * inverse % 2**32, -d * rng._MIX * inverse % 2**32) for d in range(1, ranks + 1))

    assert rng._STEP % 2 and rng._MIX % 2  # odd: s + k STEP meets every 32-bit number once in 2^32 regions
    assert [round(first_reuse(t) / 1e6, 1) for t in (1024, 64, 8)] == [1.9, 39.8, 154.2]
    assert "1.9 million regions at 1024 ranks, 40 million at 64, 154 million at 8" in " ".join(rng.__doc__.split())


@pytest.mark.parametrize("requires_grad", [False, True], ids=["plain-input", "input-needs-grad"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_replicated_tensor_dropped_inside_a_sharded_region_draws_one_mask(world_size, requires_grad):
    """Before issue 29 the per-rank stream ran from the Colwise output hook to the Rowwise input hook, so
    `skip = drop(x); return down(h) + skip` gave the ranks different "replicated" outputs (6.66 apart)."""
    clean(launch(rank_streams.replicated_dropout_inside_a_region, world_size, requires_grad, timeout=60),
           at_least=2 * 4)

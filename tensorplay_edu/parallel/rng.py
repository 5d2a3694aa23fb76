"""Random numbers in tensor-parallel regions: dropout masks per rank or shared.

Two kinds of regions need two kinds of masks:

* **replicated** activations (the residual stream of the vanilla plan, anything after an
  all-reduce) are the same tensor on every rank; their dropout mask must be the *same* on
  every rank, or the replicas drift apart.  That is the default generator, as long as
  every rank seeds it alike (``torch.manual_seed(s)`` everywhere) and draws from it alike.
* **sequence-parallel** activations are different tokens on each rank; a shared mask would
  drop the same positions of rank 0's tokens and rank 1's tokens, correlating them.  Each
  rank needs its *own* mask.

Megatron-LM keeps a second, per-rank generator for such regions (its "model-parallel RNG
tracker") and saves and restores its state around activation checkpointing.  Here a region
gets a per-rank stream *derived* from the shared one: the region draws one number from the
default generator (every rank draws the same, so replicated regions stay in step), seeds a
forked generator with that number and the rank, runs, and puts the default generator back.
Nothing lives between calls, so ``torch.utils.checkpoint`` (which restores the default
generator before recomputing) recomputes exactly the same masks.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["per_rank_rng"]

_GOLDEN = 0x9E3779B97F4A7C15  # spreads (seed, rank) pairs apart; any odd 64-bit constant works


@contextlib.contextmanager
def per_rank_rng(rank: int, device: torch.device):
    """Inside: the default generator of ``device`` gives this rank its own stream."""
    shared = int(torch.randint(0, 2**62, (), generator=torch.default_generator))  # same on every rank
    mine = (shared + (rank + 1) * _GOLDEN) % 2**63
    on_gpu = device.type == "cuda"
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if on_gpu else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):  # the CPU state is always kept
        if on_gpu:
            torch.cuda.manual_seed(mine)
        else:
            torch.default_generator.manual_seed(mine)
        yield

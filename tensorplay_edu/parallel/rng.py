"""Random numbers follow the layout: a stream of its own per rank where activations are
sharded, one shared stream where they are replicated.

A dropout mask must match what it masks:

* **replicated** activations (the residual stream of the vanilla plan, anything after an
  all-reduce) are the same tensor on every rank, so their mask must be the *same* on every
  rank, or the replicas drift apart;
* **sharded** activations (this rank's heads or hidden units after a Colwise Linear, this
  rank's tokens under sequence parallelism) are different numbers on each rank; one mask
  shared by all ranks would drop the same positions of every shard, correlating heads,
  hidden units or tokens that the single-device model masks independently.  Each rank
  needs its *own* mask.

Megatron-LM keeps a second generator for the sharded regions (``get_cuda_rng_tracker()``,
seeded ``seed + 2718 + tp_rank``) and its model code forks into it by hand around
attention dropout and, with sequence parallelism, around each whole block.  PyTorch's
DTensor decides per random op from the DTensor's placements (an offset-based tracker,
CUDA only).  Here the styles decide at the only places where a layout is known, their
hooks: every hook that hands a local tensor to the module's own code moves the default
generator of that tensor's device to the stream its layout needs:

==============================================  ============================================
hook (training mode)                            stream afterwards
==============================================  ============================================
ColwiseParallel / RowwiseParallel output        this rank's if ``Shard``, shared if Replicate
SequenceParallel input (and so its output)      this rank's
PrepareModuleInput / PrepareModuleOutput        this rank's if every converted tensor is
                                                ``Shard``, shared otherwise
a module given to ``parallelize_module``        shared (outside your parallelized modules
returns                                         the stream is always the shared one)
==============================================  ============================================

So ``nn.Dropout``, ``F.dropout`` and ``F.scaled_dot_product_attention(dropout_p=...)``
between a Colwise and a Rowwise Linear draw per-rank masks, and a dropout after the Rowwise
(replicated output) draws the shared mask, with no change to the model's code.

The switch: **shared -> this rank's**: the region's number ``s`` is the shared stream's seed
one ``STEP`` further, ``s = seed + STEP`` (mod 2^32), the same on every rank; seed this rank's
stream with ``s + (rank + 1) * MIX``.  **This rank's -> shared**: seed the shared stream
with ``s`` (the "rank -1" stream), so the next region counts on from it.  STEP is odd, so
the regions' numbers run through all 2^32 values before one comes back, and a stream of one
(region, rank) is not drawn again by another for millions of regions (the first reuse: after
1.9 million regions at 1024 ranks, 40 million at 64, 154 million at 8).  (A hash of the
generator's state, this module's first choice, is a random map of 2^32 numbers: from seed 0,
with nothing else drawn, it came back to a number it had given after 14,404 regions, and
from then on the masks repeated; a 32-layer Llama under the full plan opens 65 regions a
forward.)  Which stream runs, and its ``s``, are read from the generator's own seed (a
per-rank seed carries a tag in its top 16 bits): nothing is kept between hooks.
``torch.utils.checkpoint`` saves and restores generator states, seeds included, so a
recomputed block replays the same switches and the same masks.

Consequences, by design: masks change from step to step (each region counts a new ``s``);
a fixed ``torch.manual_seed`` on every rank reproduces a run exactly; the masks of the ranks
together are a mask of the single-device model (independent Bernoulli draws), not the one
one process would draw with the same seed; a training forward moves the shared stream
(one reseed per sharded region), the same way on every rank.  Eval mode draws
nothing.  A hook that switches streams is a graph break under ``torch.compile`` (seeding a
generator cannot be traced), so a compiled training step runs in a few more graphs.
"""

from __future__ import annotations

import torch

__all__ = ["follow_layout", "to_rank_stream", "to_shared_stream", "on_rank_stream", "reset_streams_hook"]

_TAG = 0x7E5D  # top 16 bits of a per-rank seed ("tensor-parallel stream")
_MIX = 0x9E3779B9  # odd 32-bit constant: rank r's stream is s + (r + 1) * _MIX, the shared one s
_STEP = 0x85EBCA6B  # odd: s, s + _STEP, s + 2 _STEP, ... (mod 2^32) meet every 32-bit number once per cycle
_LOW = 2**32  # the CPU generator (mt19937) reads only the low 32 bits of a seed


def _generator(device: torch.device) -> torch.Generator:
    """The default generator that dropout on ``device`` draws from."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


def on_rank_stream(gen: torch.Generator) -> bool:
    return gen.initial_seed() >> 48 == _TAG


def _next_region(gen: torch.Generator) -> int:
    """The next region's number: the shared stream's seed one step on (a 64-bit seed folded to
    32 bits first), the same on every rank.  Read on the host, no tensor op (nothing a host-sync
    check would see)."""
    seed = gen.initial_seed()
    return ((seed ^ seed >> 32) + _STEP) % _LOW


def to_rank_stream(gen: torch.Generator, rank: int) -> None:
    """Shared -> this rank's stream (nothing if already there)."""
    if not on_rank_stream(gen):
        s = _next_region(gen)
        gen.manual_seed(_TAG << 48 | rank << 32 | (s + (rank + 1) * _MIX) % _LOW)


def to_shared_stream(gen: torch.Generator) -> None:
    """This rank's stream -> a shared one (nothing if already shared)."""
    seed = gen.initial_seed()
    if seed >> 48 == _TAG:
        rank = (seed >> 32) & 0xFFFF
        gen.manual_seed((seed - (rank + 1) * _MIX) % _LOW)  # s: the region's number, the same on every rank


def follow_layout(sharded: bool, module: torch.nn.Module, mesh, tensor) -> None:
    """Called by the styles' hooks: the stream ``tensor``'s layout needs, in training mode.
    Every hook calls it, so the usual case (already on that stream) is one read of the seed."""
    if not module.training:
        return
    device = getattr(tensor, "device", None)
    if not isinstance(device, torch.device):
        return
    gen = _generator(device)
    if sharded and mesh.size() > 1:
        if not on_rank_stream(gen):  # else nothing to do: not even this rank's index to look up
            to_rank_stream(gen, mesh.get_local_rank())
    else:
        to_shared_stream(gen)


def reset_streams_hook(module: torch.nn.Module, inputs, output) -> None:
    """A forward hook on each module given to ``parallelize_module``: back to the shared stream
    when it returns (the CPU generator, and the current GPU's if CUDA is in use)."""
    if module.training:
        to_shared_stream(torch.default_generator)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            to_shared_stream(_generator(torch.device("cuda")))

"""Random numbers follow the tensor's layout: a stream of its own per rank for a sharded tensor,
one shared stream for a replicated one.

A dropout mask must match what it masks.  A **replicated** tensor (the residual stream, anything
after an all-reduce) is the same on every rank, so its mask must be the same on every rank, or the
replicas drift apart.  A **sharded** tensor (this rank's heads after a Colwise Linear, this rank's
tokens under sequence parallelism) holds different elements on each rank, so each rank draws its
own mask.  The styles' hooks know each layout they hand to your code, and leave two traces:

* **a mark** on the tensor's autograd node (``grad_fn.metadata["tp_rank"]``: this rank's TP index
  if sharded, -1 if replicated; ``tensor._tp_rank`` on a leaf; the model's inputs are replicated).
  A random op (``F.dropout`` and its kin, ``F.scaled_dot_product_attention``'s ``dropout_p``,
  wrapped on import) walks its input's graph back to the nearest marks: any sharded one makes it
  draw this rank's stream, else the shared one, wherever the op is written;
* **the default stream**: each hook moves the device's default generator to the stream its layout
  needs, and the model's return moves it back to the shared one.  It serves where no graph is
  recorded (``torch.no_grad()``, ``torch.compile``'s traced code, inputs that need no gradient).

The limit: without a graph only the default stream decides, so a replicated ``drop(x * 2)`` of such
an input, written between a Colwise and a Rowwise Linear, draws this rank's mask (drop it before
the Colwise call instead); for the same reason use ``torch.utils.checkpoint(...,
use_reentrant=False)`` around such code.

Switching streams reseeds the generator: this rank's stream of a region is the shared seed one
step on, mixed with the rank, and the shared stream counts on from the region's seed.  A (region,
rank) stream is first drawn again after 1.9 million regions at 1024 ranks, 40 million at 64, 154
million at 8.  A fixed ``torch.manual_seed`` on every rank reproduces a run, and a non-reentrant
checkpoint redraws the same masks.  The ranks' masks together are a mask of the single-device
model, not the one one process would draw.  Eval mode draws nothing; a compiled step with a switch
runs in a few more graphs (seeding cannot be traced).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

__all__ = ["follow_layout", "to_rank_stream", "to_shared_stream", "on_rank_stream", "reset_streams_hook",
           "mark", "stream_of", "mark_model_inputs"]

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


def follow_layout(sharded: bool, module: torch.nn.Module, mesh, tensor, marks: bool = True) -> None:
    """Called by the styles' hooks, in training mode: mark ``tensor`` and move the default
    stream to the one its layout needs (usually already there: one read of the seed)."""
    if not module.training:
        return
    device = getattr(tensor, "device", None)
    if not isinstance(device, torch.device):
        return
    sharded = sharded and mesh.size() > 1
    if marks:
        mark(tensor, mesh.get_local_rank() if sharded else -1)
    gen = _generator(device)
    if sharded:
        if not on_rank_stream(gen):
            to_rank_stream(gen, mesh.get_local_rank())
    else:
        to_shared_stream(gen)


# ---- the marks, and the random ops that read them ------------------------------------------------

def mark(tensor, rank: int) -> None:
    """Record ``tensor``'s stream: ``rank`` (sharded) or -1 (replicated).  A DTensor: its local tensor."""
    local = getattr(tensor, "_local", tensor)
    if not isinstance(local, torch.Tensor) or torch.compiler.is_compiling():
        return
    if local.grad_fn is not None:
        local.grad_fn.metadata["tp_rank"] = rank
    else:
        local._tp_rank = rank  # a leaf: no node to carry it


def stream_of(tensor: torch.Tensor) -> int | None:
    """The stream ``tensor``'s random op draws from: a rank (sharded), -1 (replicated), or None
    (no mark reached: the default stream).  Walks the autograd graph back to the nearest marks
    and leaves the answer on ``tensor``'s node, so a later walk stops there."""
    node = tensor.grad_fn
    if node is None:
        return getattr(tensor, "_tp_rank", None)
    found, todo, seen = None, [node], set()
    while todo:
        n = todo.pop()
        if n is None or id(n) in seen:  # ids of this walk's nodes, alive while it runs
            continue
        seen.add(id(n))
        rank = n.metadata.get("tp_rank")
        if rank is None:
            leaf = getattr(n, "variable", None)  # AccumulateGrad: a leaf tensor, maybe marked
            rank = getattr(leaf, "_tp_rank", None)
        if rank is not None and rank >= 0:
            found = rank  # sharded anywhere: sharded
            break
        if rank is not None:
            found = -1
        else:
            todo.extend(parent for parent, _ in n.next_functions)
    if found is not None:
        node.metadata["tp_rank"] = found
    return found


def _draws(p_name: str, p_at: int, p_default, training_at: int | None, training_default: bool = True):
    """When a random op draws: its probability argument above 0 (and ``training`` true)."""
    def draws(args, kwargs) -> bool:
        p = kwargs.get(p_name, args[p_at] if len(args) > p_at else p_default)
        training = True if training_at is None else kwargs.get(
            "training", args[training_at] if len(args) > training_at else training_default)
        return bool(training) and p > 0
    return draws


def _following(fn, draws):
    """``fn`` drawing from the stream of its first tensor argument."""
    @functools.wraps(fn)
    def random_op(*args, **kwargs):
        if not draws(args, kwargs) or not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        x = args[0] if args else kwargs.get("input", kwargs.get("query"))
        want = stream_of(x) if isinstance(x, torch.Tensor) else None
        gen = _generator(x.device) if want is not None else None
        if want is None or (want >= 0) == on_rank_stream(gen):
            return fn(*args, **kwargs)  # the default stream is the right one
        if want >= 0:  # a sharded tensor where the hooks left the shared stream
            to_rank_stream(gen, want)
            try:
                return fn(*args, **kwargs)
            finally:
                to_shared_stream(gen)
        rank = (gen.initial_seed() >> 32) & 0xFFFF  # a replicated tensor inside a sharded region
        to_shared_stream(gen)
        try:
            return fn(*args, **kwargs)
        finally:
            to_rank_stream(gen, rank)
    random_op.__tensorplay_guard__ = True
    return random_op


_RANDOM_OPS = {  # name in torch.nn.functional: when it draws
    "dropout": _draws("p", 1, 0.5, 2), "dropout1d": _draws("p", 1, 0.5, 2), "dropout2d": _draws("p", 1, 0.5, 2),
    "dropout3d": _draws("p", 1, 0.5, 2), "alpha_dropout": _draws("p", 1, 0.5, 2, training_default=False),
    "feature_alpha_dropout": _draws("p", 1, 0.5, 2, training_default=False),
    "scaled_dot_product_attention": _draws("dropout_p", 4, 0.0, None),
}


def install_random_ops() -> None:
    """Wrap the random ops of ``torch.nn.functional`` (idempotent; called on import)."""
    for name, draws in _RANDOM_OPS.items():
        fn = getattr(F, name, None)
        if fn is not None and not getattr(fn, "__tensorplay_guard__", False):
            setattr(F, name, _following(fn, draws))


def mark_model_inputs(module: torch.nn.Module, args, kwargs):
    """A forward pre-hook on each module given to ``parallelize_module``: its tensor inputs are
    replicated (the styles' hooks, which run after it, mark what they shard)."""
    if module.training:
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                mark(value, -1)


def reset_streams_hook(module: torch.nn.Module, inputs, output) -> None:
    """A forward hook on each module given to ``parallelize_module``: back to the shared stream
    when it returns (the CPU generator, and the current GPU's if CUDA is in use)."""
    if module.training:
        to_shared_stream(torch.default_generator)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            to_shared_stream(_generator(torch.device("cuda")))


install_random_ops()

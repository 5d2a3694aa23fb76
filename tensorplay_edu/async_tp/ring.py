"""Async tensor parallelism: an all-gather and its matmuls, or a matmul and its
reduce-scatter, decomposed into one ring step per rank so that each transfer overlaps a
matmul (Wang et al., ASPLOS 2023; the "collective matmul" of the JAX scaling book).

**All-gather -> matmul** (a sequence-sharded block input read by wq/wk/wv; the output
layer's input).  Rank r starts with its chunk of the sequence.  At each of t steps it
sends the chunk in hand to rank r+1, and *while it travels* multiplies the chunk by every
reader's weight, writing those rows of each output; then it takes the chunk that arrived
from rank r-1.  After t steps every rank has seen every chunk: the same outputs as
all-gather then matmul, the same bytes sent ((t-1) chunks per rank), and all but one matmul
overlap a transfer.  One ring per block input, shared by all its readers.

**Matmul -> reduce-scatter** (wo, w2 under sequence parallelism).  The partial sum
destined for chunk d starts at rank d+1, which computes its part; each rank adds its own
part and passes it on; after t-1 steps it arrives, complete, at rank d.  While an
accumulator travels, the rank computes its part of the next one.

**Backward.**  The gradient of all-gather -> matmuls is matmuls -> reduce-scatter (the
readers' input gradients summed, chunk by chunk, along the ring) and a local weight
gradient; the gradient of matmul -> reduce-scatter is all-gather -> matmuls (the output
gradient's chunks travel; each gives rows of the input gradient and a term of the weight
gradient).  PyTorch's compiler pass fuses less there: it skips a reduce-scatter fed by
several matmuls (wq + wk + wv) unless the projections are one matmul, and never fuses the
weight-gradient matmul; here both rings do all of it.

Numbers: the gathered outputs are computed row block by row block (the same products; a
BLAS may block a smaller matmul differently, so equal to about 1 ulp), and the ring adds the
ranks' partial sums in its own order (a summation-order difference from the collective's).

Switch it on as torchtitan does (torchtitan's two lines; only the import changes)::

    torch._inductor.config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)

or explicitly, without touching torch's config: ``with enable_async_tp(mesh): ...``.  The
vanilla plan has no all-gather or reduce-scatter (its collectives are all-reduces), so
nothing changes there, as in PyTorch, whose pass only matches those two patterns.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from .. import collectives as C
from .. import debug
from . import timeline
from ..placement import chunk_offset, chunk_sizes

__all__ = ["enable_symm_mem_for_group", "enable_async_tp", "is_async", "ring_ok", "ring_ok_rows", "RingInput",
           "GatherMatmul",
           "MatmulReduceScatter", "ring_gather", "ring_reduce_scatter", "time_gather_matmul"]

logger = logging.getLogger(__name__)
_GROUPS: set[str] = set()  # what enable_symm_mem_for_group marked (PyTorch keeps such a registry too)
_MESHES: list = []  # the meshes of the active `with enable_async_tp(mesh):` blocks


def enable_symm_mem_for_group(group_name: str) -> None:
    """Mark a TP group for async TP (it runs decomposed while ``torch._inductor.config._micro_pipeline_tp``)."""
    _GROUPS.add(group_name)


@contextlib.contextmanager
def enable_async_tp(mesh):
    """Inside: tensor parallelism on ``mesh`` runs decomposed (torch's config untouched)."""
    _MESHES.append(mesh)
    try:
        yield
    finally:
        _MESHES.remove(mesh)


def is_async(mesh) -> bool:
    """Does TP on this (1-D) mesh run decomposed now?"""
    if mesh.size() == 1:
        return False
    if any(m == mesh for m in _MESHES):
        return True
    config = sys.modules.get("torch._inductor.config")  # set by torchtitan's line; never imported here
    return bool(_GROUPS and config is not None and getattr(config, "_micro_pipeline_tp", False)  # (the config's
                and mesh.get_group().group_name in _GROUPS)  # getattr is slow: skipped while no group is marked)


# ---- where a ring is right ---------------------------------------------------------------

def ring_refusal(dim: int, ndim: int, sizes: list[int], readers=()) -> str | None:
    """Why a ring must not replace this all-gather (or reduce-scatter) on ``dim``, or None.

    The rings pass whole rows of the sequence (or batch): each chunk is multiplied by the
    weight on its own.  A shard of the last dim is a slice of the features the matmul sums
    over (no chunk can be multiplied alone); a rank holding no rows has nothing to send
    (gloo would wait for it); a reader with a forward of its own (a Float8Linear under the
    high-precision styles, a Linear subclass) would be bypassed by the ring's plain matmul."""
    if dim == ndim - 1:
        return f"the shard is on the last dim (the features the matmul sums over), not on rows"
    if min(sizes) == 0:
        return f"a rank holds no rows ({sizes} over {len(sizes)} ranks)"
    own = [getattr(m, "_tp_fqn", "?") for m in readers if type(m).forward is not torch.nn.Linear.forward]
    if own:  # a Float8Linear under the high-precision styles, a Linear subclass: the ring's matmul would skip it
        return f"{own} run a forward of their own (a Float8Linear, a Linear subclass)"
    return None


def ring_ok(x, readers, mesh) -> bool:
    """Async TP on, and a ring right for this sharded input (a DTensor) and its readers? A
    refused ring is logged (logger ``tensorplay_edu.async_tp``) and the caller gathers."""
    if not is_async(mesh):
        return False
    dim = x.placements[0].dim
    reason = ring_refusal(dim, x.ndim, chunk_sizes(x.shape[dim], mesh.size()), readers)
    if reason:
        logger.info("async TP: %s runs the synchronous all-gather: %s", debug.current_module() or "a module", reason)
    return reason is None


def ring_ok_rows(dim: int, shape, mesh, owner: str, module=None) -> bool:
    """The same for ``module``'s matmul -> reduce-scatter of an output of ``shape`` onto ``dim``."""
    if not is_async(mesh):
        return False
    reason = ring_refusal(dim, len(shape), chunk_sizes(shape[dim], mesh.size()), [module] if module else ())
    if reason:
        logger.info("async TP: %s runs the synchronous reduce-scatter: %s", owner or "a module", reason)
    return reason is None


# ---- the two rings ----------------------------------------------------------------------

def ring_gather(shard: torch.Tensor, dim: int, sizes: list[int], mesh, consume) -> int:
    """Every chunk of the sequence passes through this rank, one per step: ``consume(c, chunk)``
    runs while the next chunk travels.  Returns the bytes this rank sent."""
    group, t, r = mesh.get_group(), mesh.size(), mesh.get_local_rank()
    chunk, c, sent = shard, r, 0
    for step in range(t):
        if step < t - 1:  # pass the chunk in hand on, take the one from rank r-1
            incoming = (c - 1) % t
            shape = list(shard.shape)
            shape[dim] = sizes[incoming]
            handle, started = C.ring_shift(chunk, shape, r, group), timeline.mark()
            sent += chunk.numel() * chunk.element_size()
        with timeline.interval("compute", f"chunk {c}"):
            consume(c, chunk)
        if step < t - 1:
            chunk, c = handle.wait(), incoming
            timeline.close("transfer", f"chunk {c}", started)
    return sent


def ring_reduce_scatter(produce, shape_of, mesh) -> tuple[torch.Tensor, int]:
    """This rank's chunk of a sum over ranks: ``produce(d)`` is this rank's part of chunk d.
    The accumulator for chunk d starts at rank d+1 and collects every rank's part on its way
    to rank d; the next part is computed while it travels.  Returns (my chunk, bytes sent)."""
    group, t, r = mesh.get_group(), mesh.size(), mesh.get_local_rank()
    d = (r - 1) % t
    with timeline.interval("compute", f"chunk {d}"):
        acc = produce(d)
    sent = 0
    for k in range(1, t):
        d = (r - 1 - k) % t  # the chunk whose accumulator arrives from rank r-1 while ours goes to r+1
        handle = C.ring_shift(acc, shape_of(d), r, group)
        started, sent = timeline.mark(), sent + acc.numel() * acc.element_size()
        with timeline.interval("compute", f"chunk {d}"):
            mine = produce(d)
        arrived = handle.wait()
        timeline.close("transfer", f"sum {d}", started)
        acc = arrived + mine
    return acc, sent


def _rows(x: torch.Tensor, dim: int, sizes: list[int], c: int) -> torch.Tensor:
    """Chunk ``c`` of ``x`` along ``dim`` (torch.chunk sizes)."""
    return x.narrow(dim, chunk_offset(sum(sizes), len(sizes), c), sizes[c])


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


class GatherMatmul(torch.autograd.Function):
    """``all_gather(x, dim) @ W_j^T`` for every reader j, decomposed (forward: ring_gather;
    backward: ring_reduce_scatter of the summed input gradients, local weight gradients)."""

    @staticmethod
    def forward(ctx, x, mesh, dim: int, sizes: list[int], *weights):
        full = list(x.shape)
        full[dim] = sum(sizes)
        gathered = x.new_empty(full)  # kept for the weight gradients, as all-gather -> matmul keeps it
        outs = [x.new_empty(full[:-1] + [w.shape[0]]) for w in weights]  # [.., s, o_j/t]

        def consume(c, chunk):
            _rows(gathered, dim, sizes, c).copy_(chunk)
            for out, w in zip(outs, weights):
                _rows(out, dim, sizes, c).copy_(chunk @ w.t())

        sent = ring_gather(x, dim, sizes, mesh, consume)
        debug.record("all_gather_matmul", full, x.dtype, mesh.size(), sent, mesh.get_group())
        ctx.save_for_backward(gathered, *weights)
        ctx.mesh, ctx.dim, ctx.sizes, ctx.module = mesh, dim, sizes, debug.current_module()
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        gathered, *weights = ctx.saved_tensors
        mesh, dim, sizes = ctx.mesh, ctx.dim, ctx.sizes
        pairs = [(g, w) for g, w in zip(grads, weights) if g is not None]

        def shape_of(d):
            shape = list(gathered.shape)
            shape[dim] = sizes[d]
            return shape

        def produce(d):  # this rank's part of the input gradient's chunk d: sum_j g_j[chunk d] @ W_j
            part = gathered.new_zeros(shape_of(d)) if not pairs else None
            for g, w in pairs:
                term = _rows(g, dim, sizes, d) @ w
                part = term if part is None else part + term
            return part

        with debug.backward_scope(ctx.module):
            grad_x, sent = ring_reduce_scatter(produce, shape_of, mesh)
            debug.record("matmul_reduce_scatter", gathered.shape, gathered.dtype, mesh.size(), sent, mesh.get_group())
        grad_w = [None if g is None else _flat(g).t() @ _flat(gathered) for g in grads]  # local, no comm
        return (grad_x, None, None, None, *grad_w)


class MatmulReduceScatter(torch.autograd.Function):
    """``reduce_scatter(x @ W^T, dim)`` decomposed (forward: ring_reduce_scatter; backward:
    ring_gather of the output gradient, each chunk giving rows of grad x and a term of grad W)."""

    @staticmethod
    def forward(ctx, x, weight, mesh, dim: int):
        sizes = chunk_sizes(x.shape[dim], mesh.size())

        def shape_of(d):
            shape = list(x.shape[:-1]) + [weight.shape[0]]
            shape[dim] = sizes[d]
            return shape

        y, sent = ring_reduce_scatter(lambda d: _rows(x, dim, sizes, d) @ weight.t(), shape_of, mesh)
        debug.record("matmul_reduce_scatter", list(x.shape[:-1]) + [weight.shape[0]], x.dtype, mesh.size(), sent,
                     mesh.get_group())
        ctx.save_for_backward(x, weight)
        ctx.mesh, ctx.dim, ctx.sizes, ctx.module = mesh, dim, sizes, debug.current_module()
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        mesh, dim, sizes = ctx.mesh, ctx.dim, ctx.sizes
        grad_x = torch.empty_like(x)
        grad_w = torch.zeros_like(weight)

        def consume(c, g):  # g: chunk c of the output gradient
            _rows(grad_x, dim, sizes, c).copy_(g @ weight)
            grad_w.add_(_flat(g).t() @ _flat(_rows(x, dim, sizes, c)))

        with debug.backward_scope(ctx.module):
            sent = ring_gather(grad.contiguous(), dim, sizes, mesh, consume)
            full = list(grad.shape)
            full[dim] = sum(sizes)
            debug.record("all_gather_matmul", full, grad.dtype, mesh.size(), sent, mesh.get_group())
        return grad_x, grad_w, None, None


class RingInput:
    """A sequence-sharded module input whose all-gather is decomposed with its readers' matmuls.

    Handed on by PrepareModuleInput (or ColwiseParallel) instead of the gathered tensor; the
    first reader to ask runs :class:`GatherMatmul` for all of them, each gets its output.
    """

    def __init__(self, shard: torch.Tensor, mesh, dim: int, sizes: list[int], readers: list, owner: str):
        self.shard, self.mesh, self.dim, self.sizes, self.readers = shard, mesh, dim, sizes, readers
        self.owner = owner  # the module path its collective is recorded under
        self.outputs: dict[int, torch.Tensor] | None = None  # reader index -> its output, after the ring ran

    @property
    def shape(self) -> torch.Size:
        full = list(self.shard.shape)
        full[self.dim] = sum(self.sizes)
        return torch.Size(full)

    def output_for(self, module) -> torch.Tensor:
        index = next((i for i, m in enumerate(self.readers) if m is module), None)
        if index is None:
            raise RuntimeError(f"async TP: '{getattr(module, '_tp_fqn', type(module).__name__)}' reads a block input "
                               "whose all-gather was fused with its ColwiseParallel readers only; give it "
                               "ColwiseParallel, or turn async TP off")
        if self.outputs is None:
            with debug.module_scope(self.owner):
                self.outputs = dict(enumerate(self._run()))
        out = self.outputs[index]
        return out if module.bias is None else out + module.bias

    def _run(self) -> tuple:
        """Every reader's output, from one ring (float8 readers: Float8RingInput)."""
        return GatherMatmul.apply(self.shard, self.mesh, self.dim, self.sizes, *[m.weight for m in self.readers])


# ---- how much overlapped --------------------------------------------------------------

@torch.no_grad()
def time_gather_matmul(shard: torch.Tensor, weights: list[torch.Tensor], mesh, dim: int = 1, repeats: int = 5) -> dict:
    """This rank's seconds for one all-gather -> matmuls ring: fused, its transfers alone and its
    matmuls alone (medians of ``repeats`` after a warm-up; noisy on a busy machine: use many), the
    ring's ideal and ``timeline.overlap``: how much of the overlap the ring could reach it reached.
    On CUDA the seconds are the compute stream's, between two CUDA events; on the CPU a plain timer's."""
    t = mesh.size()
    sizes = [shard.shape[dim]] * t  # even chunks
    outs = [shard.new_empty(list(shard.shape[:-1]) + [w.shape[0]]) for w in weights]

    def matmuls(c, chunk):
        for out, w in zip(outs, weights):
            out.copy_(chunk @ w.t())

    def run(consume=None, transfer=True):
        dist.barrier(group=mesh.get_group())
        if shard.is_cuda:  # the host only queues kernels: time the GPU's stream between two events instead
            torch.cuda.synchronize()  # nothing queued before the start
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
        else:
            start = time.perf_counter()
        if transfer:  # each chunk's wait() makes the compute stream wait for NCCL's: the end event follows
            ring_gather(shard, dim, sizes, mesh, consume or (lambda c, chunk: None))
        else:
            for c in range(t):
                consume(c, shard)
        if shard.is_cuda:
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000  # ms -> s
        return time.perf_counter() - start

    def median(fn):
        fn()  # warm-up: first connections, first allocations
        return sorted(fn() for _ in range(repeats))[repeats // 2]

    fused, comm = median(lambda: run(matmuls)), median(lambda: run())
    comp = median(lambda: run(matmuls, transfer=False))
    return {"fused": fused, "comm": comm, "comp": comp, "ideal": timeline.ring_ideal(comm, comp, t),
            "overlap": timeline.overlap(fused, comm, comp, t)}

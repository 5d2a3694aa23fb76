"""The rings of async tensor parallelism: an all-gather and its matmuls, or a matmul and its
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

Switched on in switch.py; where a ring is right, and how the styles use it: fusion.py.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import collectives as C
from .. import debug
from ..parallel.style import FusedInput
from ..placement import chunk_offset, chunk_sizes
from . import timeline

__all__ = ["gather_schedule", "ring_gather", "ring_reduce_scatter", "chunk_rows", "all_gather_matmul", "reduce_scatter_ring",
           "matmul_reduce_scatter", "input_grad_ring", "gather_matmul_grads",
           "GatherMatmul", "MatmulReduceScatter", "RingInput"]


# ---- the two rings ----------------------------------------------------------------------
def gather_schedule(t: int, r: int, chunk: torch.Tensor, post, consume) -> None:
    """Rank r's t steps of the all-gather ring, starting with its own chunk: post the chunk in hand
    to rank r+1 (``post(chunk, incoming)`` returns a handle whose ``wait()`` gives chunk ``incoming``
    from rank r-1), ``consume(c, chunk)`` while it travels, then take the one that arrived.
    :func:`ring_gather` posts a ``ring_shift``; ``measure.standin_ring`` a sleeping thread."""
    c = r
    for step in range(t):
        if step < t - 1:  # pass the chunk in hand on, take the one from rank r-1
            incoming = (c - 1) % t
            started = timeline.mark()  # the transfer's clock starts when the send is posted, not after
            handle = post(chunk, incoming)
        with timeline.interval("compute", f"chunk {c}"):
            consume(c, chunk)
        if step < t - 1:
            chunk, c = handle.wait(), incoming
            timeline.close("transfer", f"chunk {c}", started)


def ring_gather(shard: torch.Tensor, dim: int, sizes: list[int], mesh, consume) -> int:
    """Every chunk of the sequence passes through this rank, one per step: ``consume(c, chunk)``
    runs while the next chunk travels.  Returns the bytes this rank sent."""
    group, t, r = mesh.get_group(), mesh.size(), mesh.get_local_rank()
    sent = 0

    def post(chunk, incoming):  # send to rank r+1, receive chunk `incoming` ([b, s_incoming, h]) from r-1
        nonlocal sent
        shape = list(shard.shape)
        shape[dim] = sizes[incoming]
        sent += chunk.numel() * chunk.element_size()
        return C.ring_shift(chunk, shape, r, group)

    gather_schedule(t, r, shard, post, consume)
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
        started = timeline.mark()  # posted from here: a receiver never ends before its sender starts
        handle = C.ring_shift(acc, shape_of(d), r, group)
        sent += acc.numel() * acc.element_size()
        with timeline.interval("compute", f"chunk {d}"):
            mine = produce(d)
        arrived = handle.wait()
        timeline.close("transfer", f"sum {d}", started)
        acc = arrived + mine
    return acc, sent


def chunk_rows(x: torch.Tensor, dim: int, sizes: list[int], c: int) -> torch.Tensor:
    """Chunk ``c`` of ``x`` along ``dim`` (torch.chunk sizes)."""
    return x.narrow(dim, chunk_offset(sum(sizes), len(sizes), c), sizes[c])


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def all_gather_matmul(shard: torch.Tensor, dim: int, sizes: list[int], mesh, matmuls) -> tuple:
    """``all_gather(shard, dim)`` and ``matmul_j(gathered)`` for every j, as one ring; each
    ``matmul_j`` maps rows ``[.., s_c, k]`` to ``[.., s_c, o_j]``.  Returns (gathered, outputs)."""
    full = list(shard.shape)
    full[dim] = sum(sizes)
    gathered = shard.new_empty(full)  # kept for the weight gradients, as all-gather -> matmul keeps it
    outs = [None] * len(matmuls)

    def consume(c, chunk):
        chunk_rows(gathered, dim, sizes, c).copy_(chunk)
        for j, matmul in enumerate(matmuls):
            y = matmul(chunk)  # [.., s_c, o_j/t]
            if outs[j] is None:
                outs[j] = y.new_empty(full[:-1] + [y.shape[-1]])
            chunk_rows(outs[j], dim, sizes, c).copy_(y)

    sent = ring_gather(shard, dim, sizes, mesh, consume)
    debug.record("all_gather_matmul", full, shard.dtype, mesh.size(), sent, mesh.get_group())
    return gathered, outs


def reduce_scatter_ring(part, shape_of, full_shape, mesh) -> torch.Tensor:
    """``reduce_scatter`` of the ranks' products as one ring: ``part(d)`` is this rank's product
    for chunk d, of shape ``shape_of(d)``, computed while the previous sum travels."""
    y, sent = ring_reduce_scatter(part, shape_of, mesh)
    debug.record("matmul_reduce_scatter", list(full_shape), y.dtype, mesh.size(), sent, mesh.get_group())
    return y


def matmul_reduce_scatter(rows_times_w, x: torch.Tensor, dim: int, out_features: int, mesh) -> torch.Tensor:
    """``reduce_scatter(rows_times_w(x), dim)`` as one ring: ``rows_times_w`` maps rows of ``x``
    ``[.., s_c, in/t]`` to this rank's addend ``[.., s_c, out]``."""
    sizes = chunk_sizes(x.shape[dim], mesh.size())
    full = list(x.shape[:-1]) + [out_features]

    def shape_of(d):
        shape = list(full)
        shape[dim] = sizes[d]
        return shape

    return reduce_scatter_ring(lambda d: rows_times_w(chunk_rows(x, dim, sizes, d)), shape_of, full, mesh)


def input_grad_ring(grads, dim: int, sizes: list[int], full_shape, mesh, times_w, zeros) -> torch.Tensor:
    """Backward of :func:`all_gather_matmul`: chunk d of the input gradient is ``sum_j times_w(j, g_j[chunk d])``,
    reduce-scattered along the ring (``zeros(shape)`` when no reader has a gradient)."""
    def shape_of(d):
        shape = list(full_shape)
        shape[dim] = sizes[d]
        return shape

    def part(d):  # this rank's part of the input gradient's chunk d
        terms = [times_w(j, chunk_rows(g, dim, sizes, d)) for j, g in enumerate(grads) if g is not None]
        return sum(terms[1:], terms[0]) if terms else zeros(shape_of(d))

    return reduce_scatter_ring(part, shape_of, full_shape, mesh)


def gather_matmul_grads(grad: torch.Tensor, x: torch.Tensor, dim: int, mesh, grads_of) -> tuple:
    """Backward of :func:`matmul_reduce_scatter`: the output gradient's chunks travel a ring;
    ``grads_of(g_chunk, x_rows)`` gives that chunk's rows of grad x and its term of grad W."""
    sizes = chunk_sizes(x.shape[dim], mesh.size())
    grad_x, grad_w = None, None

    def consume(c, g):
        nonlocal grad_x, grad_w
        gx, gw = grads_of(g, chunk_rows(x, dim, sizes, c))
        if grad_x is None:
            grad_x = gx.new_empty(x.shape)
        chunk_rows(grad_x, dim, sizes, c).copy_(gx)
        grad_w = gw if grad_w is None else grad_w + gw

    sent = ring_gather(grad, dim, sizes, mesh, consume)
    full = list(grad.shape)
    full[dim] = sum(sizes)
    debug.record("all_gather_matmul", full, grad.dtype, mesh.size(), sent, mesh.get_group())
    return grad_x, grad_w


class GatherMatmul(torch.autograd.Function):
    """``all_gather(x, dim) @ W_j^T`` for every reader j, decomposed (forward: the gather ring;
    backward: a reduce-scatter ring of the summed input gradients, local weight gradients)."""

    @staticmethod
    def forward(ctx, x, mesh, dim: int, sizes: list[int], *weights):
        gathered, outs = all_gather_matmul(x, dim, sizes, mesh, [lambda rows, w=w: rows @ w.t() for w in weights])
        ctx.save_for_backward(gathered, *weights)
        ctx.mesh, ctx.dim, ctx.sizes, ctx.module = mesh, dim, sizes, debug.current_module()
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        gathered, *weights = ctx.saved_tensors
        with debug.backward_scope(ctx.module):  # sum_j g_j[chunk d] @ W_j, chunk by chunk
            grad_x = input_grad_ring(grads, ctx.dim, ctx.sizes, gathered.shape, ctx.mesh,
                                     lambda j, rows: rows @ weights[j], gathered.new_zeros)
        grad_w = [None if g is None else _flat(g).t() @ _flat(gathered) for g in grads]  # local, no comm
        return (grad_x, None, None, None, *grad_w)


class MatmulReduceScatter(torch.autograd.Function):
    """``reduce_scatter(x @ W^T, dim)`` decomposed (forward: the reduce-scatter ring; backward:
    a gather ring of the output gradient, each chunk giving rows of grad x and a term of grad W)."""

    @staticmethod
    def forward(ctx, x, weight, mesh, dim: int):
        y = matmul_reduce_scatter(lambda rows: rows @ weight.t(), x, dim, weight.shape[0], mesh)
        ctx.save_for_backward(x, weight)
        ctx.mesh, ctx.dim, ctx.module = mesh, dim, debug.current_module()
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors

        def grads_of(g, rows):  # g: a chunk of the output gradient, rows: the same rows of x
            return g @ weight, _flat(g).t() @ _flat(rows)

        with debug.backward_scope(ctx.module):
            grad_x, grad_w = gather_matmul_grads(grad.contiguous(), x, ctx.dim, ctx.mesh, grads_of)
        return grad_x, grad_w, None, None


class RingInput(FusedInput):
    """A sequence-sharded module input whose all-gather runs as a ring with its readers' matmuls.

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

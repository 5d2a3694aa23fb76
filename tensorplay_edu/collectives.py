"""The six collectives, on any tensor dim, with uneven (``torch.chunk``) shards, and the
ring step that async TP builds its decomposed collectives from.

The transition table (:mod:`tensorplay_edu.transition`) calls them for every layout move;
``distribute_tensor``, ``from_local(run_check=True)`` and the async rings call them directly.
Nothing else in the package communicates.  Each one

* moves the chosen dim to the front, because the flat collectives concatenate on dim 0;
* pads every rank's block to ``ceil(n / t)`` rows, because gloo rejects unequal sizes,
  and trims the padding off the result;
* shows itself to the watchers first (:func:`tensorplay_edu.debug.watch`: what it will put on
  the wire), and records itself in any active :class:`~tensorplay_edu.debug.CommDebugMode` after;
* never writes into its input (autograd may have saved it), and runs under ``no_grad``:
  gradients are the business of the autograd Function that calls it.

A group of one rank, or an empty global tensor, moves nothing and issues nothing
(every rank knows the global shape, so they all skip together).

Float8 tensors (:mod:`tensorplay_edu.float8`) are gathered, not reduced: gloo refuses
their dtypes, so their bytes travel as ``uint8`` (bit-exact both ways) and are recorded as
what they are, float8 at 1 byte per element.  A sum of float8 values is refused.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist

from . import debug
from .mesh import DeviceMesh
from .placement import Replicate, Shard, chunk_sizes, local_shape

# torch 2.13 renamed the flat collectives; older releases only have the old names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _no_grad(fn):
    """``torch.no_grad()`` around ``fn``, entered only when grad mode is on: the table calls these
    from inside an autograd Function, where it is already off (and the context costs microseconds)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        with torch.no_grad():
            return fn(*args, **kwargs)
    return run


def _wire(x: torch.Tensor) -> torch.Tensor:
    """What the backend moves: a float8 tensor's bytes as uint8 (a view, no copy)."""
    return x.view(torch.uint8) if x.dtype in FLOAT8 else x


def _cat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.cat``, float8 through its bytes (CUDA concatenates float8 only from torch 2.6; byte 0 is +0.0)."""
    return torch.cat([_wire(p) for p in parts], dim=dim).view(parts[0].dtype)


def _no_float8_sum(x: torch.Tensor, op: str) -> None:
    if x.dtype in FLOAT8:
        raise TypeError(f"{op} of a {x.dtype} tensor: float8 values are gathered, never summed by a collective "
                        "(reduce in high precision, as torchao does)")


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with zero rows appended along dim 0 up to ``rows``."""
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


def _three_d(x: torch.Tensor, dim: int) -> tuple[int, int, int]:
    """``x`` seen as [before, dim, after]: a view, no copy, whatever the dim."""
    return math.prod(x.shape[:dim]), x.shape[dim], math.prod(x.shape[dim + 1:])


@_no_grad
def all_gather(x: torch.Tensor, dim: int, sizes: list[int], group) -> torch.Tensor:
    """Concatenate every rank's chunk along ``dim``; rank r holds ``sizes[r]`` rows.  # [n/t] -> [n]

    The flat collective stacks the ranks' blocks in front: [t, before, c, after].  Moving
    the rank axis next to ``dim`` is then one copy (none for dim 0): no copy of the input.
    """
    t, c = len(sizes), max(sizes)
    full_shape = [sum(sizes) if i == dim else n for i, n in enumerate(x.shape)]
    if t == 1 or math.prod(full_shape) == 0:
        return x if t == 1 else x.new_zeros(full_shape)
    before, rows, after = _three_d(x, dim)
    block = x.reshape(before, rows, after)  # [before, n/t, after]
    if rows < c:  # uneven: pad this rank's block to c rows (gloo wants equal sizes)
        block = _cat([block, _wire(block).new_zeros(before, c - rows, after)], dim=1)
    even = c * t == sum(sizes)
    # [t*before, c, after]; when before == 1 and no padding that is already the result's memory layout
    out = block.new_empty(full_shape if even and before == 1 else (t * before, c, after))
    issued = debug.watch("all_gather", group, block, out, detail=f"chunks {sizes}", shape=x.shape)
    _all_gather_flat(_wire(out.view(t * before, c, after)), _wire(block.contiguous()), group=group)
    debug.record("all_gather", full_shape, x.dtype, t, (t - 1) * before * c * after * x.element_size(), group, issued)
    if even and before == 1:
        return out
    out = out.view(t, before, c, after)
    if not even:  # drop each block's padding
        return _cat([out[r, :, : sizes[r]] for r in range(t)], dim=1).view(full_shape)  # [before, n, after]
    return out.permute(1, 0, 2, 3).reshape(full_shape)  # one copy, [before, t*c, after]; not a view of a buffer


@_no_grad
def reduce_scatter(x: torch.Tensor, dim: int, sizes: list[int], rank: int, op, group) -> torch.Tensor:
    """Reduce the ranks' full addends and keep chunk ``rank`` along ``dim``.  # [n] -> [n/t]

    The flat collective scatters blocks in front, so rank r's rows are moved there:
    [before, t, c, after] -> [t, before, c, after], one copy (none for dim 0).
    """
    t, c = len(sizes), max(sizes)
    _no_float8_sum(x, "reduce_scatter")
    if t == 1 or x.numel() == 0:
        return x.narrow(dim, 0, sizes[rank])
    before, rows, after = _three_d(x, dim)
    blocks = x.reshape(before, rows, after)  # [before, n, after]
    if rows < t * c:  # uneven: pad to t blocks of c rows
        blocks = torch.cat([blocks, blocks.new_zeros(before, t * c - rows, after)], dim=1)
    send = blocks.view(before, t, c, after).transpose(0, 1).contiguous()  # [t, before, c, after]
    out = send.new_empty((before, c, after))  # [before, c, after]
    issued = debug.watch("reduce_scatter", group, send, out, reduce=op, detail=f"chunks {sizes}", shape=x.shape)
    _reduce_scatter_flat(out.view(before * c, after), send.view(t * before * c, after), op=op, group=group)
    debug.record("reduce_scatter", x.shape, x.dtype, t, (t - 1) * before * c * after * x.element_size(), group, issued)
    local_shape = list(x.shape)
    local_shape[dim] = sizes[rank]
    return out[:, : sizes[rank]].reshape(local_shape)


@_no_grad
def all_reduce(x: torch.Tensor, op, group) -> torch.Tensor:
    """Every rank gets the reduction of all ranks' tensors (into a new tensor)."""
    t = dist.get_world_size(group)
    _no_float8_sum(x, "all_reduce")
    if t == 1 or x.numel() == 0:
        return x
    out = x.contiguous().clone()
    issued = debug.watch("all_reduce", group, out, reduce=op)
    dist.all_reduce(out, op=op, group=group)
    debug.record("all_reduce", x.shape, x.dtype, t, 2 * (t - 1) * -(-x.numel() // t) * x.element_size(), group, issued)
    return out


@_no_grad
def all_to_all(x: torch.Tensor, src_dim: int, dst_dim: int, src_sizes: list[int], dst_sizes: list[int],
               rank: int, group) -> torch.Tensor:
    """Trade a chunk along ``src_dim`` for a chunk along ``dst_dim``.  # [a/t, b] -> [a, b/t]

    Rank r cuts its block into t pieces along ``dst_dim`` and sends piece j to rank j;
    it receives piece r of every rank and stacks them along ``src_dim``.
    """
    t, cs, cd = len(src_sizes), max(src_sizes), max(dst_sizes)
    if t == 1:
        return x
    full_shape = [sum(src_sizes) if i == src_dim else n for i, n in enumerate(x.shape)]
    if math.prod(full_shape) == 0:
        full_shape[dst_dim] = dst_sizes[rank]
        return x.new_zeros(full_shape)
    padded = _pad_rows(x.movedim(src_dim, 0), cs).movedim(0, src_dim)
    padded = _pad_rows(padded.movedim(dst_dim, 0), t * cd).movedim(0, dst_dim)
    send = torch.stack(padded.split(cd, dim=dst_dim)).contiguous()  # [t, ..cs.., ..cd..]
    recv = torch.empty_like(send)
    issued = debug.watch("all_to_all", group, send, recv, detail=f"chunks {src_sizes} -> {dst_sizes}", shape=x.shape)
    dist.all_to_all_single(recv, send, group=group)
    pieces = [recv[i].narrow(src_dim, 0, src_sizes[i]) for i in range(t)]
    out = torch.cat(pieces, dim=src_dim).narrow(dst_dim, 0, dst_sizes[rank]).contiguous()
    debug.record("all_to_all", x.shape, x.dtype, t, (t - 1) * send[0].numel() * send.element_size(), group, issued)
    return out


class RingStep:
    """One step of a ring in flight: ``wait()`` returns what arrived from the previous rank."""

    def __init__(self, works, sending: torch.Tensor, arriving: torch.Tensor):
        self.works, self.sending, self.arriving = works, sending, arriving  # keep both alive until done

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        return self.arriving


@_no_grad
def ring_shift(x: torch.Tensor, recv_shape, rank: int, group) -> RingStep:
    """Send ``x`` to the next rank of the group's ring and receive a ``recv_shape`` tensor from
    the previous one, without waiting: the caller computes meanwhile (the decomposed collectives
    of :mod:`tensorplay_edu.async_tp`, which record the op they replace)."""
    t = dist.get_world_size(group)
    after, before = dist.get_global_rank(group, (rank + 1) % t), dist.get_global_rank(group, (rank - 1) % t)
    sending, arriving = x.contiguous(), x.new_empty(recv_shape)
    debug.watch("ring_shift", group, sending, recv=arriving.shape)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, _wire(sending), after, group),
                                    dist.P2POp(dist.irecv, _wire(arriving), before, group)])
    return RingStep(works, sending, arriving)


@_no_grad
def broadcast(x: torch.Tensor, src: int, group) -> torch.Tensor:
    """Every rank gets group-rank ``src``'s ``x`` (the others pass a buffer of that shape)."""
    t = dist.get_world_size(group)
    if t == 1 or x.numel() == 0:
        return x
    out = x.contiguous().clone()
    issued = debug.watch("broadcast", group, out, detail=f"src {src}")
    dist.broadcast(out, src=dist.get_global_rank(group, src) if group is not None else src, group=group)
    debug.record("broadcast", x.shape, x.dtype, t, out.numel() * out.element_size(), group, issued)
    return out


@_no_grad
def scatter(full: torch.Tensor | None, like: torch.Tensor, dim: int, sizes: list[int], rank: int, src: int,
            group) -> torch.Tensor:
    """Group-rank ``src`` sends chunk r of ``full`` along ``dim`` to rank r.  # [n] -> [n/t]

    ``like`` is a tensor of the full shape and dtype (only ``src`` needs real data in ``full``).
    """
    t, c = len(sizes), max(sizes)
    if t == 1:
        return like if full is None else full
    if like.numel() == 0:
        return like.narrow(dim, 0, sizes[rank])
    front_shape = (c, *like.movedim(dim, 0).shape[1:])
    out = like.new_empty(front_shape)
    chunks = None
    if rank == src:
        front = _pad_rows(full.movedim(dim, 0), t * c)
        chunks = [piece.contiguous() for piece in front.split(c)]
    issued = debug.watch("scatter", group, out, chunks, detail=f"src {src} chunks {sizes}", shape=like.shape)
    dist.scatter(out, chunks, src=dist.get_global_rank(group, src), group=group)
    debug.record("scatter", like.shape, like.dtype, t, (t - 1) * out.numel() * out.element_size(), group, issued)
    return out[: sizes[rank]].movedim(0, dim).contiguous()


# ---- from_local(run_check=True): the one from_local that communicates ----------------

def run_check(local: torch.Tensor, mesh: DeviceMesh, placements, shape) -> torch.Tensor:
    """from_local(run_check=True): check every rank's local shape, broadcast replicas from rank 0."""
    mine = local_shape(shape, mesh, placements)
    for i, p in enumerate(placements):
        group, t = mesh.get_group(i), mesh.size(i)
        sizes = torch.tensor([list(local.shape)], dtype=torch.int64, device=local.device)  # [1, ndim]
        for r, got in enumerate(all_gather(sizes, 0, [1] * t, group).tolist()):  # [t, ndim]
            want = list(mine)
            if isinstance(p, Shard):
                want[p.dim] = chunk_sizes(shape[p.dim], t)[r]
            if got != want:
                raise ValueError(f"DTensor.from_local(run_check=True): rank {r} of mesh dim {i} holds a local "
                                 f"tensor of shape {got}, expected {want} for global {list(shape)} as "
                                 f"{list(placements)}")
        if isinstance(p, Replicate):
            local = _TakeValues.apply(local, broadcast(local, 0, group))
    return local


class _TakeValues(torch.autograd.Function):
    """``values`` in forward, the gradient straight to ``x`` in backward (run_check's broadcast)."""

    @staticmethod
    def forward(ctx, x, values):
        return values

    @staticmethod
    def backward(ctx, grad):
        return grad, None

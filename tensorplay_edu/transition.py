"""The layout-transition table: the one place where tensor parallelism communicates.

Given this rank's local tensor and a source and a target placement on one mesh
dimension of ``t`` ranks, :func:`move` issues exactly the collective that turns one
layout into the other:

=====================  ========================  =====================================
source -> target       forward                   backward (the same table, reversed)
=====================  ========================  =====================================
Shard(d) -> Replicate  all-gather on d           Replicate -> Shard(d): local chunk
Partial  -> Replicate  all-reduce                Replicate -> Replicate: nothing
Partial  -> Shard(d)   reduce-scatter on d       Shard(d) -> Replicate: all-gather
Replicate -> Shard(d)  local chunk (no comm)     Shard(d) -> Replicate: all-gather
Shard(a) -> Shard(b)   all-to-all                Shard(b) -> Shard(a): all-to-all
Replicate -> Partial   keep on rank 0, zeros     Replicate -> Replicate: nothing
                       elsewhere (no comm)
same -> same           nothing                   nothing
=====================  ========================  =====================================

The backward column is not written anywhere: :class:`Redistribute` applies :func:`move`
to the gradient, from the gradient's placement back to the source, where a ``Partial``
source counts as ``Replicate`` (the gradient of a sum reaches every addend whole).
The gradient's placement is ``for_gradient(target)`` unless the tensor's readers
declared otherwise, e.g. ``to_local(grad_placements=[Partial()])`` when the local
result feeds a matmul whose input gradient is a partial sum on each rank.

Megatron-LM's conjugate operators are rows of this table, not separate functions. The
letters are Korthikanti et al. 2022's (Shoeybi et al. 2019 called f-bar ``g``):

* ``f``  (identity forward, all-reduce backward) = ``from_local(x, [Replicate()])`` read
  with gradient ``Partial``: backward is Partial -> Replicate, an all-reduce.
* ``f̄``  (all-reduce forward, identity backward) = Partial -> Replicate.
* sequence parallelism's ``g`` (all-gather forward, reduce-scatter backward)
  = Shard(s) -> Replicate read with gradient ``Partial``: backward Partial -> Shard(s).
* ``ḡ``  (reduce-scatter forward, all-gather backward) = Partial -> Shard(s).

Uneven shards follow ``torch.chunk`` (see :func:`~tensorplay_edu.placement.chunk_sizes`);
the collectives pad and trim.  On an n-D mesh each mesh dimension moves on its own
group; un-sharding moves go first so a tensor dim is never sharded twice midway.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import collectives as C
from . import debug
from .placement import Partial, Placement, Replicate, Shard, chunk_offset, chunk_sizes, for_gradient

__all__ = ["TABLE", "move", "redistribute_local", "Redistribute", "GradLayout"]

# The forward column of the table above, as data (notebooks and tests read it).
TABLE = {
    ("Shard", "Replicate"): "all_gather",
    ("Partial", "Replicate"): "all_reduce",
    ("Partial", "Shard"): "reduce_scatter",
    ("Replicate", "Shard"): "local chunk",
    ("Shard", "Shard"): "all_to_all",
    ("Replicate", "Partial"): "local: rank 0 keeps, others zero",
}


def move(x: torch.Tensor, src: Placement, dst: Placement, shape: torch.Size, group, t: int, rank: int) -> torch.Tensor:
    """One mesh dimension: turn ``x`` (laid out as ``src``) into the ``dst`` layout.

    ``shape`` is the global shape, ``rank`` this rank's index in ``group`` of ``t`` ranks.
    """
    if src == dst:
        return x
    if isinstance(src, Shard) and isinstance(dst, Replicate):
        return C.all_gather(x, src.dim, chunk_sizes(shape[src.dim], t), group)  # [n/t] -> [n]
    if isinstance(src, Partial) and isinstance(dst, Replicate):
        return C.all_reduce(x, src.dist_op, group)  # sum of addends, everywhere
    if isinstance(src, Partial) and isinstance(dst, Shard):
        return C.reduce_scatter(x, dst.dim, chunk_sizes(shape[dst.dim], t), rank, src.dist_op, group)  # [n] -> [n/t]
    if isinstance(src, Replicate) and isinstance(dst, Shard):
        n = shape[dst.dim]  # [n] -> [n/t], no communication
        return x.narrow(dst.dim, chunk_offset(n, t, rank), chunk_sizes(n, t)[rank])
    if isinstance(src, Shard) and isinstance(dst, Shard):
        return C.all_to_all(x, src.dim, dst.dim, chunk_sizes(shape[src.dim], t), chunk_sizes(shape[dst.dim], t),
                            rank, group)  # [a/t, b] -> [a, b/t]
    if isinstance(src, Replicate) and isinstance(dst, Partial):
        if dst.reduce_op != "sum":
            raise NotImplementedError(f"Replicate -> {dst!r}: only Partial('sum') can be made from a replica")
        return x if rank == 0 else torch.zeros_like(x)  # the sum over ranks is x, exactly
    # Shard -> Partial and Partial(op1) -> Partial(op2) go through Replicate. (Shard -> Partial('sum') could
    # zero-fill outside this rank's chunk with no communication, at t times the memory; PyTorch refuses the move.)
    return move(move(x, src, Replicate(), shape, group, t, rank), Replicate(), dst, shape, group, t, rank)


def _order(src: tuple, dst: tuple) -> list[int]:
    """Mesh dims to move, un-sharding moves (target Replicate) first."""
    todo = [i for i in range(len(src)) if src[i] != dst[i]]
    return sorted(todo, key=lambda i: not isinstance(dst[i], Replicate))


def redistribute_local(x: torch.Tensor, mesh, src: tuple, dst: tuple, shape: torch.Size) -> torch.Tensor:
    """All mesh dimensions: move ``x`` from placements ``src`` to ``dst`` (both normalised).

    One tensor dim may be sharded by at most one mesh dim (checked by DTensor).
    """
    if len(src) == 1:  # a 1-D mesh: one move
        return move(x, src[0], dst[0], shape, mesh.get_group(0), mesh.size(0), mesh.get_local_rank(0))
    current = list(src)
    for i in _order(src, dst):
        if isinstance(dst[i], Shard):  # never let two mesh dims shard one tensor dim midway
            for j, p in enumerate(current):
                if j != i and p == dst[i]:
                    x = move(x, p, Replicate(), shape, mesh.get_group(j), mesh.size(j), mesh.get_local_rank(j))
                    current[j] = Replicate()
        x = move(x, current[i], dst[i], shape, mesh.get_group(i), mesh.size(i), mesh.get_local_rank(i))
        current[i] = dst[i]
    return x  # a dim parked on Replicate above still differs from its target, so it comes later


class GradLayout:
    """Where the gradient of one DTensor will arrive, as declared by its readers.

    Every reader of a DTensor that may send a gradient back declares its placement:
    ``to_local(grad_placements=...)`` explicitly, ``to_local()`` and ``redistribute``
    implicitly (the tensor's own placements, Partial read as Replicate).  Autograd adds
    the readers' gradients up *before* :class:`Redistribute` sees them, so three
    readers declaring ``Partial`` cost one collective, not three.  Readers that disagree
    would add gradients of different layouts: that is an error.

    A DTensor made by a view of another (``flatten``, ``view``, ``float``) forwards
    its declarations to its parent, with ``Shard`` dims mapped back.
    """

    __slots__ = ("default", "declared", "parent", "to_parent")  # one per DTensor: made in every hook

    def __init__(self, placements: tuple, parent: "GradLayout | None" = None, to_parent=None):
        self.default = for_gradient(placements)
        self.declared: tuple | None = None
        self.parent, self.to_parent = parent, to_parent

    def declare(self, placements: tuple) -> None:
        if self.parent is not None:
            return self.parent.declare(self.to_parent(placements))
        if self.declared is not None and self.declared != placements:
            raise RuntimeError(
                f"this DTensor is read with gradient placements {list(self.declared)} and {list(placements)}: "
                "its readers' gradients are added up, so they must share one placement. Pass the same "
                "grad_placements to every to_local() of it (or redistribute it once and read that)."
            )
        self.declared = placements

    @property
    def placements(self) -> tuple:
        return self.declared if self.declared is not None else self.default


class Redistribute(torch.autograd.Function):
    """Forward: the table from ``src`` to ``dst``.  Backward: the table from the
    gradient's placement back to ``for_gradient(src)``."""

    @staticmethod
    def forward(ctx, x, mesh, src: tuple, dst: tuple, shape: torch.Size, grad_layout: GradLayout):
        ctx.mesh, ctx.src, ctx.shape, ctx.grad_layout = mesh, src, shape, grad_layout
        ctx.module = debug.current_module()
        return redistribute_local(x, mesh, src, dst, shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        grad_src = ctx.grad_layout.placements
        for p in (*ctx.src, *grad_src):
            if isinstance(p, Partial) and p.reduce_op != "sum":
                raise NotImplementedError(f"gradients through {p!r} are not implemented (only Partial('sum'))")
        with debug.backward_scope(ctx.module):
            out = redistribute_local(grad, ctx.mesh, grad_src, for_gradient(ctx.src), ctx.shape)
        return out, None, None, None, None, None

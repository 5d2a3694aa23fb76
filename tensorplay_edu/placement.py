"""Placements: how one logical (global) tensor is laid out over one mesh dimension.

=============  =====================================================  ==================
placement      what rank r of a t-rank mesh dimension holds           paper's name
=============  =====================================================  ==================
``Shard(d)``   the r-th ``torch.chunk`` of the tensor along dim ``d``  "split" / [.., d/t]
``Replicate``  the whole tensor, identical on every rank               "copy"
``Partial``    an addend: the tensor is the sum over ranks             "pending reduction"
=============  =====================================================  ==================

Shard sizes follow ``torch.chunk``: every rank gets ``ceil(n / t)`` rows except the
last ones, which get what is left, possibly nothing (10 rows over 4 ranks: 3, 3, 3, 1;
2 rows over 4 ranks: 1, 1, 0, 0).  :func:`chunk_sizes` is that rule, in one place.

Equality and ``repr`` follow PyTorch: ``Shard(-1) != Shard(2)`` as objects, but a
redistribute normalises negative dims first (:meth:`Shard.normalized`), so moving a
3-D tensor from ``Shard(-1)`` to ``Shard(2)`` costs nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .mesh import DeviceMesh, get_current_mesh

__all__ = ["Placement", "Shard", "Replicate", "Partial", "chunk_sizes", "chunk_offset", "normalize", "for_gradient"]


def chunk_sizes(n: int, t: int) -> list[int]:
    """Sizes of ``torch.chunk(x, t)`` along a dim of size ``n``, padded with zeros to ``t`` entries."""
    full = -(-n // t) if n else 0  # ceil(n / t)
    return [max(0, min(full, n - r * full)) for r in range(t)]


def chunk_offset(n: int, t: int, r: int) -> int:
    """Index of rank ``r``'s first row when ``n`` rows are chunked over ``t`` ranks."""
    return min(n, r * (-(-n // t))) if n else 0


class Placement:
    """Base class of the three placements."""

    def is_shard(self, dim: int | None = None) -> bool:
        return isinstance(self, Shard) and (dim is None or self.dim == dim)

    def is_replicate(self) -> bool:
        return isinstance(self, Replicate)

    def is_partial(self) -> bool:
        return isinstance(self, Partial)


class Shard(Placement):
    """Rank r holds the r-th ``torch.chunk`` of the tensor along ``dim``."""

    def __init__(self, dim: int):
        if not isinstance(dim, int):
            raise TypeError(f"Shard(dim) takes an int dim, got {dim!r}")
        self.dim = dim

    def normalized(self, ndim: int) -> "Shard":
        """``Shard(-1)`` of a 3-D tensor is ``Shard(2)``; raises for a dim out of range."""
        if not -ndim <= self.dim < ndim:
            raise ValueError(f"Shard({self.dim}) does not fit a {ndim}-D tensor (dims -{ndim}..{ndim - 1})")
        return Shard(self.dim % ndim)

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self):
        return hash(("Shard", self.dim))

    def __repr__(self):
        return f"Shard(dim={self.dim})"

    def __str__(self):
        return f"S({self.dim})"


class Replicate(Placement):
    """Every rank holds the whole tensor."""

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("Replicate")

    def __repr__(self):
        return "Replicate()"

    def __str__(self):
        return "R"


_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


class Partial(Placement):
    """Every rank holds an addend; the tensor is their reduction (``"sum"`` by default).

    Gradients flow only through ``"sum"`` (the one tensor parallelism needs); the other
    reductions are forward-only.
    """

    def __init__(self, reduce_op: str = "sum"):
        if reduce_op not in _REDUCE_OPS:
            raise ValueError(f"Partial(reduce_op={reduce_op!r}): choose one of {sorted(_REDUCE_OPS)}")
        self.reduce_op = reduce_op

    @property
    def dist_op(self):
        return _REDUCE_OPS[self.reduce_op]

    def __eq__(self, other):
        return isinstance(other, Partial) and other.reduce_op == self.reduce_op

    def __hash__(self):
        return hash(("Partial", self.reduce_op))

    def __repr__(self):
        return f"Partial({self.reduce_op})"

    def __str__(self):
        return f"P({self.reduce_op})"


def normalize(placements, ndim: int) -> tuple[Placement, ...]:
    """Placements with every ``Shard`` dim made non-negative (and checked against ``ndim``)."""
    return tuple(p.normalized(ndim) if isinstance(p, Shard) else p for p in placements)


def for_gradient(placements) -> tuple[Placement, ...]:
    """The placements a gradient is sent back in: a ``Partial`` becomes ``Replicate``.

    The gradient of ``y = sum_r x_r`` with respect to each addend ``x_r`` is the full
    gradient of ``y``, identical on every rank: a replicated tensor.
    """
    return tuple(Replicate() if isinstance(p, Partial) else p for p in placements)


_WHOLE = (Replicate, Partial)  # placements with nothing to normalise


def resolve_placements(mesh, placements, ndim: int, what: str) -> tuple[DeviceMesh, tuple[Placement, ...]]:
    """(mesh, placements) checked: the current mesh when none is given, Replicate everywhere when no
    placements are, negative Shard dims counted from the end; ``what`` names the caller in errors."""
    mesh = mesh if mesh is not None else get_current_mesh()
    if mesh is None:
        raise ValueError(f"{what}: pass device_mesh (or call it inside `with mesh:`)")
    if placements is None:
        placements = [Replicate()] * mesh.ndim
    placements = tuple(placements)
    if len(placements) == 1 == mesh.ndim:  # the common case, checked quickly
        p = placements[0]
        if type(p) in _WHOLE or (type(p) is Shard and 0 <= p.dim < ndim):
            return mesh, placements
    wrong = next((p for p in placements if not isinstance(p, Placement)), None)
    if wrong is not None:
        raise TypeError(f"{what}: placements holds {wrong!r}, a {type(wrong).__name__}, not a Placement: use "
                        "Shard(dim), Replicate() or Partial()")
    if len(placements) != mesh.ndim:
        raise ValueError(f"{what}: give one placement per mesh dimension ({mesh.ndim}), got {placements}")
    placements = normalize(placements, ndim)
    shards = [p.dim for p in placements if isinstance(p, Shard)]
    if len(shards) != len(set(shards)):
        raise NotImplementedError(f"{what}: {placements} shards one tensor dim on two mesh dims; "
                                  "use one per tensor dim")
    return mesh, placements


def local_shape(shape, mesh: DeviceMesh, placements) -> list[int]:
    """This rank's local shape for a tensor of global ``shape``."""
    local = list(shape)
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            local[p.dim] = chunk_sizes(shape[p.dim], mesh.size(i))[mesh.get_local_rank(i)]
    return local


def global_shape(local, mesh: DeviceMesh, placements, shape=None, stride=None) -> torch.Size:
    """from_local's global shape: ``shape`` checked against this rank's piece (``torch.chunk``
    sizes), or, without one, even pieces (local size x ranks on each sharded dim)."""
    if stride is not None and shape is None:
        raise ValueError("DTensor.from_local: pass shape together with stride")
    if shape is None:  # even pieces: torch.chunk then gives every rank exactly `local`
        shape = list(local.shape)
        for i, p in enumerate(placements):
            if isinstance(p, Shard):
                shape[p.dim] *= mesh.size(i)
        return torch.Size(shape)
    expected, shape = local_shape(shape, mesh, placements), torch.Size(shape)
    if stride is not None and tuple(stride) != torch.empty(shape, device="meta").stride():
        raise NotImplementedError(f"DTensor.from_local: only contiguous global strides, got {tuple(stride)}")
    if list(local.shape) != expected:
        raise ValueError(f"DTensor.from_local: rank {mesh.get_rank()} holds a local tensor of shape "
                         f"{list(local.shape)}, but a global {list(shape)} laid out as {list(placements)} gives it "
                         f"{expected} (torch.chunk sizes); pass the right shape=")
    return shape

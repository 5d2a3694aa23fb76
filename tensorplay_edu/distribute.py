"""Putting data on the mesh, with communication: ``distribute_tensor``.

``distribute_tensor`` takes one full tensor (on the source rank) and lays it out:
``Shard`` scatters it, ``Replicate`` broadcasts it.  (``from_local`` wraps a piece each rank
already holds, without communicating: :mod:`tensorplay_edu.dtensor`.)

Every rank passes a tensor of the global shape and dtype (only the source rank's values
are read).  A rank with another shape would receive garbage from the scatter, so before
moving anything ``distribute_tensor`` all-gathers one number, a digest of the shape and
dtype, over each mesh dimension and raises naming both shapes if they differ.
``parallelize_module`` does that once for all the parameters of a plan, and
``src_data_rank=None`` and meta tensors (which move nothing) check nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib

import torch
import torch.distributed as dist

from . import collectives as C
from . import debug
from .dtensor import DTensor
from .placement import resolve_placements
from .mesh import DeviceMesh
from .placement import Partial, Replicate, Shard, chunk_offset, chunk_sizes
from .transition import GradLayout

__all__ = ["distribute_tensor"]


_CHECKED = contextvars.ContextVar("tensorplay_edu_shapes_checked", default=False)


def _same_everywhere(lines: list[str], mesh: DeviceMesh, what: str, fix: str) -> None:
    """Raise unless every rank of each mesh dimension holds the same ``lines`` (one tiny
    all-gather of their digest per mesh dim; the lines themselves only on a mismatch)."""
    digest = int.from_bytes(hashlib.sha256("\n".join(lines).encode()).digest()[:8], "little", signed=True)
    mine = torch.tensor([digest], dtype=torch.int64, device=mesh.device_type)
    for i in range(mesh.ndim):
        group, t = mesh.get_group(i), mesh.size(i)
        with debug.module_scope(f"{what} (shape check)"):
            digests = C.all_gather(mine, 0, [1] * t, group).tolist()
        if len(set(digests)) > 1:
            everyone = [None] * t
            dist.all_gather_object(everyone, lines, group=group)
            other = next(r for r in range(t) if everyone[r] != lines)
            first = next((a, b) for a, b in zip(lines + ["(nothing)"], everyone[other] + ["(nothing)"]) if a != b)
            raise ValueError(f"{what}: rank {mesh.get_rank()} holds {first[0]}, rank "
                             f"{dist.get_global_rank(group, other) if group is not None else other} (mesh dim {i}) "
                             f"holds {first[1]}: {fix}")


@contextlib.contextmanager
def check_same_parameters(params: list, mesh: DeviceMesh, src_data_rank):
    """parallelize_module's check of the ``(name, parameter)`` pairs a plan distributes, once for
    the whole plan; inside, distribute_tensor trusts it."""
    if src_data_rank is not None and any(not p.is_meta for _, p in params):
        _same_everywhere([f"'{name}' of shape {list(p.shape)} and dtype {p.dtype}" for name, p in params], mesh,
                         "parallelize_module", "every rank must build the same model (same shapes, same dtypes) "
                         "before parallelizing it")
    token = _CHECKED.set(True)
    try:
        yield
    finally:
        _CHECKED.reset(token)


def distribute_tensor(tensor: torch.Tensor, device_mesh: DeviceMesh | None = None, placements=None, *,
                      src_data_rank: int | None = 0) -> DTensor:
    """Lay a full tensor out over the mesh: a new leaf DTensor.

    ``src_data_rank`` is a rank *within each mesh dimension* (0 .. size - 1), as in PyTorch:
    ``Shard`` scatters and ``Replicate`` broadcasts from it, and ``Partial`` keeps the
    tensor there as the only non-zero addend (the sum is the tensor, exactly).  With
    ``src_data_rank=None`` nothing is communicated and every rank's own ``tensor`` is what
    it contributes: its ``torch.chunk`` piece for ``Shard``, itself for ``Replicate``
    (the ranks must hold the same data), and itself as its addend for ``Partial`` (the
    global tensor is then the sum of the ranks' tensors).

    As in PyTorch, the local pieces are moved to the mesh's device (``"cuda"``: this
    rank's current GPU).  A meta tensor stays on the meta device, with this rank's shape,
    and nothing is communicated for it.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"distribute_tensor takes a torch.Tensor, got a {type(tensor).__name__}: make it one first "
                        "(torch.tensor(...))")
    if not tensor.is_leaf:
        raise RuntimeError("`distribute_tensor` should be used to distribute leaf tensors! but found non-leaf tensor!")
    mesh, placements = resolve_placements(device_mesh, placements, tensor.ndim, "distribute_tensor")
    if tensor.is_meta:  # a model built on the meta device: shapes only, nothing to send
        src_data_rank = None
    elif tensor.device.type != mesh.device_type:  # as PyTorch: the pieces live on the mesh's device
        tensor = tensor.to(mesh.device_type)
    if src_data_rank is not None and not (isinstance(src_data_rank, int) and 0 <= src_data_rank < min(mesh.shape)):
        raise ValueError(f"distribute_tensor: src_data_rank={src_data_rank!r} is not a rank of every mesh dimension "
                         f"(mesh shape {mesh.shape}): pass a rank in 0..{min(mesh.shape) - 1}, or None to keep each "
                         "rank's own data")
    if src_data_rank is not None and not _CHECKED.get():
        _same_everywhere([f"a tensor of shape {list(tensor.shape)} and dtype {tensor.dtype}"], mesh,
                         "distribute_tensor", "every rank must pass a tensor of the global shape and dtype (only "
                         f"rank {src_data_rank}'s values are used; src_data_rank=None keeps each rank's own)")
    x = tensor.detach()
    for i, p in enumerate(placements):
        group, t, r = mesh.get_group(i), mesh.size(i), mesh.get_local_rank(i)
        if src_data_rank is None:  # no communication: this rank's own data
            if isinstance(p, Shard):
                n = tensor.shape[p.dim]
                x = x.narrow(p.dim, chunk_offset(n, t, r), chunk_sizes(n, t)[r])
        elif isinstance(p, Shard):
            x = C.scatter(x if r == src_data_rank else None, x, p.dim, chunk_sizes(tensor.shape[p.dim], t), r,
                          src_data_rank, group)
        elif isinstance(p, Replicate):
            x = C.broadcast(x, src_data_rank, group)
        elif isinstance(p, Partial):
            x = x if r == src_data_rank else torch.zeros_like(x)
    local = x.clone(memory_format=torch.contiguous_format)  # never alias the caller's tensor
    local.requires_grad_(tensor.requires_grad)
    return DTensor(local, mesh, placements, tensor.shape, GradLayout(placements))

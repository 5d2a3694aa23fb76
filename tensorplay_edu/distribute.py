"""Putting data on the mesh, with communication: ``distribute_tensor`` and
``DTensor.from_local(..., run_check=True)``.

``distribute_tensor`` takes one full tensor (on the source rank) and lays it out:
``Shard`` scatters it, ``Replicate`` broadcasts it.  ``from_local`` never communicates,
except when asked to check that the ranks' pieces fit together.
"""

from __future__ import annotations

import torch

from . import collectives as C
from .dtensor import DTensor, _local_shape, _resolve
from .mesh import DeviceMesh
from .placement import Partial, Replicate, Shard, chunk_offset, chunk_sizes
from .transition import GradLayout

__all__ = ["distribute_tensor", "run_check"]


def run_check(local: torch.Tensor, mesh: DeviceMesh, placements, shape) -> torch.Tensor:
    """from_local(run_check=True): check every rank's local shape, broadcast replicas from rank 0."""
    mine = _local_shape(shape, mesh, placements)
    for i, p in enumerate(placements):
        group, t = mesh.get_group(i), mesh.size(i)
        sizes = torch.tensor([list(local.shape)], dtype=torch.int64, device=local.device)  # [1, ndim]
        for r, got in enumerate(C.all_gather(sizes, 0, [1] * t, group).tolist()):
            want = list(mine)
            if isinstance(p, Shard):
                want[p.dim] = chunk_sizes(shape[p.dim], t)[r]
            if got != want:
                raise ValueError(f"DTensor.from_local(run_check=True): rank {r} of mesh dim {i} holds a local "
                                 f"tensor of shape {got}, expected {want} for global {list(shape)} as {list(placements)}")
        if isinstance(p, Replicate):
            local = _TakeValues.apply(local, C.broadcast(local, 0, group))
    return local


class _TakeValues(torch.autograd.Function):
    """``values`` in forward, the gradient straight to ``x`` in backward (run_check's broadcast)."""

    @staticmethod
    def forward(ctx, x, values):
        return values

    @staticmethod
    def backward(ctx, grad):
        return grad, None


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
    if not tensor.is_leaf:
        raise RuntimeError("`distribute_tensor` should be used to distribute leaf tensors! but found non-leaf tensor!")
    mesh, placements = _resolve(device_mesh, placements, tensor.ndim, "distribute_tensor")
    if tensor.is_meta:  # a model built on the meta device: shapes only, nothing to send
        src_data_rank = None
    elif tensor.device.type != mesh.device_type:  # as PyTorch: the pieces live on the mesh's device
        tensor = tensor.to(mesh.device_type)
    if src_data_rank is not None and not (isinstance(src_data_rank, int) and 0 <= src_data_rank < min(mesh.shape)):
        raise ValueError(f"distribute_tensor: src_data_rank={src_data_rank!r} is not a rank of every mesh dimension "
                         f"(mesh shape {mesh.shape}): pass a rank in 0..{min(mesh.shape) - 1}, or None to keep each "
                         "rank's own data")
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

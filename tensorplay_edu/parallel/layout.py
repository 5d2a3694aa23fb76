"""Where a parameter's piece lives: a parallelized parameter is a plain ``nn.Parameter``
holding this rank's piece, and ``param.tp_layout`` (a :class:`ParamLayout`: mesh, placements,
global shape) says which piece of the whole it is.  A parameter without one is whole."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..mesh import DeviceMesh
from ..placement import Placement, Shard, chunk_offset

__all__ = ["ParamLayout", "param_layout", "is_split", "tp_offsets", "where"]


@dataclass(frozen=True)
class ParamLayout:
    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    shape: torch.Size  # the global (single-device) shape


def param_layout(param: torch.Tensor) -> ParamLayout | None:
    """How a parallelized parameter is laid out (None: a full, untouched parameter)."""
    return getattr(param, "tp_layout", None)


def is_split(layout: ParamLayout | None) -> bool:
    """Does ``layout`` cut the parameter into pieces (Shard on a mesh dim of more than one rank)?"""
    return layout is not None and any(isinstance(p, Shard) and layout.mesh.size(d) > 1
                                       for d, p in enumerate(layout.placements))


def tp_offsets(layout: ParamLayout) -> list[int]:
    """Where this rank's tensor-parallel piece starts in the whole parameter."""
    offsets = [0] * len(layout.shape)
    for d, p in enumerate(layout.placements):
        if isinstance(p, Shard):
            offsets[p.dim] += chunk_offset(layout.shape[p.dim], layout.mesh.size(d), layout.mesh.get_local_rank(d))
    return offsets


def where(value: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, tuple[int, ...]]:
    """This rank's local tensor of a parameter (or of a tensor shaped like it) and its offsets
    in the single-device tensor.  ``value`` is the TP piece, or FSDP2's DTensor of it."""
    offsets = tp_offsets(layout)
    if _is_torch_dtensor(value):  # FSDP2 cut our piece again, over the data-parallel mesh
        piece_shape, mesh = value.shape, value.device_mesh
        for d, p in enumerate(value.placements):
            if p.is_shard():
                offsets[p.dim] += chunk_offset(piece_shape[p.dim], mesh.size(d), mesh.get_coordinate()[d])
        value = value.to_local()
    return value, tuple(offsets)


def _is_torch_dtensor(value) -> bool:
    """Is ``value`` a PyTorch DTensor (what FSDP2 makes of a parameter), not one of ours?"""
    from torch.distributed.tensor import DTensor as TorchDTensor

    return isinstance(value, TorchDTensor)

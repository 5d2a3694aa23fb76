"""Parameters after parallelization: plain ``nn.Parameter``s holding this rank's piece.

A parallel style replaces ``module.weight`` by an ``nn.Parameter`` of the local shard,
so ``torch.optim``, ``state_dict()`` and ``.grad`` work unchanged.  The global layout
is not lost: each such parameter carries ``param.tp_layout``, a :class:`ParamLayout`
(mesh, placements, global shape); :func:`param_layout` reads it.  A parameter without
one was never touched: it is the same full tensor on every rank.

:func:`full_state_dict` gathers the single-device state dict from a parallelized model
(through the transition table: Shard -> Replicate is an all-gather), and
:func:`load_full_state_dict` puts one back (Replicate -> Shard: a local chunk).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..distribute import distribute_tensor
from ..dtensor import DTensor
from ..mesh import DeviceMesh
from ..placement import Placement, Replicate

__all__ = ["ParamLayout", "param_layout", "as_dtensor", "distribute_param", "full_state_dict", "load_full_state_dict"]


@dataclass(frozen=True)
class ParamLayout:
    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    shape: torch.Size  # the global (single-device) shape


def param_layout(param: torch.Tensor) -> ParamLayout | None:
    """How a parallelized parameter is laid out (None: a full, untouched parameter)."""
    return getattr(param, "tp_layout", None)


def distribute_param(module: nn.Module, name: str, placement: Placement, mesh: DeviceMesh,
                     src_data_rank: int | None) -> nn.Parameter:
    """Replace ``module.<name>`` by this rank's piece of it (scattered / broadcast from ``src_data_rank``)."""
    full = getattr(module, name)
    piece = distribute_tensor(full.detach(), mesh, [placement], src_data_rank=src_data_rank)
    param = nn.Parameter(piece.to_local(), requires_grad=full.requires_grad)
    param.tp_layout = ParamLayout(mesh, piece.placements, full.shape)
    setattr(module, name, param)
    return param


def as_dtensor(param: torch.Tensor, local: torch.Tensor | None = None) -> DTensor:
    """A parallelized parameter (or ``local``, e.g. its gradient) as the DTensor it is a
    piece of.  No communication."""
    layout = param_layout(param)
    return DTensor.from_local(param if local is None else local, layout.mesh, layout.placements, shape=layout.shape)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The single-device state dict, on every rank (gathers the sharded parameters)."""
    out = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if param_layout(value) is None:
            out[name] = value.detach().clone()
        else:
            out[name] = as_dtensor(value, value.detach()).full_tensor()
    return out


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a single-device state dict into a parallelized model (each rank keeps its piece)."""
    own = model.state_dict(keep_vars=True)
    missing, unexpected = set(own) - set(state), set(state) - set(own)
    if missing or unexpected:
        raise KeyError(f"load_full_state_dict: missing keys {sorted(missing)}, unexpected keys {sorted(unexpected)}")
    with torch.no_grad():
        for name, value in own.items():
            layout = param_layout(value)
            full = state[name].to(value.device, value.dtype)
            if layout is None:
                value.copy_(full)
            else:
                piece = DTensor.from_local(full, layout.mesh, [Replicate()] * layout.mesh.ndim)
                value.copy_(piece.redistribute(placements=layout.placements).to_local())

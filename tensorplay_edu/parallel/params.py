"""Parameters after parallelization: plain ``nn.Parameter``s holding this rank's piece.

A parallel style replaces ``module.weight`` by an ``nn.Parameter`` of the local shard,
so ``torch.optim``, ``state_dict()`` and ``.grad`` work unchanged.  The global layout
is not lost: each such parameter carries ``param.tp_layout``, a :class:`ParamLayout`
(mesh, placements, global shape); :func:`param_layout` reads it.  A parameter without
one was never touched: it is the same full tensor on every rank.  The module keeps the
layouts too (``module._tp_layouts``): wrappers that replace parameters (FSDP2's
``fully_shard``, ``to_empty``) lose the attribute, and :func:`attach_layouts` puts it back.

:func:`full_state_dict` gathers the single-device state dict from a parallelized model
(through the transition table: Shard -> Replicate is an all-gather), and
:func:`load_full_state_dict` puts one back (Replicate -> Shard: a local chunk).
"""

from __future__ import annotations

import copy
import types

import torch
from torch import nn

from ..distribute import distribute_tensor
from ..dtensor import DTensor
from ..mesh import DeviceMesh
from ..placement import Placement, Replicate
from .checkpoint import register_state_dict_hooks
from .grad_sync import follow_replaced
from .layout import ParamLayout, _is_torch_dtensor, is_split, param_layout
from .piece import Piece

__all__ = ["attach_layouts", "buffers_to_mesh", "as_dtensor", "distribute_param", "full_state_dict", "load_full_state_dict"]


def distribute_param(module: nn.Module, name: str, placement: Placement, mesh: DeviceMesh,
                     src_data_rank: int | None) -> nn.Parameter:
    """Replace ``module.<name>`` by this rank's piece of it (scattered / broadcast from ``src_data_rank``)."""
    full = getattr(module, name)
    piece = distribute_tensor(full.detach(), mesh, [placement], src_data_rank=src_data_rank)
    param = nn.Parameter(piece.to_local(), requires_grad=full.requires_grad)
    setattr(module, name, param)
    if not hasattr(module, "_tp_layouts"):  # the module keeps them too: some wrappers replace parameters
        module._tp_layouts = {}
        register_state_dict_hooks(module)  # state_dict(): pieces that DCP can place
        module._apply = types.MethodType(_apply_keeping_layouts, module)  # to_empty, .to(), .double()
        module.__deepcopy__ = types.MethodType(_deepcopy_keeping_layouts, module)  # copy.deepcopy looks here
        module.register_forward_pre_hook(_attach_before_forward)  # before the style's hooks: they read layouts
    module._tp_layouts[name] = ParamLayout(mesh, piece.placements, full.shape)
    attach_own_layouts(module)  # param.tp_layout
    return param


def buffers_to_mesh(module: nn.Module, mesh: DeviceMesh) -> None:
    """Move ``module``'s own buffers to the mesh's device (parameters move in distribute_tensor)."""
    for name, buffer in list(module.named_buffers(recurse=False)):
        if buffer is not None and not buffer.is_meta and buffer.device.type != mesh.device_type:
            module._buffers[name] = buffer.to(mesh.device_type)


def attach_layouts(model: nn.Module) -> nn.Module:
    """Give every parallelized parameter of ``model`` its ``tp_layout`` again, from its module.

    Call it after something replaced the parameters (FSDP2's ``fully_shard``, whose
    parameters are PyTorch DTensors over the data-parallel mesh; ``to_empty``): then
    ``param_layout``, ``clip_grad_norm_`` and the guard on PyTorch's clipping see them.
    """
    for module in model.modules():
        attach_own_layouts(module)
    return model


def attach_own_layouts(module: nn.Module) -> None:
    """:func:`attach_layouts` for ``module``'s own parameters (before every forward too)."""
    follow_replaced(module)  # a partial gradient's bucket state, on the new parameter too
    for name, layout in getattr(module, "_tp_layouts", {}).items():
        param = module._parameters.get(name)
        if param is not None and getattr(param, "tp_layout", None) is not layout:
            param.tp_layout = layout
            if is_split(layout) and param.requires_grad and not hasattr(param, "_tp_marks_grad"):
                param.register_post_accumulate_grad_hook(_mark_grad)  # .grad is a piece too: get_total_norm's guard
                param._tp_marks_grad = True


def _attach_before_forward(module: nn.Module, args) -> None:
    """Parameters replaced since the last forward (``to_empty``, ``load_state_dict(assign=True)``,
    FSDP2) get their layouts back before the module runs."""
    attach_own_layouts(module)


def _apply_keeping_layouts(self: nn.Module, fn, recurse: bool = True):
    """``nn.Module._apply`` (behind ``to_empty``, ``.to()``, ``.double()``), then the layouts on
    whatever parameters it made: a meta model's pieces know what they are as soon as they are real."""
    out = type(self)._apply(self, fn, recurse)
    attach_own_layouts(self)
    return out


def _deepcopy_keeping_layouts(self: nn.Module, memo: dict) -> nn.Module:
    """``copy.deepcopy``: what it does for any module (``__setstate__`` of the copied ``__dict__``),
    then the layouts on the copy's parameters (``nn.Parameter``'s deepcopy drops ``tp_layout``)."""
    twin = type(self).__new__(type(self))
    memo[id(self)] = twin
    state = {k: v for k, v in self.__dict__.items() if k != "__deepcopy__"}
    twin.__setstate__(copy.deepcopy(state, memo))
    twin.__deepcopy__ = types.MethodType(_deepcopy_keeping_layouts, twin)
    attach_own_layouts(twin)
    return twin


def _mark_grad(param: torch.Tensor) -> None:
    """A piece's gradient is a piece: the same layout, so that PyTorch's norm functions refuse it."""
    if param.grad is not None and getattr(param.grad, "tp_layout", None) is None:
        param.grad.tp_layout = param.tp_layout


def _unwrap(value: torch.Tensor) -> torch.Tensor:
    """A PyTorch DTensor (FSDP2's data-parallel shard of our piece) gathered to our piece."""
    return value.full_tensor() if _is_torch_dtensor(value) else value


def as_dtensor(param: torch.Tensor, local: torch.Tensor | None = None) -> DTensor:
    """A parallelized parameter (or ``local``, e.g. its gradient) as the DTensor it is a
    piece of.  No communication."""
    layout = param_layout(param)
    return DTensor.from_local(param if local is None else local, layout.mesh, layout.placements, shape=layout.shape)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The single-device state dict, on every rank (gathers the sharded parameters)."""
    out = {}
    for name, value in _live_state(model).items():
        piece = _unwrap(value.detach())  # FSDP2: its all-gather over the data-parallel mesh first
        if param_layout(value) is None:
            out[name] = piece.clone()
        else:
            out[name] = as_dtensor(value, piece).full_tensor()
    return out


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a single-device state dict into a parallelized model (each rank keeps its piece).

    Every key must be there, with the single-device shape and the model's dtype: the
    whole dict is checked before anything is copied, and an error names each bad key.
    """
    own = _live_state(model)
    missing, unexpected = set(own) - set(state), set(state) - set(own)
    if missing or unexpected:
        raise KeyError(f"load_full_state_dict: missing keys {sorted(missing)}, unexpected keys {sorted(unexpected)}")
    bad = []
    for name, value in own.items():
        layout, given = param_layout(value), state[name]
        want = layout.shape if layout is not None else value.shape
        if not isinstance(given, torch.Tensor):
            bad.append(f"'{name}' is a {type(given).__name__}, not a tensor")
        elif given.shape != want or given.dtype != value.dtype:
            bad.append(f"'{name}' has shape {list(given.shape)} and dtype {given.dtype}, the model expects "
                       f"{list(want)} and {value.dtype}")
    if bad:
        raise ValueError("load_full_state_dict: " + "; ".join(bad) + ". Give the single-device (unsharded) state "
                         "dict of this model; convert dtypes first (e.g. {k: v.to(dtype) for k, v in sd.items()}).")
    with torch.no_grad():
        for name, value in own.items():
            layout = param_layout(value)
            piece = state[name].to(value.device)
            if layout is not None:
                full = DTensor.from_local(piece, layout.mesh, [Replicate()] * layout.mesh.ndim)
                piece = full.redistribute(placements=layout.placements).to_local()
            if _is_torch_dtensor(value):  # FSDP2: its data-parallel shard of our piece
                from torch.distributed.tensor import distribute_tensor as torch_distribute
                piece = torch_distribute(piece, value.device_mesh, value.placements, src_data_rank=None)
            value.copy_(piece)


def _live_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``state_dict(keep_vars=True)`` with the live parameters themselves (a split one's entry is a
    Piece there, for DCP: ``.param`` is the parameter)."""
    return {name: value.param if isinstance(value, Piece) and value.param is not None else value
            for name, value in attach_layouts(model).state_dict(keep_vars=True).items()}

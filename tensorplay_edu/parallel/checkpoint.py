"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): every rank writes its own
pieces, and a checkpoint saved at one TP degree loads at any other.

DCP writes a state dict as *chunks*: each rank declares, for each tensor, which block of the
whole tensor it holds (offsets and sizes), one rank writes each distinct block, and the
checkpoint's metadata records the whole tensor's size and where each block went.  Loading
is the same question asked the other way: each rank declares the blocks it wants, and DCP
reads them from whichever saved chunks overlap them.  That is resharding, for free.

A parallelized parameter is a plain ``nn.Parameter`` holding this rank's piece, so a plain
``model.state_dict()`` would hand DCP a tensor of the *local* shape under the same name on
every rank, which DCP takes for a replica: it keeps one rank's piece (the rank with the least storage
planned so far, not necessarily rank 0) and drops the others.
So a tensor-parallel module's ``state_dict()`` hands out a :class:`Piece` (piece.py) instead:
a tensor of the parameter's single-device size holding this rank's local tensor and its
offsets in the whole, which DCP asks which chunk it holds.  Nothing is gathered: no rank
ever holds a parameter it does not own.

==================================  ==============================================
a parallelized parameter            its state-dict entry
==================================  ==============================================
``Shard`` over the TP group          ``Piece``: this rank's chunk, at its offset
``Replicate`` (norm weights, bias)   the plain tensor (every rank writes the same)
FSDP2 over dp of a TP piece          ``Piece``: TP offset + FSDP2's offset inside it
``state_dict(keep_vars=True)``       ``Piece`` whose ``.local`` is the live parameter
==================================  ==============================================

``load_state_dict`` takes a ``Piece`` of this rank's own place (a state dict of the same
layout, e.g. after ``dcp.load`` into ``model.state_dict()``, or ``torch.load`` of a file this
rank saved), a tensor of the single-device shape (this rank keeps its chunk), or a tensor of
the local shape (as before).  A piece of another place is an error: reshard it through DCP.

The optimizer's state (AdamW's ``exp_avg``, ...) has the parameters' local shapes: a plain
``opt.state_dict()`` hands out the same pieces (optim_state.py), and :func:`get_state_dict` /
:func:`set_state_dict` (the signatures of ``torch.distributed.checkpoint.state_dict``'s) do
too, keyed by parameter name.  PyTorch's own functions of that name are refused for
tensor-parallel models (they would not find the layouts of FSDP2's parameters).
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.checkpoint import state_dict as _torch_sd

from .layout import ParamLayout, _is_torch_dtensor, is_split, where
from .piece import Piece

__all__ = ["Piece", "get_state_dict", "set_state_dict", "get_model_state_dict", "set_model_state_dict",
           "get_optimizer_state_dict", "set_optimizer_state_dict"]


# ---- state_dict() / load_state_dict() hooks of a parallelized module ----------------------------

def register_state_dict_hooks(module: nn.Module) -> None:
    """Called once per module by ``distribute_param``: pieces out, pieces (or whole tensors) in."""
    module.register_state_dict_post_hook(_pieces_out)
    module.register_load_state_dict_pre_hook(_pieces_in)


def _pieces_out(module, state_dict, prefix, local_metadata) -> None:
    for name, layout in getattr(module, "_tp_layouts", {}).items():
        key, value = prefix + name, state_dict.get(prefix + name)
        if value is None or isinstance(value, Piece) or not is_split(layout):
            continue  # replicated ones are whole already
        local, offsets = where(value, layout)  # keep_vars=True: local is (a view of) the live parameter
        state_dict[key] = Piece(local, layout.shape, offsets, param=value if isinstance(value, nn.Parameter) else None)


def _pieces_in(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    for name, layout in getattr(module, "_tp_layouts", {}).items():
        key, param = prefix + name, module._parameters.get(name)
        if key in state_dict and param is not None:
            state_dict[key] = _as_local(state_dict[key], layout, param, key)


def _as_local(value, layout: ParamLayout, param: torch.Tensor, key: str):
    """What ``load_state_dict`` copies into ``param``: this rank's part of ``value``."""
    mine, offsets = where(param.detach(), layout)
    if isinstance(value, Piece):
        if (value.shape, value.offsets, value.local.shape) != (layout.shape, offsets, mine.shape):
            raise ValueError(
                f"load_state_dict: '{key}' is the part at offsets {list(value.offsets)} (shape "
                f"{list(value.local.shape)}) of a {list(value.shape)} tensor, but this rank holds the part at "
                f"{list(offsets)} (shape {list(mine.shape)}) of {list(layout.shape)}: the state dict comes from "
                "another layout (or another rank). Save it with torch.distributed.checkpoint and dcp.load it into "
                "this model's (or optimizer's) state_dict(): DCP reshards")
        local = value.local
    elif isinstance(value, torch.Tensor) and not _is_torch_dtensor(value) and value.shape == layout.shape \
            and value.shape != mine.shape:  # a single-device tensor: this rank's chunk of it
        local = value
        for d, (size, start) in enumerate(zip(mine.shape, offsets)):
            local = local.narrow(d, start, size)
    else:
        return value  # this rank's own piece as a plain tensor (or anything else: load_state_dict checks it)
    if _is_torch_dtensor(param):  # FSDP2 wants its DTensor of our piece
        from torch.distributed.tensor import DTensor as TorchDTensor
        return TorchDTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape,
                                       stride=param.stride())
    return local


# ---- model and optimizer state dicts, DCP-ready -------------------------------------------------

def _parameters_by_fqn(model: nn.Module) -> dict[str, tuple[ParamLayout, torch.Tensor]]:
    """Canonical parameter names (as torch's state-dict API writes them, without DDP's "module.")
    -> (tensor-parallel layout, parameter), for the parallelized parameters."""
    out = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owner, _, attr = name.rpartition(".")
        layout = getattr(model.get_submodule(owner), "_tp_layouts", {}).get(attr)
        if layout is not None:
            for fqn in _torch_sd._get_fqns(model, name):
                out[fqn] = (layout, param)
    return out


def _map_optimizer_state(model, optim_state_dict: dict, convert) -> dict:
    """``convert`` every state tensor shaped like its (split) parameter: exp_avg, exp_avg_sq, momentum."""
    params, states = _parameters_by_fqn(model), optim_state_dict.get("state", {})
    for fqn, state in states.items():
        layout, param = params.get(fqn, (None, None))
        if is_split(layout):  # a new dict: the one given may be the optimizer's own
            states[fqn] = {k: convert(v, layout, param, f"state.{fqn}.{k}")
                           if isinstance(v, torch.Tensor) and v.ndim == len(layout.shape) else v
                           for k, v in state.items()}
    return optim_state_dict


def _piece_of_state(value, layout, param, key):
    if isinstance(value, Piece):  # opt.state_dict() made it one already (optim_state.py)
        return value
    local, offsets = where(value, layout)
    return Piece(local, layout.shape, offsets)


def get_model_state_dict(model: nn.Module, *, submodules=None, options=None) -> dict:
    """``torch.distributed.checkpoint.state_dict.get_model_state_dict``: tensor-parallel entries are pieces."""
    return _torch_sd.get_model_state_dict(model, submodules=submodules, options=options)


def set_model_state_dict(model: nn.Module, model_state_dict: dict, *, options=None):
    return _torch_sd.set_model_state_dict(model, model_state_dict, options=options)


def get_optimizer_state_dict(model: nn.Module, optimizers, *, submodules=None, options=None) -> dict:
    """PyTorch's function, with the state of tensor-parallel parameters as pieces (a fresh
    optimizer's state is initialised first, as PyTorch does, so that DCP can load into it)."""
    sd = _unguarded("get_optimizer_state_dict")(model, optimizers, submodules=submodules, options=options)
    return _map_optimizer_state(model, sd, _piece_of_state)


def set_optimizer_state_dict(model: nn.Module, optimizers, optim_state_dict: dict, *, options=None) -> None:
    optim_state_dict = _map_optimizer_state(model, optim_state_dict, _as_local)
    _unguarded("set_optimizer_state_dict")(model, optimizers, optim_state_dict, options=options)


def get_state_dict(model: nn.Module, optimizers, *, submodules=None, options=None) -> tuple[dict, dict]:
    """``(model state dict, optimizer state dict)``, ready for ``dcp.save`` / ``dcp.load``."""
    return (get_model_state_dict(model, submodules=submodules, options=options),
            get_optimizer_state_dict(model, optimizers, submodules=submodules, options=options))


def set_state_dict(model: nn.Module, optimizers, *, model_state_dict: dict, optim_state_dict: dict, options=None):
    """Load what :func:`get_state_dict` gave (after ``dcp.load`` into it): the model, then the optimizer."""
    result = set_model_state_dict(model, model_state_dict, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return result


# ---- the guard on PyTorch's optimizer-state functions ------------------------------------------

def _unguarded(name: str):
    fn = getattr(_torch_sd, name)
    return getattr(fn, "__wrapped__", fn) if getattr(fn, "__tensorplay_guard__", False) else fn


def _guarded(torch_fn, name: str):
    @functools.wraps(torch_fn)
    def checked(model, optimizers, *args, **kwargs):
        if any(is_split(layout) for layout, _ in _parameters_by_fqn(model).values()):
            raise RuntimeError(
                f"torch.distributed.checkpoint.state_dict.{name} was given a tensor-parallel model: its optimizer "
                "state holds this rank's pieces without their place, so dcp.save would keep rank 0's and drop the "
                f"others. Use tensorplay_edu.parallel.checkpoint.{name} (the same arguments).")
        return torch_fn(model, optimizers, *args, **kwargs)

    checked.__tensorplay_guard__ = True
    return checked


def install_guards() -> None:
    for name in ("get_state_dict", "set_state_dict", "get_optimizer_state_dict", "set_optimizer_state_dict"):
        fn = getattr(_torch_sd, name)
        if not getattr(fn, "__tensorplay_guard__", False):
            setattr(_torch_sd, name, _guarded(fn, name))


install_guards()

"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): every rank writes its own
pieces, and a checkpoint saved at one TP degree loads at any other.

DCP writes a state dict as *chunks*: each rank declares, for each tensor, which block of the
whole tensor it holds (offsets and sizes), one rank writes each distinct block, and the
checkpoint's metadata records the whole tensor's size and where each block went.  Loading
is the same question asked the other way: each rank declares the blocks it wants, and DCP
reads them from whichever saved chunks overlap them.  That is resharding, for free.

A parallelized parameter is a plain ``nn.Parameter`` holding this rank's piece, so a plain
``model.state_dict()`` would hand DCP a tensor of the *local* shape under the same name on
every rank, which DCP takes for a replica: it keeps rank 0's piece and drops the others.
So a tensor-parallel module's ``state_dict()`` hands out a :class:`Piece` instead: a tensor
whose size is the parameter's single-device size, holding this rank's local tensor and its
offsets in the whole, and answering DCP's three questions (``__create_write_items__``,
``__create_chunk_list__``, ``__get_tensor_shard__``).  Nothing is gathered: no rank ever
holds a parameter it does not own.

==================================  ==============================================
a parallelized parameter            its state-dict entry
==================================  ==============================================
``Shard`` over the TP group          ``Piece``: this rank's chunk, at its offset
``Replicate`` (norm weights, bias)   the plain tensor (every rank writes the same)
FSDP2 over dp of a TP piece          ``Piece``: TP offset + FSDP2's offset inside it
==================================  ==============================================

``load_state_dict`` takes a ``Piece`` of this rank's own place (a state dict of the same
layout, e.g. after ``dcp.load`` into ``model.state_dict()``), a tensor of the single-device
shape (this rank keeps its chunk), or a tensor of the local shape (as before).  A piece of
another layout is an error: reshard it through DCP.  ``torch.save`` of a ``Piece`` saves its
local tensor.

The optimizer's state (AdamW's ``exp_avg``, ...) has the parameters' local shapes and no
layout: :func:`get_state_dict` / :func:`set_state_dict` (the signatures of
``torch.distributed.checkpoint.state_dict``'s) give its tensors the same pieces.  Importing
this package makes PyTorch's own optimizer-state functions raise for tensor-parallel
parameters instead of letting DCP keep rank 0's moments.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.checkpoint import state_dict as _torch_sd
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from .params import ParamLayout, _is_torch_dtensor, is_split, where

__all__ = ["Piece", "get_state_dict", "set_state_dict", "get_model_state_dict", "set_model_state_dict",
           "get_optimizer_state_dict", "set_optimizer_state_dict"]


class Piece(torch.Tensor):
    """A state-dict entry: this rank's ``local`` tensor of a bigger one, at ``offsets``.

    Its size is the whole tensor's (what DCP compares with the checkpoint); ``.local`` is the
    data.  Ops other than ``detach`` / ``clone`` / ``to`` / ``copy_`` / ``empty_like`` are
    refused: take ``.local``, or gather with ``tensorplay_edu.parallel.full_state_dict``.
    """

    @staticmethod
    def __new__(cls, local: torch.Tensor, shape, offsets):
        piece = torch.Tensor._make_wrapper_subclass(cls, torch.Size(shape), dtype=local.dtype, device=local.device)
        piece.local, piece.offsets = local, tuple(offsets)
        return piece

    def __init__(self, local, shape, offsets):
        super().__init__()

    # ---- DCP's protocol: which chunk this rank holds, and its data ----------------------------
    def __create_write_items__(self, fqn: str, obj) -> list[WriteItem]:
        if self.local.numel() == 0:  # torch.chunk left this rank nothing (2 rows over 4 ranks)
            return []
        chunk = self.__create_chunk_list__()[0]
        return [WriteItem(index=MetadataIndex(fqn, chunk.offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(chunk=chunk, properties=TensorProperties.create_from_tensor(
                              self.local), size=self.shape))]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        if self.local.numel() == 0:
            return []
        return [ChunkStorageMetadata(offsets=torch.Size(self.offsets), sizes=self.local.shape)]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        return self.local

    # ---- as a tensor ---------------------------------------------------------------------------
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func in (aten.detach.default, aten.clone.default, aten._to_copy.default, aten.empty_like.default,
                    aten.alias.default):
            piece = args[0]
            return Piece(func(piece.local, *args[1:], **kwargs), piece.shape, piece.offsets)
        if func is aten.copy_.default and isinstance(args[0], Piece):
            dst, src = args[0], args[1]
            if isinstance(src, Piece) and (src.shape, src.offsets) != (dst.shape, dst.offsets):
                raise ValueError(f"copy_ between pieces of different places ({src.offsets} and {dst.offsets})")
            dst.local.copy_(src.local if isinstance(src, Piece) else src)
            return dst
        raise NotImplementedError(
            f"{func} on a Piece (this rank's {list(args[0].local.shape) if isinstance(args[0], Piece) else ''} part "
            "of a tensor-parallel state-dict entry): use .local for this rank's tensor, "
            "tensorplay_edu.parallel.full_state_dict(model) for the whole one")

    def __repr__(self):
        return f"Piece(shape={list(self.shape)}, offsets={list(self.offsets)}, local={self.local!r})"

    def __reduce_ex__(self, proto):
        return self.local.__reduce_ex__(proto)  # torch.save: this rank's tensor, as a plain tensor


# ---- state_dict() / load_state_dict() hooks of a parallelized module ----------------------------

def register_state_dict_hooks(module: nn.Module) -> None:
    """Called once per module by ``distribute_param``: pieces out, pieces (or whole tensors) in."""
    module.register_state_dict_post_hook(_pieces_out)
    module.register_load_state_dict_pre_hook(_pieces_in)


def _pieces_out(module, state_dict, prefix, local_metadata) -> None:
    for name, layout in getattr(module, "_tp_layouts", {}).items():
        key, value = prefix + name, state_dict.get(prefix + name)
        if value is None or isinstance(value, nn.Parameter) or not is_split(layout):
            continue  # keep_vars=True hands out the live parameters; replicated ones are whole already
        local, offsets = where(value, layout)
        state_dict[key] = Piece(local, layout.shape, offsets)


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
                "another layout. Save it with torch.distributed.checkpoint and dcp.load it into this model's "
                "state_dict(): DCP reshards")
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

"""ColwiseParallel and RowwiseParallel: Megatron's column- and row-split layers.

Each style does three things, as in PyTorch: shard the parameters, convert the input
in a forward pre-hook, convert the output in a forward hook.  The module's own forward
runs on plain local tensors and local parameters.  All communication is a DTensor
``redistribute`` (the transition table), so the collectives below are rows of it:

=====================================  ==================  ================================
layer (default layouts)                forward             backward
=====================================  ==================  ================================
Colwise Linear, input Replicate        nothing             all-reduce of the input grad (f)
Rowwise Linear, output Replicate       all-reduce (g)      nothing
Colwise, input Shard(s) (seq. par.)    all-gather          reduce-scatter
Rowwise, output Shard(s) (seq. par.)   reduce-scatter      all-gather
=====================================  ==================  ================================
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from ..debug import module_scope
from ..dtensor import DTensor
from ..mesh import DeviceMesh
from ..placement import Partial, Placement, Replicate, Shard, chunk_offset, chunk_sizes
from .grad_sync import bucket_for
from .params import distribute_param

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel"]


class ParallelStyle:
    """A way to parallelize one module: subclasses implement ``_apply(module, device_mesh)``."""

    src_data_rank: int | None = 0

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        raise NotImplementedError


def fqn(module: nn.Module) -> str:
    """The module's path as parallelize_module saw it (its class name otherwise)."""
    return getattr(module, "_tp_fqn", "") or type(module).__name__


def mark_applied(module: nn.Module, style: str) -> None:
    """Colwise / Rowwise / SequenceParallel shard a module once; a second time is an error."""
    if getattr(module, "_tp_applied", None):
        raise RuntimeError(
            f"distribute_module should only be called once on a module, but it has already been called on this "
            f"module! ({style} on '{fqn(module)}', already parallelized by {module._tp_applied})")
    module._tp_applied = style


def input_as_dtensor(x, mesh: DeviceMesh, layout: Placement, shape=None) -> DTensor:
    """A module input as a DTensor: a DTensor as it is, a plain tensor declared ``layout``."""
    if isinstance(x, DTensor):
        return x
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"expecting a torch.Tensor or DTensor input, got {type(x).__name__}")
    return DTensor.from_local(x, mesh, [layout], shape=shape)


# The last plain input a Colwise Linear wrapped.  wq, wk and wv read the same x one
# after the other, so they share one DTensor and its gradient layout: their partial
# input gradients are added up first and the f all-reduce happens once per x, not
# once per layer (1 + 2L all-reduces in a vanilla Llama backward instead of 1 + 5L).
# One slot only, so at most one activation is held until the next Colwise call.
_LAST_INPUT: list = []


def shared_replicated(x: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    """``from_local(x, [Replicate()])``, the same one for consecutive Colwise readers of ``x``."""
    if _LAST_INPUT:
        last_x, version, last_mesh, dt = _LAST_INPUT[0]
        if last_x is x and version == x._version and last_mesh == mesh:
            return dt
    dt = DTensor.from_local(x, mesh, [Replicate()])
    _LAST_INPUT[:] = [(x, x._version, mesh, dt)]
    return dt


def to_layout(dt: DTensor, layout: Placement) -> DTensor:
    """``dt`` redistributed to ``layout`` if it is not there already (negative dims normalised)."""
    target = layout.normalized(dt.ndim) if isinstance(layout, Shard) else layout
    return dt if dt.placements == (target,) else dt.redistribute(dt.device_mesh, [target])


def _shape_with(local: torch.Tensor, dim: int, size: int) -> list[int]:
    shape = list(local.shape)
    shape[dim % local.ndim] = size
    return shape


class _LinearOrEmbedding(ParallelStyle):
    def __init__(self, *, input_layouts: Placement | None = None, output_layouts: Placement | None = None,
                 use_local_output: bool = True):
        self.input_layouts = (input_layouts or self.default_input,)
        self.output_layouts = (output_layouts or self.default_output,)
        self.use_local_output = use_local_output

    def __repr__(self):
        return (f"{type(self).__name__}(input_layouts={self.input_layouts}, output_layouts={self.output_layouts}, "
                f"use_local_output={self.use_local_output})")

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            raise NotImplementedError(
                f"{type(self).__name__} currently only support nn.Linear and nn.Embedding! "
                f"'{fqn(module)}' is a {type(module).__name__}; give it another style or leave it out of the plan")
        mark_applied(module, type(self).__name__)
        self._shard(module, device_mesh)
        module.register_forward_pre_hook(lambda mod, inputs: self._prepare_input(mod, inputs, device_mesh))
        module.register_forward_hook(lambda mod, inputs, out: self._prepare_output(mod, out, device_mesh))
        return module

    def _finish(self, dt: DTensor, module: nn.Module):
        """Output DTensor -> the declared output layout -> local tensor if asked."""
        with module_scope(fqn(module)):
            dt = to_layout(dt, self.output_layouts[0])
        return dt.to_local() if self.use_local_output else dt


class ColwiseParallel(_LinearOrEmbedding):
    """Split the output features: Linear weight and bias on Shard(0), Embedding weight on Shard(1).

    Input Replicate (the input gradient is a partial sum, reduced by one all-reduce: f);
    output sharded on the last dim, ``Shard(-1)``.
    """

    default_input, default_output = Replicate(), Shard(-1)
    desired_input_layouts = (Replicate(),)

    def _shard(self, module, mesh):
        dim = 0 if isinstance(module, nn.Linear) else 1
        for name, _ in list(module.named_parameters(recurse=False)):
            distribute_param(module, name, Shard(dim), mesh, self.src_data_rank)

    def _prepare_input(self, module, inputs, mesh):
        x = inputs[0]
        with module_scope(fqn(module)):
            if isinstance(x, torch.Tensor) and self.input_layouts[0] == Replicate() and isinstance(module, nn.Linear):
                x = shared_replicated(x, mesh)  # [.., in]
            else:
                x = to_layout(input_as_dtensor(x, mesh, self.input_layouts[0]), Replicate())  # [.., in]
        grad = [Partial()] if isinstance(module, nn.Linear) else None  # x @ W_local^T: partial input grad
        return (x.to_local(grad_placements=grad),)

    def _prepare_output(self, module, out, mesh):  # out: [.., out/t]
        features = module.out_features if isinstance(module, nn.Linear) else module.embedding_dim
        dt = DTensor.from_local(out, mesh, [Shard(-1)], shape=_shape_with(out, -1, features))
        return self._finish(dt, module)


class RowwiseParallel(_LinearOrEmbedding):
    """Split the input features: Linear weight on Shard(1), bias replicated and added once,
    after the reduction; Embedding weight on Shard(0), a vocab-parallel lookup.

    Input ``Shard(-1)`` for a Linear (an Embedding takes ``input_layouts=Replicate()``);
    the local result is a partial sum, reduced to the output layout: Replicate is an
    all-reduce (g), ``Shard(d)`` a reduce-scatter.
    """

    default_input, default_output = Shard(-1), Replicate()

    def _shard(self, module, mesh):
        if isinstance(module, nn.Linear):
            distribute_param(module, "weight", Shard(1), mesh, self.src_data_rank)
            if module.bias is not None:
                distribute_param(module, "bias", Replicate(), mesh, self.src_data_rank)
                if self.output_layouts[0] != Replicate():  # each rank sums the bias grad over its own rows
                    bucket_for(mesh).register(module.bias)
            module.forward = types.MethodType(_partial_linear, module)
        else:
            distribute_param(module, "weight", Shard(0), mesh, self.src_data_rank)
            module.forward = types.MethodType(_vocab_parallel_embedding, module)

    @staticmethod
    def desired_input_layout(module) -> Placement:
        """A Linear wants its input split on the features, an Embedding wants all the ids."""
        return Shard(-1) if isinstance(module, nn.Linear) else Replicate()

    def _prepare_input(self, module, inputs, mesh):
        with module_scope(fqn(module)):
            x = to_layout(input_as_dtensor(inputs[0], mesh, self.input_layouts[0], self._input_shape(module, inputs[0], mesh)),
                          self.desired_input_layout(module))
        return (x.to_local(),)

    def _input_shape(self, module, x, mesh):
        if isinstance(module, nn.Linear) and isinstance(x, torch.Tensor) and self.input_layouts[0].is_shard():
            dim = self.input_layouts[0].dim % x.ndim
            if dim == x.ndim - 1:  # the feature dim: its global size is known
                return _shape_with(x, -1, module.in_features)
        return None

    def _prepare_output(self, module, out, mesh):  # out: [.., out], this rank's addend
        dt = DTensor.from_local(out, mesh, [Partial()])
        bias = getattr(module, "bias", None) if isinstance(module, nn.Linear) else None
        if bias is None:
            return self._finish(dt, module)  # g: all-reduce, or reduce-scatter
        with module_scope(fqn(module)):
            dt = to_layout(dt, self.output_layouts[0])  # g: all-reduce, or reduce-scatter
        place = dt.placements[0]
        # The bias split with the features is the table's Replicate -> Shard local chunk, taken by hand so
        # that its gradient stays a zero-padded partial sum for the bucket (grad_sync.py), not an all-gather.
        if isinstance(place, Shard) and place.dim == dt.ndim - 1:
            t, r = mesh.size(), mesh.get_local_rank()
            bias = bias.narrow(0, chunk_offset(bias.shape[0], t, r), chunk_sizes(bias.shape[0], t)[r])
        local = dt.to_local() + bias  # added once, after the reduction
        return local if self.use_local_output else DTensor.from_local(local, mesh, [place], shape=dt.shape)


def _partial_linear(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Rowwise Linear forward: ``x_local @ W_local^T``, a partial sum; the bias comes later."""
    return F.linear(x, self.weight)  # [.., in/t] @ [out, in/t]^T -> [.., out]


def _vocab_parallel_embedding(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """Rowwise Embedding forward: look up the ids in this rank's rows, zeros elsewhere.

    The sum over ranks (the reduction that follows) is the ordinary lookup.
    """
    layout = self.weight.tp_layout
    vocab, t, r = layout.shape[0], layout.mesh.size(), layout.mesh.get_local_rank()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise IndexError(f"'{fqn(self)}': token id out of range [0, {vocab}) (min {int(ids.min())}, max {int(ids.max())})")
    start, rows = chunk_offset(vocab, t, r), chunk_sizes(vocab, t)[r]
    outside = (ids < start) | (ids >= start + rows)
    local_ids = (ids - start).masked_fill(outside, 0)
    pad = self.padding_idx - start if self.padding_idx is not None and start <= self.padding_idx < start + rows else None
    if rows == 0:  # this rank holds no rows: every id is someone else's
        return self.weight.new_zeros((*ids.shape, self.embedding_dim)) + 0 * self.weight.sum()
    out = F.embedding(local_ids, self.weight, pad, self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse)
    return out.masked_fill(outside.unsqueeze(-1), 0.0)  # [.., dim], this rank's addend

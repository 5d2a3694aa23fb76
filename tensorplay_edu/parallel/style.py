"""ColwiseParallel and RowwiseParallel: Megatron's column- and row-split layers.

Each style does three things, as in PyTorch: shard the parameters, convert the input
in a forward pre-hook, convert the output in a forward hook.  The module's own forward
runs on plain local tensors and local parameters.  All communication is a DTensor
``redistribute`` (the transition table), so the collectives below are rows of it:

=====================================  ==================  ================================
layer (default layouts)                forward             backward
=====================================  ==================  ================================
Colwise Linear, input Replicate        nothing             all-reduce of the input grad (f)
Rowwise Linear, output Replicate       all-reduce (f̄)      nothing
Colwise, input Shard(s) (seq. par.)    all-gather (g)      reduce-scatter
Rowwise, output Shard(s) (seq. par.)   reduce-scatter (ḡ)  all-gather
=====================================  ==================  ================================

Megatron-LM's operators are these rows (Korthikanti et al.'s letters): f is :func:`megatron_f` (the input
read with its gradient declared Partial), f̄ the Rowwise Partial -> Replicate, g and ḡ the SP pair.
A fusion (``FUSIONS`` below) may run a gather or a reduce-scatter together with its matmuls.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F
from torch import nn

from ..debug import current_module, module_scope
from ..dtensor import DTensor
from ..mesh import DeviceMesh
from ..placement import Partial, Placement, Replicate, Shard, chunk_offset, chunk_sizes
from .base import ParallelStyle, claim, fqn, one_placement
from .grad_sync import partial_gradient
from .init import install_reset_parameters
from .own_forward import (overrides_forward, partial_gradients_of_extras, partial_own_forward, refuse_whole_row_options,
                          vocab_parallel_embedding)
from .params import buffers_to_mesh, distribute_param
from .rng import follow_layout

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "megatron_f", "FUSIONS", "FusedInput"]


def input_as_dtensor(x, mesh: DeviceMesh, layout: Placement, shape=None) -> DTensor:
    """A module input as a DTensor: a DTensor as it is, a plain tensor declared ``layout``."""
    if isinstance(x, DTensor):
        return x
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"expecting a torch.Tensor or DTensor input, got {type(x).__name__}")
    if type(x).__module__.startswith("torch.distributed.tensor"):
        raise TypeError(f"'{current_module() or 'a parallelized module'}' got PyTorch's torch.distributed.tensor.DTensor"
                        f" (placements {list(x.placements)}): tensorplay_edu's styles take plain tensors or "
                        "tensorplay_edu DTensors. Use one library for the whole model, or pass x.full_tensor() / "
                        "x.to_local().")
    return DTensor.from_local(x, mesh, [layout], shape=shape)


def to_layout(dt: DTensor, layout: Placement) -> DTensor:
    """``dt`` redistributed to ``layout`` if it is not there already (negative dims normalised)."""
    target = layout.normalized(dt.ndim) if isinstance(layout, Shard) else layout
    return dt if dt.placements == (target,) else dt.redistribute(placements=(target,))


def _shape_with(local: torch.Tensor, dim: int, size: int) -> list[int]:
    shape = list(local.shape)
    shape[dim % local.ndim] = size
    return shape


class _LinearOrEmbedding(ParallelStyle):
    def __init__(self, *, input_layouts: Placement | None = None, output_layouts: Placement | None = None,
                 use_local_output: bool = True):
        one_placement(self, input_layouts=input_layouts, output_layouts=output_layouts)
        self.input_layouts = (input_layouts or self.default_input,)
        self.output_layouts = (output_layouts or self.default_output,)
        self.use_local_output = use_local_output

    def __repr__(self):
        return (f"{type(self).__name__}(input_layouts={self.input_layouts}, output_layouts={self.output_layouts}, "
                f"use_local_output={self.use_local_output})")

    claims = ("shard",)

    def _validate(self, module: nn.Module) -> None:
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            raise NotImplementedError(
                f"{type(self).__name__} currently only support nn.Linear and nn.Embedding! "
                f"'{fqn(module)}' is a {type(module).__name__}; give it another style or leave it out of the plan")
        if isinstance(module, nn.Embedding):
            refuse_whole_row_options(self, module, fqn(module), rowwise=isinstance(self, RowwiseParallel))
        super()._validate(module)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        claim(self, module)
        self._shard(module, device_mesh)
        install_reset_parameters(module)  # reset_parameters() draws the whole weight, keeps this rank's piece
        buffers_to_mesh(module, device_mesh)
        module.register_forward_pre_hook(lambda mod, inputs: self._prepare_input(mod, inputs, device_mesh))
        module.register_forward_hook(lambda mod, inputs, out: self._output_hook(mod, inputs, out, device_mesh))
        return module

    def _output_hook(self, module, inputs, out, mesh):
        out = self._prepare_output(module, out, mesh, inputs)
        follow_layout(isinstance(self.output_layouts[0], Shard), module, mesh, out)  # dropout masks after it
        return out

    def _input_shape(self, module, x, mesh):
        """A plain input sharded on a Linear's features: its global shape is known (uneven pieces too)."""
        if isinstance(module, nn.Linear) and isinstance(x, torch.Tensor) and self.input_layouts[0].is_shard():
            dim = self.input_layouts[0].dim % x.ndim
            if dim == x.ndim - 1:
                return _shape_with(x, -1, module.in_features)
        return None

    def _finish(self, dt: DTensor, module: nn.Module):
        """Output DTensor -> the declared output layout -> local tensor if asked."""
        with module_scope(fqn(module)):
            dt = to_layout(dt, self.output_layouts[0])  # from Partial: f̄ (all-reduce) or ḡ (reduce-scatter)
        return dt.to_local() if self.use_local_output else dt


_REPLICATED, _PARTIAL = (Replicate(),), (Partial(),)  # compared with, and declared, in every forward


class ColwiseParallel(_LinearOrEmbedding):
    """Split the output features: Linear weight and bias on Shard(0), Embedding weight on Shard(1).

    Input Replicate (the input gradient is a partial sum, reduced by one all-reduce: f);
    output sharded on the last dim, ``Shard(-1)``.
    """

    default_input, default_output = Replicate(), Shard(-1)
    desired_input_layouts = (Replicate(),)

    def param_placements(self, module):
        dim = 0 if isinstance(module, nn.Linear) else 1  # the output features: [out, in] or [vocab, dim]
        return {(module, name): Shard(dim) for name, p in module.named_parameters(recurse=False)
                if name in ("weight", "bias")}  # a subclass's own parameters stay whole (own_forward.py)

    def _shard(self, module, mesh):
        for (_, name), placement in self.param_placements(module).items():
            distribute_param(module, name, placement, mesh, self.src_data_rank)
        if _own_forward(module):
            partial_gradients_of_extras(module, mesh, fqn(module))  # they read this rank's output features only
        if isinstance(module, nn.Linear):  # it may read a FusedInput (see FUSIONS)
            module._tp_colwise = True
            module.forward = types.MethodType(_colwise_linear, module)

    def _prepare_input(self, module, inputs, mesh):
        x = inputs[0]
        if isinstance(x, FusedInput):  # gathered together with its readers' matmuls (see FUSIONS)
            return inputs
        if not (isinstance(x, DTensor) and x.placements == _REPLICATED):  # else whole already: nothing moves
            with module_scope(fqn(module)):
                x = input_as_dtensor(x, mesh, self.input_layouts[0], self._input_shape(module, x, mesh))
                if isinstance(x.placements[0], Shard) and (stand_in := fused("gather", module, x, mesh)) is not None:
                    return (stand_in,)  # (a fusion gathers it with the matmul)
                x = to_layout(x, Replicate())  # [.., in]; from Shard(s): all-gather (its backward: reduce-scatter)
        # x @ W_local^T: each rank's input gradient is an addend, so reading x is Megatron's f.
        return (megatron_f(x) if isinstance(module, nn.Linear) else x.to_local(),)

    def _prepare_output(self, module, out, mesh, inputs=None):  # out: [.., out/t]
        layout = self.output_layouts[0]
        if self.use_local_output and (layout.is_shard(-1) or layout.is_shard(out.ndim - 1)):
            return out  # already the declared layout: a DTensor made and unmade here would do nothing
        features = module.out_features if isinstance(module, nn.Linear) else module.embedding_dim
        dt = DTensor.from_local(out, mesh, [Shard(-1)], shape=_shape_with(out, -1, features))
        return self._finish(dt, module)


class RowwiseParallel(_LinearOrEmbedding):
    """Split the input features: Linear weight on Shard(1), bias replicated and added once,
    after the reduction; Embedding weight on Shard(0), a vocab-parallel lookup.

    Input ``Shard(-1)`` for a Linear (an Embedding takes ``input_layouts=Replicate()``);
    the local result is a partial sum, reduced to the output layout: Replicate is an
    all-reduce (f̄), ``Shard(d)`` a reduce-scatter (ḡ).
    """

    default_input, default_output = Shard(-1), Replicate()

    def param_placements(self, module):
        if isinstance(module, nn.Linear):  # the input features; the bias is added once, whole
            return {(module, "weight"): Shard(1), **({(module, "bias"): Replicate()} if module.bias is not None else {})}
        return {(module, "weight"): Shard(0)}  # the vocabulary

    def _shard(self, module, mesh):
        for (_, name), placement in self.param_placements(module).items():
            distribute_param(module, name, placement, mesh, self.src_data_rank)
        if _own_forward(module):
            partial_gradients_of_extras(module, mesh, fqn(module))  # a subclass's own parameters: addends too
        if isinstance(module, nn.Linear):
            if module.bias is not None and isinstance(self.output_layouts[0], Shard) and not _own_forward(module):
                partial_gradient(module, "bias", mesh, f"{fqn(module)}.bias")  # each rank sums its own rows
            module.forward = functools.partial(_partial_linear, module, mesh, self.output_layouts[0])
        else:
            module.forward = types.MethodType(vocab_parallel_embedding, module)

    @staticmethod
    def desired_input_layout(module) -> Placement:
        """A Linear wants its input split on the features, an Embedding wants all the ids."""
        return Shard(-1) if isinstance(module, nn.Linear) else Replicate()

    def _prepare_input(self, module, inputs, mesh):
        x, layout = inputs[0], self.input_layouts[0]
        if (isinstance(module, nn.Linear) and isinstance(x, torch.Tensor) and x.ndim
                and (layout.is_shard(-1) or layout.is_shard(x.ndim - 1)) and x.shape[-1] == module.weight.shape[1]):
            return inputs  # this rank's features already [.., in/t]: a DTensor made and unmade would do nothing
        with module_scope(fqn(module)):
            x = to_layout(input_as_dtensor(inputs[0], mesh, self.input_layouts[0], self._input_shape(module, inputs[0], mesh)),
                          self.desired_input_layout(module))
        return (x.to_local(),)

    def _prepare_output(self, module, out, mesh, inputs=None):  # out: [.., out], this rank's addend (or reduced by a fusion)
        dt = out if isinstance(out, DTensor) else DTensor.from_local(out, mesh, [Partial()])
        bias = getattr(module, "bias", None) if isinstance(module, nn.Linear) else None
        if bias is None or _own_forward(module):  # (a subclass's forward took its bias in, on rank 0)
            return self._finish(dt, module)  # f̄: all-reduce, or ḡ: reduce-scatter
        if isinstance(self.output_layouts[0], Shard):  # no-op unless the bias was replaced since
            partial_gradient(module, "bias", mesh, f"{fqn(module)}.bias")
        with module_scope(fqn(module)):
            dt = to_layout(dt, self.output_layouts[0])  # f̄ (Megatron's 2019 g): Partial -> Replicate, an all-reduce
        return self._add_bias(dt, bias, mesh)  # (or Partial -> Shard(1), a reduce-scatter, under SP)

    def _add_bias(self, dt: DTensor, bias: torch.Tensor, mesh) -> DTensor | torch.Tensor:
        """The reduced output plus the (replicated) bias, added once."""
        place = dt.placements[0]
        # The bias split with the features is the table's Replicate -> Shard local chunk, taken by hand so
        # that its gradient stays a zero-padded partial sum, reduced by grad_sync.py, not an all-gather.
        if isinstance(place, Shard) and place.dim == dt.ndim - 1:
            t, r = mesh.size(), mesh.get_local_rank()
            bias = bias.narrow(0, chunk_offset(bias.shape[0], t, r), chunk_sizes(bias.shape[0], t)[r])
        if isinstance(place, Partial):  # no reduction yet: the bias joins the addends once, Replicate -> Partial
            bias = DTensor.from_local(bias, mesh, [Replicate()]).redistribute(placements=[Partial()]).to_local()
        local = dt.to_local() + bias  # added once, after the reduction (or as rank 0's addend)
        return local if self.use_local_output else DTensor.from_local(local, mesh, [place], shape=dt.shape)


def _partial_linear(self: nn.Linear, mesh: DeviceMesh, output: Placement, x: torch.Tensor):
    """Rowwise Linear forward: ``x_local @ W_local^T``, a partial sum; the bias comes later.

    A module with a ``partial_forward`` (its own product without the bias) runs that; one with a
    forward of its own runs it on this rank's columns (own_forward.py).  A fusion may run the
    matmul together with its reduce-scatter, and hand back the reduced DTensor."""
    if isinstance(output, Shard):
        dim = output.normalized(x.ndim).dim
        with module_scope(fqn(self)):
            local = fused("matmul_reduce_scatter", self, x, mesh, dim)  # [.., s/t, out], reduced
        if local is not None:
            return DTensor.from_local(local, mesh, [Shard(dim)], shape=[*x.shape[:-1], self.weight.shape[0]])
    if hasattr(self, "partial_forward"):
        return self.partial_forward(x)
    if _own_forward(self):
        return partial_own_forward(self, mesh, x)  # a subclass's forward on this rank's columns
    return F.linear(x, self.weight)  # [.., in/t] @ [out, in/t]^T -> [.., out]


def _own_forward(module: nn.Module) -> bool:
    """A Linear or Embedding subclass with a forward of its own (and no ``partial_forward``)."""
    base = nn.Linear if isinstance(module, nn.Linear) else nn.Embedding
    return overrides_forward(module, base) and not hasattr(module, "partial_forward")


def megatron_f(x: DTensor) -> torch.Tensor:
    """Megatron's f: forward, the replicated input itself; backward, the readers' gradients (each rank's
    addend) all-reduced: the table's Partial -> Replicate row.  Readers of ONE DTensor share one f
    (wq/wk/wv under PrepareModuleInput(use_local_output=False)): one all-reduce for their sum."""
    return x.to_local(grad_placements=_PARTIAL)


# ---- plug-in points: a collective fused with its matmuls -------------------------------------
# A fusion (the overlapped rings register one) runs a row of the table with the matmuls beside it: how the
# row runs changes, not its values (up to a sum's order). A method returns None where it does not apply:
#   gather(module, x, mesh)                      x, a sharded DTensor its Colwise Linears read: a FusedInput
#   matmul_reduce_scatter(module, x, mesh, dim)  a Rowwise Linear's product, reduced onto Shard(dim)
FUSIONS: list = []


class FusedInput:
    """A stand-in for a gathered input (``.shape``: the gathered shape): its gather runs with its
    readers' matmuls, and each Colwise Linear that reads it asks it for its output."""

    def output_for(self, module: nn.Linear) -> torch.Tensor:
        raise NotImplementedError


def _colwise_linear(self: nn.Linear, x) -> torch.Tensor:
    """A Colwise Linear's forward: its own, or its output from a FusedInput."""
    return x.output_for(self) if isinstance(x, FusedInput) else type(self).forward(self, x)


def fused(step: str, *args):
    """The first registered fusion's result for ``step``, or None (then the plain code runs)."""
    for fusion in FUSIONS:
        out = getattr(fusion, step)(*args)
        if out is not None:
            return out
    return None

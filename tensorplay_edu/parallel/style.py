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

A ``Float8Linear`` under these (high-precision) styles computes what torchao computes under
PyTorch's plain styles, rather than an error: the amax of every tensor the style cuts (the
weight shard; a Rowwise input; a Colwise output gradient) is taken over the TP group, the
row-split matmul runs in float8 too, and every collective moves high precision.  Only the
float8 styles (:mod:`tensorplay_edu.float8.float8_tensor_parallel`) move activations in float8.
torchtitan's rowwise float8 recipes put Float8Linears under these styles, so that must work.
"""

from __future__ import annotations

import dataclasses
import functools
import types

import torch
import torch.nn.functional as F
from torch import nn

from ..debug import current_module, module_scope
from ..dtensor import DTensor
from ..mesh import DeviceMesh
from ..placement import Partial, Placement, Replicate, Shard, chunk_offset, chunk_sizes
from ..async_tp.ring import MatmulReduceScatter, RingInput, is_async, ring_ok, ring_ok_rows
from ..async_tp.ring import logger as async_logger
from .grad_sync import partial_gradient
from .init import install_reset_parameters
from .own_forward import overrides_forward, partial_gradients_of_extras, partial_own_forward, vocab_parallel_embedding
from .params import attach_own_layouts, buffers_to_mesh, distribute_param
from .rng import follow_layout

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel"]


class ParallelStyle:
    """A way to parallelize one module: subclasses implement ``_apply(module, device_mesh)``.

    ``claims`` names what a style takes over on a module: ``"shard"`` (its parameters and
    forward), ``"input"`` or ``"output"`` (a hook converting them).  Each may be taken once:
    a second style claiming the same thing would shard twice or convert twice.
    ``_validate`` raises, without changing anything, the errors ``_apply`` would raise, so
    that ``parallelize_module`` can check a whole plan before it shards anything.
    """

    src_data_rank: int | None = 0
    claims: tuple[str, ...] = ()

    def _validate(self, module: nn.Module) -> None:
        for claim in self.claims:
            taken = getattr(module, "_tp_claims", {}).get(claim)
            if taken:
                raise RuntimeError(_TWICE[claim].format(style=type(self).__name__, path=fqn(module), by=taken))

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        raise NotImplementedError

    def param_placements(self, module: nn.Module) -> dict[tuple[nn.Module, str], Placement] | None:
        """Where ``_apply`` will put each parameter it shards, ``{(owner, name): placement}``
        (``{}``: it shards none; ``None``: unknown).  parallelize_module checks tied weights with it."""
        return None


_TWICE = {
    "shard": "distribute_module should only be called once on a module, but it has already been called on this "
             "module! ({style} on '{path}', already parallelized by {by})",
    "input": "{style} on '{path}': its inputs are already converted by {by}; a second input hook would convert "
             "them twice (e.g. gather twice). Use one PrepareModuleInput per module.",
    "output": "{style} on '{path}': its outputs are already converted by {by}; a second output hook would convert "
              "them twice. Use one PrepareModuleOutput per module.",
}


def fqn(module: nn.Module) -> str:
    """The module's path as parallelize_module saw it (its class name otherwise)."""
    return getattr(module, "_tp_fqn", "") or type(module).__name__


def claim(style: ParallelStyle, module: nn.Module) -> None:
    """Check that ``style`` may be applied to ``module``, then record what it takes over."""
    style._validate(module)
    if not hasattr(module, "_tp_claims"):
        module._tp_claims = {}
    for what in style.claims:
        module._tp_claims[what] = type(style).__name__


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
        for arg, value in (("input_layouts", input_layouts), ("output_layouts", output_layouts)):
            if value is not None and not isinstance(value, Placement):  # caught here, not at the first forward
                kind = f"a {type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list)) else \
                    f"{value!r}, a {type(value).__name__}"
                raise TypeError(f"{type(self).__name__}({arg}=...) takes one Placement (the layout on the 1-D TP "
                                f"mesh), got {kind}: e.g. {arg}=Shard(-1) or {arg}=Replicate()")
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
        cut = [o for o in ("max_norm",) + (("scale_grad_by_freq",) if isinstance(self, RowwiseParallel) else ())
               if isinstance(module, nn.Embedding) and getattr(module, o)]
        if cut:  # each rank would renormalise its part of a row / count other ranks' ids as row 0's
            raise NotImplementedError(f"{type(self).__name__} on '{fqn(module)}': nn.Embedding({cut[0]}=...) reads "
                                      "whole rows or every id, which this rank's piece does not hold; leave the "
                                      "embedding whole (out of the plan), or drop the option")
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
            dt = to_layout(dt, self.output_layouts[0])
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
        if isinstance(module, nn.Linear):  # a reader of a (maybe ring-gathered, see async_tp/ring.py) input
            module._tp_colwise = True
            module.forward = types.MethodType(_colwise_linear, module)
        if hasattr(module, "float8_spec"):  # a Float8Linear: its weight rows and output columns are cut, so their
            cut = (mesh, (0,))  # amaxes are taken over the TP group (communication stays in high precision)
            module.float8_spec = dataclasses.replace(module.float8_spec, weight_cut=cut, grad_cut=cut)

    def _prepare_input(self, module, inputs, mesh):
        attach_own_layouts(module)  # no-op unless the parameters were replaced (to_empty, assign=True)
        x = inputs[0]
        if isinstance(x, RingInput):  # its all-gather runs fused with its readers' matmuls
            return inputs
        if not (isinstance(x, DTensor) and x.placements == _REPLICATED):  # else whole already: nothing moves
            with module_scope(fqn(module)):
                x = input_as_dtensor(x, mesh, self.input_layouts[0], self._input_shape(module, x, mesh))
                if isinstance(module, nn.Linear) and isinstance(x.placements[0], Shard) and ring_ok(x, [module], mesh):
                    return (ring_input(x, mesh, [module], fqn(module)),)  # async TP: gather fused with the matmul
                x = to_layout(x, Replicate())  # [.., in]
        # x @ W_local^T: each rank's input gradient is an addend (Partial), so reading x is Megatron's f.
        # Readers of ONE DTensor share one f: hand wq/wk/wv the same DTensor (PrepareModuleInput on their
        # parent, use_local_output=False) and their gradients are summed before a single all-reduce.
        grad = _PARTIAL if isinstance(module, nn.Linear) else None
        return (x.to_local(grad_placements=grad),)

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
    all-reduce (g), ``Shard(d)`` a reduce-scatter.
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
            if module.bias is not None and self.output_layouts[0] != Replicate() and not _own_forward(module):
                partial_gradient(module, "bias", mesh, f"{fqn(module)}.bias")  # each rank sums its own rows
            module.forward = functools.partial(_partial_linear, module, mesh, self.output_layouts[0])
            if hasattr(module, "float8_spec"):  # a Float8Linear: input columns and weight columns are cut, so their
                cut = (mesh, (0,))  # amaxes are taken over the TP group; the partial sum is reduced in high precision
                module.float8_spec = dataclasses.replace(module.float8_spec, input_cut=cut, weight_cut=cut)
        else:
            module.forward = types.MethodType(vocab_parallel_embedding, module)

    @staticmethod
    def desired_input_layout(module) -> Placement:
        """A Linear wants its input split on the features, an Embedding wants all the ids."""
        return Shard(-1) if isinstance(module, nn.Linear) else Replicate()

    def _prepare_input(self, module, inputs, mesh):
        attach_own_layouts(module)  # no-op unless the parameters were replaced (to_empty, assign=True)
        x, layout = inputs[0], self.input_layouts[0]
        if (isinstance(module, nn.Linear) and isinstance(x, torch.Tensor) and x.ndim
                and (layout.is_shard(-1) or layout.is_shard(x.ndim - 1)) and x.shape[-1] == module.weight.shape[1]):
            return inputs  # this rank's features already [.., in/t]: a DTensor made and unmade would do nothing
        with module_scope(fqn(module)):
            x = to_layout(input_as_dtensor(inputs[0], mesh, self.input_layouts[0], self._input_shape(module, inputs[0], mesh)),
                          self.desired_input_layout(module))
        return (x.to_local(),)

    def _prepare_output(self, module, out, mesh, inputs=None):  # out: [.., out], this rank's addend (or reduced: async)
        dt = out if isinstance(out, DTensor) else DTensor.from_local(out, mesh, [Partial()])
        bias = getattr(module, "bias", None) if isinstance(module, nn.Linear) else None
        if bias is None or _own_forward(module):  # (a subclass's forward took its bias in, on rank 0)
            return self._finish(dt, module)  # g: all-reduce, or reduce-scatter
        if self.output_layouts[0] != Replicate():  # no-op unless the bias was replaced since
            partial_gradient(module, "bias", mesh, f"{fqn(module)}.bias")
        with module_scope(fqn(module)):
            dt = to_layout(dt, self.output_layouts[0])  # g: all-reduce, or reduce-scatter
        return self._add_bias(dt, bias, mesh)

    def _add_bias(self, dt: DTensor, bias: torch.Tensor, mesh) -> DTensor | torch.Tensor:
        """The reduced output plus the (replicated) bias, added once."""
        place = dt.placements[0]
        # The bias split with the features is the table's Replicate -> Shard local chunk, taken by hand so
        # that its gradient stays a zero-padded partial sum, reduced by grad_sync.py, not an all-gather.
        if isinstance(place, Shard) and place.dim == dt.ndim - 1:
            t, r = mesh.size(), mesh.get_local_rank()
            bias = bias.narrow(0, chunk_offset(bias.shape[0], t, r), chunk_sizes(bias.shape[0], t)[r])
        local = dt.to_local() + bias  # added once, after the reduction
        return local if self.use_local_output else DTensor.from_local(local, mesh, [place], shape=dt.shape)


def _partial_linear(self: nn.Linear, mesh: DeviceMesh, output: Placement, x: torch.Tensor):
    """Rowwise Linear forward: ``x_local @ W_local^T``, a partial sum; the bias comes later.

    Under async TP with a sharded output the matmul and its reduce-scatter run as one ring
    (async_tp/ring.py) and come back reduced, as a DTensor.  A Float8Linear runs its float8 matmul
    (the reduction that follows stays in high precision, and synchronous)."""
    if hasattr(self, "float8_spec"):
        if isinstance(output, Shard) and is_async(mesh):
            async_logger.info("async TP: %s runs the synchronous reduce-scatter: a Float8Linear under the "
                              "high-precision RowwiseParallel (its float8 matmul runs in its own forward)", fqn(self))
        return self.partial_forward(x)
    if isinstance(output, Shard) and ring_ok_rows(output.normalized(x.ndim).dim, x.shape, mesh, fqn(self), self):
        dim = output.normalized(x.ndim).dim
        with module_scope(fqn(self)):
            local = MatmulReduceScatter.apply(x, self.weight, mesh, dim)  # [.., s/t, out]
        return DTensor.from_local(local, mesh, [Shard(dim)], shape=[*x.shape[:-1], self.weight.shape[0]])
    if _own_forward(self):
        return partial_own_forward(self, mesh, x)  # a subclass's forward on this rank's columns
    return F.linear(x, self.weight)  # [.., in/t] @ [out, in/t]^T -> [.., out]


def _own_forward(module: nn.Module) -> bool:
    """A Linear or Embedding subclass with a forward of its own (a Float8Linear has its partial_forward)."""
    base = nn.Linear if isinstance(module, nn.Linear) else nn.Embedding
    return overrides_forward(module, base) and not hasattr(module, "float8_spec")


def _colwise_linear(self: nn.Linear, x) -> torch.Tensor:
    """A Colwise Linear's forward: its own, or its output from a ring-fused all-gather (async TP)."""
    if isinstance(x, RingInput):
        return x.output_for(self)
    return type(self).forward(self, x)


def ring_input(x: DTensor, mesh: DeviceMesh, readers: list, owner: str) -> RingInput:
    """A sequence-sharded DTensor, to be gathered by a ring fused with ``readers``' matmuls."""
    dim = x.placements[0].dim
    return RingInput(x.to_local(), mesh, dim, chunk_sizes(x.shape[dim], mesh.size()), readers, owner)

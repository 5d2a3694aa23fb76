"""Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput: tensor parallelism
whose activations travel in float8 (torchao's ``torchao.float8.float8_tensor_parallel``).

Parameters are sharded exactly as by ColwiseParallel / RowwiseParallel; the modules must be
:class:`~tensorplay_edu.float8.Float8Linear`.  What changes is *when* a tensor becomes
float8: **before** it is gathered, while it is still sharded, with one scale for the whole
tensor (its global amax: a max all-reduce of one number).  Every rank then holds exactly its
piece of the single-device float8 tensor, and the all-gather moves 1 byte per element:

================================  =====================  ====================================
collective (sequence parallelism)  moves                  why
================================  =====================  ====================================
all-gather of a block input        e4m3 (forward)         cast while sequence-sharded; shared
                                                          by wq/wk/wv (w1/w3): one gather
reduce-scatter after wo / w2       high precision (fwd)   a sum: float8 cannot add partial sums
                                                          without rounding each addend again
all-gather of wo / w2's output     e5m2 (backward)        the gradient is cast while sharded,
gradient                                                  then gathered
reduce-scatter of a block input's  high precision (bwd)   a sum again (wq + wk + wv's partial
gradient                                                  input gradients, over the ranks)
amax all-reduces (max, 1 number)   float32                one per sharded tensor cast: block
                                                          input, rowwise input, weight shard,
                                                          sharded output gradient
================================  =====================  ====================================

Without sequence parallelism (inputs replicated) nothing is gathered in float8: replicated
tensors are cast locally (their amax is already global) and the all-reduces stay in high
precision.  The weights' float8 copies are cast with a global amax in forward and reused in
backward (torchao casts them again, with another amax all-reduce each).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from .. import debug
from ..dtensor import DTensor
from ..async_tp.fusion import ring_input, ring_ok
from ..async_tp.ring import RingInput, all_gather_matmul, input_grad_ring
from ..parallel.prepare import PrepareModuleInput
from ..parallel.base import fqn
from ..parallel.style import ColwiseParallel, RowwiseParallel, input_as_dtensor
from ..placement import Partial, Replicate, Shard
from ..transition import redistribute_local
from .float8_linear import Float8Input, Float8Linear, float8_mm
from .scaling import E4M3, E5M2, Scaled, quantize

__all__ = ["Float8ColwiseParallel", "Float8RowwiseParallel", "PrepareFloat8ModuleInput"]


def _require_float8(style, module: nn.Module) -> None:
    if not isinstance(module, Float8Linear):
        raise ValueError(f"Expecting module to be Float8Linear but found {type(module)} ({type(style).__name__} on "
                         f"'{fqn(module)}': convert the model with convert_to_float8_training first)")


class _Float8Gather(torch.autograd.Function):
    """Forward: this rank's shard cast to e4m3 with the global amax, then all-gathered as float8.
    Backward: the (summed, partial) input gradient reduce-scattered in high precision."""

    @staticmethod
    def forward(ctx, x, mesh, src: Shard, shape, power_of_2=False):
        x8 = quantize(x, E4M3, (mesh, (0,)), power_of_2)  # [b, s/t, h] -> float8, one global scale
        data = redistribute_local(x8.data, mesh, (src,), (Replicate(),), shape)  # [b, s, h]: all-gather, 1 B/elem
        ctx.mesh, ctx.src, ctx.shape, ctx.module = mesh, src, shape, debug.current_module()
        ctx.mark_non_differentiable(data, x8.scale)
        carrier = x.new_zeros(()).expand(shape)  # the gradients' way back: no memory, values never read
        return carrier, data, x8.scale

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, _data, _scale):
        with debug.backward_scope(ctx.module):
            grad = redistribute_local(grad, ctx.mesh, (Partial(),), (ctx.src,), ctx.shape)  # [b, s/t, h]
        return grad, None, None, None, None


class _Float8GatherMatmul(torch.autograd.Function):
    """Async TP with float8 readers: the e4m3 chunks of the block input travel the gather ring,
    each multiplied by every reader's float8 weight; backward, the readers' e5m2 gradients give
    the input gradient through the reduce-scatter ring (async_tp/ring.py: only the matmul differs)."""

    @staticmethod
    def forward(ctx, x, mesh, dim: int, sizes: list[int], specs: tuple, *weights):
        x8 = quantize(x, E4M3, (mesh, (0,)), specs[0].power_of_2)  # [b, s/t, h]: one global scale
        w8s = [quantize(w, E4M3, spec.weight_cut, spec.power_of_2) for w, spec in zip(weights, specs)]

        def times(w8, spec):  # a chunk [b, s_c, h] in e4m3 -> [b, s_c, o/t] in x's dtype
            return lambda chunk: float8_mm(chunk.reshape(-1, chunk.shape[-1]), x8.scale, w8.data.t(), w8.scale,
                                           x.dtype, spec.emulate).view(*chunk.shape[:-1], -1)

        gathered, outs = all_gather_matmul(x8.data, dim, sizes, mesh, [times(w8, sp) for w8, sp in zip(w8s, specs)])
        ctx.save_for_backward(gathered, x8.scale, *[w.data for w in w8s], *[w.scale for w in w8s])
        ctx.mesh, ctx.dim, ctx.sizes, ctx.specs, ctx.module = mesh, dim, sizes, specs, debug.current_module()
        ctx.dtypes = (x.dtype, [w.dtype for w in weights])
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        gathered, x_scale, *w = ctx.saved_tensors
        n = len(ctx.specs)
        w_data, w_scale, (x_dtype, w_dtypes) = w[:n], w[n:], ctx.dtypes
        specs = ctx.specs
        with debug.backward_scope(ctx.module):
            g8s = [None if g is None else quantize(g, E5M2, spec.grad_cut, spec.power_of_2)
                   for g, spec in zip(grads, specs)]

            def times_w(j, rows):  # e5m2 rows of g_j @ W_j in float8, in x's dtype
                return float8_mm(rows.reshape(-1, rows.shape[-1]), g8s[j].scale, w_data[j], w_scale[j], x_dtype,
                                 specs[j].emulate).view(*rows.shape[:-1], -1)

            grad_x = input_grad_ring([None if g8 is None else g8.data for g8 in g8s], ctx.dim, ctx.sizes,
                                     gathered.shape, ctx.mesh, times_w,
                                     lambda shape: torch.zeros(shape, dtype=x_dtype, device=gathered.device))
        x2 = gathered.reshape(-1, gathered.shape[-1])
        grad_w = [None if g8 is None else float8_mm(g8.data.reshape(-1, g8.data.shape[-1]).t(), g8.scale, x2, x_scale,
                                                   dt, spec.emulate) for g8, dt, spec in zip(g8s, w_dtypes, specs)]
        return (grad_x, None, None, None, None, *grad_w)


class Float8RingInput(RingInput):
    """A RingInput whose readers are Float8Linears: the chunks travel in e4m3."""

    def _run(self):
        return _Float8GatherMatmul.apply(self.shard, self.mesh, self.dim, self.sizes,
                                         tuple(m.spec for m in self.readers), *[m.weight for m in self.readers])


def to_float8_input(x, layout, desired, mesh, power_of_2: bool = False) -> Float8Input:
    """A module input laid out as ``layout``, cast to e4m3 where it is, then moved to ``desired``
    (Shard -> Replicate: a float8 all-gather; Replicate stays: a local cast, no amax to share)."""
    dt = input_as_dtensor(x, mesh, layout)
    src, dst = dt.placements[0], desired if desired is not None else layout
    if isinstance(src, Shard) and dst == Replicate():
        carrier, data, scale = _Float8Gather.apply(dt.to_local(), mesh, src, dt.shape, power_of_2)
        return Float8Input(carrier, Scaled(data, scale))
    if src == Replicate() and dst == Replicate():
        carrier = dt.to_local(grad_placements=[Partial()])  # its readers' gradients are partial: Megatron's f
        return Float8Input(carrier, quantize(carrier.detach(), E4M3, None, power_of_2))
    raise NotImplementedError(f"float8 input from {src!r} to {dst!r}: only Shard -> Replicate (a float8 all-gather) "
                              "and Replicate are implemented")


class Float8ColwiseParallel(ColwiseParallel):
    """ColwiseParallel for a Float8Linear: its weight shard's amax and its output gradient's amax
    are global; a sharded input is cast before it is gathered."""

    def _validate(self, module: nn.Module) -> None:
        _require_float8(self, module)
        super()._validate(module)

    # (ColwiseParallel itself gives a Float8Linear global amaxes for its cut weight and output gradient)

    def _prepare_input(self, module, inputs, mesh):
        x = inputs[0]
        if isinstance(x, Float8Input):  # cast (and gathered) already, by PrepareFloat8ModuleInput
            return (x,)
        layout = x.placements[0] if isinstance(x, DTensor) else self.input_layouts[0]
        if isinstance(layout, Shard):
            with debug.module_scope(fqn(module)):
                return (to_float8_input(x, self.input_layouts[0], Replicate(), mesh, module.float8_spec.power_of_2),)
        return super()._prepare_input(module, inputs, mesh)  # replicated: cast inside the matmul, locally


class Float8RowwiseParallel(RowwiseParallel):
    """RowwiseParallel for a Float8Linear: its (feature-sharded) input, weight shard and a
    sequence-sharded output gradient get global amaxes; the reduction of the partial output
    happens inside the float8 matmul, in high precision, and its backward gathers in e5m2."""

    def _validate(self, module: nn.Module) -> None:
        _require_float8(self, module)
        super()._validate(module)

    def _shard(self, module, mesh):
        super()._shard(module, mesh)
        del module.forward  # Float8Linear.forward: its matmul reduces (RowwiseParallel's partial forward is not used)
        # (its amax cuts follow from the column-split weight: Float8Linear.spec)
        module.float8_spec = replace(module.float8_spec, reduce=(mesh, self.output_layouts[0]))

    def _prepare_output(self, module, out, mesh, inputs=None):  # out: reduced already, laid out as output_layouts
        place = self.output_layouts[0]
        place = place.normalized(out.ndim) if isinstance(place, Shard) else place
        x = inputs[0] if inputs else None  # [.., s, in/t]: its rows are the output's whole rows (uneven too)
        rows = x.carrier if isinstance(x, Float8Input) else x
        shape = [*rows.shape[:-1], module.out_features] if isinstance(rows, torch.Tensor) else None
        dt = DTensor.from_local(out, mesh, [place], shape=shape)
        if module.bias is None:
            return dt.to_local() if self.use_local_output else dt
        return self._add_bias(dt, module.bias, mesh)


class PrepareFloat8ModuleInput(PrepareModuleInput):
    """PrepareModuleInput whose inputs are cast to e4m3 before they move: the Shard -> Replicate
    all-gather moves float8, once for all the Float8Linears that read the input."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_output: bool = False,
                 float8_dtype: torch.dtype = torch.float8_e4m3fn, fwd_config_submodule_fqn: str | None = None):
        super().__init__(input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
                         input_kwarg_layouts=input_kwarg_layouts, desired_input_kwarg_layouts=desired_input_kwarg_layouts,
                         use_local_output=use_local_output)
        if float8_dtype != torch.float8_e4m3fn:
            raise NotImplementedError("PrepareFloat8ModuleInput only support casting to float8_e4m3fn for now")
        self.float8_dtype, self.fwd_config_submodule_fqn = float8_dtype, fwd_config_submodule_fqn

    def _validate(self, module: nn.Module) -> None:
        readers = [m for m in module.modules() if isinstance(m, Float8Linear)]
        if self.fwd_config_submodule_fqn is not None:
            readers = [module.get_submodule(self.fwd_config_submodule_fqn)]
        if not readers or not all(isinstance(m, Float8Linear) for m in readers):
            raise ValueError(f"PrepareFloat8ModuleInput on '{fqn(module)}': its float8 input is read by Float8Linear "
                             "submodules, and it has none (convert the model with convert_to_float8_training first)")
        super()._validate(module)

    def _convert(self, x, layout, desired, mesh, module):
        if layout is None:
            return x
        with debug.module_scope(fqn(module)):
            dt = input_as_dtensor(x, mesh, layout)
            readers = [m for m in module.modules() if getattr(m, "_tp_colwise", False)]
            if desired == Replicate() and isinstance(dt.placements[0], Shard) and readers and \
                    ring_ok(dt, [m for m in readers if not isinstance(m, Float8Linear)], mesh):
                ring = ring_input(dt, mesh, readers, fqn(module))  # async TP: float8 chunks on the ring
                return Float8RingInput(ring.shard, mesh, ring.dim, ring.sizes, readers, ring.owner)
            power_of_2 = any(m.float8_spec.power_of_2 for m in module.modules() if isinstance(m, Float8Linear))
            return to_float8_input(dt, layout, desired, mesh, power_of_2)  # a Float8Input, whatever use_local_output

"""Float8Linear: an ``nn.Linear`` whose three matmuls read float8 operands (torchao's recipe,
tensorwise dynamic scaling).

Forward ``y = x @ W^T``: ``x`` and ``W`` are cast to e4m3 (:mod:`.scaling`), multiplied, and
the product is rescaled to the input's dtype.  Backward, the output gradient is cast to e5m2
(more range, less precision: gradients span many orders of magnitude) and two float8 matmuls
give ``grad_x = g @ W`` and ``grad_W = g^T @ x``, reusing the float8 ``x`` and ``W`` saved
in forward (so the backward casts only the gradient, and needs no second weight amax).

The matmul: ``torch._scaled_mm`` (real float8 kernels; it runs on the CPU too, accumulating in
float32) for float32 / bfloat16 / float16 models; an emulation for float64 models or with
``Float8LinearConfig(emulate=True)``, as torchao's: the exact float8 values dequantized and
multiplied in float32 (float64 for a float64 model), one cast to the output dtype at the end.
Either way the result is ``(a_fp8 @ b_fp8) / (scale_a * scale_b)``.

Tensor parallelism changes *where the amax is taken* and *where the output is reduced*; the
styles of :mod:`.float8_tensor_parallel` say so through ``module.float8_spec`` (a
:class:`Float8Spec`), set once when the model is parallelized.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from .. import debug
from ..gpu_rules import nccl as nccl_rules
from ..async_tp.fusion import ring_ok_rows
from ..async_tp.ring import gather_matmul_grads, matmul_reduce_scatter
from ..parallel.base import fqn
from ..placement import Partial, Replicate, Shard
from ..transition import redistribute_local
from .config import Float8LinearConfig
from .scaling import E4M3, E5M2, Scaled, cast, quantize

__all__ = ["Float8LinearConfig", "Float8Linear", "Float8Spec", "Float8Input", "float8_mm",
           "convert_to_float8_training"]


@dataclass(frozen=True)
class Float8Spec:
    """How one Float8Linear runs: ``cut``s are ``(mesh, mesh dims)`` a tensor is sharded on
    (its amax is reduced over them); ``reduce = (mesh, placement)``: the local product is a
    partial sum, reduced to that placement inside the matmul (Float8RowwiseParallel)."""

    emulate: bool = False
    input_cut: tuple | None = None
    weight_cut: tuple | None = None
    grad_cut: tuple | None = None
    reduce: tuple | None = None
    recompute_weight: bool = False  # cast the weight again in backward, with its saved scale (force_recompute_...)
    power_of_2: bool = False  # scales rounded down to powers of two (round_scales_to_power_of_2)


@dataclass(frozen=True)
class Float8Input:
    """A module input already in float8 (cast, and maybe gathered, by a float8 style).

    ``carrier`` is a high-precision tensor of the same shape on the autograd graph: the
    Linears' input gradients flow into it; its values are never read.
    """

    carrier: torch.Tensor
    scaled: Scaled

    @property
    def shape(self) -> torch.Size:
        return self.scaled.data.shape


def float8_mm(a: torch.Tensor, scale_a, b: torch.Tensor, scale_b, out_dtype: torch.dtype, emulate: bool,
              pad_to: int | None = None):
    """``(a @ b) / (scale_a * scale_b)`` for float8 ``a`` [M, K] and ``b`` [K, N].

    CUDA's float8 kernels want K and N in multiples of 16; a TP shard often is not (a hidden
    size of 688 over 4 ranks: 172), so on a GPU both are zero-padded (``pad_to``; zeros add
    nothing to the product) and the result trimmed.  Under :class:`~tensorplay_edu.gpu_rules.nccl.NCCLRulesMode`
    the CPU pads the same way, so the checked matmuls are the ones a GPU runs.
    """
    if emulate or out_dtype == torch.float64:  # torchao's emulation: dequantize, multiply, one cast at the end
        wide = torch.float64 if out_dtype == torch.float64 else torch.float32  # never in bf16 / fp16
        return ((a.to(wide) / scale_a.to(wide)) @ (b.to(wide) / scale_b.to(wide))).to(out_dtype)
    if pad_to is None:  # CUDA's 16, also on the CPU while NCCLRulesMode checks what CUDA would be given
        pad_to = 16 if a.is_cuda or nccl_rules.active() else 1
    n = b.shape[1]
    a = _pad(a, 1, pad_to)  # [M, K+]
    b = _pad(_pad(b, 0, pad_to), 1, pad_to)  # [K+, N+]
    out = torch._scaled_mm(a.contiguous(), b.t().contiguous().t(),  # row-major a, column-major b (as CUDA wants)
                           scale_a=scale_a.reciprocal(), scale_b=scale_b.reciprocal(), out_dtype=out_dtype)
    return out[:, :n]


def _pad(x: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    """``x`` with zeros appended along ``dim`` up to a multiple of ``multiple``.

    Float8 goes through its bytes: ``torch.cat`` of float8 tensors exists on CUDA only from
    torch 2.6, while a ``uint8`` view (same size, no copy) concatenates everywhere, and the
    byte 0 is +0.0 in both e4m3fn and e5m2: the result is the same bits."""
    extra = -x.shape[dim] % multiple
    if not extra:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    raw = x.view(torch.uint8) if x.dtype in (E4M3, E5M2) else x
    return torch.cat([raw, raw.new_zeros(shape)], dim=dim).view(x.dtype)


class _Float8Linear(torch.autograd.Function):
    """``y = x @ W^T`` in float8 (then reduced over TP ranks if ``spec.reduce``); backward in float8.

    With a sequence-sharded ``reduce`` under async TP the reduce-scatter runs as a ring fused
    with the matmul, and its backward as a ring of e5m2 gradient chunks (``async_tp/ring.py``)."""

    @staticmethod
    def forward(ctx, x, weight, x8: Scaled | None, spec: Float8Spec):
        x8 = x8 if x8 is not None else quantize(x, E4M3, spec.input_cut, spec.power_of_2)  # [.., in]
        w8 = quantize(weight, E4M3, spec.weight_cut, spec.power_of_2)  # [out, in] (a shard: its amax is global)
        lead, k = x8.data.shape[:-1], x8.data.shape[-1]

        def rows_times_w(rows: torch.Tensor) -> torch.Tensor:  # [.., in] float8 -> [.., out]
            out = float8_mm(rows.reshape(-1, k), x8.scale, w8.data.t(), w8.scale, x.dtype, spec.emulate)
            return out.view(*rows.shape[:-1], -1)

        mesh, dst = spec.reduce if spec.reduce is not None else (None, None)
        dst = dst.normalized(x8.data.ndim) if isinstance(dst, Shard) else dst
        ctx.ring = isinstance(dst, Shard) and ring_ok_rows(dst.dim, x8.data.shape, mesh, debug.current_module())
        if ctx.ring:  # matmul -> reduce-scatter as one ring, chunk by chunk
            y = matmul_reduce_scatter(lambda rows: rows_times_w(rows), x8.data, dst.dim, w8.data.shape[0], mesh)
        else:
            y = rows_times_w(x8.data)  # [.., out]
            if spec.reduce is not None:  # Float8RowwiseParallel: f̄ (all-reduce) or reduce-scatter, high precision
                y = redistribute_local(y, mesh, (Partial(),), (dst,), y.shape)
        if spec.recompute_weight:  # keep the high-precision weight and its scale; backward casts it again
            ctx.save_for_backward(x8.data, x8.scale, weight, w8.scale)
        else:
            ctx.save_for_backward(x8.data, x8.scale, w8.data, w8.scale)
        ctx.spec, ctx.dst, ctx.full_shape = spec, dst, (*lead, w8.data.shape[0])
        ctx.dtypes, ctx.module = (x.dtype, weight.dtype), debug.current_module()
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        spec, dst, (x_dtype, w_dtype) = ctx.spec, ctx.dst, ctx.dtypes
        if spec.recompute_weight:
            x_data, x_scale, weight, w_scale = ctx.saved_tensors  # the forward's scale: no second amax (as torchao)
            w_data = cast(weight, w_scale, E4M3)
        else:
            x_data, x_scale, w_data, w_scale = ctx.saved_tensors

        def grads_of(g: torch.Tensor, g_scale, x_rows: torch.Tensor):  # float8 [.., out], [.., in] -> hp
            g2, x2 = g.reshape(-1, w_data.shape[0]), x_rows.reshape(-1, x_rows.shape[-1])
            grad_x = float8_mm(g2, g_scale, w_data, w_scale, x_dtype, spec.emulate).view(x_rows.shape)
            return grad_x, float8_mm(g2.t(), g_scale, x2, x_scale, w_dtype, spec.emulate)  # [.., in], [out, in]

        with debug.backward_scope(ctx.module):
            if isinstance(dst, Shard):  # gy: this rank's slice: cast while sharded (global amax), gather in e5m2
                mesh = spec.reduce[0]
                g8 = quantize(gy, E5M2, (mesh, (0,)), spec.power_of_2)
                if ctx.ring:
                    return (*gather_matmul_grads(g8.data, x_data, dst.dim, mesh,
                                                 lambda g, rows: grads_of(g, g8.scale, rows)), None, None)
                gathered = redistribute_local(g8.data, mesh, (dst,), (Replicate(),), ctx.full_shape)
                g8 = Scaled(gathered, g8.scale)  # 1 byte per element
            else:
                g8 = quantize(gy, E5M2, spec.grad_cut, spec.power_of_2)
        grad_x, grad_w = grads_of(g8.data, g8.scale, x_data)
        return grad_x, grad_w, None, None


class Float8Linear(nn.Linear):
    """An ``nn.Linear`` computing in float8 (so the tensor-parallel styles accept it)."""

    def __init__(self, *args, config: Float8LinearConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.config = config or Float8LinearConfig()
        self.float8_spec = Float8Spec(emulate=self.config.emulate,  # the float8 styles add where tensors are cut
                                      recompute_weight=self.config.force_recompute_fp8_weight_in_bwd,
                                      power_of_2=self.config.round_scales_to_power_of_2)

    @classmethod
    def from_float(cls, mod: nn.Linear, config: Float8LinearConfig | None = None) -> "Float8Linear":
        """The same parameters (the same objects), computing in float8."""
        with torch.device("meta"):
            new = cls(mod.in_features, mod.out_features, bias=False, config=config)
        new.weight, new.bias = mod.weight, mod.bias
        return new

    @property
    def spec(self) -> Float8Spec:
        """``float8_spec`` with the cuts its weight's layout implies: a weight split on its rows
        (ColwiseParallel) has a global amax, and so has the output gradient split with it; one split
        on its columns (RowwiseParallel) has, and so has the input split with it."""
        layout = getattr(self, "_tp_layouts", {}).get("weight")  # kept by the module: FSDP replaces parameters
        place = layout.placements[0] if layout is not None and len(layout.placements) == 1 else None
        if not isinstance(place, Shard):
            return self.float8_spec
        cut, spec = (layout.mesh, (0,)), self.float8_spec
        cuts = ("weight_cut", "grad_cut") if place.dim == 0 else ("weight_cut", "input_cut")
        return replace(spec, **{k: cut for k in cuts if getattr(spec, k) is None})

    def partial_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Under the plain RowwiseParallel: this rank's float8 product ``x_local @ W_local^T``, a
        partial sum the style reduces (in high precision) and adds the bias to, once."""
        with debug.module_scope(fqn(self)):
            return _Float8Linear.apply(x, self.weight, None, self.spec)

    def forward(self, x):
        carrier, x8 = (x.carrier, x.scaled) if isinstance(x, Float8Input) else (x, None)
        with debug.module_scope(fqn(self)):  # the amax all-reduces (and a rowwise reduction) are this module's
            y = _Float8Linear.apply(carrier, self.weight, x8, self.spec)
        if self.bias is not None and self.float8_spec.reduce is None:  # a rowwise style adds it after the reduction
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, emulate={self.config.emulate}"


def convert_to_float8_training(module: nn.Module, *, module_filter_fn=None,
                               config: Float8LinearConfig | None = None) -> nn.Module:
    """Swap every ``nn.Linear`` of ``module`` for a :class:`Float8Linear` (in place; returns the
    module, or the new one if ``module`` itself is a Linear).

    ``module_filter_fn(mod, fqn) -> bool`` keeps a Linear in high precision when it returns
    False (torchtitan: ``lambda mod, fqn: fqn != "output"``).
    """
    def swap(mod: nn.Module, fqn: str) -> nn.Module:
        if isinstance(mod, nn.Linear) and not isinstance(mod, Float8Linear):
            if module_filter_fn is None or module_filter_fn(mod, fqn):
                return Float8Linear.from_float(mod, config)
            return mod
        for name, child in mod.named_children():
            new = swap(child, f"{fqn}.{name}" if fqn else name)
            if new is not child:
                setattr(mod, name, new)
        return mod

    return swap(module, "")

"""Tensorwise dynamic scaling: how a tensor becomes float8, as torchao.float8 does it.

A float8 number has few bits: ``e4m3`` (``torch.float8_e4m3fn``, inputs and weights)
has 3 mantissa bits and reaches 448; ``e5m2`` (``torch.float8_e5m2``, gradients) has 2
mantissa bits and reaches 57344.  To use that range, a tensor ``x`` is multiplied by one
number, its *scale*, before the cast::

    amax  = max |x|                                  over the WHOLE tensor ("tensorwise")
    scale = FP8_MAX / max(amax, 1e-12)               (in float64, then float32, as torchao)
    data  = clamp(x * scale, -FP8_MAX, FP8_MAX).to(float8)      x ~= data / scale

The clamp makes the cast saturate (the largest value lands exactly on FP8_MAX); e5m2
casts on the CPU would otherwise turn 61440 and above into inf.

**Under tensor parallelism the amax must be global.**  A rank holding a shard of ``x``
(a sequence slice, a weight shard, a slice of a gradient) sees only its part; with its own
amax it would pick its own scale and the ranks' float8 pieces would not be pieces of one
float8 tensor (and not the single-device cast).  The global amax is the transition
table's ``Partial("max") -> Replicate``: one all-reduce (max) of one number over the
mesh dims the tensor is sharded on.  Then every rank casts with the same scale, and
their pieces are exactly the single-device ``data``, cut the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..placement import Partial, Replicate
from ..transition import redistribute_local

__all__ = ["E4M3", "E5M2", "Scaled", "amax", "to_scale", "cast", "quantize"]

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2  # forward operands / gradients
EPS = 1e-12


@dataclass(frozen=True)
class Scaled:
    """A float8 tensor and its tensorwise scale: ``data / scale`` approximates the original."""

    data: torch.Tensor  # float8
    scale: torch.Tensor  # float32, 0-d

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return self.data.to(dtype) / self.scale.to(dtype)


def amax(x: torch.Tensor, cut=None) -> torch.Tensor:
    """``max |x|`` of the whole tensor: float32 (exact for float32 / bf16 / fp16 values), float64
    for a float64 tensor (as torchao: its scale is then computed from the unrounded amax).

    ``cut = (mesh, dims)``: ``x`` is this rank's piece of a tensor sharded on those mesh dims;
    the pieces' maxima are reduced over them (``Partial("max") -> Replicate``, one all-reduce).
    """
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    local = x.abs().amax().to(dtype) if x.numel() else x.new_zeros((), dtype=dtype)
    if cut is None or not cut[1]:
        return local
    mesh, dims = cut
    src = tuple(Partial("max") if d in dims else Replicate() for d in range(mesh.ndim))
    return redistribute_local(local, mesh, src, (Replicate(),) * mesh.ndim, local.shape)


def to_scale(amax_value: torch.Tensor, fp8: torch.dtype, power_of_2: bool = False) -> torch.Tensor:
    """``FP8_MAX / max(amax, eps)``: computed in float64, kept in float32 (torchao's numerics);
    ``power_of_2``: rounded down to a power of two (``round_scales_to_power_of_2``)."""
    scale = (torch.finfo(fp8).max / amax_value.double().clamp(min=EPS)).float()
    return torch.exp2(torch.floor(torch.log2(scale))) if power_of_2 else scale


def cast(x: torch.Tensor, scale: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """The saturating cast: ``clamp(x * scale, -max, max)`` rounded to ``fp8`` (nearest, ties to even)."""
    top = torch.finfo(fp8).max
    return (x.float() * scale).clamp(-top, top).to(fp8)


def quantize(x: torch.Tensor, fp8: torch.dtype, cut=None, power_of_2: bool = False) -> Scaled:
    """``x`` in ``fp8`` with its tensorwise scale (global over ``cut``, see :func:`amax`)."""
    scale = to_scale(amax(x, cut), fp8, power_of_2)
    return Scaled(cast(x, scale, fp8), scale)

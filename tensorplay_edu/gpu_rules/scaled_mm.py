"""What CUDA's float8 matmul refuses: ``torch._scaled_mm``'s rules, checked on the CPU.

The CPU kernel of ``torch._scaled_mm`` multiplies almost anything; the CUDA one (cuBLASLt,
``_scaled_mm_out_cuda`` in ``aten/src/ATen/native/cuda/Blas.cpp``) refuses, before it runs:

* operands that are not float8 e4m3fn or e5m2 (the "fnuz" float8 types are ROCm's), or both e5m2;
* a ``mat1`` that is not row-major or a ``mat2`` that is not column-major (cuBLASLt's "TN" layout:
  ``a.contiguous()`` and ``b.t().contiguous().t()``);
* K (``mat1``'s columns) and N (``mat2``'s columns) not multiples of 16;
* scales that are not float32, or neither one value each (tensorwise) nor rowwise: ``scale_a``
  of shape (M, 1) (one per row of ``mat1``) *and* ``scale_b`` of shape (1, N) (one per column
  of ``mat2``), both contiguous; one tensorwise and one rowwise scale is no recipe;
* an output dtype it does not write, a bias with a float32 output, and a rowwise-scaled
  output that is not bfloat16 (the rowwise kernel, ``f8f8bf16_rowwise``, writes bfloat16; the
  portable rule, newer cuBLASLt builds on the newest GPUs accept more).

:class:`~tensorplay_edu.gpu_rules.nccl.NCCLRulesMode` wraps ``torch._scaled_mm`` with :func:`checked`
while it is active.  Under the mode the float8 Linear (``float8_mm``) pads K and N to multiples
of 16 on the CPU as it does on CUDA, so the matmuls checked are the ones a GPU will run; a direct
call is checked as called.
"""

from __future__ import annotations

import torch

from .. import debug

__all__ = ["problems", "checked"]

_F8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_FNUZ = (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)  # ROCm's float8 (MI300): not CUDA's kernel


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def problems(mat1, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
             use_fast_accum=False) -> list[str]:
    """What CUDA's ``_scaled_mm`` (cuBLASLt) refuses; the CPU kernel accepts most of it."""
    bad = []
    if mat1.dim() != 2 or mat2.dim() != 2:
        return [f"mat1 and mat2 must be matrices, got {list(mat1.shape)} and {list(mat2.shape)}"]
    (m, k), (k2, n) = mat1.shape, mat2.shape
    if k != k2:
        bad.append(f"mat1 {list(mat1.shape)} and mat2 {list(mat2.shape)} cannot be multiplied")
    if k % 16 or k2 % 16 or n % 16:
        bad.append(f"K and N must be multiples of 16 (mat1 {m}x{k}, mat2 {k2}x{n}): pad them, as float8_mm "
                   "does on CUDA")
    if mat1.dtype in _FNUZ or mat2.dtype in _FNUZ:
        bad.append(f"{_name(mat1.dtype)} x {_name(mat2.dtype)}: the fnuz float8 types are ROCm's; CUDA's kernel "
                   "takes float8_e4m3fn / float8_e5m2")
    elif mat1.dtype not in _F8 or mat2.dtype not in _F8:
        bad.append(f"operands must be float8 e4m3fn / e5m2, got {_name(mat1.dtype)} and {_name(mat2.dtype)}")
    elif mat1.dtype == mat2.dtype == torch.float8_e5m2:
        bad.append("both operands are float8_e5m2: cuBLASLt multiplies e4m3 x e4m3, e4m3 x e5m2 or e5m2 x e4m3")
    if m > 1 and k > 1 and mat1.stride(1) != 1:
        bad.append(f"mat1 must be row-major (strides {mat1.stride()}): pass a.contiguous()")
    if k2 > 1 and n > 1 and mat2.stride(0) != 1:
        bad.append(f"mat2 must be column-major (strides {mat2.stride()}): pass b.t().contiguous().t()")
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s.dtype != torch.float32:
            bad.append(f"{name} must be float32, got {_name(s.dtype)}")
    out = out_dtype or mat1.dtype
    tensorwise = scale_a.numel() == scale_b.numel() == 1  # checked first, as Blas.cpp does
    rowwise = not tensorwise and tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n)
    if not (tensorwise or rowwise):
        bad.append(f"scales {list(scale_a.shape)} and {list(scale_b.shape)} are no recipe: one value each "
                   f"(tensorwise) or scale_a [{m}, 1] and scale_b [1, {n}] (rowwise, both at once)")
    if rowwise and not (scale_a.is_contiguous() and scale_b.is_contiguous()):
        bad.append("rowwise scales must be contiguous")
    if rowwise and out != torch.bfloat16:
        bad.append(f"rowwise scaling writes bfloat16, not {_name(out)}: pass out_dtype=torch.bfloat16")
    if out not in (torch.float32, torch.bfloat16, torch.float16, *_F8):
        bad.append(f"out_dtype {_name(out)} is not one cuBLASLt writes (float32, bfloat16, float16, float8)")
    if bias is not None and (out == torch.float32 or bias.dtype not in (torch.bfloat16, torch.float16)):
        bad.append("a bias needs a bfloat16 / float16 output and bias")
    return bad


def checked(original, on_call, error):
    """``original`` with ``problems`` checked first: ``on_call()`` at every call, ``error`` raised on a problem."""

    def scaled_mm(*args, **kwargs):
        bad = problems(*args, **kwargs)
        on_call()
        if bad:
            raise error(f"torch._scaled_mm in {debug.current_module() or '(no module)'}: " + "; ".join(bad)
                        + " (the CUDA kernel's rules; the CPU kernel is laxer)")
        return original(*args, **kwargs)
    return scaled_mm

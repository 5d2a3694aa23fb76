"""Element-wise ops on a DTensor, piece by piece: what a model does to its logits before the loss.

Under ``loss_parallel`` the logits stay a class-sharded DTensor ``[b, s, V/t]``, and some
models touch them first: Gemma2 soft-caps them (``tanh(x / c) * c``), Granite divides them
by a scale, Cohere multiplies them by one.  A function of one element at a time, applied to
each rank's piece, is that rank's piece of the function of the whole, so a ``Shard`` or
``Replicate`` layout is kept and nothing moves (PyTorch's DTensor runs them the same way).
A ``Partial`` tensor holds addends: a scale of the sum is the sum of the scaled addends, so
``x * c``, ``x / c`` and ``-x`` keep a sum's (or a mean's); ``tanh`` or ``x + c`` of addends is
not that of the sum, nor ``-x`` of a max the max of ``-x``: refused.  The other operand must be a number (or a 0-d tensor without a gradient:
a learnable scale's gradient would be a sum over every rank's piece).
"""

from __future__ import annotations

import operator

import torch

from .. import dtensor as D
from ..placement import Partial

__all__ = ["elementwise"]


def _is_scalar(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return type(value) is torch.Tensor and value.ndim == 0 and not value.requires_grad


def elementwise(x: "D.DTensor", fn, name: str, linear: bool) -> "D.DTensor":
    """``fn`` on each rank's piece of ``x``: the same layout, no communication."""
    if any(isinstance(p, Partial) and (not linear or p.reduce_op not in ("sum", "avg")) for p in x.placements):
        raise NotImplementedError(
            f"{name} of a Partial DTensor (placements {list(x.placements)}): each rank holds an addend, and "
            f"{name} of the addends is not {name} of their sum. Reduce it first: "
            "x.redistribute(placements=[Replicate()])")
    return x._local_map(fn)


def _with_scalar(name: str, op, linear: bool, reflected: bool = False):
    def handler(x, other):
        if not _is_scalar(other):
            raise D._unsupported(f"operator {name} with a {type(other).__name__} (only a number keeps the layout)",
                                 x.placements, [other])
        return elementwise(x, (lambda t: op(other, t)) if reflected else (lambda t: op(t, other)), name, linear)
    return handler


def _torch_binary(name: str, op, linear):
    def handler(a, b, **kwargs):
        if kwargs:
            raise D._unsupported(f"torch.{name} with {sorted(kwargs)}", a.placements if isinstance(a, D.DTensor)
                                 else b.placements)
        x, other = (a, b) if isinstance(a, D.DTensor) else (b, a)
        if isinstance(other, D.DTensor) or not _is_scalar(other):
            raise D._unsupported(f"torch.{name} of a DTensor and a {type(other).__name__}", x.placements, [other])
        if x is b:  # c * x keeps linear; c / x does not
            return elementwise(x, lambda t: op(other, t), f"torch.{name}", linear and name == "mul")
        return elementwise(x, lambda t: op(t, other), f"torch.{name}", linear)
    return handler


def _tanh(x, *, out=None):
    if out is not None:
        raise D._unsupported("torch.tanh(out=...)", x.placements)
    return elementwise(x, torch.tanh, "tanh", linear=False)


def install() -> None:
    """Register the operators and torch functions (idempotent; called on import)."""
    D._OPERATORS.update({
        "__mul__": _with_scalar("*", operator.mul, linear=True),
        "__rmul__": _with_scalar("*", operator.mul, linear=True, reflected=True),
        "__truediv__": _with_scalar("/", operator.truediv, linear=True),
        "__rtruediv__": _with_scalar("/", operator.truediv, linear=False, reflected=True),
        "__add__": _with_scalar("+", operator.add, linear=False),
        "__radd__": _with_scalar("+", operator.add, linear=False, reflected=True),
        "__sub__": _with_scalar("-", operator.sub, linear=False),
        "__rsub__": _with_scalar("-", operator.sub, linear=False, reflected=True),
        "__neg__": lambda x: elementwise(x, operator.neg, "-x", linear=True),
    })
    for func in (torch.tanh, torch.Tensor.tanh):
        D.register_torch_function(func, _tanh)
    D.register_torch_function(torch.mul, _torch_binary("mul", torch.mul, linear=True))
    D.register_torch_function(torch.div, _torch_binary("div", torch.div, linear=True))


install()

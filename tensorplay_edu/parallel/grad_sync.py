"""Replicated parameters whose gradients come out as partial sums, made final in backward.

A sequence-parallel norm sees only this rank's tokens, so the gradient of its weight is
a partial sum over the TP group (``Partial``).  PyTorch leaves it so and pays one
all-reduce per parameter later.  Here every ``.grad`` is final when ``loss.backward()``
returns, for ONE collective per backward:

1. each registered parameter has a tensor hook; when its gradient arrives the hook
   keeps it aside and lets a zero through, so nothing partial lands in ``.grad``;
2. the first hook of a backward asks autograd to call :meth:`PartialGradBucket.flush`
   when the whole backward is done (``queue_callback``);
3. ``flush`` concatenates the kept gradients, moves the flat bucket Partial -> Replicate
   through the transition table (one all-reduce) and adds each slice to its ``.grad``.

Accumulating gradients over several backwards stays right: each backward reduces only
its own contribution.  The same bucket serves a rowwise bias whose output is not
replicated (each rank then sums the bias gradient over its own tokens only).
"""

from __future__ import annotations

import torch

from .. import debug
from ..mesh import DeviceMesh
from ..placement import Partial, Replicate
from ..transition import redistribute_local

__all__ = ["PartialGradBucket", "bucket_for"]

_BUCKETS: dict[DeviceMesh, "PartialGradBucket"] = {}


def bucket_for(mesh: DeviceMesh) -> "PartialGradBucket":
    """The one bucket of a mesh (all parameters of all models on it)."""
    if mesh not in _BUCKETS:
        _BUCKETS[mesh] = PartialGradBucket(mesh)
    return _BUCKETS[mesh]


class PartialGradBucket:
    def __init__(self, mesh: DeviceMesh):
        self.mesh = mesh
        self.pending: list[tuple[torch.nn.Parameter, torch.Tensor]] = []

    def register(self, param: torch.nn.Parameter) -> None:
        if param.requires_grad:
            param.register_hook(lambda grad, p=param: self._keep(p, grad))

    def _keep(self, param, grad: torch.Tensor) -> torch.Tensor:
        if not self.pending:
            torch.autograd.Variable._execution_engine.queue_callback(self.flush)
        self.pending.append((param, grad))
        return torch.zeros_like(grad)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        by_dtype: dict[torch.dtype, list] = {}
        for param, grad in pending:
            by_dtype.setdefault(grad.dtype, []).append((param, grad))
        for items in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for _, g in items])  # [sum of numels]
            with debug.backward_scope("partial grads (bucket)"):
                flat = redistribute_local(flat, self.mesh, (Partial(),), (Replicate(),), flat.shape)
            offset = 0
            for param, grad in items:
                piece = flat[offset: offset + grad.numel()].view_as(grad)
                offset += grad.numel()
                if param.grad is None:
                    param.grad = piece.clone()
                else:
                    param.grad.add_(piece)

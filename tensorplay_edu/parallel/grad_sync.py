"""Replicated parameters whose gradients come out as partial sums, made whole as they arrive.

A sequence-parallel norm sees only this rank's tokens, so the gradient of its (replicated)
weight is an addend of the true gradient: ``Partial`` over the TP group.  In the words of
the transition table, the weight is a ``Replicate`` tensor read with gradient placement
``Partial``: Megatron's ``f``, applied to a parameter.  Its backward is the table's row
Partial -> Replicate, one all-reduce.

PyTorch keeps such a gradient ``Partial`` and all-reduces it whenever the optimizer reads it
(three times per parameter in one AdamW step).  Here a hook on the parameter runs the
all-reduce when its gradient arrives, *before* autograd adds it to ``.grad``:

* ``.grad`` is whole, and the same on every rank, from the moment it is written.  Whatever
  reads it afterwards sees the true gradient: the optimizer, ``clip_grad_norm_``, and the
  hooks of ``DistributedDataParallel`` and FSDP, which run right after autograd accumulates
  a parameter's gradient.
* Accumulating gradients over several backwards stays right: each backward reduces only
  its own contribution.

The cost is one small all-reduce (a norm weight is ``[h]``) per parameter per backward.
An earlier version saved them all for one bucketed all-reduce at the end of the backward;
under DDP that came too late (DDP had already reduced, then overwrote, those gradients).

The hook lives on the parameter object.  A style calls :func:`partial_gradient` again in
every forward, which costs nothing when the hook is there and re-attaches it when the
parameter was replaced after parallelization (FSDP's unsharded parameters, ``to_empty``).
"""

from __future__ import annotations

import functools

import torch

from .. import debug
from ..mesh import DeviceMesh
from ..placement import Partial, Replicate
from ..transition import redistribute_local

__all__ = ["partial_gradient"]


def partial_gradient(param: torch.Tensor, mesh: DeviceMesh, path: str) -> None:
    """Make ``param``'s gradient whole over the 1-D ``mesh`` as it arrives (idempotent).

    ``path`` names the parameter in CommDebugMode's records.
    """
    if not param.requires_grad or getattr(param, "_tp_partial_grad", None) is not None:
        return
    param.register_hook(functools.partial(_reduce, mesh, path))
    param._tp_partial_grad = path


def _reduce(mesh: DeviceMesh, path: str, grad: torch.Tensor) -> torch.Tensor:
    """This backward's addend -> the whole gradient: Partial -> Replicate, one all-reduce."""
    with debug.backward_scope(path):
        return redistribute_local(grad, mesh, (Partial(),), (Replicate(),), grad.shape)

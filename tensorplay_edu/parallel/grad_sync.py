"""Replicated parameters whose gradients come out as partial sums, made whole: one at a time, or in one bucket.

A sequence-parallel norm sees only this rank's tokens, so the gradient of its (replicated) weight
is an addend of the true gradient: ``Partial`` over the TP group (a rowwise bias under a sharded
output is the same).  Making it whole is the transition table's Partial -> Replicate, an
all-reduce.  You choose when:

**One at a time, as it arrives (the default).**  A hook on the parameter all-reduces each
backward's addend before autograd adds it to ``.grad``, so ``.grad`` is whole on every rank from
the moment it is written, whatever reads it (the optimizer, ``clip_grad_norm_``, DDP's and FSDP's
hooks).  The cost: one small all-reduce per such parameter per backward (2L+1 for an L-block Llama).

**All in one bucket, once per step** (:func:`bucket_partial_grads`, as Megatron-LM's
``finalize_model_grads``).  ``.grad`` keeps this rank's part, and
:meth:`PartialGradBucket.finalize` issues ONE all-reduce (per TP group and dtype) for all of them.
Sums commute, so anything linear may happen to ``.grad`` first (several backwards accumulating,
DDP's average, FSDP2's reduce-scatter), but nothing may *read* it before ``finalize()``.  It runs by
itself in the optimizer's ``step`` (when you pass the optimizer) and in
:func:`tensorplay_edu.parallel.clip_grad_norm_`; anything else that reads ``.grad`` first must call
``finalize()`` itself.  It reduces only the gradients that arrived since its last call, and a
backward that would add to a gradient it already made whole (a ``finalize()`` per micro-batch, a
step without ``zero_grad``) raises.  :class:`CommDebugMode` records it as one ``backward``
all-reduce in module ``"partial grads (bucket)"``.

The hook lives on the parameter; its state on the module (``module._tp_partial_grads``), so a style
re-attaches it in every forward when the parameter was replaced (FSDP's unsharded parameters,
``to_empty``), and ``attach_layouts`` hands it to FSDP2's sharded parameters.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import debug
from ..mesh import DeviceMesh
from ..placement import Partial, Replicate
from ..transition import redistribute_local

__all__ = ["partial_gradient", "bucket_partial_grads", "PartialGradBucket", "pending_buckets", "follow_replaced"]

BUCKET_SCOPE = "partial grads (bucket)"


@dataclass(eq=False)
class _PartialGrad:
    """What a parameter's hook knows: its mesh, its name, and the bucket it defers to (None: reduce now).

    It lives on the module (``module._tp_partial_grads[name]``), so a parameter replaced after
    parallelization (FSDP2, ``to_empty``) gets the same state with its new hook."""
    mesh: DeviceMesh
    path: str
    bucket: "PartialGradBucket | None" = None
    arrived: bool = False  # an addend reached .grad since the last finalize()
    holders: list = field(default_factory=list)  # weak refs to the last 2 parameters given it (FSDP2: both kinds)


def partial_gradient(module: nn.Module, name: str, mesh: DeviceMesh, path: str) -> None:
    """Make ``module.<name>``'s gradient whole over the 1-D ``mesh`` (idempotent).

    ``path`` names the parameter in CommDebugMode's records and in errors.
    """
    param = getattr(module, name)
    if hooked(param):
        return
    states = module.__dict__.setdefault("_tp_partial_grads", {})
    state = states.setdefault(name, _PartialGrad(mesh, path))
    param.register_hook(functools.partial(_arrived, state, weakref.ref(module), name))  # weak: no cycle
    param._tp_grad_hooked = True
    param._tp_partial_grad = state  # for clip_grad_norm_, given parameters: their bucket
    _hold(state, param)


def hooked(param: torch.Tensor) -> bool:
    """Nothing for :func:`partial_gradient` to do: no gradient, or its hook already attached."""
    return not param.requires_grad or getattr(param, "_tp_grad_hooked", False)


def follow_replaced(module: nn.Module) -> None:
    """Give ``module``'s current parameters their partial-gradient state again (called by ``attach_layouts``
    after ``fully_shard`` replaced them): ``clip_grad_norm_`` finds a pending bucket through them, and
    ``finalize()`` finds FSDP2's reduced gradient on them."""
    for name, state in module.__dict__.get("_tp_partial_grads", {}).items():
        param = module._parameters.get(name)
        if param is not None and getattr(param, "_tp_partial_grad", None) is not state:
            param._tp_partial_grad = state
            _hold(state, param)


def _hold(state: _PartialGrad, param: torch.Tensor) -> None:
    """Keep ``param`` among the last two *different* parameters given ``state``: under FSDP2 its sharded
    one (where the reduced gradient lands) and its unsharded one (which the module still holds after
    backward with ``set_reshard_after_backward(False)``).  Re-registering the same one must not push
    the other out."""
    if not state.holders or state.holders[-1]() is not param:
        state.holders = [*state.holders[-1:], weakref.ref(param)]


def _arrived(state: _PartialGrad, module_ref, name: str, grad: torch.Tensor) -> torch.Tensor:
    """This backward's addend of ``module.<name>``'s gradient, before autograd adds it to ``.grad``."""
    if state.bucket is None:  # one at a time: this rank's addend -> the whole gradient, one all-reduce
        with debug.backward_scope(state.path):
            return redistribute_local(grad, state.mesh, (Partial(),), (Replicate(),), grad.shape)
    held = getattr(module_ref(), name).grad
    if held is not None and getattr(held, "_tp_made_whole", None) == held._version:  # untouched since finalize()
        raise RuntimeError(
            f"{state.path}: this backward would add its partial gradient to a gradient that "
            "PartialGradBucket.finalize() already made whole (finalize() after every micro-batch, or a step "
            "without zero_grad()). Call finalize() once per optimizer step, after the last backward, and zero "
            "the gradients after the step.")
    state.arrived = state.bucket.pending = True
    return grad  # this rank's part: .grad stays partial until finalize()


@dataclass(eq=False)
class PartialGradBucket:
    """Every partial-gradient parameter of one model, made whole by ONE all-reduce (see the module docstring)."""
    params: list[tuple[nn.Module, str, _PartialGrad]] = field(default_factory=list)
    pending: bool = False  # a gradient arrived since the last finalize()

    def finalize(self) -> None:
        """All-reduce every partial gradient that arrived since the last call, in one flat bucket per TP group."""
        if not self.pending:
            return
        groups: dict[tuple, list] = {}  # (TP group, dtype, device) -> [(this rank's grad, state)]
        for module, name, state in self.params:
            if not state.arrived:  # nothing new: reducing a whole gradient again would multiply it by t
                continue
            grad = _held_grad(module, name, state)
            local = grad.to_local() if hasattr(grad, "to_local") else grad  # FSDP2: this dp rank's rows
            key = (state.mesh.get_group(0), local.dtype, local.device)
            groups.setdefault(key, []).append((local, state))
        with debug.backward_scope(BUCKET_SCOPE):
            for members in groups.values():
                mesh = members[0][1].mesh
                flat = torch.cat([g.reshape(-1) for g, _ in members])  # [sum of numels]
                whole = redistribute_local(flat, mesh, (Partial(),), (Replicate(),), flat.shape)  # the ONE all-reduce
                for (g, state), piece in zip(members, whole.split([g.numel() for g, _ in members])):
                    g.copy_(piece.view_as(g))
                    g._tp_made_whole = g._version  # a backward adding to it before it changes is an error
                    state.arrived = False
        self.pending = False


def _held_grad(module: nn.Module, name: str, state: _PartialGrad) -> torch.Tensor:
    """Where the gradient of ``module.<name>`` is now: on the registered parameter, or (FSDP2 after its
    reduce-scatter) on the sharded parameter ``attach_layouts`` gave the state to."""
    held = [ref() for ref in reversed(state.holders)]
    for param in (module._parameters.get(name), *(p for p in held if getattr(p, "_tp_partial_grad", None) is state)):
        if param is not None and param.grad is not None:
            return param.grad
    raise RuntimeError(
        f"PartialGradBucket.finalize(): {state.path}'s partial gradient arrived but is on no parameter this "
        "bucket can see (FSDP2 replaced the parameters: call attach_layouts(model) after fully_shard, then "
        "bucket_partial_grads)")


def bucket_partial_grads(module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> PartialGradBucket:
    """Switch ``module``'s partial gradients (sequence-parallel norms, rowwise biases) to one bucket per step.

    Call it after ``parallelize_module`` (and after ``fully_shard`` + ``attach_layouts``, or DDP).  With
    ``optimizer``, its ``step()`` first calls :meth:`PartialGradBucket.finalize` (a step pre-hook); our
    ``clip_grad_norm_`` does too.  Anything else that reads ``.grad`` before the step must call
    ``finalize()`` itself.
    """
    bucket = PartialGradBucket()
    for sub in module.modules():
        follow_replaced(sub)
        for name, state in sub.__dict__.get("_tp_partial_grads", {}).items():
            state.bucket = bucket
            bucket.params.append((sub, name, state))
    if not bucket.params:
        raise ValueError(
            f"bucket_partial_grads: {type(module).__name__} has no parameter with a partial gradient (a "
            "SequenceParallel module's, or a RowwiseParallel bias with a sharded output): parallelize it first")
    if optimizer is not None:
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: bucket.finalize())
    return bucket


def pending_buckets(params) -> list[PartialGradBucket]:
    """The buckets holding a partial gradient of one of ``params`` that has not been made whole yet."""
    out = []
    for p in params:
        state = getattr(p, "_tp_partial_grad", None)
        if state is not None and state.bucket is not None and state.bucket.pending and state.bucket not in out:
            out.append(state.bucket)
    return out

"""loss_parallel: cross-entropy on logits sharded over the classes, never gathering them.

Rank r holds the logits of classes ``[o_r, o_r + V_r)`` (``torch.chunk`` of V).  Per row:

1. ``m = max_c x_c``               all-reduce (max) of one value per row
2. ``s = sum_c exp(x_c - m)``      all-reduce (sum) of one value per row; ``lse = m + log s``
3. ``x_y``, the target's logit      all-reduce (sum): only its owner has it, the others add 0
   (with label smoothing the same all-reduce also carries ``sum_c w_c x_c``)

``loss = (1 - eps) * w_y * (lse - x_y) + eps / V * (W * lse - sum_c w_c x_c)``, with
``W = sum_c w_c`` over the *global* V classes (Megatron divides by the local count).
The gradient is local, no communication: ``(1 - eps) w_y (softmax - onehot_y) + eps / V
(W softmax - w)``, times the reduction's scale.

Under ``with loss_parallel():`` ``F.cross_entropy`` (and ``nn.CrossEntropyLoss``),
``F.log_softmax`` and ``F.nll_loss`` accept a logits DTensor sharded on the class dim
(dim 1, or 0 for 1-D logits).  ``F.nll_loss(F.log_softmax(x, 1), y)`` takes the fused
path above (3 all-reduces in all).  A ``log_softmax`` used elsewhere gets its true
gradient, which costs one all-reduce in backward (PyTorch's is silently wrong,
pytorch/pytorch#190746).  The loss comes back as a plain tensor, the same on every rank.
The backward does not need to run inside the context.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .. import debug
from ..dtensor import DTensor, register_torch_function
from ..placement import Partial, Replicate, Shard, chunk_offset
from ..transition import redistribute_local

__all__ = ["loss_parallel"]


def _all_reduce(x: torch.Tensor, mesh, op: str = "sum") -> torch.Tensor:
    """Partial -> Replicate through the transition table (recorded as loss_parallel)."""
    with debug.module_scope("loss_parallel"):
        return redistribute_local(x, mesh, (Partial(op),), (Replicate(),), x.shape)


def _rows(dt: DTensor, dim: int, what: str):
    """The logits as [rows, local classes], with the class dim checked to be the sharded one."""
    if dt.device_mesh.ndim != 1 or dt.placements != (Shard(dim),):
        raise ValueError(f"loss_parallel() should be enabled only when the input tensor is sharded on dimension "
                         f"{dim} (the class dim) of a 1-D mesh; {what} got placements {list(dt.placements)}. "
                         "Produce the logits with ColwiseParallel(output_layouts=Shard(-1), use_local_output=False).")
    local = dt.to_local()
    moved = local.movedim(dim, -1)  # [.., V/t]
    return moved.reshape(-1, moved.shape[-1]), moved.shape


@torch.no_grad()
def _logsumexp(rows: torch.Tensor, mesh) -> torch.Tensor:
    """Global log-sum-exp of each row over all ranks' classes: 2 all-reduces."""
    local_max = rows.amax(1) if rows.shape[1] else rows.new_full(rows.shape[:1], float("-inf"))
    m = _all_reduce(local_max, mesh, "max")  # [N]
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = _all_reduce((rows - m[:, None]).exp().sum(1), mesh)  # [N]
    return m + s.log()


class _LogSoftmax(torch.autograd.Function):
    """``x - lse``; its backward ``g - softmax * sum_c g`` needs one all-reduce of ``sum_c g``."""

    @staticmethod
    def forward(ctx, rows, lse, mesh):
        out = rows - lse[:, None]
        ctx.save_for_backward(out)
        ctx.mesh = mesh
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        with debug.backward_scope("loss_parallel"):
            total = redistribute_local(grad.sum(1), ctx.mesh, (Partial(),), (Replicate(),), grad.shape[:1])
        return grad - out.exp() * total[:, None], None, None


class _VocabParallelNLL(torch.autograd.Function):
    """Forward: the loss from rows of logits (``softmax=True``) or of log-probabilities.
    Backward: local, no communication."""

    @staticmethod
    def forward(ctx, rows, lse, target, weight, ignore_index, eps, reduction, mesh, offset, classes, softmax):
        valid = target != ignore_index
        safe = target.masked_fill(~valid, 0)
        mine = valid & (safe >= offset) & (safe < offset + rows.shape[1])
        local_idx = (safe - offset).clamp(0, max(rows.shape[1] - 1, 0))
        picked = rows.gather(1, local_idx[:, None]).squeeze(1) if rows.shape[1] else rows.new_zeros(target.shape)
        sums = [picked.masked_fill(~mine, 0)]  # [N]: x_y on its owner, 0 elsewhere
        w_local = None if weight is None else weight.narrow(0, offset, rows.shape[1])
        if eps > 0:
            sums.append((rows if w_local is None else rows * w_local).sum(1))  # [N]: sum_c w_c x_c, this rank's part
        packed = _all_reduce(torch.stack(sums), mesh)  # [1 or 2, N]
        w_y = (torch.ones_like(lse) if weight is None else weight[safe]) * valid
        loss = (1 - eps) * w_y * (lse - packed[0])
        total_w = classes if weight is None else weight.sum()
        if eps > 0:
            loss = loss + eps / classes * (total_w * lse - packed[1]) * valid
        ctx.save_for_backward(rows, lse, w_y, valid, local_idx, mine)
        ctx.args = (w_local, eps, reduction, classes, total_w, softmax)
        if reduction == "none":
            return loss
        return loss.sum() if reduction == "sum" else loss.sum() / w_y.sum()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        rows, lse, w_y, valid, local_idx, mine = ctx.saved_tensors
        w_local, eps, reduction, classes, total_w, softmax = ctx.args
        onehot = torch.zeros_like(rows)
        if rows.shape[1]:
            onehot.scatter_(1, local_idx[:, None], mine[:, None].to(rows.dtype))
        if softmax:
            p = (rows - lse[:, None]).exp()  # [N, V/t]
            grad = (1 - eps) * w_y[:, None] * (p - onehot)
            if eps > 0:
                w = torch.ones_like(p) if w_local is None else w_local[None, :].expand_as(p)
                grad = grad + eps / classes * (total_w * p - w) * valid[:, None]
        else:
            grad = -w_y[:, None] * onehot
        scale = grad_out if reduction == "none" else grad_out / (w_y.sum() if reduction == "mean" else 1)
        grad = grad * (scale[:, None] if reduction == "none" else scale)
        return grad, *([None] * 10)


def _target(target, rows: int) -> torch.Tensor:
    if isinstance(target, DTensor):
        if target.placements != (Replicate(),):
            raise ValueError(f"loss_parallel(): the target must be replicated, got placements {list(target.placements)}")
        target = target.to_local()
    if not isinstance(target, torch.Tensor) or target.is_floating_point():
        raise NotImplementedError("loss_parallel() supports class-index targets only (not class probabilities)")
    flat = target.reshape(-1)
    if flat.numel() != rows:
        raise ValueError(f"loss_parallel(): the target has {flat.numel()} entries for {rows} rows of logits")
    return flat


def _loss(x: DTensor, target, weight, ignore_index, reduction, eps, lse=None, softmax=True, name="cross_entropy"):
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{name}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {eps}")
    dim = 1 if x.ndim >= 2 else 0
    rows, moved = _rows(x, dim, f"F.{name}")
    mesh, classes = x.device_mesh, x.shape[dim]
    flat = _target(target, rows.shape[0])
    bad = (flat != ignore_index) & ((flat < 0) | (flat >= classes))
    if bad.any():
        raise IndexError(f"loss_parallel(): target {int(flat[bad][0])} is out of bounds for {classes} classes")
    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
    if weight is not None and weight.shape != (classes,):
        raise ValueError(f"{name}: weight must have {classes} entries (one per class), got {tuple(weight.shape)}")
    if lse is None:
        lse = _logsumexp(rows, mesh)
    offset = chunk_offset(classes, mesh.size(), mesh.get_local_rank())
    out = _VocabParallelNLL.apply(rows, lse, flat, weight, ignore_index, eps, reduction, mesh, offset, classes, softmax)
    return out.view(target.shape) if reduction == "none" else out


def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    if size_average is not None or reduce is not None:
        raise NotImplementedError("loss_parallel(): use reduction=, not the deprecated size_average / reduce")
    return _loss(input, target, weight, ignore_index, reduction, label_smoothing)


def _log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    dim = (1 if input.ndim >= 2 else 0) if dim is None else dim % input.ndim
    if input.placements != (Shard(dim),):  # softmax over an unsharded dim is local
        local = F.log_softmax(input.to_local(), dim)
        return DTensor.from_local(local, input.device_mesh, input.placements, shape=input.shape)
    rows, moved = _rows(input, dim, "F.log_softmax")
    lse = _logsumexp(rows, input.device_mesh)
    local = _LogSoftmax.apply(rows, lse, input.device_mesh).view(moved).movedim(-1, dim)
    out = DTensor.from_local(local, input.device_mesh, input.placements, shape=input.shape)
    out._log_softmax_of = (input, dim, lse)  # lets nll_loss take the fused path
    return out


def _nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    if size_average is not None or reduce is not None:
        raise NotImplementedError("loss_parallel(): use reduction=, not the deprecated size_average / reduce")
    source = getattr(input, "_log_softmax_of", None)
    if source is not None and source[1] == (1 if input.ndim >= 2 else 0):  # nll(log_softmax(x)): fused
        return _loss(source[0], target, weight, ignore_index, reduction, 0.0, lse=source[2], name="nll_loss")
    zero = torch.zeros((), dtype=input.dtype)  # the rows are log-probabilities already: lse = 0
    return _loss(input, target, weight, ignore_index, reduction, 0.0, lse=zero, softmax=False, name="nll_loss")


_HANDLERS = {F.cross_entropy: _cross_entropy, F.log_softmax: _log_softmax, F.nll_loss: _nll_loss}


@contextlib.contextmanager
def loss_parallel():
    """Inside: cross-entropy, log_softmax and nll_loss work on class-sharded logits DTensors."""
    for func, handler in _HANDLERS.items():
        register_torch_function(func, handler)
    try:
        yield
    finally:
        for func in _HANDLERS:
            register_torch_function(func, None)

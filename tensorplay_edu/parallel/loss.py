"""loss_parallel: cross-entropy on logits sharded over the classes, never gathering them.

Rank r of the TP group holds the logits of classes ``[o_r, o_r + V_r)`` (``torch.chunk`` of V).
Each row needs three numbers from the whole vocabulary, one all-reduce each over the TP group
(:func:`_vocab_parallel_forward`, as in Megatron-LM's vocab-parallel cross-entropy, which takes the
target's logit second; here it comes last, so that label smoothing's sum rides in the same call):

1. ``m = max_c x_c``             all-reduce (max)
2. ``s = sum_c exp(x_c - m)``    all-reduce (sum); ``lse = m + log s``
3. ``x_y``, the target's logit   all-reduce (sum): its owner adds it, the others add 0
   (with label smoothing the same all-reduce also carries ``sum_c w_c x_c``)

``loss = (1 - eps) w_y (lse - x_y) + eps / V (W lse - sum_c w_c x_c)``, ``W = sum_c w_c`` over all V
classes.  The gradient is local, no communication: ``(1 - eps) w_y (softmax - onehot_y) + eps / V
(W softmax - w)``, times the reduction's scale.  One ``[N, V/t]`` buffer holds ``x - m``, then in place
the softmax (kept for backward instead of the logits), then in place the gradient: one backward per loss.

N-D meshes (DP x TP, CP x TP).  One mesh dim shards the class dim (dim 1, or 0 for 1-D logits): the
*TP dim*.  The others shard other tensor dims (the *row dims*: batch, sequence) or replicate; the
per-row all-reduces run on the TP dim's group alone.  The target is laid out like the logits without
their class dim: ``Shard(class)`` becomes ``Replicate``, ``Shard(d > class)`` becomes ``Shard(d - 1)``.
A plain tensor target is accepted where that layout is all ``Replicate``.

Reductions.  ``"none"`` is per row: a DTensor laid out like the target when rows are sharded, else a
plain tensor.  ``"sum"`` and ``"mean"`` add ``[sum of row losses, sum of w_y]`` over the row dims in one
more all-reduce, and ``"mean"`` divides by that global denominator (a mean of the ranks' means would
weigh each row by its own rank's count).  The loss is a plain tensor, the same on every rank, and its
backward communicates nothing.  Each data-parallel rank's gradient is then its share of the global mean's
gradient: the shares must be *summed* across DP.  DDP and FSDP2 average them instead, so multiply the loss by
the DP size before ``backward()`` (as transformers' Trainer does), or the gradients come out dp times too small.

Under ``with loss_parallel():`` ``F.cross_entropy`` (``nn.CrossEntropyLoss``), ``F.log_softmax`` and
``F.nll_loss`` accept a class-sharded logits DTensor; ``F.nll_loss(F.log_softmax(x, 1), y)`` is the same
three all-reduces.  A ``log_softmax`` read otherwise costs one all-reduce in backward (``sum_c g``).
The contexts nest, and backward may run outside them.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .. import debug
from ..dtensor import DTensor
from ..dtensor import register_torch_function
from ..placement import Partial, Replicate, Shard, chunk_offset
from ..transition import redistribute_local

__all__ = ["loss_parallel"]

_HINT = "Produce the logits with ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)."


def _all_reduce(x: torch.Tensor, mesh, dims, op: str = "sum", scope=debug.module_scope) -> torch.Tensor:
    """All-reduce ``x`` over mesh ``dims``: the transition table's ``Partial(op) -> Replicate`` row, one
    collective per mesh dim of more than one rank, on that dim's group only, recorded as loss_parallel's."""
    src = tuple(Partial(op) if i in dims else Replicate() for i in range(mesh.ndim))
    with scope("loss_parallel"):
        return redistribute_local(x, mesh, src, (Replicate(),) * mesh.ndim, x.shape)


def _layout(dt: DTensor, dim: int, what: str):
    """(TP mesh dim, row mesh dims, the target's placements) of logits sharded on ``dim``."""
    p = dt.placements
    tp = [i for i, q in enumerate(p) if q == Shard(dim)]
    if len(tp) != 1:
        raise ValueError(f"loss_parallel() requires exactly one mesh dim to shard tensor dimension {dim}, but got "
                         f"placements {p} with {len(tp)} such mesh dim(s). ({what}) {_HINT}")
    for i, q in enumerate(p):
        if i != tp[0] and not isinstance(q, (Shard, Replicate)):
            raise ValueError(f"loss_parallel() expects non-TP mesh dims to be Shard or Replicate, got {q} at dim {i}.")
    rows = [i for i, q in enumerate(p) if isinstance(q, Shard) and i != tp[0]]
    target = tuple(Replicate() if i == tp[0] else Shard(q.dim - 1) if isinstance(q, Shard) and q.dim > dim else q
                   for i, q in enumerate(p))
    return tp[0], rows, target


def _rows(dt: DTensor, dim: int):
    """This rank's logits as [local rows, local classes] (and the moved shape to undo it)."""
    moved = dt.to_local().movedim(dim, -1)  # [.., V/t]
    return moved.reshape(moved.shape[:-1].numel(), moved.shape[-1]), moved.shape  # (V/t may be 0: no -1)


@torch.no_grad()
def _vocab_parallel_forward(rows: torch.Tensor, mesh, tp: int, sums=None, lse=None, softmax: bool = True):
    """The three all-reduces of the vocabulary-parallel cross-entropy, on this rank's ``rows`` [N, V/t].

    Returns (the softmax [N, V/t] or None, the global log-sum-exp [N], the global ``sums`` [k, N] or None).
    A given ``lse`` (from our log_softmax; 0 for log-probabilities) skips the first two all-reduces;
    ``sums=None`` (log_softmax: no target) skips the third."""
    buf = None
    if lse is None:
        local_max = rows.amax(1) if rows.shape[1] else rows.new_full(rows.shape[:1], float("-inf"))  # [N]
        # all-reduce (max) over the TP group: the row's global max
        m = _all_reduce(local_max, mesh, [tp], "max")  # [N]
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a row of -inf logits shifts by 0
        buf = rows - m[:, None]  # [N, V/t]: the one fresh buffer
        # all-reduce (sum) over the TP group: the row's sum of exp(x - m)
        s = _all_reduce(buf.exp_().sum(1), mesh, [tp])  # [N]
        buf.div_(s[:, None])  # [N, V/t]: the softmax, in place
        lse = m + s.log()  # [N]
    elif softmax:
        buf = (rows - lse[:, None]).exp_()  # [N, V/t]: the softmax, from the lse given
    if sums is None:
        return buf, lse, None
    # all-reduce (sum) over the TP group: the target's logit x_y (its owner adds it, the others 0),
    # and with label smoothing sum_c w_c x_c in the same call
    total = _all_reduce(torch.stack(sums), mesh, [tp])  # [k, N], k = 1 or 2
    return buf, lse, total


class _LogSoftmax(torch.autograd.Function):
    """``x - lse``; its backward ``g - softmax * sum_c g`` needs one all-reduce of ``sum_c g`` (TP group)."""

    @staticmethod
    def forward(ctx, rows, lse, mesh, tp):
        out = rows - lse[:, None]
        ctx.save_for_backward(out)
        ctx.mesh, ctx.tp = mesh, tp
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        # all-reduce (sum) over the TP group: sum_c g of each row
        total = _all_reduce(grad.sum(1), ctx.mesh, [ctx.tp], scope=debug.backward_scope)  # [N]
        return grad - out.exp() * total[:, None], None, None, None


class _VocabParallelNLL(torch.autograd.Function):
    """Forward: the loss from rows of logits (``softmax=True``) or of log-probabilities.
    Backward: local, no communication: it scales the saved softmax buffer in place and subtracts
    the target's share, so the buffer becomes the gradient and the graph runs backward once."""

    @staticmethod
    def forward(ctx, rows, lse, target, weight, ignore_index, eps, reduction, comm, offset, classes, softmax):
        mesh, tp, row_dims = comm
        valid = target != ignore_index
        safe = target.masked_fill(~valid, 0)
        mine = valid & (safe >= offset) & (safe < offset + rows.shape[1])
        local_idx = (safe - offset).clamp(0, max(rows.shape[1] - 1, 0))
        picked = rows.gather(1, local_idx[:, None]).squeeze(1) if rows.shape[1] else rows.new_zeros(target.shape)
        sums = [picked.masked_fill(~mine, 0)]  # [N]: x_y on its owner, 0 elsewhere
        w_local = None if weight is None else weight.narrow(0, offset, rows.shape[1])
        if eps > 0:  # [N]: sum_c w_c x_c, this rank's part (a matrix-vector product: no [N, V/t] temporary)
            sums.append(rows.sum(1) if w_local is None else rows @ w_local.to(rows.dtype))
        buf, lse, packed = _vocab_parallel_forward(rows, mesh, tp, sums, lse, softmax)  # the three all-reduces
        w_y = valid.to(lse.dtype) if weight is None else weight[safe].to(lse.dtype) * valid
        loss = (1 - eps) * w_y * (lse - packed[0])
        total_w = classes if weight is None else weight.sum()
        if eps > 0:
            loss = loss + eps / classes * (total_w * lse - packed[1]) * valid
        ctx.save_for_backward(buf, w_y, valid, local_idx, mine)
        ctx.args = (w_local, eps, reduction, classes, total_w, softmax, tuple(rows.shape), rows.dtype)
        ctx.denominator, ctx.spent = 1, False
        if reduction == "none":
            return loss
        # all-reduce (sum) over the row dims: [sum of row losses, sum of w_y] of all rows, not this rank's
        acc = torch.promote_types(loss.dtype, torch.float32)  # (a bfloat16 count is inexact above 256)
        totals = _all_reduce(torch.stack([loss.to(acc).sum(), w_y.to(acc).sum()]), mesh, row_dims)
        if reduction == "sum":
            return totals[0].to(loss.dtype, copy=True)
        ctx.denominator = totals[1]  # the GLOBAL weight of the non-ignored rows
        return (totals[0] / totals[1]).to(loss.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if ctx.spent:
            raise RuntimeError("loss_parallel: this loss's backward already ran; it writes the gradient into the "
                               "softmax buffer it saved, so it runs once (retain_graph=True cannot reuse it). "
                               "Compute the loss again for a second backward.")
        ctx.spent = True
        buf, w_y, valid, local_idx, mine = ctx.saved_tensors
        w_local, eps, reduction, classes, total_w, softmax, shape, dtype = ctx.args
        scale = grad_out if reduction == "none" else grad_out / ctx.denominator  # [N] or a scalar
        hit = torch.where(valid, scale * (1 - eps) * w_y, 0)  # [N]: what the target's own logit loses
        if not softmax:  # the rows were log-probabilities: only the targets get a gradient
            grad = torch.zeros(shape, dtype=dtype, device=w_y.device)
        else:  # grad = scale * ((1 - eps) w_y (p - onehot) + eps / V (W p - w)), row by row, in buf
            grad = buf.mul_(torch.where(valid, scale * ((1 - eps) * w_y + eps / classes * total_w), 0)[:, None])
            if eps > 0:
                share = torch.where(valid, scale * eps / classes, 0)[:, None]  # [N, 1]
                if w_local is None:
                    grad.sub_(share)
                else:
                    grad.addcmul_(share, w_local[None, :].to(dtype), value=-1)
        if shape[1]:
            grad.scatter_add_(1, local_idx[:, None], -(hit * mine)[:, None].to(dtype))
        return grad, *([None] * 10)


def _target(target, x: DTensor, mesh, placements, dim: int, rows: int):
    """The target's local entries, flat, and the target's (local shape, global shape)."""
    global_shape = x.shape[:dim] + x.shape[dim + 1:]
    if isinstance(target, DTensor):
        if target.device_mesh != mesh or target.placements != placements:
            raise ValueError(f"loss_parallel(): the target has placements {target.placements}, but logits laid out "
                             f"as {x.placements} need a target laid out as {placements} (the logits' without "
                             "their class dim)")
        if target.shape != global_shape:
            raise ValueError(f"loss_parallel(): the target has shape {list(target.shape)}, "
                             f"expected {list(global_shape)} for logits of shape {list(x.shape)}")
        target = target.to_local()
    elif any(not isinstance(p, Replicate) for p in placements):
        raise ValueError(f"loss_parallel() requires a DTensor (not a plain torch.Tensor) target when the logits "
                         f"({x.placements}) shard rows over a non-TP mesh dim: is a plain tensor the global target "
                         f"or this rank's rows? Pass distribute_tensor(target, mesh, {list(placements)}) or "
                         f"DTensor.from_local(local_target, mesh, {list(placements)}, shape=...).")
    if not isinstance(target, torch.Tensor) or target.is_floating_point():
        raise NotImplementedError("loss_parallel() supports class-index targets only (not class probabilities)")
    flat = target.reshape(-1)
    if flat.numel() != rows:
        raise ValueError(f"loss_parallel(): the target has {flat.numel()} entries for {rows} rows of logits")
    return flat, target.shape, global_shape


def _loss(x: DTensor, target, weight, ignore_index, reduction, eps, lse=None, softmax=True, name="cross_entropy"):
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{name}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {eps}")
    dim = 1 if x.ndim >= 2 else 0
    tp, row_dims, placements = _layout(x, dim, f"F.{name}")
    rows, _ = _rows(x, dim)
    mesh, classes = x.device_mesh, x.shape[dim]
    flat, local_shape, global_shape = _target(target, x, mesh, placements, dim, rows.shape[0])
    bad = (flat != ignore_index) & ((flat < 0) | (flat >= classes))  # checked where it lives: no host sync
    torch._assert_async(~bad.any(), f"loss_parallel(): a target is out of bounds for {classes} classes "
                                    f"(other than ignore_index={ignore_index})")
    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
    if weight is not None and weight.shape != (classes,):
        raise ValueError(f"{name}: weight must have {classes} entries (one per class), got {tuple(weight.shape)}")
    offset = chunk_offset(classes, mesh.size(tp), mesh.get_local_rank(tp))
    out = _VocabParallelNLL.apply(rows, lse, flat, weight, ignore_index, eps, reduction, (mesh, tp, row_dims),
                                  offset, classes, softmax)
    if reduction != "none":
        return out
    out = out.view(local_shape)
    return DTensor.from_local(out, mesh, placements, shape=global_shape) if row_dims else out


def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    if size_average is not None or reduce is not None:
        raise NotImplementedError("loss_parallel(): use reduction=, not the deprecated size_average / reduce")
    return _loss(input, target, weight, ignore_index, reduction, label_smoothing)


def _log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    dim = (1 if input.ndim >= 2 else 0) if dim is None else dim % input.ndim
    if not any(p == Shard(dim) or isinstance(p, Partial) for p in input.placements):  # softmax over a whole dim
        local = F.log_softmax(input.to_local(), dim)
        return DTensor.from_local(local, input.device_mesh, input.placements, shape=input.shape)
    tp, _, _ = _layout(input, dim, "F.log_softmax")
    rows, moved = _rows(input, dim)
    _, lse, _ = _vocab_parallel_forward(rows, input.device_mesh, tp)  # all-reduces 1 and 2: the lse
    local = _LogSoftmax.apply(rows, lse, input.device_mesh, tp).view(moved).movedim(-1, dim)
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
    """Inside: cross-entropy, log_softmax and nll_loss work on class-sharded logits DTensors.

    Nestable: on exit, each function gets back the handler it had on entry (none, or an
    outer block's), so an inner block's exit never switches an outer block off."""
    before = {func: register_torch_function(func, handler) for func, handler in _HANDLERS.items()}
    try:
        yield
    finally:
        for func, handler in before.items():
            register_torch_function(func, handler)

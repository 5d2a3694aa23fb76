"""Gradient clipping for a tensor-parallel model: one norm, the same on every rank.

Clipping scales every gradient by ``min(max_norm / (norm + 1e-6), 1)``, where ``norm`` is the
p-norm of ALL gradients seen as one vector.  ``torch.nn.utils.clip_grad_norm_`` on a rank sees only
its pieces: each rank would get its own norm and clip by its own factor, and the replicated
parameters (norm weights, a rowwise bias) would drift apart.  So the sum is written out over the
ranks (for p < inf, norm^p = the sum over every gradient element of |g|^p):

* a **sharded** parameter (``Shard`` on a mesh dim of more than one rank): this rank sums |g|^p
  over its piece, and the pieces' sums are added over the ranks of every such mesh dim.  This
  rank's sum is ``Partial`` there, and ``Partial -> Replicate`` is one all-reduce per mesh dim,
  shared by all parameters sharded over the same process groups (one for a whole 1-D TP model);
* a **replicated** parameter (no layout, or ``Replicate`` on a mesh dim, or DDP's averaged
  gradients over ``"dp"``) is counted once: every rank holds the same whole gradient;
* ``norm_type=inf``: the largest |g|, so the maximum over the ranks (``Partial("max")``), with a
  "this rank saw a nan" flag in the same all-reduce (a maximum over ranks may drop a nan).

Every rank then holds the single-device norm and clips its pieces with PyTorch's
``clip_grads_with_norm_``.

Importing :mod:`tensorplay_edu.parallel` guards PyTorch's ``torch.nn.utils.clip_grad_norm_`` and
``get_total_norm``: given a tensor-parallel parameter sharded over several ranks, they raise a
``RuntimeError`` (their answer would be this rank's), and otherwise run unchanged.  PyTorch's
function stays reachable as ``torch.nn.utils.clip_grad_norm_.__wrapped__``; a reference taken
before ``tensorplay_edu.parallel`` was imported is unguarded, and ``get_total_norm`` given the
gradients (plain tensors, no layout) cannot tell.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import warnings
from collections.abc import Iterable

import torch
from torch.nn.utils import clip_grad as _torch_clip_grad

from .. import debug
from ..placement import Partial, Replicate, Shard
from ..transition import redistribute_local
from .layout import _is_torch_dtensor, param_layout
from .grad_sync import pending_buckets

__all__ = ["clip_grad_norm_"]

# PyTorch's own pieces, by their private names (the guard below never wraps these).
_local_norm = _torch_clip_grad._get_total_norm  # = torch.nn.utils.get_total_norm
_clip_grads_with_norm_ = _torch_clip_grad._clip_grads_with_norm_  # = torch.nn.utils.clip_grads_with_norm_


def _split_dims(layout) -> tuple[int, ...]:
    """The mesh dims over which ``layout`` cuts the parameter into pieces (dims of one rank cut nothing)."""
    if layout is None:
        return ()
    return tuple(d for d, p in enumerate(layout.placements) if isinstance(p, Shard) and layout.mesh.size(d) > 1)


def _cut_dims(mesh, placements, what: str) -> tuple[int, ...]:
    """The mesh dims on which ``placements`` (ours or PyTorch's) cut a tensor into pieces."""
    for d, placement in enumerate(placements):
        if placement.is_partial():
            raise NotImplementedError(f"clip_grad_norm_: {what} laid out as {placement!r} on mesh dim {d}")
    return tuple(d for d, placement in enumerate(placements) if placement.is_shard() and mesh.size(d) > 1)


@torch.no_grad()
def clip_grad_norm_(parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> torch.Tensor:
    r"""Clip the gradient norm of an iterable of parameters, some of them tensor-parallel.

    ``torch.nn.utils.clip_grad_norm_`` with the norm taken over the whole model, not over
    this rank's pieces: the same arguments, defaults, errors and return value, and the
    same result as PyTorch's function on the single-device model.

    What is summed where (p = ``norm_type``; see the module docstring for why):

    * a parameter sharded by its layout (``Shard`` on mesh dims of more than one rank):
      |g|^p summed over this rank's piece, then over the ranks of every such mesh dim
      (``Partial -> Replicate`` through the transition table: one all-reduce of a scalar
      per mesh dim, shared by all parameters sharded over the same process groups);
    * a replicated parameter (no layout, or ``Replicate`` on a mesh dim): counted once,
      as every rank holds the same whole gradient;
    * ``norm_type=inf``: the largest |g| instead of the sum (``Partial("max")``).

    Every rank must call it with the same parameters (the all-reduces are collective).
    Partial gradients left for one bucket (:func:`~tensorplay_edu.parallel.grad_sync.bucket_partial_grads`)
    are made whole first (``finalize()``).
    Gradients are scaled in place by ``min(max_norm / (total_norm + 1e-6), 1)``.

    Args:
        parameters (Iterable[Tensor] or Tensor): the parameters (plain, or parallelized by
            ``parallelize_module``) whose gradients are clipped.
        max_norm (float): max norm of the gradients.
        norm_type (float, optional): type of the used p-norm, any p > 0 or ``inf``.
            Default: 2.0
        error_if_nonfinite (bool, optional): if True, an error is thrown if the total norm
            is ``nan``, ``inf``, or ``-inf`` (on every rank: they hold the same norm).
            Default: False
        foreach (bool, optional): use the faster foreach-based implementation (as PyTorch).
            Default: None

    Returns:
        Total norm of the parameter gradients (viewed as a single vector), the same tensor
        on every rank.
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    else:
        is_generator = isinstance(parameters, types.GeneratorType)
        parameters = list(parameters)  # a generator is read once
        if is_generator and len(parameters) == 0:
            warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=3)
    _require_layouts(parameters, "tensorplay_edu.parallel.clip_grad_norm_")
    for bucket in pending_buckets(parameters):  # bucket_partial_grads: the partial gradients made whole first
        bucket.finalize()
    total_norm = _total_norm(parameters, norm_type, error_if_nonfinite, foreach)
    _clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)  # PyTorch's: 1e-6, clamped to 1
    return total_norm


def _total_norm(parameters: list, norm_type, error_if_nonfinite: bool, foreach) -> torch.Tensor:
    """The p-norm of every gradient of ``parameters`` as one vector, the same on every rank."""
    norm_type = float(norm_type)
    if not (norm_type > 0):  # also nan
        raise NotImplementedError(
            f"tensorplay_edu.parallel.clip_grad_norm_: norm_type={norm_type} is not supported; use a p > 0 or "
            "inf (a p <= 0 'norm' of sharded gradients is no sum or maximum of the pieces' norms)")
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return torch.tensor(0.0)  # as PyTorch: nothing to measure
    first_device = params[0].grad.device
    is_inf = math.isinf(norm_type)

    # 1. Group the gradients by the process groups their pieces are spread over: () for
    #    replicated ones.  The same parameters give the same groups, in the same order,
    #    on every rank, so every rank issues the same all-reduces.
    groups: dict[tuple, dict] = {}
    for p in params:
        g, cuts = p.grad, []  # cuts: the (mesh, mesh dims) over which this gradient is cut into pieces
        if _is_torch_dtensor(g):  # FSDP2 sharded our piece over the data-parallel mesh: a PyTorch DTensor
            cuts.append((g.device_mesh, _cut_dims(g.device_mesh, g.placements, "an FSDP2 gradient")))
            g = g.to_local()
        layout = param_layout(p)
        if layout is not None:
            cuts.append((layout.mesh, _cut_dims(layout.mesh, layout.placements, "a parameter")))
        cuts = [(mesh, dims) for mesh, dims in cuts if dims]
        key = tuple(mesh.get_group(d) for mesh, dims in cuts for d in dims)
        group = groups.setdefault(key, {"cuts": cuts, "grads": [], "dtype": None})
        group["dtype"] = g.real.dtype if group["dtype"] is None else torch.promote_types(group["dtype"], g.real.dtype)
        if cuts and g.numel() == 0 and (math.prod(layout.shape) if layout is not None else p.numel()) > 0:
            continue  # an empty piece of a non-empty parameter (torch.chunk: 2 rows over 4 ranks): adds nothing,
            # and PyTorch's inf norm refuses an empty tensor (a maximum over nothing)
        group["grads"].append(g)

    # 2. This rank's norm of each group (PyTorch's get_total_norm, foreach as asked), and
    #    for a sharded group its sum (max for inf) over the ranks holding the pieces.
    norms = []
    for group in groups.values():
        dtype = group["dtype"]
        if group["grads"]:
            local = _local_norm(group["grads"], norm_type, False, foreach).to(first_device, dtype)
        else:
            local = torch.zeros((), dtype=dtype, device=first_device)  # this rank holds only empty pieces
        if group["cuts"]:
            wide = torch.promote_types(dtype, torch.float32)  # sum p-th powers of half-precision norms in float32
            if is_inf:  # [largest |g| here, 1 if it is nan]: a max over ranks may drop a nan (gloo keeps
                # one only on rank 0), so whether any rank saw one travels beside it, in the same all-reduce
                x = torch.stack([torch.where(local.isnan(), 0.0, local).to(wide), local.isnan().to(wide)])
            else:
                x = local.to(wide) ** norm_type  # |g|^p summed over this rank's pieces (a nan stays nan)
            partial = Partial("max") if is_inf else Partial()
            for mesh, dims in group["cuts"]:  # FSDP2's data-parallel mesh first, then the tensor-parallel one
                src = tuple(partial if d in dims else Replicate() for d in range(mesh.ndim))
                with debug.module_scope("clip_grad_norm_"):
                    x = redistribute_local(x, mesh, src, (Replicate(),) * mesh.ndim, x.shape)
            if is_inf:
                x = torch.where(x[1] > 0, torch.nan, x[0])
            local = (x if is_inf else x ** (1.0 / norm_type)).to(dtype)
        norms.append(local)
    total_norm = torch.linalg.vector_norm(torch.stack(norms), norm_type)

    if error_if_nonfinite and torch.logical_or(total_norm.isnan(), total_norm.isinf()):
        raise RuntimeError(  # PyTorch's message
            f"The total norm of order {norm_type} for gradients from "
            "`parameters` is non-finite, so it cannot be clipped. To disable "
            "this error and scale the gradients by the non-finite norm anyway, "
            "set `error_if_nonfinite=False`")
    return total_norm


def _require_layouts(tensors: list, where: str) -> None:
    """FSDP2 x TP without ``attach_layouts``: FSDP2's parameters (PyTorch DTensors over a
    data-parallel group smaller than the world) and not one tensor-parallel layout among them.
    Every TP piece would count as a whole parameter: refuse, naming the fix."""
    fsdp = [t for t in tensors if isinstance(t, torch.Tensor) and _is_torch_dtensor(t)]
    if not fsdp or not torch.distributed.is_initialized() or any(param_layout(t) is not None for t in tensors):
        return
    mesh = fsdp[0].device_mesh
    if mesh.size() < torch.distributed.get_world_size():
        raise RuntimeError(
            f"{where}: these are FSDP2 shards over {mesh.size()} of the {torch.distributed.get_world_size()} ranks, "
            "and none carries a tensor-parallel layout. fully_shard replaced the parameters of a tensor-parallel "
            "model, so each TP piece would count as a whole parameter and every TP rank would get its own norm. "
            "Call tensorplay_edu.parallel.attach_layouts(model) after fully_shard (and again after anything that "
            "replaces parameters, e.g. to_empty), then use tensorplay_edu.parallel.clip_grad_norm_.")


# ---- the guard on PyTorch's functions -------------------------------------------------

_ADVICE = {
    "clip_grad_norm_": "Use tensorplay_edu.parallel.clip_grad_norm_ (the same arguments): it sums over the ranks "
                       "that hold the pieces, so every rank gets the single-device norm.",
    "get_total_norm": "For the norm of the gradients use tensorplay_edu.parallel.clip_grad_norm_(parameters, "
                      "max_norm=float('inf')), which clips nothing and returns the norm over all ranks; for the "
                      "norm of the parameters themselves gather them first (tensorplay_edu.parallel."
                      "full_state_dict).",
}


def _refuse_sharded(name: str, tensors) -> None:
    """Raise if a tensor of ``tensors`` is a parameter (or the gradient of one) sharded over more
    than one rank, or an FSDP2 shard of a tensor-parallel model."""
    _require_layouts(tensors, f"torch.nn.utils.{name}")
    if name == "get_total_norm" and any(isinstance(t, torch.Tensor) and _is_torch_dtensor(t) and
                                        t.device_mesh.size() < torch.distributed.get_world_size() for t in tensors):
        raise RuntimeError(f"torch.nn.utils.get_total_norm was given FSDP2 gradients on a data-parallel group smaller "
                           f"than the world: under tensor parallelism their norm is this TP rank's. {_ADVICE[name]}")
    for t in tensors:
        layout = param_layout(t) if isinstance(t, torch.Tensor) else None
        if _split_dims(layout):
            raise RuntimeError(
                f"torch.nn.utils.{name} was given a tensor-parallel parameter sharded over several ranks (this "
                f"rank holds a {list(t.shape)} piece of a {list(layout.shape)} parameter laid out as "
                f"{list(layout.placements)} on {layout.mesh}). PyTorch sees only this rank's pieces, so each rank "
                f"would get a different norm, clip by a different factor, and the replicated parameters would "
                f"drift apart. {_ADVICE[name]} (PyTorch's unchecked function: torch.nn.utils.{name}.__wrapped__.)")


def _checked(torch_fn, name: str):
    """``torch_fn`` (whose first argument is a tensor or an iterable of tensors), refusing sharded parameters."""
    first = next(iter(inspect.signature(torch_fn).parameters))

    def inspected(tensors):
        if isinstance(tensors, torch.Tensor):
            _refuse_sharded(name, [tensors])
            return tensors
        was_generator = isinstance(tensors, types.GeneratorType)
        tensors = list(tensors)  # read once here, handed on as it came (PyTorch warns about an empty generator)
        _refuse_sharded(name, tensors)
        return (t for t in tensors) if was_generator else tensors

    @functools.wraps(torch_fn)
    def checked(*args, **kwargs):
        if args:
            args = (inspected(args[0]), *args[1:])
        elif first in kwargs:
            kwargs[first] = inspected(kwargs[first])
        return torch_fn(*args, **kwargs)

    checked.__tensorplay_guard__ = True
    return checked


def install_guards() -> None:
    """Wrap PyTorch's ``clip_grad_norm_`` and ``get_total_norm`` (idempotent; called on import)."""
    utils = torch.nn.utils
    wrapped: dict[int, object] = {}  # one wrapper per PyTorch function, shared by its names
    for module, attr, name in [(_torch_clip_grad, "clip_grad_norm_", "clip_grad_norm_"),
                               (utils, "clip_grad_norm_", "clip_grad_norm_"),
                               (utils, "get_total_norm", "get_total_norm")]:
        fn = getattr(module, attr, None)
        if fn is None or getattr(fn, "__tensorplay_guard__", False):
            continue
        if id(fn) not in wrapped:
            wrapped[id(fn)] = _checked(fn, name)
        setattr(module, attr, wrapped[id(fn)])


install_guards()

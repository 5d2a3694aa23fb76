"""A row-split module runs its own forward: the class's method (a subclass's included) on this
rank's piece, with what the layout needs done before and after it.

**Rowwise Embedding** (vocab-parallel, weight ``Shard(0)``): each rank holds whole rows of
the table, so every token is looked up on exactly one rank, its owner.  Each rank runs the
module's forward on its own ids (others' ids point at row 0), then zeroes the tokens it does
not own: the sum over ranks that follows is the owner's output.  A forward that works token by
token (Gemma's ``* sqrt(h)``, an added position) is therefore right; one that mixes tokens
is not.

**Rowwise Linear** (weight ``Shard(1)``): each rank computes ``x_r @ W_r^T``, an addend of the
output.  A plain ``nn.Linear`` adds its bias after the reduction (style.py).  A subclass's
forward runs on the addend, and its bias joins the partial sum on rank 0 only: the table's
``Replicate -> Partial`` (zeros elsewhere, gradient whole everywhere, no communication).
The sum over ranks equals the one-device output when the forward is linear in the layer's
product (a scale; not ``+ c``, which t ranks would add t times): a non-linear function of a
partial sum (``relu``, ``softmax``) is not the function of the sum, so keep such a layer whole
or Colwise.  A subclass's other parameters (a learnable scale, a position table) see this
rank's addend or tokens only: their gradients are summed over the TP group as they arrive.
(``Replicate -> Partial`` and the reduction after it are rows of transition.py's table.)
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from ..dtensor import DTensor
from ..placement import Partial, Replicate, chunk_offset, chunk_sizes
from .grad_sync import partial_gradient

__all__ = ["overrides_forward", "partial_own_forward", "partial_gradients_of_extras", "vocab_parallel_embedding"]


def overrides_forward(module: nn.Module, base: type) -> bool:
    """Does ``module``'s class define a forward of its own (not ``base``'s)?"""
    return type(module).forward is not base.forward


@contextlib.contextmanager
def _swapped(module: nn.Module, **values):
    """``module``'s attributes (parameters included) set to ``values`` for the block."""
    saved = {}
    for name, value in values.items():
        store = module._parameters if name in module._parameters else module.__dict__
        saved[name] = (store, store[name])
        store[name] = value
    try:
        yield module
    finally:
        for name, (store, value) in saved.items():
            store[name] = value


def partial_gradients_of_extras(module: nn.Module, mesh, path: str) -> None:
    """A subclass's other parameters (a learnable scale, a position table) read this rank's addend or
    tokens only, so their gradients are addends too: summed over the TP group as they arrive (grad_sync)."""
    for owner_path, owner in module.named_modules():
        for name, param in owner.named_parameters(recurse=False):
            if owner is module and name in ("weight", "bias") or not param.requires_grad:
                continue
            partial_gradient(owner, name, mesh, f"{path}.{owner_path + '.' if owner_path else ''}{name}")


def partial_own_forward(module: nn.Linear, mesh, x: torch.Tensor) -> torch.Tensor:
    """A Linear subclass's forward on this rank's columns ``x_r [.., in/t]``: an addend of its output."""
    bias = module._parameters.get("bias")
    if bias is None:
        return type(module).forward(module, x)  # [.., out], this rank's addend
    # the bias as an addend too: rank 0's whole, zeros elsewhere (Replicate -> Partial, no communication)
    addend = DTensor.from_local(bias, mesh, [Replicate()]).redistribute(placements=[Partial()]).to_local()
    with _swapped(module, bias=addend):
        return type(module).forward(module, x)


def vocab_parallel_embedding(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """Rowwise Embedding forward: the module's own forward on the ids this rank owns, zeros elsewhere."""
    layout = self._tp_layouts["weight"]
    vocab, t, r = layout.shape[0], layout.mesh.size(), layout.mesh.get_local_rank()
    # checked where the ids live, without a host sync (on a GPU a device-side assert; PyTorch checks nothing)
    torch._assert_async(((ids >= 0) & (ids < vocab)).all(), f"'{_path(self)}': a token id is out of range [0, {vocab})")
    start, rows = chunk_offset(vocab, t, r), chunk_sizes(vocab, t)[r]
    if rows == 0:  # this rank holds no rows: every id is someone else's
        return self.weight.new_zeros((*ids.shape, self.embedding_dim)) + 0 * self.weight.sum()
    outside = (ids < start) | (ids >= start + rows)
    local_ids = (ids - start).masked_fill(outside, 0)  # [..], rows of this rank's [V/t, h] piece
    pad = self.padding_idx
    pad = pad - start if pad is not None and start <= pad < start + rows else None  # the pad row, if it is here
    if not overrides_forward(self, nn.Embedding):
        out = F.embedding(local_ids, self.weight, pad, self.max_norm, self.norm_type, self.scale_grad_by_freq,
                          self.sparse)
        return out.masked_fill_(outside.unsqueeze(-1), 0.0)  # in place: the lookup's backward does not read it
    with _swapped(self, padding_idx=pad):
        out = type(self).forward(self, local_ids)  # [.., h]: the class's own forward (a scale, say)
    return out.masked_fill(outside.unsqueeze(-1), 0.0)  # this rank's addend: its own tokens' rows


def _path(module: nn.Module) -> str:
    return getattr(module, "_tp_fqn", "") or type(module).__name__


def refuse_whole_row_options(style, module: nn.Embedding, path: str, rowwise: bool) -> None:
    """nn.Embedding's max_norm renormalises whole rows, and (row-split) scale_grad_by_freq counts
    every id: this rank's piece holds neither, so the style refuses them."""
    cut = [o for o in ("max_norm",) + (("scale_grad_by_freq",) if rowwise else ()) if getattr(module, o)]
    if cut:
        raise NotImplementedError(f"{type(style).__name__} on '{path}': nn.Embedding({cut[0]}=...) reads "
                                  "whole rows or every id, which this rank's piece does not hold; leave the "
                                  "embedding whole (out of the plan), or drop the option")

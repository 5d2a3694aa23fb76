"""A plain ``optimizer.state_dict()`` of tensor-parallel parameters: pieces that know their place.

AdamW keeps ``exp_avg`` and ``exp_avg_sq`` shaped like each parameter, so for a split
parameter they are this rank's piece of the single-device moments, with no layout. Handed
to ``dcp.save({"optim": opt.state_dict()})`` as they are, DCP would take them for replicas
(one name, one shape, on every rank) and keep rank 0's; resumed, rank 1 would step with
rank 0's moments. Importing this package wraps ``torch.optim.Optimizer.state_dict`` and
``load_state_dict`` (once; the wrappers carry ``__tensorplay_guard__``):

* ``state_dict()``: each state tensor shaped like its split parameter becomes a :class:`Piece`
  (the parameter's layout gives the offsets; FSDP2's DTensor state adds its own), so
  ``dcp.save`` writes every rank's chunk and ``dcp.load`` into it reshards, and ``torch.save``
  records the place;
* ``load_state_dict(sd)``: a Piece of this rank's place gives its local tensor, a tensor of the
  single-device shape gives this rank's chunk, a local-shaped tensor is taken as it is; a Piece of
  another place (another rank's file, another TP degree) is refused, naming the key.

Everything else (step counts, hyper-parameters, replicated parameters' state) is untouched.
A parameter is split when it carries ``tp_layout`` (FSDP2 replaces parameters: call
``attach_layouts(model)`` after ``fully_shard``).

As in PyTorch, ``dcp.load`` fills the state the optimizer already has: a fresh optimizer's
``state_dict()`` has none, so nothing would be read into it. Take one step first, or use
``checkpoint.get_state_dict``, which initialises the state the way PyTorch's does.
"""

from __future__ import annotations

import functools
import itertools

import torch

from .checkpoint import _as_local, _piece_of_state
from .layout import ParamLayout, is_split, param_layout
from .piece import Piece

__all__ = ["install_guards"]


def _split(param) -> ParamLayout | None:
    layout = param_layout(param) if isinstance(param, torch.Tensor) else None
    return layout if is_split(layout) else None


def _like_param(value, param) -> bool:
    """A state tensor shaped like its parameter's piece (exp_avg, momentum_buffer), not yet a Piece."""
    return isinstance(value, torch.Tensor) and not isinstance(value, Piece) and value.shape == param.shape


def _state_dict(torch_fn):
    @functools.wraps(torch_fn)
    def state_dict(self):
        sd = torch_fn(self)
        by_index, start = {}, 0  # PyTorch's numbering: a parameter's first place in the groups
        seen = set()
        for group in self.param_groups:
            for i, p in enumerate(group["params"], start):
                if id(p) not in seen:
                    seen.add(id(p))
                    by_index[i] = p
            start += len(group["params"])
        state = {}
        for key, entry in sd["state"].items():
            param = by_index.get(key)
            layout = _split(param)
            if layout is not None and isinstance(entry, dict):  # a new dict: the optimizer's own stays as is
                entry = {k: _piece_of_state(v, layout, param, k) if _like_param(v, param) else v
                         for k, v in entry.items()}
            state[key] = entry
        return {**sd, "state": state}

    state_dict.__tensorplay_guard__ = True
    return state_dict


def _load_state_dict(torch_fn):
    @functools.wraps(torch_fn)
    def load_state_dict(self, state_dict):
        saved = itertools.chain.from_iterable(g["params"] for g in state_dict.get("param_groups", []))
        params = dict(zip(saved, itertools.chain.from_iterable(g["params"] for g in self.param_groups)))
        state = {}
        for key, entry in state_dict.get("state", {}).items():
            param = params.get(key)
            if isinstance(entry, dict) and param is not None:
                entry = {k: _state_in(v, param, f"state[{key!r}][{k!r}]") for k, v in entry.items()}
            state[key] = entry
        return torch_fn(self, {**state_dict, "state": state})

    load_state_dict.__tensorplay_guard__ = True
    return load_state_dict


def _state_in(value, param, key: str):
    layout = _split(param)
    if layout is None:
        if isinstance(value, Piece):
            raise ValueError(
                f"optimizer.load_state_dict: {key} is the part at offsets {list(value.offsets)} of a "
                f"{list(value.shape)} tensor, but its parameter is whole here: the state dict comes from a "
                "tensor-parallel layout. Save it with torch.distributed.checkpoint and dcp.load it into this "
                "optimizer's state_dict(): DCP reshards")
        return value
    if not isinstance(value, torch.Tensor):
        return value
    return _as_local(value, layout, param, f"optimizer {key}")


def install_guards() -> None:
    """Wrap ``torch.optim.Optimizer.state_dict`` / ``load_state_dict`` (idempotent; called on import)."""
    for name, wrap in (("state_dict", _state_dict), ("load_state_dict", _load_state_dict)):
        fn = getattr(torch.optim.Optimizer, name)
        if not getattr(fn, "__tensorplay_guard__", False):
            setattr(torch.optim.Optimizer, name, wrap(fn))


install_guards()

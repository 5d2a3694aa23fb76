"""Optimizers on pieces: right when the update is element by element, refused otherwise.

``torch.optim`` sees this rank's piece of each split parameter.  SGD, Adam, AdamW and the
others below update every element from that element's own gradient and state (the
hyper-parameters are numbers), so the pieces' updates are the pieces of one device's update,
with no communication.  An optimizer that reads a whole matrix computes something else from
a piece: Adafactor's row and column means and its ``param.norm()``, Muon's orthogonalisation
of the update, LBFGS's dot products over every parameter.  Such an optimizer is refused at
its first step on a split parameter, with the reason.  Your own elementwise optimizer may
join the list: ``tensorplay_edu.parallel.optimizers.ELEMENTWISE.add(MyOptimizer)``.
"""

from __future__ import annotations

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .layout import is_split, param_layout

__all__ = ["ELEMENTWISE", "check_optimizer"]

ELEMENTWISE: set[type] = {getattr(torch.optim, name) for name in (
    "SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "Rprop", "ASGD",
    "SparseAdam") if hasattr(torch.optim, name)}

_WHY = {"Adafactor": "its factored second moment takes row and column means of each matrix, and its step size "
                     "the norm of each parameter",
        "Muon": "it orthogonalises each matrix's update (Newton-Schulz over the whole matrix)",
        "LBFGS": "its curvature estimate takes dot products over every parameter"}


def check_optimizer(optimizer: torch.optim.Optimizer, args=(), kwargs=None) -> None:
    """A step pre-hook on every optimizer: refuse a non-elementwise one holding split pieces."""
    if type(optimizer) in ELEMENTWISE:
        return
    split = [p for group in optimizer.param_groups for p in group["params"] if is_split(param_layout(p))]
    if split:
        name = type(optimizer).__name__
        layout = param_layout(split[0])
        raise RuntimeError(
            f"{name}.step() on {len(split)} tensor-parallel pieces (one is this rank's {list(split[0].shape)} part of "
            f"a {list(layout.shape)} parameter laid out {list(layout.placements)}): "
            f"{_WHY.get(name, 'it is not known to update element by element')}, so on a piece it computes "
            "something other than the one-device update. Use an elementwise optimizer (SGD, Adam, AdamW, ...), or "
            f"give {name} the whole parameters; if {name} is elementwise, declare it (a subclass of an elementwise "
            f"optimizer too): tensorplay_edu.parallel.optimizers.ELEMENTWISE.add({name}).")


def install_guard() -> None:
    """Register the pre-hook once (idempotent; called on import)."""
    if not getattr(torch.optim.Optimizer, "_tensorplay_step_guard", False):
        register_optimizer_step_pre_hook(check_optimizer)
        torch.optim.Optimizer._tensorplay_step_guard = True


install_guard()

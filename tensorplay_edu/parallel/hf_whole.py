"""Hugging Face's own code reading a tensor-parallel model as the whole: ``save_pretrained``
and weight initialisation see whole tensors.

**Saving.** ``model.save_pretrained(dir)`` writes ``model.state_dict()`` with safetensors,
which wants plain tensors with storage; a split parameter's entry is a ``Piece`` (this rank's
part).  HF's convention for a sharded model is that every rank calls ``save_pretrained`` and
rank 0 writes, so the wrapper gathers: with no ``state_dict=`` given and split parameters, it
passes ``full_state_dict(model)`` (an all-gather per split parameter).  Called on rank 0
alone, that all-gather waits for the other ranks until the process group's timeout; then do
``sd = full_state_dict(model)`` on every rank and ``model.save_pretrained(dir, state_dict=sd)``
on rank 0.  ``from_pretrained(dir)`` in one process gives the single-device model.

**Initialising.** HF's ``_init_weights`` indexes the parameters with global numbers
(``init.zeros_(module.weight[module.padding_idx])``: a padding row past this rank's rows of a
vocabulary-split embedding would be an IndexError).  So HF's per-module step runs on whole
stand-ins, and each rank keeps its part (``init.full_size``, the rule of init.py): the one-process
init, bit for bit, the generator in step.

``parallelize_module`` puts both wrappers on ``transformers.PreTrainedModel`` while transformers
is imported (an HF model always is by then); they carry ``__tensorplay_guard__``.
"""

from __future__ import annotations

import functools
import inspect
import sys

from torch import nn

from .init import full_size
from .layout import is_split
from .params import full_state_dict

__all__ = ["guard_hf"]


def _has_split(model: nn.Module, recurse: bool = True) -> bool:
    modules = model.modules() if recurse else (model,)
    return any(is_split(layout) for m in modules for layout in getattr(m, "_tp_layouts", {}).values())


def _wrap_save(hf_fn):
    signature = inspect.signature(hf_fn)

    @functools.wraps(hf_fn)
    def save_pretrained(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        if bound.arguments.get("state_dict") is None and _has_split(self):
            bound.arguments["state_dict"] = full_state_dict(self)  # every rank: an all-gather
        return hf_fn(*bound.args, **bound.kwargs)

    save_pretrained.__tensorplay_guard__ = True
    return save_pretrained


def _wrap_init(hf_fn):
    @functools.wraps(hf_fn)
    def _initialize_weights(self, module, *args, **kwargs):
        loaded = any(getattr(p, "_is_hf_initialized", False) for p in module.parameters(recurse=False))
        if loaded or not _has_split(module, recurse=False):  # (HF leaves loaded tensors alone)
            return hf_fn(self, module, *args, **kwargs)
        with full_size(module):  # whole stand-ins; each rank keeps its part on the way out
            return hf_fn(self, module, *args, **kwargs)

    _initialize_weights.__tensorplay_guard__ = True
    return _initialize_weights


def guard_hf() -> bool:
    """Wrap ``PreTrainedModel.save_pretrained`` and ``_initialize_weights`` (idempotent). False:
    transformers is not imported."""
    cls = getattr(sys.modules.get("transformers.modeling_utils"), "PreTrainedModel", None)
    if cls is None:
        return False
    for name, wrap in (("save_pretrained", _wrap_save), ("_initialize_weights", _wrap_init)):
        fn = getattr(cls, name, None)
        if fn is not None and not getattr(fn, "__tensorplay_guard__", False):
            setattr(cls, name, wrap(fn))
    return True

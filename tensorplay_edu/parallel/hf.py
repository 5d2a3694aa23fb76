"""Hugging Face transformers' own tensor-parallel plan, written in our styles.

A transformers model carries its plan as strings: ``model.config.base_model_tp_plan`` for
the base model (``{"layers.*.self_attn.q_proj": "colwise", ...}``, relative to
``model.model``), the class's ``_tp_plan`` for the head (``{"lm_head":
"colwise_gather_output"}``), and, from transformers 5 on, one rule that the model adds when
it is built: ``"embed_tokens": "embedding_rowwise"`` (a vocabulary-parallel embedding).
:func:`hf_plan_strings` collects them with full paths; :func:`plan_from_hf` maps each string
to one of our styles and expands ``layers.*`` against the model's own module names::

    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, ...))     # no weights downloaded
    parallelize_module(model, mesh, plan_from_hf(model))

Strings and styles (transformers 5, ``transformers/distributed/tensor_parallel.py``):

=========================  =================================================  ===================
HF string                  our style                                          typical module
=========================  =================================================  ===================
colwise                    ColwiseParallel()                                  q/k/v, gate/up
rowwise                    RowwiseParallel()                                  o_proj, down_proj
colwise_rep,               ColwiseParallel(output_layouts=Replicate())        lm_head
colwise_gather_output      (loss_parallel=True: Shard(-1) logits DTensor)
rowwise_rep,               RowwiseParallel(input_layouts=Replicate())
rowwise_split_input
embedding_rowwise          RowwiseParallel(input_layouts=Replicate())         embed_tokens
embedding_colwise          ColwiseParallel(output_layouts=Replicate())
replicate                  nothing: the module stays whole on every rank
=========================  =================================================  ===================

A tied ``lm_head`` (Shard(0) rows, as the vocabulary-parallel embedding) stays tied:
``parallelize_module`` keeps one parameter for both.  Any other string (HF's packed, MoE, MLA
styles) is a ValueError naming the module and the string; ``sequence_parallel`` is refused with
the reason (:data:`SP_REASON`).  HF's attention takes the head count from the local width, so this
rank's heads work as is; :func:`plan_from_hf` checks that both head counts divide by the mesh size
(with ``mesh=`` at once, else when ``parallelize_module`` applies each style).

Initialising on the meta device (``to_empty``, then ``model.init_weights()`` under a seed) gives
the single-device model, as for our own Llama (``init.py``).  transformers calls the
``torch.nn.init`` functions from its own copy (``transformers.initialization.TORCH_INIT_FUNCTIONS``),
so importing the package points that copy at the wrapped functions too
(``init.guard_transformers_init``), whichever was imported first.
"""

from __future__ import annotations

import fnmatch
import warnings

from torch import nn

from ..mesh import DeviceMesh
from ..placement import Replicate, Shard
from .init import guard_transformers_init
from .base import ParallelStyle
from .replicated import ReplicatedWithGradAllReduce
from .style import ColwiseParallel, RowwiseParallel

__all__ = ["HF_STYLES", "SP_REASON", "guard_transformers_init", "hf_plan_strings", "plan_from_hf"]

# HF string -> a function making our style (None: the module is left whole on every rank).
HF_STYLES = {
    "colwise": lambda: ColwiseParallel(),
    "rowwise": lambda: RowwiseParallel(),
    "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
    "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
    "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
    "embedding_colwise": lambda: ColwiseParallel(output_layouts=Replicate()),
    "replicated_with_grad_allreduce": lambda: ReplicatedWithGradAllReduce(),  # Qwen3's per-head q_norm / k_norm
    "replicate": None,
}

SP_REASON = (
    "sequence parallelism does not apply to a Hugging Face model as is. Its forward builds position_ids, the "
    "causal mask and the rotary cos/sin from the shape of the hidden states it holds, so with [b, s/t, h] shards "
    "every rank would get positions 0..s/t-1 while attention runs on the gathered sequence. Use the vanilla plan "
    "(with loss_parallel=True), or SP with the sequence split at model.layers.0 by your own PrepareModuleInput "
    "(Replicate -> Shard(1); notebook 12b): only the caller can check that the model builds nothing else from the "
    "hidden states' shape (a sliding-window or chunked mask, another position scheme).")


def _base_prefix(model: nn.Module) -> str:
    """'model.' when ``model`` is a *ForCausalLM around its base model ``model.model``; '' for the base model."""
    prefix = getattr(model, "base_model_prefix", "")
    inner = getattr(model, prefix, None) if prefix else None
    return f"{prefix}." if isinstance(inner, nn.Module) and inner is not model else ""


def hf_plan_strings(model: nn.Module) -> dict[str, str]:
    """HF's plan of ``model`` with full paths (``model.layers.*.self_attn.q_proj``): the rules the
    model adds when built (the embedding), the config's ``base_model_tp_plan``, the class's ``_tp_plan``."""
    config = getattr(model, "config", None)
    base = dict(getattr(config, "base_model_tp_plan", None) or {})
    head = dict(getattr(type(model), "_tp_plan", None) or {})
    prefix = _base_prefix(model)
    plan = {f"{prefix}{k}": v for k, v in base.items()}
    plan.update(head)
    built = getattr(model, "tp_plan", None)  # transformers >= 5 merges the plans (with the embedding) at build
    extra = {k: v for k, v in built.items() if k not in plan} if isinstance(built, dict) else {}
    if not plan and not extra:
        raise ValueError(f"{type(model).__name__} has no tensor-parallel plan: neither config.base_model_tp_plan "
                         "nor a class _tp_plan (is it a transformers model?)")
    return {**extra, **plan}


def _expand(model: nn.Module, pattern: str) -> list[str]:
    """The module paths matching ``pattern``, one dotted level per ``*`` (as HF matches layer numbers)."""
    parts = pattern.split(".")
    return [name for name, _ in model.named_modules()
            if name and len(name.split(".")) == len(parts)
            and all(fnmatch.fnmatchcase(n, p) for n, p in zip(name.split("."), parts))]


def _supported() -> str:
    return ", ".join(repr(s) for s in HF_STYLES)


def _check_heads(model: nn.Module, world: int) -> None:
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    for what, n in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if isinstance(n, int) and n % world:
            fits = [t for t in range(1, n + 1) if n % t == 0]
            raise ValueError(f"{type(model).__name__}: config.{what} = {n} does not divide by the TP degree {world} "
                             "(the mesh size): each rank must hold whole heads (q_proj/k_proj/v_proj are split by "
                             f"heads). Use a TP mesh whose size divides {n} ({', '.join(map(str, fits))}), or a model "
                             f"whose head counts divide by {world}")


def _checking_heads(style: ParallelStyle, model: nn.Module) -> ParallelStyle:
    """``style`` with a check of the model's head counts against the mesh it will be applied with:
    ``parallelize_module`` runs a style's ``mesh_checks`` before it shards anything."""
    style.mesh_checks = [*getattr(style, "mesh_checks", ()), lambda mesh: _check_heads(model, mesh.size())]
    return style


def plan_from_hf(model: nn.Module, *, mesh: DeviceMesh | None = None, loss_parallel: bool = False,
                 sequence_parallel: bool = False) -> dict[str, ParallelStyle]:
    """``{module path: our style}`` from the model's own HF plan strings, for ``parallelize_module``.

    Args:
        model: a transformers model (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``MistralForCausalLM``, ...).
        mesh: optional; when given, the head counts are checked against its size here, else when
            ``parallelize_module`` applies the plan (before it shards anything).
        loss_parallel: the output embeddings (``lm_head``) give their logits as a vocabulary-sharded
            ``Shard(-1)`` DTensor (not gathered) for ``tensorplay_edu.parallel.loss_parallel()``.
        sequence_parallel: refused with :data:`SP_REASON`.
    Raises:
        ValueError: an HF string we do not map (naming the module, the string and the supported ones),
            ``sequence_parallel``, head counts that do not divide by the mesh size, ``loss_parallel`` without
            a column-split output layer.
    """
    if sequence_parallel:
        raise ValueError(f"plan_from_hf(sequence_parallel=True): {SP_REASON}")
    if mesh is not None:
        _check_heads(model, mesh.size())
    strings = hf_plan_strings(model)
    for pattern, s in strings.items():  # every string is checked before any module is expanded
        if s == "sequence_parallel":
            raise ValueError(f"HF's plan puts 'sequence_parallel' on '{pattern}': {SP_REASON}")
        if s not in HF_STYLES:
            raise ValueError(f"HF's plan puts '{s}' on '{pattern}', a style tensorplay_edu does not map; "
                             f"supported: {_supported()}")
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    output_name = next((n for n, m in model.named_modules() if output is not None and m is output), None)
    plan: dict[str, ParallelStyle] = {}
    for pattern, s in strings.items():
        names = _expand(model, pattern)
        if not names:
            warnings.warn(f"HF's plan rule '{pattern}': '{s}' matches no module of {type(model).__name__}; skipped")
        for name in names:
            make = HF_STYLES[s]
            if make is None:
                continue
            if loss_parallel and name == output_name:
                if not s.startswith("colwise"):
                    raise ValueError(f"loss_parallel=True needs the output layer '{name}' split by columns "
                                     f"(vocabulary), but HF's plan puts '{s}' on it")
                plan[name] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
            else:
                plan[name] = make()
            _checking_heads(plan[name], model)
    if loss_parallel and output_name not in plan:
        raise ValueError(f"loss_parallel=True: HF's plan for {type(model).__name__} does not split its output "
                         f"layer '{output_name}'; the logits would not be vocabulary-sharded")
    return plan

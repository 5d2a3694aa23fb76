"""torchtitan's ``apply_tp`` for its Llama, in our words: the plan the project grew from.

torchtitan (``torchtitan/models/llama3/infra/parallelize.py``, until April 2026) parallelized a
Llama with calls of the same API this package implements.  Since pytorch/torchtitan#2963 (2026-04-27)
per-module sharding configs replace ``apply_tp``.  This module is a simplified ``apply_tp``, the text the
project grew from: torchtitan's signature and flags, its calls with only the imports changed, but the
per-Linear-``f`` plan (torchtitan's own ran sequence parallelism and PrepareModuleInput): so the
embeddings and the output layer keep replicated activations at the edges of the model, and
every block splits

* ``attention.wq / wk / wv`` and ``feed_forward.w1 / w3`` by columns (each rank computes its
  own heads, its own hidden units: no communication forward, Megatron's ``f`` backward),
* ``attention.wo`` and ``feed_forward.w2`` by rows (a partial sum, all-reduced: ``f̄``).

Each Colwise Linear wraps its input on its own, so a block's backward all-reduces the input
gradient once per Linear (1 + 5L all-reduces for L blocks, as in PyTorch).  The project's
``parallelize_llama(model, mesh, "vanilla")`` adds one PrepareModuleInput per block input so
that the three readers share one ``f`` (1 + 2L): what torchtitan runs with sequence
parallelism off.  With its default sequence parallelism torchtitan converts each half's
input once with a ``g`` (all-gather forward, reduce-scatter backward) instead.  The full plan (sequence parallelism and
``loss_parallel``) is ``parallelize_llama(model, mesh, "full")``.

The signature and flags were torchtitan's.  ``loss_parallel`` is accepted and unused here (with a warning):
the logits come out replicated (torchtitan's honours it, with ``Shard(-1)`` logits left as a
DTensor for ``loss_parallel()``).  ``enable_float8_tensorwise_tp``
swaps in the float8 styles (:mod:`tensorplay_edu.float8.float8_tensor_parallel`; convert the
model with ``convert_to_float8_training`` first, leaving ``output`` in high precision);
``enable_async_tp`` marks the TP group for async TP (:mod:`tensorplay_edu.async_tp`),
which in this plan changes nothing: it has no all-gather or reduce-scatter to
decompose, only all-reduces (PyTorch's compiler pass does nothing there either).
"""

from __future__ import annotations

import logging
import warnings

from torch import nn

from ..mesh import DeviceMesh
from ..parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from ..placement import Replicate

__all__ = ["apply_tp"]

logger = logging.getLogger(__name__)


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool, enable_float8_tensorwise_tp: bool,
             enable_async_tp: bool) -> None:
    """Tensor parallelism for a torchtitan-style Llama (``tok_embeddings``, ``layers``, ``output``): the seed's
    ``apply_tp``, the per-Linear plan torchtitan called ``apply_tp_minus_sp`` (#640), not torchtitan's own
    sequence-parallel plan (that is ``parallelize_llama(model, mesh, "full")``)."""
    if loss_parallel:  # the seed's output layer gathers the logits: loss_parallel() then has nothing to shard
        warnings.warn("apply_tp(loss_parallel=True): the flag is accepted and unused, as in the seed's plan: the output "
                      "layer gathers the logits (Replicate), so loss_parallel() computes an ordinary loss on them. For "
                      "vocabulary-sharded logits under loss_parallel(), use parallelize_llama(model, mesh, 'full').",
                      UserWarning, stacklevel=2)
    # The edges: a vocab-parallel embedding whose partial rows are summed (all-reduce), and an
    # output layer split over the vocabulary whose logits are gathered for an ordinary loss.
    parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "output": ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True),
    })
    # Every block: Megatron's split of attention and of the SwiGLU MLP; with float8 Linears
    # (convert_to_float8_training first), the float8 styles: global amaxes, float8 matmuls.
    colwise, rowwise = ColwiseParallel, RowwiseParallel
    if enable_float8_tensorwise_tp:
        from ..float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

        colwise, rowwise = Float8ColwiseParallel, Float8RowwiseParallel
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention.wq": colwise(), "attention.wk": colwise(), "attention.wv": colwise(),
            "attention.wo": rowwise(),
            "feed_forward.w1": colwise(), "feed_forward.w3": colwise(),
            "feed_forward.w2": rowwise(),
        })
    if enable_async_tp:  # torchtitan's two lines: the TP group's all-gathers and reduce-scatters run decomposed
        import torch._inductor.config

        from ..async_tp import enable_symm_mem_for_group

        torch._inductor.config._micro_pipeline_tp = True
        enable_symm_mem_for_group(tp_mesh.get_group().group_name)
    logger.info(f"Applied {'Float8 tensorwise ' if enable_float8_tensorwise_tp else ''}"
                f"{'Async ' if enable_async_tp else ''}Tensor Parallelism to the model")

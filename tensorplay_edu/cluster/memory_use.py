"""Memory per GPU, by component: the half of :mod:`tensorplay_edu.cluster` that counts bytes.

What one block saves for backward (this package's Llama, measured to the byte in notebook 04, or
Korthikanti et al.'s GPT layer), the loss's peak (measured in notebook 05), and the weights, gradients
and optimizer state of mixed-precision AdamW under TP and FSDP. Import it from ``tensorplay_edu.cluster``.
"""

from __future__ import annotations

from .model import Model, Setup

__all__ = ["korthikanti_activations", "llama_activations", "LOGIT_PEAK_BYTES", "memory"]


def korthikanti_activations(seq, batch, dim, heads, tp=1, sp=False, flash=False) -> float:
    """Bytes of activations one transformer layer keeps for backward (Korthikanti et al. 2022,
    "Reducing Activation Recomputation in Large Transformer Models", §4, 2-byte activations):

    * no parallelism:  s·b·h·(34 + 5·a·s/h)
    * tensor parallel: s·b·h·(10 + 24/t + 5·a·s/(h·t))   (norms, dropouts and block inputs stay whole)
    * TP + SP:         s·b·h·(34/t + 5·a·s/(h·t))        (SP splits those over t too)

    ``5·a·s/h`` is the s×s attention scores, their softmax and its dropout mask; flash attention never
    stores them (``flash=True`` drops the term). The paper's layer is GPT's (MLP 4h, dropout masks)."""
    sbh, scores = seq * batch * dim, 5 * heads * seq / dim
    if tp == 1:
        per = 34 + (0 if flash else scores)
    elif sp:
        per = 34 / tp + (0 if flash else scores / tp)
    else:
        per = 10 + 24 / tp + (0 if flash else scores / tp)
    return sbh * per


def llama_activations(model: Model, setup: Setup) -> dict[str, float]:
    """Bytes one block of this package's Llama saves for backward, per GPU, by component: notebook 04
    reads them off each operation and measures them to the byte on a small model. In elements
    (``p = dtype_bytes`` each; SDPA's log-sum-exp is float32, 4 bytes):

    * norms: each RMSNorm keeps its input, ``x/rms`` and ``1/rms``: 2·(2sbh + sb); SP divides by t;
    * block inputs: the input of wq/wk/wv and of w1/w3, 2·sbh, whole under TP (DTensor keeps the
      all-gathered copy; Megatron-LM would keep the shard and gather again in backward);
    * attention: q, k, v (k, v repeated to H heads) and the output, 4sbh/t; the log-sum-exp, H·sb/t;
      RoPE's cos and sin, 2s·hd, whole (flash attention: no s×s scores);
    * MLP: w1 x, w3 x, silu(w1 x) and their product, 4sbF/t."""
    t, sbh, sb, p = setup.tp, setup.seq * setup.batch * model.dim, setup.seq * setup.batch, setup.dtype_bytes
    norms = 2 * (2 * sbh + sb) * p / (t if setup.sp else 1)
    attention = 4 * sbh * p / t + 4 * model.heads * sb / t + 2 * setup.seq * model.head_dim * p
    return {"norms": norms, "block inputs": 2 * sbh * p, "attention": attention,
            "MLP": 4 * sb * model.ffn * p / t}


# The loss's peak, in bytes per logit, as notebook 05 measures it (bf16 logits upcast to float32 for the
# loss, as torchtitan; the caller drops the logits): gathered, the float32 copy, its log-softmax and the
# gradient at once; loss_parallel, the bf16 logits, their float32 copy and one softmax buffer. float32
# logits: 12 and 8.
LOGIT_PEAK_BYTES = {2: {"gathered": 12, "loss_parallel": 10}, 4: {"gathered": 12, "loss_parallel": 8}}


def memory(model: Model, setup: Setup) -> dict[str, float]:
    """Bytes per GPU by component; their sum is the usual estimate of the peak (all held at once).

    Conventions (the "16 bytes per parameter" of mixed-precision AdamW, as in ZeRO):

    * ``weights``: ``dtype_bytes`` (2) per parameter; ``gradients``: the same; ``optimizer``: 12 per
      parameter (fp32 master copy, Adam's two fp32 moments). TP divides every matmul weight and both
      embeddings by t (norm weights are replicated); FSDP then divides all three by ``dp`` (the gathered
      layer FSDP holds for a moment is left out).
    * ``activations``: one block's (:func:`llama_activations`, or Korthikanti's GPT layer with
      ``activations="korthikanti"``) times L. With ``checkpoint``: each block keeps only its input
      (s·b·h values, /t under SP), plus one block's full activations while it is recomputed. float8 is
      not modelled (torchao keeps bf16 weights and saves bf16 activations).
    * ``logits``: the loss's peak, ``LOGIT_PEAK_BYTES`` per logit of b·s·V: whole on every rank, or a
      V/t slice each with ``loss_parallel``."""
    t, d = setup.tp, setup.dp if setup.fsdp else 1
    p_gpu = (model.params() - model.norm_params()) / t + model.norm_params()
    if setup.activations == "llama":
        layer = sum(llama_activations(model, setup).values())
    elif setup.activations == "korthikanti":
        layer = korthikanti_activations(setup.seq, setup.batch, model.dim, model.heads, t, setup.sp,
                                        flash=True) * setup.dtype_bytes / 2
    else:
        raise ValueError(f"Setup.activations must be 'llama' or 'korthikanti', got {setup.activations!r}")
    block_input = setup.seq * setup.batch * model.dim * setup.dtype_bytes / (t if setup.sp else 1)
    act = layer + model.layers * block_input if setup.checkpoint else model.layers * layer
    per_logit = LOGIT_PEAK_BYTES[4 if setup.dtype_bytes == 4 else 2]
    path = "loss_parallel" if setup.loss_parallel else "gathered"
    logits = per_logit[path] * setup.batch * setup.seq * model.vocab / (t if setup.loss_parallel else 1)
    return {"weights": setup.dtype_bytes * p_gpu / d, "gradients": setup.dtype_bytes * p_gpu / d,
            "optimizer": 12 * p_gpu / d, "activations": act, "logits": logits}


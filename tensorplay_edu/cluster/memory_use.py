"""Memory per GPU, by component: the half of :mod:`tensorplay_edu.cluster` that counts bytes.

What one block saves for backward (this package's Llama, measured to the byte in notebook 04, counted in 04b, or
Korthikanti et al.'s GPT layer) under each activation-checkpointing mode, the loss's peak (measured in
notebook 05b), FSDP's transient buffers, and the weights, gradients and optimizer state of mixed-precision
AdamW under TP and FSDP. Import it from ``tensorplay_edu.cluster``.
"""

from __future__ import annotations

from .model import Model, Setup

__all__ = ["korthikanti_activations", "llama_activations", "sac_saved", "LOGIT_PEAK_BYTES", "memory"]


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
    measures them to the byte on a small model, and 04b reads them off each operation. In elements
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


# The loss's peak, in bytes per logit, as notebook 05b measures it (bf16 logits upcast to float32 for the
# loss, as torchtitan; the caller drops the logits): gathered, the float32 log-softmax the loss saved (4)
# and two temporaries in backward, its gradient coming in and going out (8); loss_parallel, the bf16
# logits, their float32 copy and one softmax buffer that becomes the gradient. float32 logits: 12 and 8.
# "pytorch_loss_parallel": PyTorch 2.13's own loss_parallel, eager, as notebook 05b measures it (its saved
# log-softmax and three temporaries in backward: 16 for either dtype), counted for Setup(loss="pytorch").
LOGIT_PEAK_BYTES = {2: {"gathered": 12, "loss_parallel": 10, "pytorch_loss_parallel": 16},
                    4: {"gathered": 12, "loss_parallel": 8, "pytorch_loss_parallel": 16}}


def sac_saved(model: Model, setup: Setup) -> float:
    """Bytes one block keeps under torchtitan's per-op selective AC, which saves the outputs of every
    other matmul (wq, wv, w1, w2 of the seven), attention's output and log-sum-exp and under SP both
    reduce-scatters' (wo's and w2's), and recomputes the rest in backward; the block's input is kept as
    under full AC. wq, wv, w1 and attention are split by t; w2's output is the full [b, s, h] of partial sums."""
    t, p, sb = setup.tp, setup.dtype_bytes, setup.seq * setup.batch
    h, kv = model.dim, model.kv_heads * model.head_dim
    scattered = 2 * sb * h / t if setup.sp and t > 1 else 0
    block_input = sb * h / (t if setup.sp else 1)
    kept = block_input + sb * (2 * h + kv + model.ffn) / t + sb * h + scattered
    return kept * p + 4 * model.heads * sb / t


def _fsdp_units(model: Model, setup: Setup) -> list[float]:
    """Parameters of each unit FSDP gathers at once on one rank: every block, the embedding, the output."""
    return [model.layer_params() / setup.tp, model.vocab * model.dim / setup.tp]


def memory(model: Model, setup: Setup) -> dict[str, float]:
    """Bytes per GPU by component; their sum is the estimate of the peak (all held at once), which
    ``published.published_checks`` holds against measured peaks.

    * ``weights`` 4, ``gradients`` 4 and ``optimizer`` 8 bytes per local parameter, as FSDP2 keeps them
      (float32 sharded parameters and gradients, AdamW's two float32 moments: the "16 bytes per
      parameter" of mixed precision). TP divides every matmul weight and both embeddings by t (norm
      weights are replicated); FSDP then divides by d.
    * ``working``: with FSDP, the unsharded bf16 unit being used and the next one prefetched, its bf16
      gradients and the reduce-scatter's input in the reduce dtype (float32 by default); without FSDP,
      the bf16 copies of every weight the matmuls read.
    * ``activations``: one block's (:func:`llama_activations`, or Korthikanti's GPT layer with
      ``activations="korthikanti"``) times L with ``ac="none"``; with ``"full"`` each block keeps its
      input (s·b·h values, /t under SP), with ``"selective"`` what :func:`sac_saved` counts, and either
      also holds one block's full activations while it is recomputed. Under float8 tensorwise TP with SP
      the gathered block inputs are saved in float8 (torchao's float8 TP styles cast before the gather).
    * ``backward``: one block's activation gradients in flight (as large as its activations).
    * ``logits``: the loss's peak, ``LOGIT_PEAK_BYTES`` per logit of b·s·V: whole on every rank, or a
      V/t slice each with ``loss_parallel`` (this package's, or PyTorch's with ``Setup(loss="pytorch")``).

    Left out: Megatron's layout (bf16 parameters with fp32 main gradients: 18 bytes per parameter), the
    unsharded float8 weights torchao keeps for backward unless ``force_recompute_fp8_weight_in_bwd``, the
    CUDA context and NCCL's buffers (the planner's reserve), and whatever makes a measured peak exceed
    the sum: ``published.error_bands()["memory"]`` says by how much it has."""
    model.check_tp(setup.tp)
    t, d, p = setup.tp, setup.dp if setup.fsdp else 1, setup.dtype_bytes
    p_gpu = (model.params() - model.norm_params()) / t + model.norm_params()
    if setup.activations == "llama":
        parts = llama_activations(model, setup)
        if setup.float8 == "tensorwise" and setup.sp and t > 1:
            parts["block inputs"] /= p
        layer = sum(parts.values())
    elif setup.activations == "korthikanti":
        layer = korthikanti_activations(setup.seq, setup.batch, model.dim, model.heads, t, setup.sp,
                                        flash=True) * p / 2
    else:
        raise ValueError(f"Setup.activations must be 'llama' or 'korthikanti', got {setup.activations!r}")
    block_input = setup.seq * setup.batch * model.dim * p / (t if setup.sp else 1)
    kept = {"none": None, "full": block_input, "selective": sac_saved(model, setup)}[setup.ac]
    act = model.layers * layer if kept is None else model.layers * kept + layer
    if setup.fsdp and setup.dp > 1:
        units = _fsdp_units(model, setup)
        red = 4 if setup.reduce_fp32 else p
        working = p * (max(units) + units[0]) + (p + red) * max(units)
    else:
        working = p * p_gpu
    per_logit = LOGIT_PEAK_BYTES[4 if p == 4 else 2]
    path = ("pytorch_loss_parallel" if setup.loss == "pytorch" else "loss_parallel") if setup.loss_parallel \
        else "gathered"
    logits = per_logit[path] * setup.batch * setup.seq * model.vocab / (t if setup.loss_parallel else 1)
    return {"weights": 4 * p_gpu / d, "gradients": 4 * p_gpu / d, "optimizer": 8 * p_gpu / d,
            "working": working, "activations": act, "backward": layer, "logits": logits}

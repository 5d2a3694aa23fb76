"""One model of scale: the hardware, the Llama 3 shapes, memory per GPU and step time.

Every number of scale in the notebooks comes from here, so that they agree with each other:

    from tensorplay_edu.scale import GPUS, MODELS, Setup, memory, step_time
    memory(MODELS["llama3-70b"], Setup(tp=8, sp=True, dp=8, fsdp=True))   # bytes per GPU by component
    step_time(MODELS["llama3-70b"], Setup(tp=8, sp=True, dp=8, fsdp=True), GPUS["h100"])

Notation (the series' letters): ``b`` sequences per data-parallel rank, ``s`` tokens per sequence,
``h`` model width (``dim``), ``a`` attention heads, ``V`` vocabulary, ``L`` layers, ``t`` the TP degree.
Everything is an estimate from first principles (counts of bytes and FLOPs, an α–β model of each
collective), and :func:`published_checks` puts it beside published figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GPU", "GPUS", "Model", "MODELS", "Setup", "DEFAULT_MFU", "memory", "korthikanti_activations",
           "FLOAT8_EFFICIENCY", "collective_time", "tp_collectives_per_layer", "tp_bytes_per_layer", "step_time",
           "tp_crossover_tokens", "tp_compute_over_comm", "tp_max_inside", "fit_cpu", "predict_step",
           "published_checks"]


@dataclass(frozen=True)
class GPU:
    """One accelerator and its links. FLOP/s are dense (no 2:4 sparsity); bandwidths are bytes/s
    per GPU per direction; α is the latency of one ring step (a collective on t ranks takes t-1 or
    2(t-1) of them)."""
    name: str
    bf16_flops: float
    fp8_flops: float
    hbm_bytes: float
    hbm_bw: float
    nvlink_bw: float
    nvlink_alpha: float
    ib_bw: float
    ib_alpha: float
    gpus_per_node: int
    source: str


# α per ring step: NCCL's own cost model (NVIDIA/nccl src/graph/tuning.cc, hwLat, Ring, Simple protocol,
# the one used for the large messages of training) charges 3.4 µs per step over NVLink and 9.6 µs per
# step over the network. One NVLink figure everywhere: NVLink 4 is 900 GB/s bidirectional = 450 GB/s
# each way. NDR InfiniBand is 400 Gb/s = 50 GB/s each way, one NIC per GPU.
_HOPPER = dict(bf16_flops=989e12, fp8_flops=1979e12, nvlink_bw=450e9, nvlink_alpha=3.4e-6,
               ib_bw=50e9, ib_alpha=9.6e-6, gpus_per_node=8)
GPUS = {
    "h100": GPU("H100 SXM", hbm_bytes=80e9, hbm_bw=3.35e12, **_HOPPER,
                source="NVIDIA H100 datasheet (SXM, dense); NVLink 4 900 GB/s bidirectional; NDR 400 Gb/s per GPU; "
                       "α from NCCL's tuning model (src/graph/tuning.cc)"),
    "h200": GPU("H200 SXM", hbm_bytes=141e9, hbm_bw=4.8e12, **_HOPPER,
                source="NVIDIA H200 datasheet (SXM, dense; same Hopper compute and links as H100); "
                       "α from NCCL's tuning model (src/graph/tuning.cc)"),
}


@dataclass(frozen=True)
class Model:
    """A Llama-shaped decoder: GQA attention (``kv_heads`` ≤ ``heads``), SwiGLU MLP of width ``ffn``,
    RMSNorms, untied embedding and output layers (as Llama 3)."""
    name: str
    layers: int
    dim: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def layer_params(self) -> int:
        """Matmul weights of one block: wq, wo [h, h]; wk, wv [h, kv·hd]; w1, w3, w2 [h, ffn]."""
        h, kv = self.dim, self.kv_heads * self.head_dim
        return 2 * h * h + 2 * h * kv + 3 * h * self.ffn

    def norm_params(self) -> int:
        """RMSNorm weights (2 per block and the final one): the only ones TP replicates."""
        return (2 * self.layers + 1) * self.dim

    def params(self) -> int:
        return self.layers * self.layer_params() + 2 * self.vocab * self.dim + self.norm_params()


MODELS = {
    "llama3-8b": Model("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    "llama3-70b": Model("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
    "llama3-405b": Model("llama3-405b", 126, 16384, 128, 8, 53248, 128256),
}


@dataclass(frozen=True)
class Setup:
    """How one training step is laid out: TP degree ``tp`` (with SP, loss_parallel, float8 and async TP
    as options), ``dp`` data-parallel replicas (``fsdp``: sharded over them), ``batch`` sequences of
    ``seq`` tokens per data-parallel rank, activations and weights in ``dtype_bytes`` (bf16: 2);
    ``checkpoint``: full activation checkpointing (keep each block's input, recompute the rest)."""
    tp: int = 1
    sp: bool = False
    loss_parallel: bool = False
    float8: bool = False
    async_tp: bool = False
    dp: int = 1
    fsdp: bool = False
    batch: int = 1
    seq: int = 8192
    dtype_bytes: int = 2
    checkpoint: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


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


def memory(model: Model, setup: Setup) -> dict[str, float]:
    """Bytes per GPU by component; their sum is the usual estimate of the peak (all held at once).

    Conventions (the "16 bytes per parameter" of mixed-precision AdamW, as in ZeRO):

    * ``weights``: ``dtype_bytes`` (2) per parameter; ``gradients``: the same; ``optimizer``: 12 per
      parameter (fp32 master copy, Adam's two fp32 moments). TP divides every matmul weight and both
      embeddings by t (norm weights are replicated); FSDP then divides all three by ``dp`` (the gathered
      layer FSDP holds for a moment is left out).
    * ``activations``: Korthikanti's accounting with flash attention (no s×s term), for all L layers,
      scaled by ``dtype_bytes/2``: TP divides the sharded parts by t (10 + 24/t), SP the rest too (34/t).
      With ``checkpoint``: each block keeps only its input (s·b·h values, /t under SP), plus one
      block's full activations while it is recomputed. float8 is not modelled (torchao keeps bf16 weights).
    * ``logits``: b·s·V fp32 values for the loss (4 bytes each): whole on every rank, or a V/t slice
      each with ``loss_parallel``."""
    t, d = setup.tp, setup.dp if setup.fsdp else 1
    p_gpu = (model.params() - model.norm_params()) / t + model.norm_params()
    act = korthikanti_activations(setup.seq, setup.batch, model.dim, model.heads, t, setup.sp, flash=True)
    if setup.checkpoint:
        act = act / model.layers + 2 * setup.seq * setup.batch * model.dim / (t if setup.sp else 1)
    logits = 4 * setup.batch * setup.seq * model.vocab / (t if setup.loss_parallel else 1)
    return {"weights": setup.dtype_bytes * p_gpu / d, "gradients": setup.dtype_bytes * p_gpu / d,
            "optimizer": 12 * p_gpu / d, "activations": model.layers * act * setup.dtype_bytes / 2,
            "logits": logits}


def _link(gpu: GPU, link: str) -> tuple[float, float]:
    if link == "nvlink":
        return gpu.nvlink_bw, gpu.nvlink_alpha
    if link == "ib":
        return gpu.ib_bw, gpu.ib_alpha
    raise ValueError(f"link must be 'nvlink' or 'ib', got {link!r}")


def collective_time(op: str, nbytes: float, world: int, gpu: GPU, link: str = "nvlink") -> float:
    """Seconds for one ring collective over ``world`` ranks of a buffer of ``nbytes`` (the FULL tensor:
    the all-gather's output, the reduce-scatter's input, the all-reduce's buffer): α–β, as NCCL models it.

    * all_reduce:                  2(t-1)/t · nbytes / B + 2(t-1)·α   (a reduce-scatter then an all-gather)
    * all_gather, reduce_scatter:   (t-1)/t · nbytes / B +  (t-1)·α

    B and α are the link's (``gpu.nvlink_bw`` / ``nvlink_alpha``, or ``ib_bw`` / ``ib_alpha``)."""
    if world <= 1:
        return 0.0
    bw, alpha = _link(gpu, link)
    steps = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}.get(op)
    if steps is None:
        raise ValueError(f"op must be all_reduce, all_gather or reduce_scatter, got {op!r}")
    return steps * (world - 1) * (nbytes / world / bw + alpha)


def tp_collectives_per_layer(model: Model, setup: Setup) -> list[tuple[str, str, float]]:
    """The TP collectives of one block in one training step, as (phase, op, full buffer bytes): what
    CommDebugMode records for :func:`tensorplay_edu.models.parallelize_llama`'s plans.

    * vanilla (no SP): forward, wo and w2 all-reduce their [b, s, h] output; backward, the transposes
      (one ``f`` per block input, shared by wq/wk/wv and by w1/w3): 2 + 2 all-reduces of b·s·h.
    * SP: each all-reduce becomes an all-gather (block input) and a reduce-scatter (block output), the
      same bytes on the wire; backward the transposes, plus one all-reduce per norm weight gradient (h).
    * float8 (tensorwise): with SP the forward all-gathers and backward's gradient all-gathers move 1-byte
      float8; every scale needs a global amax: a one-number all-reduce per sharded tensor (9 + 2·SP
      forward, 5 + 2·SP backward), counted padded to one element per rank as CommDebugMode does."""
    t, e = setup.tp, setup.batch * setup.seq * model.dim  # e: elements of one [b, s, h] activation
    if t == 1:
        return []
    full = e * setup.dtype_bytes
    low = e * (1 if setup.float8 else setup.dtype_bytes)
    if setup.sp:
        out = [("forward", "all_gather", low), ("forward", "reduce_scatter", full)] * 2
        out += [("backward", "reduce_scatter", full), ("backward", "all_gather", low)] * 2
        out += [("backward", "all_reduce", model.dim * 4.0)] * 2  # norm weights' grads (fp32 params)
    else:
        out = [("forward", "all_reduce", full)] * 2 + [("backward", "all_reduce", full)] * 2
    if setup.float8:
        amax = 4.0 * t  # one fp32 number, padded to one per rank
        out += [("forward", "all_reduce", amax)] * (9 + 2 * setup.sp)
        out += [("backward", "all_reduce", amax)] * (5 + 2 * setup.sp)
    return out


def tp_bytes_per_layer(model: Model, setup: Setup) -> dict[str, dict[str, float]]:
    """``{phase: {op: bytes each rank sends}}`` for one block: the ring's (t-1)/t of each buffer, twice
    that for an all-reduce (CommDebugMode's convention)."""
    t, out = setup.tp, {"forward": {}, "backward": {}}
    for phase, op, nbytes in tp_collectives_per_layer(model, setup):
        sent = (2 if op == "all_reduce" else 1) * (t - 1) / t * nbytes
        out[phase][op] = out[phase].get(op, 0.0) + sent
    return out


# Fraction of peak FLOP/s a well-tuned training step sustains. torchtitan's benchmarks (its
# llama3_h100_202412_torchtitan.md) report 33% to 39% MFU for Llama 3.1 8B on 8 and 128 H100s (FSDP,
# bf16); we take 0.38.
DEFAULT_MFU = 0.38
# float8 matmuls have twice the peak, but the casts, amax reductions and scaling around them are
# memory-bound work the peak does not see: we let the blocks' fp8 matmuls reach FLOAT8_EFFICIENCY of
# the bf16 efficiency, i.e. a 2 x 0.7 = 1.4x faster block matmul. Chosen so that torchtitan's Llama 3.1
# 8B table (FSDP + compile: 6,667 -> 8,532 tokens/s/GPU with float8, 1.28x) comes out; the 70B TP
# table (float8 tensorwise, 1.36x) is then an independent check (see published_checks).
FLOAT8_EFFICIENCY = 0.7


def _compute_seconds(model: Model, setup: Setup, gpu: GPU, mfu: float) -> float:
    """FLOPs per GPU per step / (peak · mfu). Matmuls: 6 · (matmul params) · (b·s tokens) / t, the 6 being
    2 forward + 4 backward per weight and token; the output layer counts, the embedding lookup does not.
    Causal attention (QKᵀ and AV): 12·L·s²·h·b halved by the mask, / t. float8 runs the blocks' matmuls
    at the fp8 peak times FLOAT8_EFFICIENCY (torchtitan converts those; the output layer and attention
    stay bf16)."""
    tokens, t = setup.batch * setup.seq, setup.tp
    blocks = 6 * model.layers * model.layer_params() * tokens / t
    rest = 6 * model.vocab * model.dim * tokens / t + 6 * model.layers * setup.seq * tokens * model.dim / t
    block_peak = gpu.fp8_flops * FLOAT8_EFFICIENCY if setup.float8 else gpu.bf16_flops
    recompute = 8 / 6 if setup.checkpoint else 1  # full AC runs every forward twice: 2 + 2 + 4 per weight
    return recompute * (blocks / block_peak + rest / gpu.bf16_flops) / mfu


def _dp_seconds(model: Model, setup: Setup, gpu: GPU) -> float:
    """Gradient traffic over the dp ranks (IB once the job spans nodes): DDP all-reduces the bf16 grads
    in 25 MB buckets; FSDP all-gathers the weights twice (forward, backward) and reduce-scatters the
    grads, one collective per block each."""
    if setup.dp == 1:
        return 0.0
    link = "ib" if setup.gpus > gpu.gpus_per_node else "nvlink"
    nbytes = setup.dtype_bytes * model.params() / setup.tp
    if setup.fsdp:
        per = nbytes / model.layers
        return model.layers * (2 * collective_time("all_gather", per, setup.dp, gpu, link)
                               + collective_time("reduce_scatter", per, setup.dp, gpu, link))
    buckets = max(1, math.ceil(nbytes / 25e6))
    return buckets * collective_time("all_reduce", nbytes / buckets, setup.dp, gpu, link)


def step_time(model: Model, setup: Setup, gpu: GPU, mfu: float = DEFAULT_MFU) -> dict[str, float]:
    """Seconds of one training step per GPU, and tokens/s.

    ``compute`` (see ``_compute_seconds``), ``tp_comm`` (every TP collective of every block, α–β over
    NVLink inside a node, IB if t spans nodes), ``dp_comm`` (gradient sync). Overlap: DP traffic hides
    behind compute (bucketed backward, FSDP prefetch) except what exceeds it; TP traffic sits on the
    critical path (each matmul waits for its input) unless ``async_tp`` splits it into pieces that
    overlap the matmuls: at best all of it hides behind compute. ``exposed`` is what stays visible."""
    compute = _compute_seconds(model, setup, gpu, mfu)
    link = "ib" if setup.tp > gpu.gpus_per_node else "nvlink"
    tp = model.layers * sum(collective_time(op, n, setup.tp, gpu, link)
                            for _, op, n in tp_collectives_per_layer(model, setup))
    dp = _dp_seconds(model, setup, gpu)
    exposed_tp = max(0.0, tp - compute) if setup.async_tp else tp
    exposed = exposed_tp + max(0.0, dp - compute)
    total = compute + exposed
    per_gpu = setup.batch * setup.seq / setup.tp / total
    return {"compute": compute, "tp_comm": tp, "dp_comm": dp, "exposed": exposed, "total": total,
            "tokens_per_s_per_gpu": per_gpu, "tokens_per_s": per_gpu * setup.gpus}


def _per_layer_terms(model: Model, gpu: GPU, link: str, tp: int, mfu: float):
    """One block at TP degree ``tp`` (bf16, SP plan): (compute s per token, TP comm s per token, the
    latency of all its ring steps in s). Per token the block computes 6·P_layer/t FLOPs and SP moves
    4 all-gathers + 4 reduce-scatters of h bf16 values, (t-1)/t of each; 8·(t-1) ring steps, plus the
    2·2(t-1) of the two norm-weight all-reduces."""
    bw, alpha = _link(gpu, link)
    compute = 6 * model.layer_params() / tp / (gpu.bf16_flops * mfu)
    comm = 8 * (tp - 1) / tp * 2 * model.dim / bw
    return compute, comm, (8 + 4) * (tp - 1) * alpha


def tp_compute_over_comm(model: Model, gpu: GPU, link: str = "nvlink", tp: int = 8, mfu: float = DEFAULT_MFU):
    """The arithmetic intensity of TP, per block and many tokens: compute time / TP traffic time.

    Per token, the block does 6·P_layer/t FLOPs (P_layer ≈ 12h² for a GPT block) while TP moves
    8·(t-1)/t·h·2 bytes (4 gathers + 4 scatters of h bf16 values, or 4 all-reduces). With F the
    sustained FLOP/s (peak · mfu) and B the link's bytes/s, the ratio is 6·P_layer·B / (16·(t-1)·h·F)
    ≈ 4.5·h·B / ((t-1)·F): independent of the number of tokens, growing with the width h, shrinking
    with t, and 9x smaller over InfiniBand than over NVLink. Above 1, TP's traffic can hide behind its
    own compute (async TP); below 1 no overlap can save it."""
    compute, comm, _ = _per_layer_terms(model, gpu, link, tp, mfu)
    return compute / comm


def tp_crossover_tokens(model: Model, gpu: GPU, link: str = "nvlink", tp: int = 8, mfu: float = DEFAULT_MFU):
    """The fewest tokens (b·s) per step for which one block's compute time covers its TP comm time.

    Both grow linearly in tokens, so only the latency term makes a crossover: compute = n·c,
    comm = n·k + A (A: α of every ring step). n ≥ A / (c - k) when c > k; ``math.inf`` when the
    bandwidth alone outweighs the compute (``tp_compute_over_comm`` < 1): no batch makes TP pay there."""
    c, k, latency = _per_layer_terms(model, gpu, link, tp, mfu)
    return latency / (c - k) if c > k else math.inf


def tp_max_inside(model: Model, gpu: GPU, link: str = "nvlink", mfu: float = DEFAULT_MFU) -> int:
    """The largest TP degree (dividing the heads and KV heads; at most a node over NVLink) whose traffic
    still fits under its compute (``tp_compute_over_comm`` ≥ 1); 1 if none."""
    limit = gpu.gpus_per_node if link == "nvlink" else model.heads
    ok = [t for t in range(2, limit + 1) if model.heads % t == 0 and model.kv_heads % t == 0
          and tp_compute_over_comm(model, gpu, link, t, mfu) >= 1]
    return max(ok, default=1)


def __getattr__(name: str):
    """``fit_cpu``, ``predict_step`` and ``published_checks`` live in scale_checks.py (the model held
    against this CPU and published figures); they are reachable here too, looked up on first use so
    that either module may be imported first."""
    if name in ("fit_cpu", "predict_step", "published_checks"):
        from . import scale_checks
        return getattr(scale_checks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

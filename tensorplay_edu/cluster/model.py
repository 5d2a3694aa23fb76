"""The cluster model: the hardware, the Llama 3 shapes, the layout of a step and the price of a collective.

Every cluster-sized number in the notebooks comes from this folder, so that they agree with each other.
This file holds the hardware, the shapes, the layout of a step (:class:`Setup`) and the price of one
collective; memory lives in ``memory_use.py``, step time in ``timing.py``, the checks against this CPU and
published figures in ``published.py``. Import everything from the folder:

    from tensorplay_edu.cluster import GPUS, MODELS, Setup, memory, step_time
    memory(MODELS["llama3-70b"], Setup(tp=8, sp=True, dp=8, fsdp=True))   # bytes per GPU by component
    step_time(MODELS["llama3-70b"], Setup(tp=8, sp=True, dp=8, fsdp=True), GPUS["h100"])

Notation (the series' letters): ``b`` sequences per data-parallel rank, ``s`` tokens per sequence,
``h`` model width (``dim``), ``H`` query heads, ``K`` key-value heads, ``F`` the feed-forward width,
``V`` vocabulary, ``L`` layers, ``t`` the TP degree, ``p`` bytes per element.
Everything is an estimate from first principles (counts of bytes and FLOPs, an α–β model of each
collective), and :func:`published_checks` puts it beside published figures.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPU", "GPUS", "Model", "MODELS", "Setup", "DEFAULT_MFU", "FLOAT8_EFFICIENCY", "NCCL_BASE_LATENCY",
           "ring_steps", "ring_terms", "collective_time"]


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


# Latency: NCCL's own cost model (NVIDIA/nccl src/graph/tuning.cc, Ring algorithm, Simple protocol, the
# one used for the large messages of training) charges a base latency of 8.4 µs per collective, plus a
# hardware latency per ring step: 3.4 µs over NVLink, 14.0 µs over the network (NCCL 2.2x's figure;
# older releases said 9.6). One NVLink figure everywhere: NVLink 4 is 900 GB/s bidirectional = 450 GB/s
# each way. NDR InfiniBand is 400 Gb/s = 50 GB/s each way, one NIC per GPU.
NCCL_BASE_LATENCY = 8.4e-6
_HOPPER = dict(bf16_flops=989e12, fp8_flops=1979e12, nvlink_bw=450e9, nvlink_alpha=3.4e-6,
               ib_bw=50e9, ib_alpha=14.0e-6, gpus_per_node=8)
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
    ``checkpoint``: full activation checkpointing (keep each block's input, recompute the rest);
    ``activations``: ``"llama"`` counts what this package's Llama saves (:func:`llama_activations`),
    ``"korthikanti"`` the paper's GPT layer (:func:`korthikanti_activations`, flash attention)."""
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
    activations: str = "llama"

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


def _link(gpu: GPU, link: str) -> tuple[float, float]:
    if link == "nvlink":
        return gpu.nvlink_bw, gpu.nvlink_alpha
    if link == "ib":
        return gpu.ib_bw, gpu.ib_alpha
    raise ValueError(f"link must be 'nvlink' or 'ib', got {link!r}")


def ring_steps(op: str, world: int) -> int:
    """Steps of a ring collective on ``world`` ranks: t-1 for an all-gather or a reduce-scatter (each
    rank passes one chunk per step), 2(t-1) for an all-reduce (a reduce-scatter, then an all-gather).
    Each step moves nbytes/t per rank."""
    steps = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}.get(op)
    if steps is None:
        raise ValueError(f"op must be all_reduce, all_gather or reduce_scatter, got {op!r}")
    return steps * (world - 1)


def ring_terms(op: str, nbytes: float, world: int, gpu: GPU, link: str = "nvlink") -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of one ring collective over ``world`` ranks of a buffer of
    ``nbytes`` (the FULL tensor: the all-gather's output, the reduce-scatter's input, the all-reduce's
    buffer), as NCCL's cost model prices it; B and α are the link's, β = 1/B:

    * all_reduce:                 2(t-1)/t · nbytes / B,   base + 2(t-1)·α  (a reduce-scatter, then an all-gather)
    * all_gather, reduce_scatter:  (t-1)/t · nbytes / B,   base +  (t-1)·α"""
    bw, alpha = _link(gpu, link)
    steps = ring_steps(op, world)
    if world <= 1:
        return 0.0, 0.0
    return steps * nbytes / world / bw, NCCL_BASE_LATENCY + steps * alpha


def collective_time(op: str, nbytes: float, world: int, gpu: GPU, link: str = "nvlink") -> float:
    """Seconds for one ring collective: the sum of :func:`ring_terms`."""
    return sum(ring_terms(op, nbytes, world, gpu, link))


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

"""The cluster model: the hardware, the Llama 3 shapes, the layout of a step and the price of a collective.

Every cluster-sized number in the notebooks comes from this folder, so that they agree with each other.
This file holds the hardware, the shapes, the layout of a step (:class:`Setup`) and the price of one
collective as NCCL prices it; memory lives in ``memory_use.py``, step time in ``timing.py``, the constants
fitted to published runs in ``calibration.py``, the checks against them in ``published.py``, the layout
search in ``search.py``. Import everything from the folder:

    from tensorplay_edu.cluster import GPUS, MODELS, Setup, memory, step_time
    memory(MODELS["llama3-70b"], Setup(tp=8, sp=True, dp=8, fsdp=True))   # bytes per GPU by component
    step_time(MODELS["llama3-70b"], Setup(tp=8, sp=True, dp=8, fsdp=True), GPUS["h100"])

Notation (the series' letters): ``b`` sequences per micro-batch per data-parallel rank, ``s`` tokens per
sequence, ``h`` model width (``dim``), ``H`` query heads, ``K`` key-value heads, ``F`` the feed-forward width,
``V`` vocabulary, ``L`` layers, ``t`` the TP degree, ``d`` the data-parallel degree, ``p`` bytes per element.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPU", "GPUS", "Model", "MODELS", "Setup", "FLOAT8_RECIPES", "AC_MODES", "NCCL_BASE_LATENCY",
           "ring_steps", "node_busbw", "bytes_sent", "ring_terms", "collective_time"]


@dataclass(frozen=True)
class GPU:
    """One accelerator and its links. FLOP/s are dense (no 2:4 sparsity). ``hbm_bytes`` is the capacity
    nvidia-smi reports. Bandwidths are bytes/s per GPU per direction: ``*_bw`` the line rate, ``*_busbw``
    what NCCL's ring achieves (nccl-tests' busBw), ``nvls_busbw`` an all-reduce inside a node (NVLink
    SHARP). α is the latency of one ring step; ``net_overhead`` NCCL's per-step host cost on a ring that
    crosses nodes."""
    name: str
    bf16_flops: float
    fp8_flops: float
    hbm_bytes: float
    hbm_bw: float
    nvlink_bw: float
    nvlink_busbw: float
    nvls_busbw: float
    nvlink_alpha: float
    ib_bw: float
    ib_busbw: float
    ib_alpha: float
    net_overhead: float
    gpus_per_node: int
    source: str


# Latency, from NCCL's own cost model (NVIDIA/nccl src/graph/tuning.cc, Ring, Simple protocol): 8.4 µs base
# per collective; per ring step 3.4 µs over NVLink and 14.0 µs over the network (NCCL 2.2x; older: 9.6). On a
# ring across n nodes only the n-1 node-crossing steps (2(n-1) for an all-reduce) pay the network's α; the
# others pay max(NVLink α, 3 x netOverhead), netOverhead = 1 µs on Intel hosts (2 on AMD).
# Bandwidth: NVLink 4 is 450 GB/s each way (line rate); NCCL's rings reach ~370 GB/s after protocol
# overhead and NVLS all-reduce ~480 GB/s busBw (NVIDIA/nccl-tests#212, NCCL's maintainer). NDR InfiniBand is
# 400 Gb/s = 50 GB/s per GPU; we take 46 GB/s busBw, the low end of the 46-48 GB/s per NDR NIC an NCCL developer
# gives (NVIDIA/nccl-tests#290); not measured here.
NCCL_BASE_LATENCY = 8.4e-6
_MIB = 2 ** 20
_HOPPER = dict(bf16_flops=989e12, fp8_flops=1979e12, nvlink_bw=450e9, nvlink_busbw=370e9, nvls_busbw=480e9,
               nvlink_alpha=3.4e-6, ib_bw=50e9, ib_busbw=46e9, ib_alpha=14.0e-6, net_overhead=1.0e-6,
               gpus_per_node=8)
_NCCL = "; NCCL's α and achieved busBw (src/graph/tuning.cc, nccl-tests#212)"
GPUS = {
    "h100": GPU("H100 SXM 80 GB (700 W)", hbm_bytes=81559 * _MIB, hbm_bw=3.35e12, **_HOPPER,
                source="NVIDIA H100 datasheet (SXM, dense); capacity as nvidia-smi shows it (81,559 MiB)" + _NCCL),
    "h200": GPU("H200 SXM 141 GB", hbm_bytes=143771 * _MIB, hbm_bw=4.8e12, **_HOPPER,
                source="NVIDIA H200 datasheet (same Hopper compute and links as H100); nvidia-smi: 143,771 MiB" + _NCCL),
    # The GPU every published throughput here was measured on (torchtitan's Grand Teton hosts): the
    # efficiencies of calibration.py are fitted on it. Its peak is unpublished ("between SXM and NVL"):
    # torchtitan divides by the SXM's 989 TFLOP/s, and so do we, so its efficiency holds the difference.
    "h100-500w": GPU("H100 96 GB HBM2e at 500 W (torchtitan's benchmark GPU)", hbm_bytes=96e9, hbm_bw=2.4e12,
                     **_HOPPER, source="torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Hardware" + _NCCL),
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

    def check_tp(self, tp: int) -> None:
        """Raise unless ``tp`` divides the query and the KV heads: a training plan gives each rank whole
        heads (notebook 02b), so a cost at another degree would be the cost of no plan that runs."""
        for what, n in (("query heads", self.heads), ("KV heads", self.kv_heads)):
            if n % tp:
                raise ValueError(f"{self.name}: TP {tp} does not divide its {n} {what}, and a training plan gives "
                                 f"each rank whole heads (the planner refuses it): take a TP degree dividing {n}")

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

# torchao's float8 training recipes: tensorwise (one scale per tensor; float8 TP all-gathers, and float8 FSDP
# all-gathers if asked), rowwise (a scale per row; communication stays bf16), rowwise_with_gw_hp (rowwise,
# with the weight-gradient matmul kept in bf16). torchtitan runs any of them through its float8 converter.
FLOAT8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
# Activation checkpointing as torchtitan's apply_ac offers it, per block: none, selective (per-op SAC:
# keep every other matmul's output and attention's), full (keep the block's input, recompute the rest).
AC_MODES = ("none", "selective", "full")
LOSS_IMPLS = ("tensorplay_edu", "pytorch")  # whose loss_parallel a run uses: its peak per logit differs


@dataclass(frozen=True)
class Setup:
    """How one optimizer step is laid out: TP degree ``tp`` (with SP, loss_parallel, float8 and async TP
    as options), ``dp`` data-parallel replicas (``fsdp``: sharded over them, as FSDP2), each running
    ``micro_batches`` micro-batches of ``batch`` sequences of ``seq`` tokens (gradient accumulation), so the
    global batch is dp·batch·micro_batches sequences. ``float8``: None or a recipe of ``FLOAT8_RECIPES``
    (True means this package's float8 TP plan, tensorwise); ``fsdp_float8_gather``: FSDP all-gathers the
    blocks' weights in float8 (torchao's ``enable_fsdp_float8_all_gather``, tensorwise only, off by
    default). ``ac``: one of ``AC_MODES``. ``reduce_fp32``: gradients reduced in float32 (torchtitan's
    default ``mixed_precision_reduce``). ``dtype_bytes``: the compute dtype (bf16: 2). ``activations``:
    ``"llama"`` counts what this package's Llama saves, ``"korthikanti"`` the paper's GPT layer.
    ``loss``: whose ``loss_parallel`` (one of ``LOSS_IMPLS``): this package's, or PyTorch's own (eager)."""
    tp: int = 1
    sp: bool = False
    loss_parallel: bool = False
    float8: str | None = None
    fsdp_float8_gather: bool = False
    async_tp: bool = False
    dp: int = 1
    fsdp: bool = False
    batch: int = 1
    micro_batches: int = 1
    seq: int = 8192
    dtype_bytes: int = 2
    ac: str = "none"
    reduce_fp32: bool = True
    activations: str = "llama"
    loss: str = "tensorplay_edu"

    def __post_init__(self):
        if self.float8 is True:
            object.__setattr__(self, "float8", "tensorwise")
        elif self.float8 is False:
            object.__setattr__(self, "float8", None)
        if self.float8 is not None and self.float8 not in FLOAT8_RECIPES:
            raise ValueError(f"Setup(float8=...) must be None or one of {FLOAT8_RECIPES}, got {self.float8!r}")
        if self.fsdp_float8_gather and self.float8 != "tensorwise":
            raise ValueError("Setup(fsdp_float8_gather=True) needs float8='tensorwise': torchao gathers float8 "
                             f"weights only with tensorwise scales (got float8={self.float8!r})")
        if self.loss not in LOSS_IMPLS:
            raise ValueError(f"Setup(loss=...) must be one of {LOSS_IMPLS}, got {self.loss!r}")
        if self.ac not in AC_MODES:
            raise ValueError(f"Setup(ac=...) must be one of {AC_MODES}, got {self.ac!r}")
        for name in ("tp", "dp", "batch", "micro_batches", "seq"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Setup({name}=...) must be a positive integer, got {value!r}")

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.dp * self.batch * self.micro_batches


def ring_steps(op: str, world: int) -> int:
    """Steps of a ring collective on ``world`` ranks: t-1 for an all-gather or a reduce-scatter (each
    rank passes one chunk per step), 2(t-1) for an all-reduce (a reduce-scatter, then an all-gather).
    Each step moves nbytes/t per rank."""
    steps = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}.get(op)
    if steps is None:
        raise ValueError(f"op must be all_reduce, all_gather or reduce_scatter, got {op!r}")
    return steps * (world - 1)


def bytes_sent(op: str, nbytes: float, world: int) -> float:
    """Bytes each rank sends in one ring collective of a ``nbytes`` buffer on ``world`` ranks: (t-1)/t of
    it, twice that for an all-reduce (CommDebugMode's count)."""
    return ring_steps(op, world) * nbytes / world



def node_busbw(world: int, nodes: int, gpu: GPU, caller: str) -> float:
    """The busBw with which ``world`` ranks spread evenly over ``nodes`` nodes leave a node: their t/n NICs (NCCL
    runs one ring per NIC), at most NVLink's."""
    if world % nodes:
        raise ValueError(f"{caller}: {world} ranks do not spread evenly over {nodes} nodes")
    return min(world // nodes * gpu.ib_busbw, gpu.nvlink_busbw)


def ring_terms(op: str, nbytes: float, world: int, gpu: GPU, link: str = "nvlink",
               nodes: int | None = None) -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of one collective over ``world`` ranks of a buffer of
    ``nbytes`` (the FULL tensor: the all-gather's output, the reduce-scatter's input, the all-reduce's
    buffer), as NCCL's cost model prices it. ``link="nvlink"``: every rank in one node; ``link="ib"``: the
    ranks spread evenly over ``nodes`` nodes (default: one rank per node). B is the achieved busBw:

    * all_reduce:                 2(t-1)/t · nbytes / B,   base + 2(t-1) steps of α  (NVLS inside a node)
    * all_gather, reduce_scatter:  (t-1)/t · nbytes / B,   base +  (t-1) steps of α

    Across n nodes only k·(n-1) steps (k = 2 for an all-reduce, else 1) pay the network's α, and the
    t/n ranks of a node leave it through their own NICs (NCCL runs one ring per NIC), so B is t/n NICs'
    busBw, at most NVLink's."""
    if link not in ("nvlink", "ib"):
        raise ValueError(f"link must be 'nvlink' or 'ib', got {link!r}")
    steps = ring_steps(op, world)
    if world <= 1:
        return 0.0, 0.0
    if link == "nvlink":
        bw = gpu.nvls_busbw if op == "all_reduce" else gpu.nvlink_busbw
        return steps * nbytes / world / bw, NCCL_BASE_LATENCY + steps * gpu.nvlink_alpha
    nodes = world if nodes is None else nodes
    crossing = (steps // (world - 1)) * (nodes - 1)
    other = max(gpu.nvlink_alpha, 3 * gpu.net_overhead)
    bw = node_busbw(world, nodes, gpu, "ring_terms")
    return (steps * nbytes / world / bw,
            NCCL_BASE_LATENCY + crossing * gpu.ib_alpha + (steps - crossing) * other)


def collective_time(op: str, nbytes: float, world: int, gpu: GPU, link: str = "nvlink",
                    nodes: int | None = None) -> float:
    """Seconds for one collective: the sum of :func:`ring_terms`."""
    return sum(ring_terms(op, nbytes, world, gpu, link, nodes))

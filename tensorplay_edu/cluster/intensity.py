"""When TP stops paying: the arithmetic intensity of TP, compute time over TP traffic time per block.

A block's matmuls grow like b·s·h²/t and its TP traffic like b·s·h, so their ratio is set by the width,
t, the link and the sustained FLOP rate, not by the batch; only the latency makes a crossover in tokens.
Back-of-envelope: FLOPs at ``DEFAULT_MFU`` of the peak and NCCL's achieved bandwidth (the step model of
``timing.py`` prices each matmul on its roofline instead). Import it from ``tensorplay_edu.cluster``.
"""

from __future__ import annotations

import math

from .calibration import DEFAULT_MFU
from .model import GPU, NCCL_BASE_LATENCY, Model

__all__ = ["tp_compute_over_comm", "tp_crossover_tokens", "tp_max_inside"]


def _per_layer_terms(model: Model, gpu: GPU, link: str, tp: int, mfu: float):
    """One block at TP degree ``tp`` (bf16, SP plan): (compute s per token, TP comm s per token, the
    latency of its collectives in s). Per token the block computes 6·P_layer/t FLOPs and SP moves
    4 all-gathers + 4 reduce-scatters of h bf16 values, (t-1)/t of each at NCCL's achieved bandwidth;
    their 8·(t-1) ring steps and the 2·2(t-1) of the two norm-weight all-reduces cost α each, and each
    of the 10 collectives NCCL's base latency."""
    if link not in ("nvlink", "ib"):
        raise ValueError(f"link must be 'nvlink' or 'ib', got {link!r}")
    bw, alpha = (gpu.nvlink_busbw, gpu.nvlink_alpha) if link == "nvlink" else (gpu.ib_busbw, gpu.ib_alpha)
    compute = 6 * model.layer_params() / tp / (gpu.bf16_flops * mfu)
    comm = 8 * (tp - 1) / tp * 2 * model.dim / bw
    return compute, comm, 10 * NCCL_BASE_LATENCY + (8 + 4) * (tp - 1) * alpha


def tp_compute_over_comm(model: Model, gpu: GPU, link: str = "nvlink", tp: int = 8, mfu: float = DEFAULT_MFU):
    """The arithmetic intensity of TP, per block and many tokens: compute time / TP traffic time.

    Per token, the block does 6·P_layer/t FLOPs (P_layer ≈ 12h² for a GPT block) while TP moves
    8·(t-1)/t·h·2 bytes (4 gathers + 4 scatters of h bf16 values, or 4 all-reduces). With R the
    sustained FLOP/s (peak · mfu) and B the achieved link bytes/s, the ratio is 6·P_layer·B / (16·(t-1)·h·R)
    ≈ 4.5·h·B / ((t-1)·R) for a GPT block: independent of the number of tokens, growing with the width h,
    shrinking with t, and ~8x smaller over InfiniBand than over NVLink. Above 1, TP's traffic can hide
    behind its own compute (async TP); below 1 no overlap can save it."""
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

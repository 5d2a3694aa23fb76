"""Step time: the half of :mod:`tensorplay_edu.cluster` that counts seconds.

FLOPs at a sustained fraction of the peak, each TP collective of a block priced by
:func:`tensorplay_edu.cluster.ring_terms` (and hidden under its own matmul by async TP), the data-parallel
gradient traffic, and when TP stops paying (compute against TP traffic per block). Import it from
``tensorplay_edu.cluster``.
"""

from __future__ import annotations

import math

from .model import (DEFAULT_MFU, FLOAT8_EFFICIENCY, GPU, NCCL_BASE_LATENCY, Model, Setup, _link,
                    collective_time)

__all__ = ["tp_collectives_per_layer", "tp_bytes_per_layer", "tp_rings", "step_time", "tp_compute_over_comm",
           "tp_crossover_tokens", "tp_max_inside"]


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



def _compute_seconds(model: Model, setup: Setup, gpu: GPU, mfu: float) -> float:
    """FLOPs per GPU per step / (peak · mfu), counted as torchtitan counts them when it reports the MFU
    that ``mfu`` stands for. Matmuls: 6 · (matmul params) · (b·s tokens) / t, the 6 being 2 forward + 4
    backward per weight and token; the output layer counts, the embedding lookup does not. Attention
    (QKᵀ and AV): 12·L·s²·h·b / t, the whole s×s square: a causal kernel does half of it, but torchtitan's
    MFU convention does not count that saving, so an MFU measured that way converts this count into
    seconds. float8 runs the blocks' matmuls at the fp8 peak times FLOAT8_EFFICIENCY (torchtitan converts
    those; the output layer and attention stay bf16)."""
    tokens, t = setup.batch * setup.seq, setup.tp
    blocks = 6 * model.layers * model.layer_params() * tokens / t
    rest = 6 * model.vocab * model.dim * tokens / t + 12 * model.layers * setup.seq * tokens * model.dim / t
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


def tp_rings(model: Model, setup: Setup, gpu: GPU, mfu: float = DEFAULT_MFU) -> list[dict]:
    """One block's TP collectives in one step (those of :func:`tp_collectives_per_layer`), each with
    its seconds and the seconds of the matmul async TP can overlap it with (0: none):
    ``{"phase", "name", "op", "comm", "matmul"}``.

    Under SP, PyTorch's async TP (notebook 10) splits a forward all-gather into a ring whose chunks feed
    the matmuls of its readers (wq, wk, wv; w1, w3), and the matmul before a reduce-scatter (wo, w2) into
    chunks whose sums travel while the next is computed. In backward it does the same for the gathered
    output gradients of wo and w2 (their input-gradient matmuls); the reduce-scatters fed by several
    matmuls (wq + wk + wv, w1 + w3), the norm all-reduces and float8's amaxes stay whole. A transfer
    hides only under its own ring's matmul (notebook 10 §6)."""
    t, n = setup.tp, setup.batch * setup.seq
    link = "ib" if t > gpu.gpus_per_node else "nvlink"
    rate = (gpu.fp8_flops * FLOAT8_EFFICIENCY if setup.float8 else gpu.bf16_flops) * mfu
    h, qkv, f = model.dim, model.dim + 2 * model.kv_heads * model.head_dim, model.ffn
    # each phase's SP gathers and scatters, in tp_collectives_per_layer's order, and the matmul FLOPs beside them
    mm = {"attention input": 2 * n * h * qkv / t, "wo": 2 * n * h * h / t, "ffn input": 2 * n * h * 2 * f / t,
          "w2": 2 * n * f * h / t}
    rings, seen = [], {"forward": 0, "backward": 0}
    for phase, op, nbytes in tp_collectives_per_layer(model, setup):
        name, hides = op, 0.0
        if setup.sp and op in ("all_gather", "reduce_scatter") and seen[phase] < len(mm):
            name = list(mm)[seen[phase]]
            seen[phase] += 1
            if phase == "forward" or op == "all_gather":  # backward's reduce-scatters have several feeders
                hides = mm[name] / rate
        rings.append({"phase": phase, "name": name, "op": op, "comm": collective_time(op, nbytes, t, gpu, link),
                      "matmul": hides})
    return rings


def step_time(model: Model, setup: Setup, gpu: GPU, mfu: float = DEFAULT_MFU) -> dict[str, float]:
    """Seconds of one training step per GPU, and tokens/s.

    ``compute`` (see ``_compute_seconds``), ``tp_comm`` (every TP collective of every block, α–β over
    NVLink inside a node, IB if t spans nodes), ``dp_comm`` (gradient sync). Overlap: DP traffic hides
    behind compute (bucketed backward, FSDP prefetch) except what exceeds it; TP traffic sits on the
    critical path (each matmul waits for its input) unless ``async_tp`` (with SP) splits a ring into
    chunks that overlap its own matmul (:func:`tp_rings`): each hides up to its matmul's time.
    ``exposed`` is what stays visible."""
    compute = _compute_seconds(model, setup, gpu, mfu)
    rings = tp_rings(model, setup, gpu, mfu)
    tp = model.layers * sum(r["comm"] for r in rings)
    dp = _dp_seconds(model, setup, gpu)
    hidden = sum(min(r["comm"], r["matmul"]) for r in rings) if setup.async_tp and setup.sp else 0.0
    exposed_tp = tp - model.layers * hidden
    exposed = exposed_tp + max(0.0, dp - compute)
    total = compute + exposed
    per_gpu = setup.batch * setup.seq / setup.tp / total
    return {"compute": compute, "tp_comm": tp, "dp_comm": dp, "exposed": exposed, "total": total,
            "tokens_per_s_per_gpu": per_gpu, "tokens_per_s": per_gpu * setup.gpus}


def _per_layer_terms(model: Model, gpu: GPU, link: str, tp: int, mfu: float):
    """One block at TP degree ``tp`` (bf16, SP plan): (compute s per token, TP comm s per token, the
    latency of its collectives in s). Per token the block computes 6·P_layer/t FLOPs and SP moves
    4 all-gathers + 4 reduce-scatters of h bf16 values, (t-1)/t of each; their 8·(t-1) ring steps and
    the 2·2(t-1) of the two norm-weight all-reduces cost α each, and each of the 10 collectives NCCL's
    base latency."""
    bw, alpha = _link(gpu, link)
    compute = 6 * model.layer_params() / tp / (gpu.bf16_flops * mfu)
    comm = 8 * (tp - 1) / tp * 2 * model.dim / bw
    return compute, comm, 10 * NCCL_BASE_LATENCY + (8 + 4) * (tp - 1) * alpha


def tp_compute_over_comm(model: Model, gpu: GPU, link: str = "nvlink", tp: int = 8, mfu: float = DEFAULT_MFU):
    """The arithmetic intensity of TP, per block and many tokens: compute time / TP traffic time.

    Per token, the block does 6·P_layer/t FLOPs (P_layer ≈ 12h² for a GPT block) while TP moves
    8·(t-1)/t·h·2 bytes (4 gathers + 4 scatters of h bf16 values, or 4 all-reduces). With R the
    sustained FLOP/s (peak · mfu) and B the link's bytes/s, the ratio is 6·P_layer·B / (16·(t-1)·h·R)
    ≈ 4.5·h·B / ((t-1)·R): independent of the number of tokens, growing with the width h, shrinking
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



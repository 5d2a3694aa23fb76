"""Step time: the half of :mod:`tensorplay_edu.cluster` that counts seconds.

A step is ``micro_batches`` forward-backward passes and one optimizer update. Each matmul costs its FLOPs
at a fitted efficiency or the bytes it reads and writes at a fitted share of HBM bandwidth, whichever is
longer (a narrow per-rank matmul, t large, turns memory-bound); attention costs its causal FLOPs; each TP
collective is priced by :func:`tensorplay_edu.cluster.ring_terms` (and hidden under its own matmul by
async TP); FSDP gathers and reduces every layer once per micro-batch, behind the compute when it fits.
The efficiencies and which published runs they were fitted to are in ``calibration.py``.

Left out: memory-bound work other than the matmuls and the optimizer (norms, casts: folded into the
fitted efficiency), float8's amax all-reduces when checkpointing recomputes them, and any overlap
torch.compile finds beyond async TP's rings.
"""

from __future__ import annotations

import math

from .calibration import CALIBRATED, Efficiency
from .model import GPU, Model, Setup, bytes_sent, collective_time

__all__ = ["block_matmuls", "matmul_seconds", "compute_seconds", "reported_flops", "tp_collectives_per_layer",
           "tp_edge_collectives", "tp_bytes_per_layer", "tp_rings", "dp_seconds", "step_time"]


def block_matmuls(model: Model, setup: Setup) -> dict[str, tuple[int, int, int]]:
    """One block's weight matmuls on one rank for one micro-batch, as (M, N, K) of the forward pass
    ``[M, K] @ [K, N]``: M = b·s tokens; colwise weights (wq, wk, wv, w1, w3) keep N/t columns, rowwise
    ones (wo, w2) K/t rows. Backward runs two more of the same FLOPs (input and weight gradients)."""
    model.check_tp(setup.tp)
    n, h, kv, f, t = setup.batch * setup.seq, model.dim, model.kv_heads * model.head_dim, model.ffn, setup.tp
    return {"wq": (n, h // t, h), "wk": (n, kv // t, h), "wv": (n, kv // t, h), "wo": (n, h, h // t),
            "w1": (n, f // t, h), "w3": (n, f // t, h), "w2": (n, h, f // t)}


def matmul_seconds(m: int, n: int, k: int, gpu: GPU, fp8: str | None = None, p: int = 2,
                   eff: Efficiency = CALIBRATED) -> float:
    """One pass of an [m, k] @ [k, n] matmul, the roofline: the longer of its 2mnk FLOPs at ``eff.matmul``
    of the peak (the fp8 peak times ``eff.float8[fp8]`` for a float8 recipe) and its p·(mk + kn + mn)
    bytes at ``eff.hbm`` of the HBM bandwidth. A narrow slice (wk and wv at a large t) reads its whole
    input to compute a thin output, and turns memory-bound. A float8 matmul is charged bf16 bytes: its
    casts read the bf16 operands."""
    rate = gpu.bf16_flops if fp8 is None else gpu.fp8_flops * eff.float8[fp8]
    return max(2 * m * n * k / (rate * eff.matmul), p * (m * k + k * n + m * n) / (gpu.hbm_bw * eff.hbm))


def _block_passes(setup: Setup) -> list[str | None]:
    """The precision of a block matmul's three passes (forward, input grad, weight grad)."""
    if setup.float8 == "rowwise_with_gw_hp":
        return ["rowwise", "rowwise", None]
    return [setup.float8] * 3


def compute_seconds(model: Model, setup: Setup, gpu: GPU, eff: Efficiency = CALIBRATED) -> dict[str, float]:
    """Seconds of one micro-batch's forward and backward on one GPU, by part:

    * ``matmuls``: the blocks' weight matmuls, three passes each (:func:`matmul_seconds`);
    * ``attention``: QKᵀ and AV on the causal half of the s×s square, 2·b·s²·h/t FLOPs forward; flash
      attention's backward computes QKᵀ again, so 2.5 times that backward; at the bf16 matmul efficiency
      (at 32k tokens attention runs slower than that: the published 32k run is our largest error);
    * ``output``: the output layer (bf16 under every float8 recipe, as torchtitan converts only the blocks);
    * ``recompute``: full AC runs each block's forward again (matmuls and attention), selective AC
      (torchtitan's per-op policy, which saves every other matmul) only wk, wo and w3 — the output layer
      is outside the checkpointed blocks."""
    passes, t = _block_passes(setup), setup.tp
    mm = block_matmuls(model, setup)
    one = {name: [matmul_seconds(*shape, gpu, fp8, eff=eff) for fp8 in passes] for name, shape in mm.items()}
    matmuls = model.layers * sum(sum(v) for v in one.values())
    attn_fwd = 2 * setup.batch * setup.seq ** 2 * model.dim / t / (gpu.bf16_flops * eff.matmul)
    attention = model.layers * 3.5 * attn_fwd
    output = 3 * matmul_seconds(setup.batch * setup.seq, model.vocab // t, model.dim, gpu, eff=eff)
    if setup.ac == "full":
        recompute = model.layers * (sum(v[0] for v in one.values()) + attn_fwd)
    elif setup.ac == "selective":
        recompute = model.layers * sum(one[name][0] for name in ("wk", "wo", "w3"))
    else:
        recompute = 0.0
    return {"matmuls": matmuls, "attention": attention, "output": output, "recompute": recompute}


def reported_flops(model: Model, setup: Setup) -> float:
    """FLOPs of one step per GPU as torchtitan counts them to report MFU: 6 per matmul weight and token
    (the output layer counts, the embedding lookup does not) plus attention's 12·L·s²·h per sequence, the
    whole square (the causal saving and recomputation are not counted)."""
    tokens = setup.global_batch * setup.seq / setup.gpus
    return tokens * (6 * (model.layers * model.layer_params() + model.vocab * model.dim)
                     + 12 * model.layers * setup.seq * model.dim)


def tp_collectives_per_layer(model: Model, setup: Setup) -> list[tuple[str, str, float]]:
    """The TP collectives of one block in one micro-batch, as (phase, op, full buffer bytes): what
    CommDebugMode records for :func:`tensorplay_edu.models.parallelize_llama`'s plans.

    * vanilla (no SP): forward, wo and w2 all-reduce their [b, s, h] output; backward, the transposes
      (one ``f`` per block input, shared by wq/wk/wv and by w1/w3): 2 + 2 all-reduces of b·s·h.
    * SP: each all-reduce becomes an all-gather (block input) and a reduce-scatter (block output), the
      same bytes on the wire; backward the transposes, plus one all-reduce per norm weight gradient (h).
    * float8 tensorwise (this package's and torchao's float8 TP plan): with SP the forward all-gathers and
      backward's gradient all-gathers move 1-byte float8, and every scale needs a global amax: a
      one-number all-reduce per sharded tensor (9 + 2·SP forward, 5 + 2·SP backward), counted padded to
      one element per rank as CommDebugMode does. The rowwise recipes communicate in bf16."""
    t, e = setup.tp, setup.batch * setup.seq * model.dim  # e: elements of one [b, s, h] activation
    if t == 1:
        return []
    tensorwise = setup.float8 == "tensorwise"
    full = e * setup.dtype_bytes
    low = e * (1 if tensorwise else setup.dtype_bytes)
    if setup.sp:
        out = [("forward", "all_gather", low), ("forward", "reduce_scatter", full)] * 2
        out += [("backward", "reduce_scatter", full), ("backward", "all_gather", low)] * 2
        out += [("backward", "all_reduce", model.dim * 4.0)] * 2  # norm weights' grads (fp32 params)
    else:
        out = [("forward", "all_reduce", full)] * 2 + [("backward", "all_reduce", full)] * 2
    if tensorwise:
        amax = 4.0 * t  # one fp32 number, padded to one per rank
        out += [("forward", "all_reduce", amax)] * (9 + 2 * setup.sp)
        out += [("backward", "all_reduce", amax)] * (5 + 2 * setup.sp)
    return out


def tp_edge_collectives(model: Model, setup: Setup) -> list[tuple[str, str, float]]:
    """The TP collectives outside the blocks in one micro-batch, as (phase, op, full buffer bytes), as
    :func:`tensorplay_edu.models.parallelize_llama`'s plans issue them: the embedding's partial rows made
    whole (an all-reduce, or under SP a reduce-scatter, whose gradient is all-gathered back); the output
    layer's input made whole (``f``: a backward all-reduce; under SP a forward all-gather, a backward
    reduce-scatter and the final norm's weight gradient); then either the logits all-gathered (b·s·V
    values, the largest single collective of a step) or, under ``loss_parallel``, three all-reduces of b·s
    float32 numbers (max, sum, target)."""
    t, p = setup.tp, setup.dtype_bytes
    if t == 1:
        return []
    tokens = setup.batch * setup.seq
    e = tokens * model.dim * p
    out = [("forward", "reduce_scatter" if setup.sp else "all_reduce", e)]
    if setup.sp:  # the embedding's gradient gathered back; the output layer's input gathered, its gradient scattered
        out += [("backward", "all_gather", e), ("forward", "all_gather", e), ("backward", "reduce_scatter", e),
                ("backward", "all_reduce", model.dim * 4.0)]
    else:
        out += [("backward", "all_reduce", e)]
    if setup.loss_parallel:
        return out + [("forward", "all_reduce", tokens * 4.0)] * 3
    return out + [("forward", "all_gather", tokens * model.vocab * p)]


def tp_bytes_per_layer(model: Model, setup: Setup, collectives=None) -> dict[str, dict[str, float]]:
    """``{phase: {op: bytes each rank sends}}`` (:func:`bytes_sent`, CommDebugMode's count) of one block's
    collectives, or of ``collectives`` given as (phase, op, bytes) (e.g. :func:`tp_edge_collectives`)."""
    out = {"forward": {}, "backward": {}}
    for phase, op, nbytes in tp_collectives_per_layer(model, setup) if collectives is None else collectives:
        out[phase][op] = out[phase].get(op, 0.0) + bytes_sent(op, nbytes, setup.tp)
    return out


def tp_rings(model: Model, setup: Setup, gpu: GPU, eff: Efficiency = CALIBRATED) -> list[dict]:
    """One block's TP collectives in one micro-batch (those of :func:`tp_collectives_per_layer`), each with
    its seconds and the seconds of the matmul async TP can overlap it with (0: none):
    ``{"phase", "name", "op", "comm", "matmul"}``.

    Under SP, PyTorch's async TP (notebook 10) splits a forward all-gather into a ring whose chunks feed
    the matmuls of its readers (wq, wk, wv; w1, w3), and the matmul before a reduce-scatter (wo, w2) into
    chunks whose sums travel while the next is computed. In backward it does the same for the gathered
    output gradients of wo and w2 (their input-gradient matmuls); the reduce-scatters fed by several
    matmuls (wq + wk + wv, w1 + w3), the norm all-reduces and float8's amaxes stay whole. A transfer
    hides only under its own ring's matmul (notebook 10, section 1; priced in notebook 10b). Each is
    priced as NCCL's collective though PyTorch's async TP moves the chunks with SymmetricMemory copies:
    an approximation.

    Activation checkpointing reruns forward collectives (phase ``"recompute"``): full AC all four (two
    without SP); torchtitan's per-op SAC saves the reduce-scatters' outputs, so reruns the two gathers
    (under SP, each beside its one recomputed reader, wk or w3) or the two all-reduces."""
    t, link = setup.tp, _tp_link(setup, gpu)
    fp8 = _block_passes(setup)[0]
    sec = {name: matmul_seconds(*shape, gpu, fp8, eff=eff) for name, shape in block_matmuls(model, setup).items()}
    mm = {"attention input": sec["wq"] + sec["wk"] + sec["wv"], "wo": sec["wo"],
          "ffn input": sec["w1"] + sec["w3"], "w2": sec["w2"]}
    rings, seen = [], {"forward": 0, "backward": 0}
    for phase, op, nbytes in tp_collectives_per_layer(model, setup):
        name, hides = op, 0.0
        if setup.sp and op in ("all_gather", "reduce_scatter") and seen[phase] < len(mm):
            name = list(mm)[seen[phase]]
            seen[phase] += 1
            if phase == "forward" or op == "all_gather":  # backward's reduce-scatters have several feeders
                hides = mm[name]
        rings.append({"phase": phase, "name": name, "op": op, "comm": collective_time(op, nbytes, t, gpu, link),
                      "matmul": hides})
    main = [r for r in rings if r["phase"] == "forward"][:4 if setup.sp else 2]  # the activations' collectives
    if setup.ac == "full":  # the whole forward again, rings and all
        rings += [{**r, "phase": "recompute"} for r in main]
    elif setup.ac == "selective":  # per-op SAC keeps reduce-scatter outputs, not gathers or all-reduces
        again = {"attention input": sec["wk"], "ffn input": sec["w3"]}  # the recomputed reader of each gather
        rings += [{**r, "phase": "recompute", "matmul": again.get(r["name"], 0.0)} for r in main
                  if r["op"] != "reduce_scatter"]
    return rings


def _tp_link(setup: Setup, gpu: GPU) -> str:
    """The TP group's link: NVLink inside a node, the network once t outgrows it."""
    return "ib" if setup.tp > gpu.gpus_per_node else "nvlink"


def dp_seconds(model: Model, setup: Setup, gpu: GPU) -> dict[str, float]:
    """Data-parallel traffic, ``{"per_micro_batch", "per_step", "unhidden"}`` seconds. Over IB once the
    job spans nodes (one NIC per GPU; only the node-crossing ring steps pay IB's α).

    * FSDP (FSDP2, reshard after forward): per micro-batch, every unit (each block, the embedding, the
      output layer) is all-gathered twice (forward, backward re-gather) in bf16 (block weights in float8
      with ``fsdp_float8_gather``) and its gradients reduce-scattered in
      float32 (``reduce_fp32``) or bf16. The first gather and the last reduce-scatter cannot overlap
      compute (``unhidden``).
    * DDP: one all-reduce of the float32 (or bf16) gradients per step, in 25 MB buckets."""
    d = setup.dp
    if d == 1:
        return {"per_micro_batch": 0.0, "per_step": 0.0, "unhidden": 0.0}
    nodes = min(d, math.ceil(setup.gpus / gpu.gpus_per_node))  # a replica's ranks: gpus_per_node / t per node
    link = "ib" if nodes > 1 else "nvlink"
    buffers = _dp_buffers(model, setup)
    if setup.fsdp:
        def unit(gathered, reduced):
            return (2 * collective_time("all_gather", gathered, d, gpu, link, nodes),
                    collective_time("reduce_scatter", reduced, d, gpu, link, nodes))
        b_ag, b_rs = unit(*buffers["block"])
        e_ag, e_rs = unit(*buffers["edge"])
        per_mb = model.layers * (b_ag + b_rs) + 2 * (e_ag + e_rs)
        return {"per_micro_batch": per_mb, "per_step": 0.0, "unhidden": b_ag / 2 + e_rs}
    nbytes = buffers["grads"]
    buckets = max(1, math.ceil(nbytes / 25e6))
    return {"per_micro_batch": 0.0, "unhidden": 0.0,
            "per_step": buckets * collective_time("all_reduce", nbytes / buckets, d, gpu, link, nodes)}


def _dp_buffers(model: Model, setup: Setup) -> dict:
    """The whole buffers of one GPU's data-parallel collectives, in bytes: FSDP, per unit ``(all-gathered,
    reduce-scattered)`` for a block and for an edge (embedding, output layer); DDP, the gradients all-reduced."""
    red = 4 if setup.reduce_fp32 else setup.dtype_bytes
    block, edge = model.layer_params() / setup.tp, model.vocab * model.dim / setup.tp
    if setup.fsdp:
        gather = 1 if setup.fsdp_float8_gather else setup.dtype_bytes
        return {"block": (block * gather, block * red), "edge": (edge * setup.dtype_bytes, edge * red)}
    return {"grads": red * (model.params() - model.norm_params()) / setup.tp}


def dp_bytes(model: Model, setup: Setup) -> dict[str, float]:
    """Bytes each GPU sends over its data-parallel group, ``{"per_micro_batch", "per_step"}``: the traffic
    :func:`dp_seconds` prices, counted as :func:`bytes_sent` counts (CommDebugMode's convention)."""
    d = setup.dp
    if d == 1:
        return {"per_micro_batch": 0.0, "per_step": 0.0}
    buffers = _dp_buffers(model, setup)
    if setup.fsdp:
        def unit(gathered, reduced):
            return 2 * bytes_sent("all_gather", gathered, d) + bytes_sent("reduce_scatter", reduced, d)
        return {"per_micro_batch": model.layers * unit(*buffers["block"]) + 2 * unit(*buffers["edge"]),
                "per_step": 0.0}
    return {"per_micro_batch": 0.0, "per_step": bytes_sent("all_reduce", buffers["grads"], d)}


def step_time(model: Model, setup: Setup, gpu: GPU, eff: Efficiency = CALIBRATED) -> dict[str, float]:
    """Seconds of one optimizer step per GPU, by part, and its throughput.

    ``compute`` (all micro-batches, :func:`compute_seconds`), ``tp_comm`` (every TP collective of every
    block, recomputation's included, NVLink inside a node), ``edge_comm`` (:func:`tp_edge_collectives`),
    ``dp_comm`` (:func:`dp_seconds`), ``optimizer`` (AdamW reads and writes 28 bytes per local parameter
    at HBM speed), ``exposed`` (communication left on the critical path: ``tp_exposed`` + ``dp_exposed``),
    ``total``, ``tokens_per_s_per_gpu``, ``tokens_per_s``, ``mfu`` (torchtitan's way, :func:`reported_flops`).
    Overlap: FSDP's traffic hides behind its micro-batch's compute except what exceeds it and its first
    gather and last reduce-scatter; DDP's all-reduce behind the last backward; TP traffic sits on the
    critical path unless ``async_tp`` (with SP) hides each ring under its own matmul."""
    mb = sum(compute_seconds(model, setup, gpu, eff).values())
    rings = tp_rings(model, setup, gpu, eff)
    tp = model.layers * sum(r["comm"] for r in rings)
    edge = sum(collective_time(op, n, setup.tp, gpu, _tp_link(setup, gpu))
               for _, op, n in tp_edge_collectives(model, setup))
    hidden = model.layers * sum(min(r["comm"], r["matmul"]) for r in rings) if setup.async_tp and setup.sp else 0.0
    dp = dp_seconds(model, setup, gpu)
    dp_exposed = max(0.0, dp["per_micro_batch"] - mb) + dp["unhidden"]
    ddp_exposed = max(0.0, dp["per_step"] - 2 / 3 * mb)
    local = (model.params() - model.norm_params()) / setup.tp / (setup.dp if setup.fsdp else 1)
    optimizer = 28 * local / (gpu.hbm_bw * eff.hbm)
    k = setup.micro_batches
    tp_exposed, dp_exposed = k * (tp + edge - hidden), k * dp_exposed + ddp_exposed
    total = k * mb + tp_exposed + dp_exposed + optimizer
    per_gpu = setup.global_batch * setup.seq / setup.gpus / total
    return {"compute": k * mb, "tp_comm": k * tp, "edge_comm": k * edge,
            "dp_comm": k * dp["per_micro_batch"] + dp["per_step"],
            "optimizer": optimizer, "tp_exposed": tp_exposed, "dp_exposed": dp_exposed,
            "exposed": tp_exposed + dp_exposed, "total": total, "tokens_per_s_per_gpu": per_gpu,
            "tokens_per_s": per_gpu * setup.gpus, "mfu": reported_flops(model, setup) / total / gpu.bf16_flops}

"""The model of scale (:mod:`tensorplay_edu.cluster`) held against the world.

* :func:`fit_cpu` and :func:`predict_step`: fit this machine's α, β and matmul FLOP/s from measured
  samples, then predict a step from its FLOPs and the collectives CommDebugMode recorded (notebook 07
  measures, fits, predicts and plots; nothing here times anything).
* :func:`published_checks`: our estimates beside published figures (Korthikanti et al.'s activation
  accounting, torchtitan's Llama 3 H100 tables, torchao's float8 speed-ups), with the ratio and source.

All three are importable from :mod:`tensorplay_edu.cluster` as well.
"""

from __future__ import annotations

from .model import GPU, GPUS, MODELS, Setup, ring_steps
from .memory_use import korthikanti_activations, llama_activations, memory
from .timing import step_time

__all__ = ["fit_cpu", "predict_step", "published_checks"]


def _lstsq_line(xs, ys) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys)."""
    n = len(xs)
    if n < 2:
        raise ValueError("fit_cpu needs at least two samples per fit")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("fit_cpu needs samples of at least two different sizes")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def _ring_cost(collectives, world: int) -> tuple[float, float]:
    """(ring steps, bytes sent per rank) of a list of collectives: CommDebugMode's records or
    ``(op, full buffer bytes)`` pairs on ``world`` ranks."""
    steps = sent = 0.0
    for c in collectives:
        if hasattr(c, "op"):
            op, t, nbytes_sent = c.op, c.group_size, c.bytes
        else:
            (op, nbytes), t = c, world
            nbytes_sent = (2 if op == "all_reduce" else 1) * (t - 1) / t * nbytes
        steps += ring_steps(op, t) if op in ("all_reduce", "all_gather", "reduce_scatter") else t - 1
        sent += nbytes_sent
    return steps, sent


def _lstsq_plane(rows) -> tuple[float, float]:
    """(a, b) minimising Σ (a·x + b·y - z)² over rows (x, y, z): no intercept."""
    sxx = sum(x * x for x, _, _ in rows)
    syy = sum(y * y for _, y, _ in rows)
    sxy = sum(x * y for x, y, _ in rows)
    sxz = sum(x * z for x, _, z in rows)
    syz = sum(y * z for _, y, z in rows)
    det = sxx * syy - sxy * sxy
    if len(rows) < 2 or det <= 1e-12 * sxx * syy:
        raise ValueError("fit_cpu needs transitions of at least two different sizes")
    return (sxz * syy - syz * sxy) / det, (syz * sxx - sxz * sxy) / det


def fit_cpu(samples: dict) -> dict[str, float]:
    """Fit this machine's constants from measured samples (pure math: pass what you measured).

    ``samples = {"all_reduce": [(nbytes, seconds), ...], "matmul": [(flops, seconds), ...], "world": 2}``
    (either list may be left out). ``nbytes`` is the all-reduced buffer's size. On t ranks a ring
    all-reduce takes 2(t-1)·α + 2(t-1)/t·nbytes·β, so the least-squares line through
    (2(t-1)/t·nbytes, seconds) has slope β (s/byte) and intercept 2(t-1)·α; a matmul of f FLOPs takes
    overhead + f / FLOP/s. Returns ``{"alpha", "beta"}`` and/or ``{"flops", "matmul_overhead"}``.

    ``samples["transitions"] = [(collectives, seconds), ...]`` instead fits α and β from timed layout
    changes (e.g. ``DTensor.redistribute`` forward and backward): ``collectives`` are what each one
    issued, as :func:`predict_step` takes them, and seconds = Σ ring steps·α + Σ bytes sent·β, least
    squares with no intercept, so α then also holds whatever each collective costs around it."""
    t, fit = samples.get("world", 2), {}
    if samples.get("transitions"):
        rows = [(*_ring_cost(coll, t), sec) for coll, sec in samples["transitions"]]
        fit["alpha"], fit["beta"] = _lstsq_plane(rows)
    elif samples.get("all_reduce"):
        xs, ys = zip(*[(2 * (t - 1) / t * n, sec) for n, sec in samples["all_reduce"]])
        intercept, fit["beta"] = _lstsq_line(xs, ys)
        fit["alpha"] = intercept / (2 * (t - 1))
    if samples.get("matmul"):
        fit["matmul_overhead"], slope = _lstsq_line(*zip(*samples["matmul"]))
        fit["flops"] = 1 / slope
    return fit


def predict_step(flops: float, collectives, fit: dict, world: int = 2) -> dict[str, float]:
    """Predicted seconds of one step on the fitted machine: ``flops / fit["flops"]`` plus the α–β time
    of each collective, nothing overlapped (gloo). ``collectives``: CommDebugMode's records (each has
    ``op``, ``bytes`` sent per rank and ``group_size``) or ``(op, full buffer bytes)`` pairs on
    ``world`` ranks. A ring op costs its (t-1) or 2(t-1) steps of α plus the bytes it sends times β."""
    steps, sent = _ring_cost(collectives, world)
    comm = steps * fit["alpha"] + sent * fit["beta"]
    compute = flops / fit["flops"]
    return {"compute": compute, "comm": comm, "total": compute + comm}


_TT = "https://github.com/pytorch/torchtitan/blob/main/benchmarks/"
_TT_2412, _TT_ASYNC = _TT + "llama3_h100_202412_torchtitan.md", _TT + "asyncTP_llama3_h100_2025-06_torchtitan.md"
_TORCHAO = "https://docs.pytorch.org/ao/main/workflows/training.html (torchao.float8 README)"
_KORTHIKANTI = "Korthikanti et al. 2022, arXiv:2205.05198, §4 (flash attention: the 5Hs/h term dropped)"


def published_checks(gpu: GPU | None = None) -> list[dict]:
    """Ours beside published figures: rows ``{"what", "ours", "theirs", "ratio", "source"}``, ratio =
    ours / theirs. torchtitan ran H100s capped at 500 W with 96 GB HBM2e (its own footnote: the peak is
    below the SXM figure we use) and torch.compile; "SAC"/"full AC" are its activation checkpointing.
    The memory row is where the model is weakest: a measured peak also holds FSDP's gathered layers,
    NCCL's buffers and the caching allocator's slack, none of which ``memory`` counts (the planner
    leaves a reserve of HBM for them)."""
    gpu = gpu or GPUS["h100"]
    m8, m70 = MODELS["llama3-8b"], MODELS["llama3-70b"]
    rows = []

    def row(what, ours, theirs, source):
        rows.append({"what": what, "ours": ours, "theirs": theirs, "ratio": ours / theirs, "source": source})

    # Activations: this Llama's count (measured to the byte in notebook 04 and tests/test_scale.py)
    # beside the paper's accounting of a GPT layer at the same s, b, h, heads and t. Not the same layer:
    # SwiGLU of width 3.5h saves 4sbF, RMSNorms save input and output, and DTensor keeps the gathered
    # block inputs that Megatron-LM gathers again in backward; the ratio says how far apart the two are.
    for name, s in (("no TP", Setup()), ("TP 8", Setup(tp=8)), ("TP 8 + SP", Setup(tp=8, sp=True))):
        ours = sum(llama_activations(m70, s).values()) / 1e9
        theirs = korthikanti_activations(s.seq, s.batch, m70.dim, m70.heads, s.tp, s.sp, flash=True) / 1e9
        row(f"70B activations/layer, s=8192, {name}: this Llama vs the paper's GPT layer (GB)", ours, theirs,
            _KORTHIKANTI)
    with_scores = korthikanti_activations(8192, 1, m70.dim, m70.heads, 8, True) / 1e9
    row("70B activations/layer, TP 8 + SP: this Llama (flash) vs GPT storing s×s scores (GB)",
        sum(llama_activations(m70, Setup(tp=8, sp=True)).values()) / 1e9, with_scores,
        "Korthikanti et al. 2022, §4 (as published: attention scores stored)")

    def tps(model, **kw):
        return step_time(model, Setup(seq=8192, **kw), gpu)["tokens_per_s_per_gpu"]

    fsdp8 = dict(dp=8, fsdp=True, batch=2)
    row("8B, FSDP 8, batch 2, compile: tokens/s/GPU (theirs with SAC)", tps(m8, **fsdp8), 6667,
        _TT_2412 + " Table 1")
    row("8B, FSDP 8, batch 2, compile, float8: tokens/s/GPU", tps(m8, float8=True, **fsdp8), 8532,
        _TT_2412 + " Table 1")
    row("8B, FSDP 8: float8 speedup (FLOAT8_EFFICIENCY is set from this row)",
        tps(m8, float8=True, **fsdp8) / tps(m8, **fsdp8), 8532 / 6667, _TT_2412 + " Table 1")
    row("8B, 8 GPUs: float8 speedup vs torchao's 'up to 1.25x'",
        tps(m8, float8=True, **fsdp8) / tps(m8, **fsdp8), 1.25, _TORCHAO)
    tp70 = dict(tp=8, sp=True, loss_parallel=True, dp=32, fsdp=True, batch=16, checkpoint=True, float8=True)
    row("70B, FSDP 32 x TP 8, float8, full AC, batch 16: tokens/s/GPU", tps(m70, **tp70), 829, _TT_2412 + " Table 4")
    row("70B, FSDP 32 x TP 8, float8, full AC, batch 16, async TP: tokens/s/GPU",
        tps(m70, **{**tp70, "async_tp": True}), 876, _TT_2412 + " Table 4")
    row("70B, FSDP 32 x TP 8, float8, full AC, batch 16: GB per GPU (theirs: 71.9 GiB)",
        sum(memory(m70, Setup(**tp70)).values()) / 1e9, 71.9 * 2**30 / 1e9, _TT_2412 + " Table 4")
    bf70 = {**tp70, "float8": False}
    row("70B, FSDP 32 x TP 8, bf16: async TP speedup", tps(m70, **bf70, async_tp=True) / tps(m70, **bf70),
        652.4 / 597.3, _TT_ASYNC)
    row("70B, FSDP 32 x TP 8, float8 tensorwise: async TP speedup", tps(m70, **tp70, async_tp=True) / tps(m70, **tp70),
        942.4 / 809.8, _TT_ASYNC)
    row("70B, FSDP 32 x TP 8 + SP, no async: float8 tensorwise speedup", tps(m70, **tp70) / tps(m70, **bf70),
        809.8 / 597.3, _TT_ASYNC)
    return rows

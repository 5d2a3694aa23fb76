"""Plan a training run: which (TP, SP, loss_parallel, float8, async TP, FSDP/DP) layouts fit, and how fast.

    python -m tensorplay_edu.cluster.search --model llama3-70b --gpus 64 --gpu h100 --seq 8192
    python -m tensorplay_edu.cluster.search --model llama3-8b --gpus 8 --batch 2 --top 5

or, from a notebook, ``feasible, refused = plan("llama3-70b", 64, "h100", seq=8192, batch=1)``.

Every number comes from :mod:`tensorplay_edu.cluster` (its docstrings state the conventions): memory
per GPU by component, the predicted step time and tokens/s. The planner tries every TP degree t that
divides the GPU count, and, for t > 1, SP on or off, loss_parallel on or off, async TP (with SP only:
it fuses SP's all-gather and reduce-scatter into the matmuls), float8 on or off, and over the
remaining d = gpus / t ranks plain DP or FSDP, each with and without full activation checkpointing
("ac": a third more compute for far less activation memory). A layout is refused when t does not
divide the heads or KV heads, when t is larger than one node (TP's traffic would cross InfiniBand),
when SP cannot split the sequence, or when it does not fit in HBM less a reserve (``RESERVE``, 10% by
default: the CUDA context, NCCL's buffers and the caching allocator's fragmentation take a few GB that
``scale.memory`` does not count. That is a floor, not a bound: torchtitan's Llama 3 70B run on 256 H100s
(FSDP 32 x TP 8, float8, full activation checkpointing, batch 16) peaks 20 GB above ``scale.memory``'s count;
``published_checks`` shows the row).
"""

from __future__ import annotations

import argparse
import sys

from .memory_use import memory
from .model import GPU, GPUS, MODELS, Model, Setup
from .timing import step_time

__all__ = ["plan", "format_plan", "main"]

_GB = 1e9
RESERVE = 0.10  # fraction of HBM a plan leaves free


def _resolve(model, gpu) -> tuple[Model, GPU]:
    if isinstance(model, str):
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}: pick one of {', '.join(MODELS)}")
        model = MODELS[model]
    if isinstance(gpu, str):
        if gpu not in GPUS:
            raise ValueError(f"unknown gpu {gpu!r}: pick one of {', '.join(GPUS)}")
        gpu = GPUS[gpu]
    return model, gpu


def _layouts(gpus: int, seq: int, batch: int):
    """Every Setup the planner considers, TP degree first."""
    for t in (t for t in range(1, gpus + 1) if gpus % t == 0):
        d = gpus // t
        tp_options = [(False, False, False)] if t == 1 else \
            [(sp, lp, asy) for sp in (False, True) for lp in (False, True) for asy in (False, True) if sp or not asy]
        for sp, lp, asy in tp_options:
            for f8 in (False, True):
                for fsdp in ((False, True) if d > 1 else (False,)):
                    for ac in (False, True):
                        yield Setup(tp=t, sp=sp, loss_parallel=lp, float8=f8, async_tp=asy, dp=d, fsdp=fsdp,
                                    batch=batch, seq=seq, checkpoint=ac)


def _why_not(model: Model, gpu: GPU, s: Setup) -> str | None:
    """The structural reasons a layout cannot run (before memory), or None."""
    why = []
    for name, n in (("heads", model.heads), ("KV heads", model.kv_heads)):
        if n % s.tp:
            why.append(f"{name}={n} do not divide by it (training plans give each rank whole heads)")
    if s.tp > gpu.gpus_per_node:
        why.append(f"larger than a node of {gpu.gpus_per_node} GPUs (TP traffic would cross InfiniBand)")
    if s.sp and s.seq % s.tp:
        why.append(f"SP cannot split seq={s.seq} into {s.tp} equal pieces")
    return f"tp={s.tp}: " + "; ".join(why) if why else None


def plan(model, gpus: int, gpu="h100", seq: int = 8192, batch: int = 1, reserve: float = RESERVE):
    """``(feasible, refused)`` for ``model`` (name or Model) on ``gpus`` GPUs of kind ``gpu``; a layout fits
    when its memory per GPU is at most ``(1 - reserve)`` of the HBM.

    ``feasible``: dicts ``{"setup", "memory" (bytes by component), "total" (bytes), "time"
    (:func:`tensorplay_edu.cluster.step_time`)}``, best first (most tokens/s; then smaller TP; then least memory).
    ``refused``: dicts ``{"setup", "reason", "over" (bytes over the usable HBM, 0 for a structural reason)}``,
    structural reasons first, then out of memory closest to fitting first."""
    model, gpu = _resolve(model, gpu)
    for name, value in (("gpus", gpus), ("seq", seq), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not 0 <= reserve < 1:
        raise ValueError(f"reserve must be a fraction of HBM in [0, 1), got {reserve!r}")
    usable = (1 - reserve) * gpu.hbm_bytes
    if gpus > gpu.gpus_per_node and gpus % gpu.gpus_per_node:
        raise ValueError(f"gpus={gpus} is not a whole number of {gpu.gpus_per_node}-GPU nodes: "
                         f"use a multiple of {gpu.gpus_per_node} (or at most one node)")
    feasible, refused = [], []
    for s in _layouts(gpus, seq, batch):
        reason = _why_not(model, gpu, s)
        if reason:
            refused.append({"setup": s, "reason": reason, "over": 0.0})
            continue
        mem = memory(model, s)
        total = sum(mem.values())
        if total > usable:
            over = total - usable
            refused.append({"setup": s, "over": over, "reason": f"out of memory: {total / _GB:.1f} GB per GPU, "
                            f"{over / _GB:.1f} GB over the {usable / _GB:.0f} GB usable "
                            f"({1 - reserve:.0%} of {gpu.hbm_bytes / _GB:.0f} GB HBM)"})
            continue
        feasible.append({"setup": s, "memory": mem, "total": total, "time": step_time(model, s, gpu)})
    # ties (async hiding all TP traffic, loss_parallel changing memory only): the smaller TP degree, then
    # the fewer bytes
    feasible.sort(key=lambda r: (-round(r["time"]["tokens_per_s"], 3), r["setup"].tp, r["total"]))
    refused.sort(key=lambda r: (r["over"] > 0, r["over"], r["setup"].tp))
    return feasible, refused


def _name(s: Setup) -> str:
    parts = [f"tp={s.tp}"] + [n for n, on in (("sp", s.sp), ("loss_parallel", s.loss_parallel),
                                              ("async", s.async_tp), ("float8", s.float8),
                                              ("ac", s.checkpoint)) if on]
    parts.append(f"{'fsdp' if s.fsdp else 'dp'}={s.dp}")
    return " ".join(parts)


def format_plan(model, gpus: int, gpu="h100", seq: int = 8192, batch: int = 1, top: int = 10,
                reserve: float = RESERVE) -> str:
    """The planner's report as text (what the command line prints)."""
    model, gpu = _resolve(model, gpu)
    feasible, refused = plan(model, gpus, gpu, seq, batch, reserve)
    n = len(feasible) + len(refused)
    lines = [f"{model.name} ({model.params() / 1e9:.1f}B) on {gpus} x {gpu.name} ({gpu.hbm_bytes / _GB:.0f} GB, "
             f"{1 - reserve:.0%} usable), seq {seq}, batch {batch} per data-parallel rank: {len(feasible)} of {n} "
             "layouts fit",
             "memory per GPU in GB; times per step in s; ac = full activation checkpointing", ""]
    if feasible:
        head = (f"{'#':>3} {'layout':<46}{'weights':>8}{'grads':>7}{'optim':>7}{'activ':>7}{'logits':>7}"
                f"{'total':>7}  {'compute':>8}{'tp comm':>8}{'dp comm':>8}{'exposed':>8}{'step':>7}{'tok/s/GPU':>10}")
        lines += [head, "-" * len(head)]
        for i, r in enumerate(feasible[:top], 1):
            m, t = r["memory"], r["time"]
            lines.append(f"{i:>3} {_name(r['setup']):<46}" + "".join(
                f"{m[k] / _GB:>{w}.1f}" for k, w in (("weights", 8), ("gradients", 7), ("optimizer", 7),
                                                     ("activations", 7), ("logits", 7)))
                + f"{r['total'] / _GB:>7.1f}  {t['compute']:>8.2f}{t['tp_comm']:>8.2f}{t['dp_comm']:>8.2f}{t['exposed']:>8.2f}"
                  f"{t['total']:>7.2f}{t['tokens_per_s_per_gpu']:>10,.0f}")
        if len(feasible) > top:
            lines.append(f"    ... and {len(feasible) - top} more that fit (--top to see them)")
    else:
        lines.append("nothing fits: add GPUs, shorten --seq or lower --batch")
    if refused:
        lines += ["", "refused:"]
        by_reason: dict[str, list[Setup]] = {}
        for r in refused:  # structural reasons: one line per TP degree; memory: one line per layout
            key = r["reason"] if r["over"] == 0 else f"{_name(r['setup'])}: {r['reason']}"
            by_reason.setdefault(key, []).append(r["setup"])
        items = list(by_reason.items())
        for reason, setups in items[:top]:
            lines.append(f"  {reason}" + (f" ({len(setups)} layouts)" if len(setups) > 1 else ""))
        if len(items) > top:
            lines.append(f"  ... and {len(items) - top} more (--top to see them)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensorplay_edu.cluster.search", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3-70b", help=f"one of: {', '.join(MODELS)}")
    parser.add_argument("--gpus", type=int, default=64, help="GPUs in the job (a whole number of nodes)")
    parser.add_argument("--gpu", default="h100", help=f"one of: {', '.join(GPUS)}")
    parser.add_argument("--seq", type=int, default=8192, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences per data-parallel rank")
    parser.add_argument("--top", type=int, default=10, help="how many layouts (and refusals) to print")
    parser.add_argument("--reserve", type=float, default=RESERVE,
                        help="fraction of HBM left free for the CUDA context, NCCL and fragmentation (default 0.1)")
    args = parser.parse_args(argv)
    if args.model not in MODELS:
        parser.error(f"argument --model: unknown model {args.model!r}; known models: {', '.join(MODELS)}")
    if args.gpu not in GPUS:
        parser.error(f"argument --gpu: unknown gpu {args.gpu!r}; known: {', '.join(GPUS)}")
    for name in ("gpus", "seq", "batch", "top"):
        if getattr(args, name) <= 0:
            parser.error(f"argument --{name}: must be a positive integer, got {getattr(args, name)}")
    node = GPUS[args.gpu].gpus_per_node
    if args.gpus > node and args.gpus % node:
        parser.error(f"argument --gpus: {args.gpus} is not a whole number of {node}-GPU nodes; "
                     f"use a multiple of {node} (e.g. {args.gpus // node * node or node}) or at most {node}")
    if not 0 <= args.reserve < 1:
        parser.error(f"argument --reserve: a fraction of HBM in [0, 1), got {args.reserve}")
    print(format_plan(args.model, args.gpus, args.gpu, args.seq, args.batch, args.top, args.reserve))
    return 0


if __name__ == "__main__":
    sys.exit(main())

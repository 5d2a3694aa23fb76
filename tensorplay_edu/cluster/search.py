"""Plan a training run: which layouts fit a global batch on a cluster, how fast they run, how sure the model is.

    python -m tensorplay_edu.cluster.search --model llama3-70b --gpus 64 --gpu h100 --seq 8192
    python -m tensorplay_edu.cluster.search --model llama3-8b --gpus 8 --global-batch 16 --float8 none --json

or, from a notebook, ``feasible, refused = plan("llama3-70b", 64, "h100", seq=8192, global_batch=64)``.

Every layout runs the same global batch (sequences per optimizer step) on all the GPUs, so their step times compare
like for like. For each TP degree t (dividing the heads, inside a node) the d = gpus / t data-parallel replicas
share the batch; each runs it as micro-batches (gradient accumulation), the fastest that fits. The planner tries
SP, loss_parallel (this package's, or PyTorch's with ``loss="pytorch"``) and async TP (with SP), every float8 recipe
(tensorwise with FSDP gathers its weights in float8, as torchao recommends; ``float8=()``: none), plain DP or FSDP,
and no, selective or full activation checkpointing. It refuses what cannot run or does not fit in HBM less
``RESERVE`` (the CUDA context and NCCL's buffers, outside the allocator peaks the memory model is checked
against). Two honesty rules come from ``published.error_bands``:

* **risky**: a layout whose memory estimate, divided by the model's lowest memory ratio on published
  peaks (it under-counts by up to that), would not fit. Risky layouts rank after every safe one.
* **tie**: a safe layout within the model's ``time`` error (its largest miss on the tokens/s of a published
  run it was not fitted to) of the best step: the model cannot order them. (The ``ranking`` band is closer,
  but no published pair differs in TP degree or checkpointing.) The report names the tie with the smallest
  TP degree, the one with the fewest collectives on the critical path.

When no layout fits, the planner names what the job needs beyond TP and data parallelism (pipeline or context
parallelism): outside this model, as are HSDP, ZeRO-1/2 and CPU offload.
"""

from __future__ import annotations

import argparse
import json
import sys

from .memory_use import memory
from .model import FLOAT8_RECIPES, GPU, GPUS, LOSS_IMPLS, MODELS, Model, Setup
from .published import error_bands
from .timing import step_time

__all__ = ["plan", "needs", "format_plan", "plan_json", "main", "RESERVE"]

_GIB = 2 ** 30
RESERVE = 0.05  # fraction of HBM a plan leaves free


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


def _layouts(gpus: int, seq: int, float8=FLOAT8_RECIPES, loss: str = "tensorplay_edu"):
    """Every layout the planner considers (micro-batching aside), TP degree first."""
    for t in (t for t in range(1, gpus + 1) if gpus % t == 0):
        d = gpus // t
        tp_options = [(False, False, False)] if t == 1 else \
            [(sp, lp, asy) for sp in (False, True) for lp in (False, True) for asy in (False, True) if sp or not asy]
        for sp, lp, asy in tp_options:
            for f8 in (None, *float8):
                for fsdp in ((False, True) if d > 1 else (False,)):
                    for ac in ("none", "selective", "full"):
                        yield Setup(tp=t, sp=sp, loss_parallel=lp, float8=f8, async_tp=asy, dp=d, fsdp=fsdp,
                                    fsdp_float8_gather=fsdp and f8 == "tensorwise", seq=seq, ac=ac, loss=loss)


def _why_not(model: Model, gpu: GPU, s: Setup, global_batch: int) -> str | None:
    """The structural reasons a layout cannot run (before memory), or None."""
    why = []
    for name, n in (("heads", model.heads), ("KV heads", model.kv_heads)):
        if n % s.tp:
            why.append(f"{name}={n} do not divide by it (training plans give each rank whole heads)")
    if s.tp > gpu.gpus_per_node:
        why.append(f"larger than a node of {gpu.gpus_per_node} GPUs (TP traffic would cross InfiniBand)")
    if s.sp and s.seq % s.tp:
        why.append(f"SP cannot split seq={s.seq} into {s.tp} equal pieces")
    if why:
        return f"tp={s.tp}: " + "; ".join(why)
    if global_batch % s.dp:
        return (f"tp={s.tp}: the global batch of {global_batch} sequences does not split evenly over its "
                f"{s.dp} data-parallel replicas" + (" (fewer sequences than replicas)" if global_batch < s.dp else ""))
    return None


def plan(model, gpus: int, gpu="h100", seq: int = 8192, global_batch: int | None = None, reserve: float = RESERVE,
         float8=FLOAT8_RECIPES, loss: str = "tensorplay_edu"):
    """``(feasible, refused)`` for ``model`` (name or Model) on ``gpus`` GPUs of kind ``gpu``, a global batch of
    ``global_batch`` sequences of ``seq`` tokens (default: one per GPU), float8 recipes ``float8`` (``()``: none),
    whose ``loss_parallel`` (``Setup.loss``).

    ``feasible``: dicts ``{"setup", "memory" (bytes by component), "total" (bytes), "time" (:func:`step_time`),
    "risky", "tie_with_best"}``, safe ones first, fastest first; each setup carries the micro-batch (``batch``)
    and ``micro_batches`` chosen: the fastest safe one, else the fastest that fits. ``refused``: dicts
    ``{"setup", "reason", "over" (bytes over the usable HBM at one sequence per micro-batch; 0 for a structural
    reason)}``, out of memory first, closest to fitting first."""
    model, gpu = _resolve(model, gpu)
    global_batch = gpus if global_batch is None else global_batch
    for name, value in (("gpus", gpus), ("seq", seq), ("global_batch", global_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not 0 <= reserve < 1:
        raise ValueError(f"reserve must be a fraction of HBM in [0, 1), got {reserve!r}")
    if gpus > gpu.gpus_per_node and gpus % gpu.gpus_per_node:
        raise ValueError(f"gpus={gpus} is not a whole number of {gpu.gpus_per_node}-GPU nodes: "
                         f"use a multiple of {gpu.gpus_per_node} (or at most one node)")
    usable, bands = (1 - reserve) * gpu.hbm_bytes, error_bands()
    under = bands["memory"][0]
    feasible, refused = [], []
    for base in _layouts(gpus, seq, (float8,) if isinstance(float8, str) else tuple(float8), loss):  # Setup checks
        reason = _why_not(model, gpu, base, global_batch)
        if reason:
            refused.append({"setup": base, "reason": reason, "over": 0.0})
            continue
        per_replica, options = global_batch // base.dp, []
        for b in (b for b in range(1, per_replica + 1) if per_replica % b == 0):
            s = Setup(**{**base.__dict__, "batch": b, "micro_batches": per_replica // b})
            mem = memory(model, s)
            total = sum(mem.values())
            if total > usable:
                if b == 1:
                    refused.append({"setup": s, "over": total - usable, "reason":
                                    f"out of memory even at one sequence per micro-batch: {total / _GIB:.1f} GiB "
                                    f"per GPU, {(total - usable) / _GIB:.1f} GiB over the {usable / _GIB:.1f} GiB "
                                    f"usable ({1 - reserve:.0%} of {gpu.hbm_bytes / _GIB:.1f} GiB)"})
                break  # a larger micro-batch needs more
            options.append({"setup": s, "memory": mem, "total": total, "time": step_time(model, s, gpu),
                            "risky": total / under > usable})
        if options:
            feasible.append(min(options, key=lambda r: (r["risky"], r["time"]["total"])))
    safe = [r["time"]["total"] for r in feasible if not r["risky"]]
    best = min(safe or [r["time"]["total"] for r in feasible] or [0.0])
    tolerance = max(bands["time"][1] - 1, 1 - bands["time"][0])
    for r in feasible:
        r["tie_with_best"] = not r["risky"] and r["time"]["total"] <= best * (1 + tolerance)
    feasible.sort(key=lambda r: (r["risky"], r["time"]["total"], r["total"]))
    refused.sort(key=lambda r: (r["over"] == 0, r["over"], r["setup"].tp))
    return feasible, refused


def needs(model, gpus: int, gpu="h100", seq: int = 8192, global_batch: int | None = None,
          reserve: float = RESERVE) -> str | None:
    """What a job needs beyond this model's TP and data parallelism when no layout fits, by name, or None."""
    feasible, refused = plan(model, gpus, gpu, seq, global_batch, reserve)
    return None if feasible else _beyond(refused, *_resolve(model, gpu), seq, global_batch or gpus, reserve)


def _beyond(refused: list[dict], model: Model, gpu: GPU, seq: int, global_batch: int, reserve: float) -> str:
    """:func:`needs`, from the refusals of a plan where nothing fits."""
    memory_refusals = [r for r in refused if r["over"] > 0]
    if not memory_refusals:
        return (f"pipeline parallelism: a global batch of {global_batch} sequences cannot be shared by the data-parallel "
                f"replicas of any TP degree up to a node ({gpu.gpus_per_node}); pipeline stages need fewer replicas "
                "(or raise --global-batch). Outside this model")
    closest = memory_refusals[0]["setup"]
    state = sum(v for k, v in memory(model, closest).items() if k in ("weights", "gradients", "optimizer", "working"))
    if state > (1 - reserve) * gpu.hbm_bytes:
        where = f"tp={closest.tp}" + (f" with FSDP over {closest.dp}" if closest.fsdp else "")
        return (f"pipeline parallelism: at {where}, the weights, gradients, optimizer state and their buffers "
                f"alone take {state / _GIB:.1f} GiB per GPU. Outside this model")
    return (f"context parallelism (or pipeline parallelism): one sequence of {seq} tokens per micro-batch does not "
            f"fit even with full activation checkpointing at tp={closest.tp}. Outside this model")


def _name(s: Setup) -> str:
    parts = [f"tp={s.tp}"] + [n for n, on in (("sp", s.sp), ("loss_parallel", s.loss_parallel),
                                              ("async", s.async_tp)) if on]
    parts += [f"float8={s.float8}"] if s.float8 else []
    parts += [f"ac={s.ac}"] if s.ac != "none" else []
    parts.append(f"{'fsdp' if s.fsdp else 'dp'}={s.dp}")
    return " ".join(parts)


def _layout_fields(s: Setup) -> dict:
    return {"tp": s.tp, "dp": s.dp, "fsdp": s.fsdp, "ac": s.ac, "sp": s.sp, "loss_parallel": s.loss_parallel,
            "async_tp": s.async_tp, "float8": s.float8, "fsdp_float8_gather": s.fsdp_float8_gather, "loss": s.loss}


def _setup_of(row: dict) -> Setup:
    """The layout of a row of :func:`plan_json` (or of a refusal's ``layout``)."""
    return Setup(**{k: row[k] for k in _layout_fields(Setup())})


def plan_json(model, gpus: int, gpu="h100", seq: int = 8192, global_batch: int | None = None,
              reserve: float = RESERVE, **options) -> dict:
    """The plan as plain data (what ``--json`` prints): ``{"layouts": [...], "refused": [...], ...}``;
    ``options``: :func:`plan`'s ``float8`` and ``loss``."""
    feasible, refused = plan(model, gpus, gpu, seq, global_batch, reserve, **options)
    model, gpu = _resolve(model, gpu)
    global_batch = gpus if global_batch is None else global_batch
    layouts = [{**_layout_fields(r["setup"]), "micro_batch": r["setup"].batch,
                "micro_batches": r["setup"].micro_batches, "memory_gib": r["total"] / _GIB,
                "memory_parts_gib": {k: v / _GIB for k, v in r["memory"].items()}, "step_s": r["time"]["total"],
                "tokens_per_s_per_gpu": r["time"]["tokens_per_s_per_gpu"], "mfu": r["time"]["mfu"],
                "tie_with_best": r["tie_with_best"], "risky": r["risky"]} for r in feasible]
    return {"model": model.name, "gpus": gpus, "gpu": gpu.name, "seq": seq, "global_batch": global_batch,
            "usable_gib": (1 - reserve) * gpu.hbm_bytes / _GIB, "error_bands": error_bands(),
            "needs": None if feasible else _beyond(refused, model, gpu, seq, global_batch, reserve),
            "layouts": layouts,
            "refused": [{"layout": _layout_fields(r["setup"]), "reason": r["reason"]} for r in refused]}


def format_plan(model, gpus: int, gpu="h100", seq: int = 8192, global_batch: int | None = None, top: int = 10,
                reserve: float = RESERVE, **options) -> str:
    """The planner's report as text (what the command line prints)."""
    data = plan_json(model, gpus, gpu, seq, global_batch, reserve, **options)
    feasible, refused, bands = data["layouts"], data["refused"], data["error_bands"]
    lines = [f"{data['model']} on {gpus} x {data['gpu']}, {data['usable_gib']:.1f} GiB usable per GPU, "
             f"global batch {data['global_batch']} x {seq} tokens: {len(feasible)} layouts fit, {len(refused)} refused",
             f"model error on published runs (ours / theirs): tokens/s {bands['time'][0]:.2f}-{bands['time'][1]:.2f}, "
             f"one layout over another {bands['ranking'][0]:.2f}-{bands['ranking'][1]:.2f}, peak memory "
             f"{bands['memory'][0]:.2f}-{bands['memory'][1]:.2f}",
             "tie = within the tokens/s error of the best step (the model cannot order them); risky = fits only if "
             "the memory estimate is not low",
             "micro = sequences per micro-batch x micro-batches; GiB per GPU: state = weights + gradients + optimizer, "
             "work = FSDP's gathered and reduce buffers, activ = saved activations + one block's gradients; "
             "MFU = torchtitan's FLOP count over the bf16 peak (float8 rows too)", ""]
    if feasible:
        names = [_name(_setup_of(r)) for r in feasible[:top]]
        w = max(len(n) for n in names) + 2
        head = (f"{'#':>3} {'layout':<{w}}{'micro':>7}{'state':>7}{'work':>6}{'activ':>7}{'logits':>7}{'GiB':>7}"
                f"{'step s':>8}{'tok/s/GPU':>10}{'MFU':>6}  note")
        lines += [head, "-" * len(head)]
        for i, (r, name) in enumerate(zip(feasible, names), 1):
            m = r["memory_parts_gib"]
            state = m["weights"] + m["gradients"] + m["optimizer"]
            note = ", ".join(n for n, on in (("tie", r["tie_with_best"]), ("risky", r["risky"])) if on)
            lines.append(f"{i:>3} {name:<{w}}"
                         f"{r['micro_batch']:>4}x{r['micro_batches']:<2}{state:>7.1f}{m['working']:>6.1f}"
                         f"{m['activations'] + m['backward']:>7.1f}{m['logits']:>7.1f}{r['memory_gib']:>7.1f}"
                         f"{r['step_s']:>8.2f}{r['tokens_per_s_per_gpu']:>10,.0f}{r['mfu']:>6.0%}  {note}")
        if len(feasible) > top:
            lines.append(f"    ... and {len(feasible) - top} more that fit (--top to see them)")
        ties = [r for r in feasible if r["tie_with_best"]]
        if ties:
            simplest = min(ties, key=lambda r: r["tp"])  # the first, so the fastest, of the smallest TP degree
            lines.append(f"{len(ties)} tie with the best; the one with the smallest TP degree "
                         f"(#{feasible.index(simplest) + 1}): {_name(_setup_of(simplest))}")
    else:
        lines.append(f"nothing fits: this job needs {data['needs']}")
    memory = [r for r in refused if "out of memory" in r["reason"]]
    if memory:  # one line per layout, closest to fitting first
        lines += ["", f"refused, out of memory ({len(memory)}):"]
        lines += [f"  {_name(_setup_of(r['layout']))}: {r['reason']}" for r in memory[:top]]
        if len(memory) > top:
            lines.append(f"  ... and {len(memory) - top} more (--top to see them)")
    structural: dict[str, int] = {}
    for r in refused:  # one line per reason (a TP degree's), however many layouts it covers
        if "out of memory" not in r["reason"]:
            structural[r["reason"]] = structural.get(r["reason"], 0) + 1
    if structural:
        lines += ["", "refused, cannot run:"]
        lines += [f"  {reason}" + (f" ({n} layouts)" if n > 1 else "") for reason, n in structural.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tensorplay_edu.cluster.search",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3-70b", help=f"one of: {', '.join(MODELS)}")
    parser.add_argument("--gpus", type=int, default=64, help="GPUs in the job (a whole number of nodes)")
    parser.add_argument("--gpu", default="h100", help=f"one of: {', '.join(GPUS)}")
    parser.add_argument("--seq", type=int, default=8192, help="tokens per sequence")
    parser.add_argument("--global-batch", type=int, default=None,
                        help="sequences per optimizer step (default: one per GPU)")
    parser.add_argument("--top", type=int, default=10, help="how many layouts (and refusals) to print")
    parser.add_argument("--reserve", type=float, default=RESERVE,
                        help=f"fraction of HBM left free for the CUDA context and NCCL (default {RESERVE})")
    parser.add_argument("--float8", choices=("all", "none", *FLOAT8_RECIPES), default="all",
                        help="float8 recipes to try (default: all)")
    parser.add_argument("--loss", choices=LOSS_IMPLS, default=LOSS_IMPLS[0], help="whose loss_parallel is priced")
    parser.add_argument("--json", action="store_true", help="print the whole plan as JSON")
    args = parser.parse_args(argv)
    options = {"float8": {"all": FLOAT8_RECIPES, "none": ()}.get(args.float8, args.float8), "loss": args.loss}
    if args.model not in MODELS:
        parser.error(f"argument --model: unknown model {args.model!r}; known models: {', '.join(MODELS)}")
    if args.gpu not in GPUS:
        parser.error(f"argument --gpu: unknown gpu {args.gpu!r}; known: {', '.join(GPUS)}")
    for name in ("gpus", "seq", "top", "global_batch"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"argument --{name.replace('_', '-')}: must be a positive integer, got {value}")
    node = GPUS[args.gpu].gpus_per_node
    if args.gpus > node and args.gpus % node:
        parser.error(f"argument --gpus: {args.gpus} is not a whole number of {node}-GPU nodes; "
                     f"use a multiple of {node} (e.g. {args.gpus // node * node or node}) or at most {node}")
    if not 0 <= args.reserve < 1:
        parser.error(f"argument --reserve: a fraction of HBM in [0, 1), got {args.reserve}")
    job = (args.model, args.gpus, args.gpu, args.seq, args.global_batch)
    print(json.dumps(plan_json(*job, args.reserve, **options), indent=1) if args.json
          else format_plan(*job, args.top, args.reserve, **options))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make gpu-check`'s GPU-sized lines: what a step costs (MEASURED) and whether it is right (PASS / FAIL).

    torchrun --standalone --nproc-per-node 8 benchmarks/gpu_run.py benchmarks/gpu_measure.py --check d
    torchrun --standalone --nproc-per-node 8 benchmarks/gpu_run.py benchmarks/gpu_measure.py --check e

The model is gpu_model.py's (``--config gpu``: Llama-3-8B's block at 4 layers, 8192 tokens, bf16, full plan).

``--check d``, one MEASURED line each (a measurement has no threshold: nothing here can PASS): ``d1`` ours,
``d2`` ours with float8, ``d3`` ours with async TP, ``d4`` PyTorch's own TP, ``d5`` the hand-written floor.
Ours puts the norms' partial gradients in one bucket, as ``make bench`` and the floor do, so that d1 and d5
are like for like. Each gives tokens/s (b·s tokens per step over the median step of the slowest rank), the
MFU (:func:`model_flops` per GPU over the step time and the GPU's bf16 peak) and the peak memory allocated
per GPU during the steps (the largest over the ranks).

``--check e``: the losses of ``MATCH_STEPS`` AdamW steps, compared with a stated absolute tolerance
(``TOLERANCE``), every loss finite (a NaN FAILs, naming its step): ``e1`` ours against PyTorch's TP in bf16,
``e2`` float8 TP against the same float8 model on one GPU (rank 0's; SKIP on a GPU too small for it) AND
against e1's bf16 losses within ``FLOAT8_VS_BF16``, its loss falling (a float8 bug shared by both float8
sides shows there), ``e3`` async TP against synchronous TP.

Every line names the backend and the device it ran on. ``--config tiny`` is the CPU dry run's model
(seconds on gloo ranks); ``--skip-float8 WHY`` prints d2 and e2 as SKIP (old GPUs).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpu_model import CONFIGS, model_flops, peak_flops, too_small, trainer  # noqa: E402  (benchmarks/gpu_model.py)
from probes import timed_steps  # noqa: E402
from tensorplay_edu.launcher.torchrun import current_device, run_from_env  # noqa: E402

MATCH_STEPS = 5
# |loss - reference loss|, absolute, on a mean cross-entropy near ln(128256) = 11.8 at the start. Both sides
# round every matmul output to bf16 (unit roundoff 2^-8 = 3.9e-3) but sum in another order (shards, rings),
# so a logit may differ by a few bf16 roundings while the mean over b·s tokens differs far less; 2e-2 leaves
# room for AdamW's first steps amplifying sign flips of near-zero gradients. float8 rounds each operand to
# 3 mantissa bits (e4m3): one bf16 difference upstream can move an element by a whole float8 step, hence 5e-2.
TOLERANCE = {"e1": 2e-2, "e2": 5e-2, "e3": 2e-2}
# e2's second comparison: float8 TP against e1's bf16 losses (ours). A float8 model is numerically another model
# (each matmul operand rounded to e4m3, relative step 2^-3), so its losses drift from bf16's by more than rounding
# noise; 0.1 per step (under 1% of a loss near 11.8) still catches a float8 matmul that is wrong on this GPU for
# both sides of the first comparison (a bad scale moves the loss by far more, or to NaN), which e2's first
# comparison, float8 against the same float8 code, cannot see. With it, the float8 loss must fall over the steps.
FLOAT8_VS_BF16 = 0.1
MEASURE = {"d1": ("bf16", "ours"), "d2": ("float8", "ours float8"), "d3": ("bf16", "ours async"),
           "d4": ("bf16", "torch"), "d5": ("bf16", "hand")}
NAMES = {"ours": "ours (tensorplay_edu)", "torch": "PyTorch's TP (torch.distributed.tensor.parallel)",
         "hand": "hand-written floor (tensorplay_edu/models/by_hand.py)", "ours float8": "ours float8 (float8 styles)",
         "ours async": "ours async TP (rings)", "single float8": "float8 model on one GPU"}
MATCH = {"e1": ("ours", "torch", "bf16 losses, ours vs PyTorch's TP"),
         "e2": ("ours float8", "single float8", "float8 losses, float8 TP vs the float8 model on one GPU"),
         "e3": ("ours async", "ours", "bf16 losses, async TP vs synchronous TP")}


def _value(loss: torch.Tensor) -> float:
    full = getattr(loss, "full_tensor", None)  # ours and PyTorch's DTensor: a replicated scalar
    return float((full() if full is not None else loss).float().item())


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def where(device: torch.device) -> str:
    return f"on {dist.get_world_size()} {device.type} rank(s) ({dist.get_backend_config()})"


def measure(kind: str, c: dict, device: torch.device, steps: int, warmup: int) -> dict:
    """Median step seconds of the slowest rank, and the peak memory allocated on any rank's GPU."""
    step = trainer(kind, c, device)
    step()  # first step: lazy allocations, NCCL communicators, cuBLAS handles
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    times = timed_steps(step, warmup, steps, device)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (times, peak))  # plain torch.distributed: the report's bookkeeping
    slowest = [max(ts[i] for ts, _ in everyone) for i in range(steps)]
    del step
    _free(device)
    return {"step_s": statistics.median(slowest),
            "peak": None if peak is None else max(p for _, p in everyone)}


def measured_line(check: str, c: dict, res: dict, device: torch.device) -> str:
    precision, kind = MEASURE[check]
    tokens = c["batch"] * c["seq"]
    flops = model_flops(c) / dist.get_world_size()  # per GPU
    peak, of = peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else (None, "peak unknown: cpu")
    mfu = (f"MFU {100 * flops / res['step_s'] / peak:.1f}% {of}" if peak
           else f"MFU n/a ({of}; {flops / res['step_s'] / 1e12:.3g} TFLOP/s per rank)")
    memory = (f"peak memory {res['peak'] / 2**30:.1f} GiB per GPU (the largest rank)" if res["peak"] is not None
              else f"peak memory n/a ({device.type})")
    bucket = ", norm gradients in one bucket as make bench" if kind.startswith("ours") else ""
    return (f"MEASURED {check}. {precision} step, full plan{bucket}, {NAMES[kind]} {where(device)}: "
            f"{tokens / res['step_s']:,.0f} tokens/s, {1000 * res['step_s']:.1f} ms/step, {mfu}, {memory}")


def losses(kind: str, c: dict, device: torch.device, steps: int) -> list[float]:
    step = trainer(kind, c, device)
    out = [_value(step()) for _ in range(steps)]
    del step
    _free(device)
    return out



def _not_finite(values: list[float]) -> int | None:
    return next((i for i, v in enumerate(values) if not math.isfinite(v)), None)


def match_line(check: str, c: dict, device: torch.device, steps: int, cache: dict) -> str:
    """PASS / FAIL: ``check``'s losses against its reference's, every loss finite. ``cache`` keeps each
    variant's losses (e1's "ours" is e3's reference and e2's bf16 comparison)."""
    kind, ref_kind, what = MATCH[check]
    if check == "e2" and (why := too_small(c, device)):
        return f"SKIP {check}. {what} ({why})"

    def run(k: str) -> list[float]:
        if k not in cache:
            cache[k] = losses(k, c, device, steps)
        return cache[k]

    mine = run(kind)
    if ref_kind == "single float8":  # rank 0's GPU trains the whole model; the others wait
        ref = losses(ref_kind, c, device, steps) if dist.get_rank() == 0 else None
        dist.barrier()
        box = [ref]
        dist.broadcast_object_list(box, src=0)
        ref = box[0]
    else:
        ref = run(ref_kind)
    columns = [(kind, mine), (ref_kind, ref)] + ([("ours bf16", run("ours"))] if check == "e2" else [])
    if dist.get_rank() == 0:
        for i in range(steps):
            print(f"  {check} step {i}: " + ", ".join(f"{k} {v[i]:.6f}" for k, v in columns))
    head = f"{check}. {what}, {steps} AdamW steps {where(device)}"
    for k, v in columns:
        if (bad := _not_finite(v)) is not None:
            return f"FAIL {head}: {k}'s loss at step {bad} is {v[bad]} (every loss must be finite)"
    worst = max(abs(a - b) for a, b in zip(mine, ref))
    ok = worst <= TOLERANCE[check]
    verdict = (f"worst |loss difference| {worst:.1e} {'within' if ok else 'ABOVE'} the tolerance "
               f"{TOLERANCE[check]:.0e}")
    if check == "e2":
        bf16 = columns[2][1]
        drift = max(abs(a - b) for a, b in zip(mine, bf16))
        falls = mine[-1] < mine[0]
        ok = ok and drift <= FLOAT8_VS_BF16 and falls
        verdict += (f"; against ours in bf16 (e1's) {drift:.1e} {'within' if drift <= FLOAT8_VS_BF16 else 'ABOVE'} "
                    f"{FLOAT8_VS_BF16:g} (float8 is another rounding); the loss "
                    f"{'falls' if falls else 'does NOT fall'}")
    return f"{'PASS' if ok else 'FAIL'} {head}: {verdict} (losses {mine[0]:.4f} -> {mine[-1]:.4f})"


def main(args) -> None:
    device, c = current_device(), CONFIGS[args.config]
    rank0 = dist.get_rank() == 0
    if rank0:
        print(f"gpu_measure: config {args.config} {c}, bf16, full plan; {model_flops(c):.3g} FLOP per step",
              flush=True)
    checks = {"d": list(MEASURE), "e": list(MATCH), "all": [*MEASURE, *MATCH]}[args.check]
    failed, cache = False, {}
    for check in checks:
        if args.skip_float8 and check in ("d2", "e2"):
            line = f"SKIP {check}. float8 ({args.skip_float8})"
        elif check in MEASURE:
            line = measured_line(check, c, measure(MEASURE[check][1], c, device, args.steps, args.warmup), device)
        else:
            line = match_line(check, c, device, args.match_steps, cache)
        failed |= line.startswith("FAIL")
        if rank0:
            print(line, flush=True)
    if failed:
        raise SystemExit(1)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", choices=["d", "e", "all"], default="all")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="gpu")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per measurement (after --warmup)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--match-steps", type=int, default=MATCH_STEPS)
    parser.add_argument("--skip-float8", default="", metavar="WHY", help="print d2 and e2 as SKIP (WHY)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    run_from_env(main, parse())

"""`make bench`: one training step of the small Llama (forward, loss, backward, AdamW) by one process, by
tensorplay_edu, by the hand-written floor (tensorplay_edu/models/by_hand.py) and by PyTorch's own
`torch.distributed.tensor.parallel`, with the same model, plan and inputs.

    python benchmarks/bench.py            # small and medium configs, 2 and 4 ranks, both plans
    python benchmarks/bench.py --quick    # small config only, fewer steps (under 2 minutes); writes to a temp folder
    python benchmarks/bench.py --async-only --config medium    # only the async rows, printed
    torchrun --nproc-per-node 2 benchmarks/bench.py --torchrun --impl ours    # one variant on GPUs (NCCL)

Per (config, plan, ranks): the median step time of the slowest rank, the collectives and bytes of one step,
the bytes saved for backward and the peak RSS per rank. Beside them: ours with the float8 model and styles,
ours with async TP (and the same pair with each rank's compute thread pinned to one core, leaving gloo's
threads the other), loss_parallel against gathered logits, the loss alone, and ours against the floor taking
turns in the same ranks (overhead.py). The variants run interleaved, round by round, so a slow spell of the
machine hits all of them.

Writes results.md and results.png into benchmarks/ for a full run (the committed record), into a fresh
temporary folder for --quick, or into --out DIR.

This file chooses what runs and in which order; runners.py is what a launched rank runs, configs.py the
models, probes.py what is measured besides time; report.py and report_*.py write the tables.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from tensorplay_edu import launch
from tensorplay_edu.launcher.torchrun import current_device, run_from_env

from configs import CONFIGS
from overhead import compare
from probes import _cores, activation_formula
from report import render
from report_async import async_section
from runners import rank_bench, rank_loss_bench

HERE = os.path.dirname(os.path.abspath(__file__))


def variants(quick: bool):
    for config in (["small"] if quick else ["small", "medium"]):
        for world in (2, 4):
            for plan in ("vanilla", "full"):
                yield config, plan, world


# Each launched variant: (row label, impl passed to rank_bench, float8).  "ours float8" is the
# float32 model converted to float8; its rows sit in a table of their own (report_float8.py).
IMPLS = (("ours", "ours", False), ("hand", "hand", False), ("torch", "torch", False), ("ours float8", "ours", True))
SMALL_ROUNDS = 6  # interleaved rounds of the small config (the medium one runs the first `repeats` of them)
PAIRED_STEPS = {"small": 160, "medium": 6}  # the floor table's turns of ours and of the floor, in one launch: a 95 %
# interval of the median ratio needs 6 at least, and 160 keep it a few percent wide on the small config
SINGLES = (("single", False), ("single float8", True))
# Async rows (full plan, async_configs()): row label -> (async TP on, main thread pinned).  "ours" (in IMPLS)
# is their synchronous reference; the pinned pair runs on 2 ranks only (2 cores here: one for compute).
ASYNC = {"ours async": (True, False), "ours pinned": (False, True), "ours async pinned": (True, True)}
SYNC_OF = {"ours async": "ours", "ours async pinned": "ours pinned"}


def async_configs(quick: bool) -> list[str]:
    return ["small"] if quick else ["medium"]


def async_variants(plan: str, world: int) -> list[str]:
    """The async-section labels launched next to ours (full plan): pinned ones on 2 ranks, with a core to spare."""
    if plan != "full":
        return []
    return [lab for lab, (_, pin) in ASYNC.items() if not pin or (world == 2 and _cores() >= 2)]


def run(args) -> list[dict]:
    rows = {}
    steps, warmup, repeats = (3, 1, 2) if args.quick else (5, 1, 3)
    singles = {}
    only = getattr(args, "async_only", False)
    chosen = [args.config] if only else async_configs(args.quick)
    todo = [(c, "full", w) for c in chosen for w in (2, 4)] if only else list(variants(args.quick))
    rounds = repeats if only or args.quick else max(repeats, SMALL_ROUNDS)
    for rep in range(rounds):
        for config, plan, world in todo:
            if config != "small" and rep >= repeats:
                continue
            n = steps if config == "small" else 2
            for label, impl, float8 in (IMPLS[:1] if only else IMPLS):
                res = launch(rank_bench, world, config, plan, impl, n, warmup, torch.float32, float8, timeout=600)[0]
                rows.setdefault((config, plan, world, label), []).append(res)
            for label in (async_variants(plan, world) if config in chosen else []):
                fused, pin = ASYNC[label]
                res = launch(rank_bench, world, config, plan, "ours", n, warmup, torch.float32, False, fused, pin,
                             timeout=600)[0]
                rows.setdefault((config, plan, world, label), []).append(res)
            if plan == "full" and rep == 0 and not only:
                res = launch(rank_bench, world, config, "gathered", "ours", 1, 0, timeout=600)[0]
                rows[(config, "gathered", world, "ours")] = [res]
        for config in ({c for c, _, _ in todo if c == "small" or rep < repeats} if not only else ()):
            for label, float8 in SINGLES:
                res = launch(rank_bench, 1, config, "none", "single", steps if config == "small" else 2, warmup,
                             torch.float32, float8, threads=2, timeout=600)[0]
                singles.setdefault((config, label), []).append(res)
        print(f"round {rep + 1}/{rounds} done", flush=True)
    table = summarize(rows, singles)
    if not only:  # the floor table: ours and the floor taking turns in the same ranks (benchmarks/overhead.py)
        for config, plan, world in todo:
            pair = compare(config, world, PAIRED_STEPS[config] if not args.quick else 6, plan)
            table.append({"config": config, "plan": plan, "world": world, "impl": "paired", **pair})
    for config in ([] if only else ["small"] if args.quick else ["small", "medium"]):
        for world in (2, 4):  # the loss alone, ours against the floor's
            res = launch(rank_loss_bench, world, config, 5 if args.quick else 9, timeout=600)[0]
            table.append({"config": config, "plan": "loss", "world": world, "impl": "loss", **res})
    return table


def summarize(rows, singles) -> list[dict]:
    """One dict per (config, plan, ranks, impl); impl is "ours", "torch", "ours float8", "ours async",
    "ours pinned", "ours async pinned", "single", "single float8" (plan "-", 1 rank).  ``singles`` is
    keyed by (config, impl).  Raises if an async row's step moved other bytes than its synchronous row's."""
    out = []
    for (config, plan, world, impl), results in rows.items():
        best = min(results, key=lambda r: r["median_s"])
        formula = plan in ("vanilla", "full") and impl == "ours"
        row = {"config": config, "plan": plan, "world": world, "impl": impl,
               "median_ms": 1000 * statistics.median(r["median_s"] for r in results),
               "counts": best["counts"], "bytes": best["bytes"], "float8_bytes": best.get("float8_bytes", 0),
               "saved_mb": best["saved"] / 2**20, "layer_saved": best.get("layer_saved", 0),
               "layer_formula": activation_formula(config, plan, world) if formula else 0,
               "rss_mb": max(r["rss_mb"] for r in results),
               "repeats_ms": [1000 * r["median_s"] for r in results],
               "spread": max(r["median_s"] for r in results) / min(r["median_s"] for r in results) - 1}
        for key in ("total_bytes", "pinned", "sync_counts", "sync_total_bytes", "float8_emulated"):
            if key in best:
                row[key] = best[key]
        if any("overlap" in r for r in results):  # each the slowest rank's; the repeat in the middle, whole
            overlaps = sorted((r["overlap"] for r in results if "overlap" in r), key=lambda o: o["fused"])
            rings = sorted((r["ring"] for r in results if "ring" in r), key=lambda x: x["wait_s"])
            row["overlap"] = overlaps[(len(overlaps) - 1) // 2]
            if rings:
                row["ring"] = rings[(len(rings) - 1) // 2]
        out.append(row)
    for row in out:
        ref = SYNC_OF.get(row["impl"])
        sync = next((r for r in out if r["impl"] == ref and (r["config"], r["plan"], r["world"]) ==
                     (row["config"], row["plan"], row["world"])), None)
        if sync is not None and "total_bytes" in sync and row.get("total_bytes") != sync["total_bytes"]:
            raise RuntimeError(f"{row['impl']} {row['config']} x{row['world']}: {row.get('total_bytes')} bytes per "
                               f"rank in one step, {ref} {sync['total_bytes']}: async TP must move the same bytes")
    for (config, impl), results in singles.items():
        out.append({"config": config, "plan": "-", "world": 1, "impl": impl,
                    "median_ms": 1000 * statistics.median(r["median_s"] for r in results), "counts": {}, "bytes": 0,
                    "float8_bytes": 0, "saved_mb": results[0]["saved"] / 2**20,
                    "rss_mb": max(r["rss_mb"] for r in results)})
    return out


def report_folder(quick: bool, out: str | None) -> str:
    """Where results.md and results.png go: ``--out``, else benchmarks/ for a full run (the committed record)
    and a fresh temporary folder for ``--quick`` (its numbers never replace the record unless asked)."""
    if out is not None:
        os.makedirs(out, exist_ok=True)
        return out
    return tempfile.mkdtemp(prefix="bench_quick_") if quick else HERE


def write_report(table: list[dict], quick: bool, out: str | None = None) -> str:
    folder = report_folder(quick, out)
    text = render(table, quick, folder)
    return text + f"\nwrote {os.path.join(folder, 'results.md')} and results.png\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small config only, fewer steps (< 2 minutes)")
    parser.add_argument("--out", default=None,
                        help="folder for results.md / results.png (default: benchmarks/ for a full run, a fresh "
                             "temporary folder for --quick, so a quick run never replaces the committed record)")
    parser.add_argument("--torchrun", action="store_true", help="one variant under torchrun (GPUs: NCCL)")
    parser.add_argument("--impl", choices=["ours", "hand", "torch"], default="ours")
    parser.add_argument("--plan", choices=["vanilla", "full"], default="full")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="--torchrun only: the model's dtype (default float32)")
    parser.add_argument("--float8", action="store_true",
                        help="--torchrun --impl ours only: the model converted to float8, the float8 styles")
    parser.add_argument("--async-tp", action="store_true",
                        help="--torchrun --impl ours --plan full only: async TP on (ring-decomposed gathers, "
                             "scatters)")
    parser.add_argument("--async-only", action="store_true",
                        help="launched: only the async rows of --config (ours sync and async, full plan, 2 and 4 "
                             "ranks, and the pinned pair on 2); prints them, writes no file")
    args = parser.parse_args(argv)
    if args.dtype is not None and not args.torchrun:
        parser.error("--dtype goes with --torchrun (the launched benchmark runs float32)")
    if args.float8 and not args.torchrun:
        parser.error("--float8 goes with --torchrun (the launched benchmark always has its float8 rows)")
    if args.float8 and args.impl != "ours":
        parser.error("--float8 goes with --impl ours (PyTorch's float8 tensor parallelism needs torchao)")
    if args.async_tp and not args.torchrun:
        parser.error("--async-tp goes with --torchrun (the launched benchmark always has its async rows)")
    if args.async_tp and (args.impl != "ours" or args.plan != "full"):
        parser.error("--async-tp goes with --impl ours --plan full (ours decomposes the full plan's gathers and "
                     "scatters; the vanilla plan has none)")
    if args.async_only and args.torchrun:
        parser.error("--async-only is a launched run; under --torchrun use --async-tp")
    if args.torchrun:
        dtype_name = args.dtype or "float32"

        def one():
            res = rank_bench(args.config, args.plan, args.impl, 5, 2, getattr(torch, dtype_name), args.float8,
                             args.async_tp)
            if dist.get_rank() == 0:
                name = args.impl + " float8" * args.float8 + " async" * args.async_tp
                print(f"{name} {args.config} {args.plan} {dtype_name} x{dist.get_world_size()} "
                      f"({current_device().type}): {1000 * res['median_s']:.1f} ms/step, "
                      f"{res['tokens_per_s']:.0f} tokens/s, {res['counts']}, "
                      f"gather+scatter bytes/rank {res['bytes']:,}"
                      + (f", total bytes/rank {res['total_bytes']:,} (the synchronous step's: "
                         f"{res['sync_total_bytes']:,})" if args.async_tp else ""))
        run_from_env(one)
    start = time.perf_counter()
    table = run(args)
    if args.async_only:
        print("\n".join(async_section(table)))
        for row in sorted(table, key=lambda r: (r["world"], r["impl"])):  # what the medians hide
            print(f"{row['impl']} x{row['world']}: ms per repeat " + ", ".join(f"{ms:.0f}" for ms in row["repeats_ms"]))
    else:
        print(write_report(table, args.quick, args.out))
    print(f"bench took {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main())

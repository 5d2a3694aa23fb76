"""`make bench`: the small Llama trained by one process, by tensorplay_edu and by PyTorch's
own `torch.distributed.tensor.parallel`, with the same model, plan and inputs.

    python benchmarks/bench.py            # small and medium configs, 2 and 4 ranks, both plans
    python benchmarks/bench.py --quick    # small config only, fewer steps (under 2 minutes)

Per (config, plan, ranks) it reports the median training-step time (forward, loss,
backward, AdamW; the slowest rank of each step, median over steps and repeats), the ratio
ours / PyTorch, the collectives and bytes of one step, the bytes saved for backward and
the peak RSS per rank, and loss_parallel against gathering the logits.  The variants
run interleaved, repeat by repeat, so a slow spell of the machine hits all of them.
Float8 rows: for each (config, plan, ranks) also "ours float8" (the float32 model converted
by ``convert_to_float8_training``, output layer excluded, and ``parallelize_llama(...,
float8=True)``; matmuls through ``torch._scaled_mm``, on the CPU here) against ours in float32
and the same float8 model on one process (PyTorch's float8 TP needs torchao: not compared).
Writes benchmarks/results.md and benchmarks/results.png.  Under torchrun it runs one
variant on GPUs: `torchrun --nproc-per-node 2 benchmarks/bench.py --torchrun --impl ours`
(`--dtype bfloat16` there for a bf16 model; float32 otherwise; `--float8` for ours with the
float8 model and styles, bf16 being the realistic GPU setting).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

from tensorplay_edu import CommDebugMode, init_device_mesh, launch
from tensorplay_edu.torchrun import current_device, run_from_env
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {
    "small": dict(dim=256, n_layers=2, vocab_size=8192, seq=128, batch=4),
    "medium": dict(dim=1024, n_layers=4, vocab_size=32000, seq=256, batch=4),
}


def build(config: str, float8: bool = False) -> tuple[Transformer, torch.Tensor, torch.Tensor]:
    """The model and one batch; ``float8``: the Linears converted as torchtitan does (the output layer stays)."""
    c = CONFIGS[config]
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=c["dim"], n_layers=c["n_layers"], n_heads=8, vocab_size=c["vocab_size"],
                                  max_seq_len=c["seq"]))
    if float8:
        from tensorplay_edu.float8 import convert_to_float8_training
        model = convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "output")
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, c["vocab_size"], (c["batch"], c["seq"]), generator=g)
    return model, tokens, tokens.roll(-1, dims=1)


def torch_parallelize(model, plan: str):
    """The same two plans with PyTorch's own API (what users would otherwise run)."""
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    mesh = torch_mesh(current_device().type, (dist.get_world_size(),))
    sp = plan == "full"
    parallelize_module(model, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False) if sp
        else ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        **({"norm": SequenceParallel()} if sp else {}),
    })
    block = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
             "attention.wo": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel(),
             "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
             "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel()}
    block_in = Shard(1) if sp else Replicate()  # as parallelize_llama: one DTensor per block input, one f / gather
    block.update({"attention": PrepareModuleInput(input_layouts=(block_in, None), desired_input_layouts=(Replicate(), None)),
                  "feed_forward": PrepareModuleInput(input_layouts=(block_in,), desired_input_layouts=(Replicate(),))})
    if sp:
        block.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
    for layer in model.layers.values():
        parallelize_module(layer, mesh, block)
    return model


class TorchCommBytes:
    """Bytes each rank sends in PyTorch's all-gathers, reduce-scatters and all-to-alls,
    counted as ours are (ring accounting, tensorplay_edu/debug.py), seen by a dispatch
    mode.  PyTorch's all-reduces (loss_parallel's and the lazy Partial gradients') do not
    pass through a dispatch mode here, so all-reduce bytes are compared as counts."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.namespace in ("_c10d_functional", "c10d_functional"):
                    outer.record(func._overloadpacket.__name__, args)
                return func(*args, **(kwargs or {}))

        self.mode, self.bytes = Mode(), 0

    def record(self, name: str, args) -> None:
        from torch.distributed.distributed_c10d import _get_group_size_by_name

        if name not in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
            return  # wait_tensor and friends move nothing; all-reduces are left out (see below)
        x, t = args[0], _get_group_size_by_name(next(a for a in reversed(args) if isinstance(a, str)))
        n = x.numel()
        per_rank = {"all_gather_into_tensor": (t - 1) * n, "reduce_scatter_tensor": (t - 1) * (n // t),
                    "all_to_all_single": (t - 1) * (n // t)}
        self.bytes += per_rank[name] * x.element_size()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def _saved_bytes(step) -> int:
    """Bytes autograd keeps for backward during ``step()`` (each storage once)."""
    seen, total = set(), 0

    def pack(t):
        nonlocal total
        inner = t
        for attr in ("_local_tensor", "elem"):  # PyTorch's DTensor and AsyncCollectiveTensor wrap a plain tensor
            while isinstance(getattr(inner, attr, None), torch.Tensor):
                inner = getattr(inner, attr)
        try:
            key = (inner.untyped_storage().data_ptr(), inner.untyped_storage().nbytes())
        except RuntimeError:  # a wrapper without storage: count its elements
            key = (id(inner), inner.numel() * inner.element_size())
        if key not in seen:
            seen.add(key)
            total += key[1]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return total


def _layer_saved_bytes(model, step) -> int:
    """Bytes saved for backward inside ``layers["0"]`` (parameters and buffers left out)."""
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    inside, seen = [False], {}
    layer = model.layers["0"]
    hooks = [layer.register_forward_pre_hook(lambda mod, args: inside.__setitem__(0, True)),
             layer.register_forward_hook(lambda mod, args, out: inside.__setitem__(0, False))]

    def pack(t):
        storage = t.untyped_storage()
        if inside[0] and storage.data_ptr() not in skip and storage.data_ptr() not in seen:
            seen[storage.data_ptr()] = (storage.nbytes(), t)  # keep t: its storage stays unique
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    for h in hooks:
        h.remove()
    return sum(n for n, _ in seen.values())


def activation_formula(config: str, plan: str, world: int) -> int:
    """Bytes one block saves for backward per rank: Korthikanti et al. 2022 adapted to this
    Llama in notebooks/04_sequence_parallel.ipynb (SwiGLU, no dropout, SDPA saving a
    log-sum-exp, float32 RoPE tables): TP = p[6sbh + 2sb + (4sbh + 4sbf + asb)/t + 2s hd],
    TP+SP = p[2sbh + (8sbh + 4sbf + (a+2)sb)/t + 2s hd]."""
    c = CONFIGS[config]
    s, b, h, a, t, p = c["seq"], c["batch"], c["dim"], 8, world, 4
    f = 16 * -(-8 * h // (3 * 16))  # SwiGLU hidden, as in models/llama.py
    hd = h // a
    if plan == "full":
        return p * (2 * s * b * h + (8 * s * b * h + 4 * s * b * f + (a + 2) * s * b) // t + 2 * s * hd)
    return p * (6 * s * b * h + 2 * s * b + (4 * s * b * h + 4 * s * b * f + a * s * b) // t + 2 * s * hd)


def rank_bench(config: str, plan: str, impl: str, steps: int, warmup: int, dtype: torch.dtype = torch.float32,
               float8: bool = False) -> dict:
    """One variant on this rank: per-step times, collectives, bytes, memory (``dtype``: --torchrun --dtype;
    ``float8``: the float8 model, with the float8 styles for ``impl="ours"``, as is for ``"single"``)."""
    if float8 and impl == "torch":
        raise ValueError("float8 goes with impl 'ours' or 'single' (PyTorch's float8 TP needs torchao)")
    device = current_device()
    model, tokens, labels = build(config, float8)
    model, tokens, labels = model.to(device, dtype), tokens.to(device), labels.to(device)
    loss_ctx = contextlib.nullcontext
    if impl == "ours":
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        if plan == "gathered":  # the full plan, but the output layer gathers the logits (no loss_parallel)
            parallelize_llama(model, mesh, "full", gather_logits=True, float8=float8)
        else:
            parallelize_llama(model, mesh, plan, float8=float8)
            loss_ctx = lambda: loss_context(plan)  # noqa: E731
    elif impl == "torch":
        torch_parallelize(model, plan)
        if plan == "full":
            from torch.distributed.tensor.parallel import loss_parallel
            loss_ctx = loss_parallel
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with loss_ctx():
            loss = llama_loss(model(tokens), labels)
            loss.backward()  # PyTorch's loss_parallel needs the backward inside
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # compile-free warm-up of every path
    counts, nbytes, float8_bytes = {}, 0, 0
    formula_rows = impl == "ours" and plan in ("vanilla", "full") and not float8  # the formula is high precision's
    layer_saved = _layer_saved_bytes(model, step) if formula_rows else 0
    if impl == "ours":
        with CommDebugMode() as comm:
            saved = _saved_bytes(step)
        counts = comm.get_comm_counts()
        nbytes = sum(b for op, b in comm.get_comm_bytes().items() if op != "all_reduce")  # like for like
        float8_bytes = sum(r.bytes for r in comm.records if r.op != "all_reduce" and r.dtype.startswith("float8"))
    elif impl == "torch":
        from torch.distributed.tensor.debug import CommDebugMode as TorchComm
        with TorchComm() as comm, TorchCommBytes() as weigh:
            saved = _saved_bytes(step)
        nbytes = weigh.bytes
        counts = {str(k).split(".")[-1].replace("_into_tensor", "").replace("_tensor", "").replace("_single", ""): v
                  for k, v in comm.get_comm_counts().items()}
    else:
        saved = _saved_bytes(step)
    times = []
    for _ in range(warmup + steps):
        if dist.get_world_size() > 1:
            dist.barrier()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times = times[warmup:]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, times)  # plain torch.distributed: bookkeeping
    slowest = [max(ts[i] for ts in everyone) for i in range(len(times))]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"median_s": statistics.median(slowest), "counts": counts, "bytes": nbytes, "saved": saved, "rss_mb": rss_mb,
            "tokens_per_s": tokens.numel() / statistics.median(slowest), "layer_saved": layer_saved,
            "float8_bytes": float8_bytes}


def variants(quick: bool):
    for config in (["small"] if quick else ["small", "medium"]):
        for world in (2, 4):
            for plan in ("vanilla", "full"):
                yield config, plan, world


# Each launched variant: (row label, impl passed to rank_bench, float8).  "ours float8" is the
# float32 model converted to float8; its rows sit in a table of their own (report.py).
IMPLS = (("ours", "ours", False), ("torch", "torch", False), ("ours float8", "ours", True))
SINGLES = (("single", False), ("single float8", True))


def run(args) -> list[dict]:
    rows = {}
    steps, warmup, repeats = (3, 1, 2) if args.quick else (5, 1, 3)
    singles = {}
    for rep in range(repeats):
        for config, plan, world in variants(args.quick):
            for label, impl, float8 in IMPLS:
                res = launch(rank_bench, world, config, plan, impl, steps if config == "small" else 2, warmup,
                             torch.float32, float8, timeout=600)[0]
                rows.setdefault((config, plan, world, label), []).append(res)
            if plan == "full" and rep == 0:
                res = launch(rank_bench, world, config, "gathered", "ours", 1, 0, timeout=600)[0]
                rows[(config, "gathered", world, "ours")] = [res]
        for config in {c for c, _, _ in variants(args.quick)}:
            for label, float8 in SINGLES:
                res = launch(rank_bench, 1, config, "none", "single", steps if config == "small" else 2, warmup,
                             torch.float32, float8, threads=2, timeout=600)[0]
                singles.setdefault((config, label), []).append(res)
        print(f"repeat {rep + 1}/{repeats} done", flush=True)
    return summarize(rows, singles)


def summarize(rows, singles) -> list[dict]:
    """One dict per (config, plan, ranks, impl); impl is "ours", "torch", "ours float8", "single",
    "single float8" (plan "-", 1 rank).  ``singles`` is keyed by (config, impl)."""
    out = []
    for (config, plan, world, impl), results in rows.items():
        best = min(results, key=lambda r: r["median_s"])
        formula = plan in ("vanilla", "full") and impl == "ours"
        out.append({"config": config, "plan": plan, "world": world, "impl": impl,
                    "median_ms": 1000 * statistics.median(r["median_s"] for r in results),
                    "counts": best["counts"], "bytes": best["bytes"], "float8_bytes": best.get("float8_bytes", 0),
                    "saved_mb": best["saved"] / 2**20, "layer_saved": best.get("layer_saved", 0),
                    "layer_formula": activation_formula(config, plan, world) if formula else 0,
                    "rss_mb": max(r["rss_mb"] for r in results)})
    for (config, impl), results in singles.items():
        out.append({"config": config, "plan": "-", "world": 1, "impl": impl,
                    "median_ms": 1000 * statistics.median(r["median_s"] for r in results), "counts": {}, "bytes": 0,
                    "float8_bytes": 0, "saved_mb": results[0]["saved"] / 2**20,
                    "rss_mb": max(r["rss_mb"] for r in results)})
    return out


def write_report(table: list[dict], quick: bool) -> str:
    from report import render  # benchmarks/report.py

    return render(table, quick, HERE)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small config only, fewer steps (< 2 minutes)")
    parser.add_argument("--torchrun", action="store_true", help="one variant under torchrun (GPUs: NCCL)")
    parser.add_argument("--impl", choices=["ours", "torch"], default="ours")
    parser.add_argument("--plan", choices=["vanilla", "full"], default="full")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="--torchrun only: the model's dtype (default float32)")
    parser.add_argument("--float8", action="store_true",
                        help="--torchrun --impl ours only: the model converted to float8, the float8 styles")
    args = parser.parse_args(argv)
    if args.dtype is not None and not args.torchrun:
        parser.error("--dtype goes with --torchrun (the launched benchmark runs float32)")
    if args.float8 and not args.torchrun:
        parser.error("--float8 goes with --torchrun (the launched benchmark always has its float8 rows)")
    if args.float8 and args.impl != "ours":
        parser.error("--float8 goes with --impl ours (PyTorch's float8 tensor parallelism needs torchao)")
    if args.torchrun:
        dtype_name = args.dtype or "float32"

        def one():
            res = rank_bench(args.config, args.plan, args.impl, 5, 2, getattr(torch, dtype_name), args.float8)
            if dist.get_rank() == 0:
                name = f"{args.impl} float8" if args.float8 else args.impl
                print(f"{name} {args.config} {args.plan} {dtype_name} x{dist.get_world_size()} "
                      f"({current_device().type}): {1000 * res['median_s']:.1f} ms/step, "
                      f"{res['tokens_per_s']:.0f} tokens/s, {res['counts']}, "
                      f"gather+scatter bytes/rank {res['bytes']:,}")
        run_from_env(one)
    start = time.perf_counter()
    table = run(args)
    print(write_report(table, args.quick))
    print(f"bench took {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main())

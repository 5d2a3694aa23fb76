"""`make bench`: the small Llama trained by one process, by tensorplay_edu and by PyTorch's
own `torch.distributed.tensor.parallel`, with the same model, plan and inputs.

    python benchmarks/bench.py            # small and medium configs, 2 and 4 ranks, both plans
    python benchmarks/bench.py --quick    # small config only, fewer steps (under 2 minutes); writes to a temp folder

Per (config, plan, ranks) it reports the median training-step time (forward, loss,
backward, AdamW; the slowest rank of each step, median over steps and repeats), the ratio
ours / PyTorch, the collectives and bytes of one step, the bytes saved for backward and
the peak RSS per rank, and loss_parallel against gathering the logits.  The variants
run interleaved, repeat by repeat, so a slow spell of the machine hits all of them.
Float8 rows: for each (config, plan, ranks) also "ours float8" (the float32 model converted
by ``convert_to_float8_training``, output layer excluded, and ``parallelize_llama(...,
float8=True)``; matmuls through ``torch._scaled_mm``, on the CPU here) against ours in float32
and the same float8 model on one process (PyTorch's float8 TP needs torchao: not compared).
The floor (issue 13): "hand", the same model and plan written directly in raw collectives
(tensorplay_edu/models/by_hand.py: Megatron's f, g and the sequence-parallel pair, the in-place vocab-parallel
cross-entropy, one norm-gradient bucket), checked equal to one process by tests/test_hand.py; the
small config runs SMALL_ROUNDS interleaved rounds, and the report gives each ratio as the median of
the per-round ratios with its range.  The floor table's target reads ours and the floor taking turns
in the same ranks (benchmarks/overhead.py's ``compare``, PAIRED_STEPS turns each): launched apart,
their ratio drifts with the machine by more than the difference it is asked about.
Writes benchmarks/results.md and benchmarks/results.png (a full run: the committed record, headed by the
commit it ran on); ``--quick`` writes them into a fresh temporary folder, and ``--out DIR`` anywhere.  Under torchrun it runs one
variant on GPUs: `torchrun --nproc-per-node 2 benchmarks/bench.py --torchrun --impl ours`
(`--dtype bfloat16` there for a bf16 model; float32 otherwise; `--float8` for ours with the
float8 model and styles, bf16 being the realistic GPU setting; `--async-tp` for ours with async
TP on, full plan).
Async rows (issue 11): ours with async TP (``with enable_async_tp(mesh):`` around the forward:
the full plan's block-input all-gathers and wo / w2's reduce-scatters run as rings of
isend / irecv, each transfer under a matmul) against ours synchronous, full plan, at 2 and 4
ranks of the medium config (small with --quick): step time, the collectives (the decomposed ones
by name: all_gather_matmul, matmul_reduce_scatter), total bytes per rank (the bench raises unless
they equal the synchronous step's), the overlap of one block-input ring
(``async_tp.time_gather_matmul`` on a [b, s/t, h] input and layer 0's wq / wk / wv shards) and,
from a ``Timeline`` of one step, how long the rings waited for transfers.  Plus the same pair on
2 ranks whose main (compute) threads are pinned to one core after the process group started,
so that gloo's transfer threads, started earlier, keep the other core.
`python benchmarks/bench.py --async-only --config medium` runs only those rows and prints them
(it writes no file).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from tensorplay_edu import CommDebugMode, init_device_mesh, launch
from tensorplay_edu import async_tp
from tensorplay_edu.parallel import bucket_partial_grads
from tensorplay_edu.async_tp.timeline import Timeline
from tensorplay_edu.launcher.torchrun import current_device, run_from_env
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {
    "small": dict(dim=256, n_layers=2, vocab_size=8192, seq=128, batch=4),
    "medium": dict(dim=1024, n_layers=4, vocab_size=32000, seq=256, batch=4),
}


def float8_emulated(clock=time.perf_counter) -> bool:
    """True where this CPU's ``torch._scaled_mm`` is a reference loop: oneDNN has a float8 matmul kernel only
    for some CPUs, and elsewhere runs a loop that was measured here at 0.07 GFLOP/s, a thousand times slower
    than a float32 matmul (a medium-config step would take hours).  The float8 models then emulate the
    matmul, as torchao's CPU tests do (``Float8LinearConfig(emulate=True)``: the exact float8 values
    dequantized and multiplied in float32); casts, scales, collectives and bytes are unchanged.  ``clock``:
    the seconds clock read around each matmul (a test passes one that does not depend on the machine)."""
    a, b, one = torch.randn(128, 128), torch.randn(128, 128), torch.tensor(1.0)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()

    def fastest(fn) -> float:  # the least of five: a busy machine only ever adds time
        times = []
        for _ in range(5):
            start = clock()
            fn()
            times.append(clock() - start)
        return min(times)

    float32 = fastest(lambda: a @ b)
    float8 = fastest(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.float32))
    return is_reference_loop(float32, float8)


def is_reference_loop(float32_s: float, float8_s: float) -> bool:
    """The rule :func:`float8_emulated` applies to its two times: a kernel is within a few times float32's, the
    reference loop about a thousand times; 50x (plus a millisecond, for a float32 time near zero) splits them."""
    return float8_s > 50 * float32_s + 1e-3


def build(config: str, float8: bool = False, emulate: bool = False) -> tuple[Transformer, torch.Tensor, torch.Tensor]:
    """The model and one batch; ``float8``: the Linears converted as torchtitan does (the output layer stays),
    their matmul emulated if ``emulate`` (rank_bench asks :func:`float8_emulated`)."""
    c = CONFIGS[config]
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=c["dim"], n_layers=c["n_layers"], n_heads=8, vocab_size=c["vocab_size"],
                                  max_seq_len=c["seq"]))
    if float8:
        from tensorplay_edu.float8 import Float8LinearConfig, convert_to_float8_training
        model = convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "output",
                                           config=Float8LinearConfig(emulate=emulate))
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
    log-sum-exp): TP = p[6sbh + 2sb + (4sbh + 4sbf + asb)/t], TP+SP = p[2sbh + (8sbh + 4sbf + (a+2)sb)/t].
    Notebook 04's formula adds the RoPE tables' slices (2s hd p); they are the model's buffers now,
    which the measurement (_layer_saved_bytes) leaves out with the parameters."""
    c = CONFIGS[config]
    s, b, h, a, t, p = c["seq"], c["batch"], c["dim"], 8, world, 4
    f = 16 * -(-8 * h // (3 * 16))  # SwiGLU hidden, as in models/llama.py
    if plan == "full":
        return p * (2 * s * b * h + (8 * s * b * h + 4 * s * b * f + (a + 2) * s * b) // t)
    return p * (6 * s * b * h + 2 * s * b + (4 * s * b * h + 4 * s * b * f + a * s * b) // t)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pin_compute_thread() -> dict:
    """Pin this rank's main thread (its matmuls) to the first core it may use, leaving the others to
    the threads started before (gloo's transfer threads, started with the process group): Linux's
    ``sched_setaffinity(0, ...)`` sets the calling thread's affinity only.  Returns the core, how
    many cores there are and how many of this process's other threads may still run elsewhere."""
    if not hasattr(os, "sched_getaffinity"):
        raise RuntimeError("pinning the compute threads needs Linux's os.sched_setaffinity")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise RuntimeError(f"pinning the compute threads needs 2 cores or more to leave one free; this rank has "
                           f"{cores}")
    os.sched_setaffinity(0, {cores[0]})
    free = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            free += os.sched_getaffinity(int(tid)) != {cores[0]}
        except OSError:  # a thread that ended meanwhile
            pass
    return {"core": cores[0], "cores": len(cores), "free_threads": free}


def ring_waits(intervals) -> dict:
    """Seconds of one step's rings, from a Timeline: matmuls (compute), transfers in flight, and
    waits (transfer time under no matmul: the rank had finished its matmul and waited for a chunk)."""
    merged: list[list[float]] = []
    for a, b in sorted((i.start, i.end) for i in intervals if i.kind == "compute"):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    transfers = [(i.start, i.end) for i in intervals if i.kind == "transfer"]
    in_flight = sum(b - a for a, b in transfers)
    covered = sum(max(0.0, min(b, mb) - max(a, ma)) for a, b in transfers for ma, mb in merged)
    return {"compute_s": sum(b - a for a, b in merged), "transfer_s": in_flight, "wait_s": in_flight - covered,
            "transfers": len(transfers)}


def block_ring_overlap(model, config: str, mesh, dtype: torch.dtype, device) -> dict:
    """``time_gather_matmul`` of one block-input ring: a [b, s/t, h] input and layer 0's wq / wk / wv shards."""
    c, t = CONFIGS[config], mesh.size()
    g = torch.Generator().manual_seed(2)
    shard = torch.randn(c["batch"], c["seq"] // t, c["dim"], generator=g).to(device, dtype)
    attention = model.layers["0"].attention
    weights = [m.weight.detach() for m in (attention.wq, attention.wk, attention.wv)]
    return async_tp.time_gather_matmul(shard, weights, mesh, dim=1, repeats=5)


DECOMPOSED = ("all_gather_matmul", "matmul_reduce_scatter")


def rank_loss_bench(config: str, repeats: int = 7) -> dict:
    """The loss alone, forward and backward, on this rank's vocabulary slice of the config's logits
    ([b * s, V/t], float32): ours (``F.cross_entropy`` under ``loss_parallel()``) against the floor's
    (hand.VocabParallelCrossEntropy), interleaved; the medians of each and of the per-repeat ratio."""
    from tensorplay_edu.models.by_hand import VocabParallelCrossEntropy
    from tensorplay_edu import DTensor, Shard
    from tensorplay_edu.parallel import loss_parallel
    c = CONFIGS[config]
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    g = torch.Generator().manual_seed(2)
    n, vocab = c["batch"] * c["seq"], c["vocab_size"]
    local = torch.randn(n, vocab, generator=g).chunk(t, 1)[r].contiguous().requires_grad_(True)
    labels = torch.randint(0, vocab, (n,), generator=g)
    offset = r * -(-vocab // t)

    def ours():
        with loss_parallel():
            torch.nn.functional.cross_entropy(DTensor.from_local(local, mesh, [Shard(1)], shape=(n, vocab)),
                                              labels).backward()

    def hand():
        VocabParallelCrossEntropy.apply(local, labels, offset, None).backward()

    times = {"ours": [], "hand": []}
    for i in range(repeats + 1):
        for name, fn in (("ours", ours), ("hand", hand)) if i % 2 else (("hand", hand), ("ours", ours)):
            dist.barrier()
            start = time.perf_counter()
            fn()
            local.grad = None
            if i:  # the first round warms up
                times[name].append(time.perf_counter() - start)
    everyone = [None] * t
    dist.all_gather_object(everyone, times)
    slowest = {k: [max(ts[k][i] for ts in everyone) for i in range(repeats)] for k in times}
    return {"ours_ms": 1000 * statistics.median(slowest["ours"]), "hand_ms": 1000 * statistics.median(slowest["hand"]),
            "ratios": [a / b for a, b in zip(slowest["ours"], slowest["hand"])]}


def rank_bench(config: str, plan: str, impl: str, steps: int, warmup: int, dtype: torch.dtype = torch.float32,
               float8: bool = False, async_tp_on: bool = False, pin: bool = False) -> dict:
    """One variant on this rank: per-step times, collectives, bytes, memory (``dtype``: --torchrun --dtype;
    ``float8``: the float8 model, with the float8 styles for ``impl="ours"``, as is for ``"single"``;
    ``async_tp_on``: ours, full plan, with async TP around the forward: raises unless one step moves the
    synchronous step's bytes; ``pin``: the main thread pinned to one core after the group started)."""
    if float8 and impl == "torch":
        raise ValueError("float8 goes with impl 'ours' or 'single' (PyTorch's float8 TP needs torchao)")
    if async_tp_on and (impl != "ours" or plan != "full"):
        raise ValueError("async TP goes with impl 'ours' and plan 'full' (the vanilla plan has nothing to decompose)")
    device = current_device()
    emulate = float8 and device.type == "cpu" and float8_emulated()  # once per rank
    model, tokens, labels = build(config, float8, emulate)
    model, tokens, labels = model.to(device, dtype), tokens.to(device), labels.to(device)
    loss_ctx, mesh = contextlib.nullcontext, None
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
    elif impl == "hand":  # the floor: the same model and plan in raw collectives (tensorplay_edu/models/by_hand.py)
        from tensorplay_edu.models.by_hand import HandLlama
        model = HandLlama(model, plan)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if impl == "ours" and plan != "vanilla":  # the norms' partial gradients: one bucket, made whole in opt.step()
        bucket_partial_grads(model, opt)      # (as the floor and Megatron do; parallel/grad_sync.py)
    pinned = pin_compute_thread() if pin else {"cores": _cores()}  # pinned after every group exists

    def step(fused: bool = async_tp_on):
        if impl == "hand":
            from tensorplay_edu.models.by_hand import hand_step
            hand_step(model, tokens, labels)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return
        with loss_ctx():
            with async_tp.enable_async_tp(mesh) if fused else contextlib.nullcontext():
                out = model(tokens)  # the backward follows what the forward chose
            loss = llama_loss(out, labels)
            loss.backward()  # PyTorch's loss_parallel needs the backward inside
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # compile-free warm-up of every path
    counts, nbytes, float8_bytes, extra = {}, 0, 0, {}
    formula_rows = (impl == "ours" and plan in ("vanilla", "full") and not float8  # the formula is high precision's
                    and not async_tp_on and not pin)
    layer_saved = _layer_saved_bytes(model, step) if formula_rows else 0
    if async_tp_on:  # the synchronous step's collectives, to hold the decomposed step's bytes against
        with CommDebugMode() as sync_comm:
            step(fused=False)
    if impl == "ours":
        with CommDebugMode() as comm:
            saved = _saved_bytes(step)
        counts = comm.get_comm_counts()
        nbytes = sum(b for op, b in comm.get_comm_bytes().items() if op != "all_reduce")  # like for like
        float8_bytes = sum(r.bytes for r in comm.records if r.op != "all_reduce" and r.dtype.startswith("float8"))
        extra["total_bytes"] = comm.get_total_bytes()
        if async_tp_on:
            missing = [op for op in DECOMPOSED if op not in counts]
            if missing:
                raise RuntimeError(f"async TP: no {', '.join(missing)} in the step's collectives {counts}")
            if comm.get_total_bytes() != sync_comm.get_total_bytes():
                raise RuntimeError(f"async TP moved {comm.get_total_bytes():,} bytes per rank in one step, the "
                                   f"synchronous step {sync_comm.get_total_bytes():,}: {comm.get_comm_bytes()} against "
                                   f"{sync_comm.get_comm_bytes()}")
            extra.update(sync_counts=sync_comm.get_comm_counts(), sync_total_bytes=sync_comm.get_total_bytes())
            if device.type == "cpu":  # perf_counter timings; on a GPU the ring's times need CUDA events
                with Timeline() as tl:
                    step()
                extra["ring"] = ring_waits(tl.intervals)
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
    if async_tp_on and device.type == "cpu":  # after the timed steps: one block-input ring, fused and apart
        extra["overlap"] = block_ring_overlap(model, config, mesh, dtype, device)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (times, extra.get("overlap"), extra.get("ring")))  # plain torch.distributed
    slowest = [max(ts[i] for ts, _, _ in everyone) for i in range(len(times))]
    if "overlap" in extra:  # the ring of the rank whose fused ring took longest; the longest waits
        extra["overlap"] = max((o for _, o, _ in everyone), key=lambda o: o["fused"])
        extra["ring"] = max((r for _, _, r in everyone), key=lambda r: r["wait_s"])
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"median_s": statistics.median(slowest), "counts": counts, "bytes": nbytes, "saved": saved, "rss_mb": rss_mb,
            "tokens_per_s": tokens.numel() / statistics.median(slowest), "layer_saved": layer_saved,
            "float8_bytes": float8_bytes, "pinned": pinned,
            "float8_emulated": emulate, **extra}


def variants(quick: bool):
    for config in (["small"] if quick else ["small", "medium"]):
        for world in (2, 4):
            for plan in ("vanilla", "full"):
                yield config, plan, world


# Each launched variant: (row label, impl passed to rank_bench, float8).  "ours float8" is the
# float32 model converted to float8; its rows sit in a table of their own (report.py).
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
        from overhead import compare

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
    from report import render  # benchmarks/report.py

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
        from report import async_section  # benchmarks/report.py

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

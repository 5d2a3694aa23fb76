"""What a benchmarked step is measured by besides its time: the bytes PyTorch's collectives send, the bytes
saved for backward (the whole step, one block, and the formula for one block), which cores the threads
run on, and how an async TP ring overlaps and waits."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from tensorplay_edu import async_tp

from configs import CONFIGS


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
    Llama in notebooks/04b_sp_memory_at_scale.ipynb (SwiGLU, no dropout, SDPA saving a
    log-sum-exp): TP = p[6sbh + 2sb + (4sbh + 4sbf + asb)/t], TP+SP = p[2sbh + (8sbh + 4sbf + (a+2)sb)/t].
    Notebook 04b's formula adds the RoPE tables' slices (2s hd p); they are the model's buffers now,
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


def timed_steps(step, warmup: int, steps: int, device: torch.device) -> list[float]:
    """Seconds of each of ``steps`` calls of ``step`` after ``warmup`` more, the ranks lined up by a
    barrier before each (on CUDA the host waits for the GPU before the clock stops)."""
    times = []
    for _ in range(warmup + steps):
        if dist.get_world_size() > 1:
            dist.barrier()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[warmup:]

"""What one launched rank runs for `make bench`: a variant's training steps (ours, PyTorch's, the floor, one
process; float8, async TP, pinned threads) with their collectives, bytes and memory, and the loss alone."""

from __future__ import annotations

import contextlib
import resource
import statistics
import time

import torch
import torch.distributed as dist

from tensorplay_edu import CommDebugMode, init_device_mesh
from tensorplay_edu import async_tp
from tensorplay_edu.parallel import bucket_partial_grads
from tensorplay_edu.async_tp.timeline import Timeline
from tensorplay_edu.launcher.torchrun import current_device
from tensorplay_edu.models import llama_loss, loss_context, parallelize_llama

from configs import CONFIGS, build, float8_emulated, torch_parallelize
from probes import (TorchCommBytes, timed_steps, _cores, _layer_saved_bytes, _saved_bytes, block_ring_overlap,
                    pin_compute_thread, ring_waits)


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
    times = timed_steps(step, warmup, steps, device)
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

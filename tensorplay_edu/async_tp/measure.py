"""How much of a ring's transfer time its matmuls hide: one all-gather -> matmuls ring timed
fused, its transfers alone and its matmuls alone (notebook 10 and the GPU check use it)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from . import timeline
from .ring import ring_gather

__all__ = ["time_gather_matmul"]


@torch.no_grad()
def time_gather_matmul(shard: torch.Tensor, weights: list[torch.Tensor], mesh, dim: int = 1, repeats: int = 5) -> dict:
    """This rank's seconds for one all-gather -> matmuls ring: fused, its transfers alone and its
    matmuls alone (medians of ``repeats`` after a warm-up; noisy on a busy machine: use many), the
    ring's ideal and ``timeline.overlap``: how much of the overlap the ring could reach it reached.
    On CUDA the seconds are the compute stream's, between two CUDA events; on the CPU a plain timer's."""
    t = mesh.size()
    sizes = [shard.shape[dim]] * t  # even chunks
    outs = [shard.new_empty(list(shard.shape[:-1]) + [w.shape[0]]) for w in weights]

    def matmuls(c, chunk):
        for out, w in zip(outs, weights):
            out.copy_(chunk @ w.t())

    def run(consume=None, transfer=True):
        dist.barrier(group=mesh.get_group())
        if shard.is_cuda:  # the host only queues kernels: time the GPU's stream between two events instead
            torch.cuda.synchronize()  # nothing queued before the start
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
        else:
            start = time.perf_counter()
        if transfer:  # each chunk's wait() makes the compute stream wait for NCCL's: the end event follows
            ring_gather(shard, dim, sizes, mesh, consume or (lambda c, chunk: None))
        else:
            for c in range(t):
                consume(c, shard)
        if shard.is_cuda:
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000  # ms -> s
        return time.perf_counter() - start

    def median(fn):
        fn()  # warm-up: first connections, first allocations
        return sorted(fn() for _ in range(repeats))[repeats // 2]

    fused, comm = median(lambda: run(matmuls)), median(lambda: run())
    comp = median(lambda: run(matmuls, transfer=False))
    return {"fused": fused, "comm": comm, "comp": comp, "ideal": timeline.ring_ideal(comm, comp, t),
            "overlap": timeline.overlap(fused, comm, comp, t)}

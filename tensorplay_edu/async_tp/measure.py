"""How much of a ring's transfer time its matmuls hide: one all-gather -> matmuls ring timed
fused, its transfers alone and its matmuls alone (notebook 10 and the GPU check use it).

:func:`time_standin_ring` times the same schedule on one process with a **stand-in** transfer: a
thread that sleeps for the transfer's time and does no work, as a copy engine takes no core from
the matmul.  It shows what the instrument reads when the transfer really runs beside the matmul."""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from . import timeline
from .ring import gather_schedule, ring_gather

__all__ = ["time_gather_matmul", "SleepTransfer", "standin_ring", "time_standin_ring"]


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


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
        return _median([fn() for _ in range(repeats)])

    fused, comm = median(lambda: run(matmuls)), median(lambda: run())
    comp = median(lambda: run(matmuls, transfer=False))
    return {"fused": fused, "comm": comm, "comp": comp, "ideal": timeline.ring_ideal(comm, comp, t),
            "overlap": timeline.overlap(fused, comm, comp, t)}


class SleepTransfer:
    """A stand-in transfer: a thread that sleeps ``seconds`` (no core works meanwhile, as for a copy
    engine), then ``wait()`` hands over ``chunk``.  ``cpu``: the CPU seconds the thread used; ``done_ns``:
    ``perf_counter_ns`` when the sleep ended (the transfer's real end, before the rank's ``wait()``)."""

    def __init__(self, chunk: torch.Tensor, seconds: float):
        self.chunk, self.cpu, self.done_ns = chunk, 0.0, None
        self._thread = threading.Thread(target=self._run, args=(seconds,), daemon=True)
        self._thread.start()

    def _run(self, seconds: float) -> None:
        start = time.thread_time()
        time.sleep(seconds)
        self.done_ns = time.perf_counter_ns()
        self.cpu = time.thread_time() - start

    def wait(self) -> torch.Tensor:
        self._thread.join()
        return self.chunk


def standin_ring(chunks: list[torch.Tensor], consume, seconds: float, r: int = 0, handles: list | None = None) -> float:
    """Rank ``r``'s all-gather -> matmul ring (:func:`~tensorplay_edu.async_tp.ring.gather_schedule`, the
    schedule ``ring_gather`` runs) on one process, with ``chunks`` the t chunks of the gathered input and
    each transfer a :class:`SleepTransfer` of ``seconds``.  Returns the CPU seconds the transfers used;
    ``handles``, if given, receives the transfers (their ``done_ns``: when each sleep ended)."""
    transfers = [] if handles is None else handles

    def post(chunk, incoming):  # the stand-in "receives" chunk `incoming` after sleeping
        transfers.append(SleepTransfer(chunks[incoming], seconds))
        return transfers[-1]

    gather_schedule(len(chunks), r, chunks[r], post, consume)
    return sum(handle.cpu for handle in transfers)


@torch.no_grad()
def time_standin_ring(x: torch.Tensor, weights: list[torch.Tensor], t: int, seconds: float | None = None,
                      dim: int = 1, repeats: int = 9) -> dict:
    """Seconds of rank 0's all-gather -> matmuls ring on one process, each transfer a thread sleeping
    ``seconds`` (:func:`standin_ring`; None: as long as one chunk's matmuls, timed first, the balanced
    case): fused, the transfers alone and the matmuls alone (medians of ``repeats``, the three taken in
    turn so that a load on the machine falls on all three), the ring's ideal, ``timeline.overlap``,
    ``transfer_cpu``, the CPU seconds the stand-in transfers of one fused run used (median), and
    ``seconds``.  ``x``: the gathered input, cut into t chunks along ``dim``."""
    chunks = list(x.chunk(t, dim))

    def matmuls(c, chunk):
        for w in weights:
            chunk @ w.t()

    if seconds is None:
        one = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            matmuls(0, chunks[0])
            one.append(time.perf_counter() - start)
        seconds = _median(one[1:])

    def fused():
        return standin_ring(chunks, matmuls, seconds)

    def comm():
        return standin_ring(chunks, lambda c, chunk: None, seconds)

    def comp():
        for c in range(t):
            matmuls(c, chunks[c])
        return 0.0

    runs = {"fused": [], "comm": [], "comp": [], "transfer_cpu": []}
    for i in range(repeats + 1):  # the first round warms up
        for name, fn in (("fused", fused), ("comm", comm), ("comp", comp)):
            start = time.perf_counter()
            cpu = fn()
            if i:
                runs[name].append(time.perf_counter() - start)
                if name == "fused":
                    runs["transfer_cpu"].append(cpu)
    out = {name: _median(v) for name, v in runs.items()}
    out["ideal"] = timeline.ring_ideal(out["comm"], out["comp"], t)
    out["overlap"] = timeline.overlap(out["fused"], out["comm"], out["comp"], t)
    out["seconds"] = seconds
    return out

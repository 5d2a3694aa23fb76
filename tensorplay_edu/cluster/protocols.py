"""NCCL's LL protocol beside its Simple one, for a ring inside one node: what a small collective costs.

:func:`~tensorplay_edu.cluster.model.ring_terms` prices every collective with the latencies of NCCL's
**Simple** protocol (8.4 µs base, 3.4 µs per NVLink step). For small messages NCCL picks the **LL** (low
latency) protocol instead: it sends 8-byte lines whose flag travels with the data, so a step needs no separate
synchronisation and costs far less, at the price of bandwidth (half the line of every 8 bytes is flag). On one
H100 node nccl-tests logs Ring/LL for all-reduces from 8 B to 1 MB and NVLS/Simple above (NVIDIA/nccl-tests#309).

NCCL's cost model (NVIDIA/nccl ``src/graph/tuning.cc``, the 2.2x default tuner constants), Ring, one node:

==========  ==========  ==============  ====================================================
protocol    base (µs)   per NVLink step  bus bandwidth
==========  ==========  ==============  ====================================================
Simple      8.4         3.4              the ring's busBw (``GPU.nvlink_busbw``; NVLS for an all-reduce)
LL          6.6         0.6              half the ring's busBw, at most 141 GB/s on Hopper (``llMaxBws``)
==========  ==========  ==============  ====================================================

NCCL prices every (algorithm, protocol) pair this way and runs the cheapest; :func:`cheapest_protocol` does
the same over these two (LL128, base 14 µs + 1.9 µs per step, never wins against both inside a node here).
The existing functions of ``cluster`` are left as they are: their Simple figures are an upper bound on a
small collective's latency.
"""

from .model import GPU, ring_steps, ring_terms

__all__ = ["NCCL_LL", "protocol_terms", "cheapest_protocol"]

# Ring / LL inside one node (tuning.cc: baseLatencies Ring LL, hwLatencies NVLINK Ring LL, llMaxBws Hopper-N1).
NCCL_LL = {"base": 6.6e-6, "alpha": 0.6e-6, "max_busbw": 141e9, "busbw_share": 0.5}


def protocol_terms(op: str, nbytes: float, world: int, gpu: GPU, protocol: str = "ll") -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of one ring collective inside one node (NVLink), as NCCL's cost
    model prices it for ``protocol``: ``"simple"`` is exactly :func:`ring_terms` (``link="nvlink"``), ``"ll"``
    the LL protocol. ``nbytes`` is the FULL tensor, as for :func:`ring_terms`."""
    if protocol == "simple":
        return ring_terms(op, nbytes, world, gpu, "nvlink")
    if protocol != "ll":
        raise ValueError(f"protocol must be 'simple' or 'll', got {protocol!r}")
    steps = ring_steps(op, world)
    if world <= 1:
        return 0.0, 0.0
    busbw = min(NCCL_LL["max_busbw"], NCCL_LL["busbw_share"] * gpu.nvlink_busbw)
    return steps * nbytes / world / busbw, NCCL_LL["base"] + steps * NCCL_LL["alpha"]


def cheapest_protocol(op: str, nbytes: float, world: int, gpu: GPU) -> tuple[str, float]:
    """(protocol, seconds): the cheaper of LL and Simple for this collective inside one node, as NCCL picks."""
    times = {p: sum(protocol_terms(op, nbytes, world, gpu, p)) for p in ("ll", "simple")}
    best = min(times, key=times.get)
    return best, times[best]


"""NCCL's three protocols, LL, LL128 and Simple, for a ring inside one node: what a collective costs with each;
and NCCL's tree all-reduce across nodes.

:func:`~tensorplay_edu.cluster.model.ring_terms` prices every collective with the latencies of NCCL's
**Simple** protocol (8.4 µs base, 3.4 µs per NVLink step). NCCL also has two cheaper-latency protocols, which
trade bandwidth for latency: **LL** (low latency) sends 8-byte lines whose flag travels with the data, so a step
needs no separate synchronisation, at the price of half of every line; **LL128** does the same with 128-byte
lines of which 8 bytes are flag, so it keeps most of the bandwidth. On one H100 node nccl-tests logs Ring/LL for
all-reduces from 8 B to 1 MB and NVLS/Simple above (NVIDIA/nccl-tests#309).

NCCL's cost model (NVIDIA/nccl ``src/graph/tuning.cc``, the default tuner constants), Ring, one node (NVLink):

==========  ==========  ===============  ===========================================================
protocol    base (µs)   per NVLink step  bus bandwidth
==========  ==========  ===============  ===========================================================
Simple      8.4         3.4              the ring's busBw (``GPU.nvlink_busbw``)
LL          6.6         0.6              half the ring's busBw, at most 141 GB/s on Hopper (``llMaxBws``)
LL128       14.0        1.9              0.92 of the ring's busBw (the per-channel cap, 36.7 GB/s x channels, is
                                         above it on an H100 node and is left out)
==========  ==========  ===============  ===========================================================

NCCL enables LL128 by default on Hopper and Blackwell (tuning.cc, "Enable LL128 by default only on
Hopper/Blackwell"). NCCL prices every (algorithm, protocol) pair this way and runs the cheapest;
:func:`cheapest_protocol` does the same over these three ring protocols. With an H100's figures LL wins small
messages, Simple large ones, and LL128 a middle band where its lower latency outweighs its 8% bandwidth loss
against Simple and its bandwidth outweighs LL's lower latency: for an all-gather on 8 ranks, from about 4.5 MB
to about 24 MB (:func:`ll128_band` computes it), by at most a few percent of the time; on 4 ranks, whose
rings have fewer steps for LL128's lower α to save, never. ``cluster``'s package-level names do not re-export
these; import them from ``tensorplay_edu.cluster.protocols``.

One algorithm besides the ring: :func:`tree_all_reduce_terms` prices an all-reduce across nodes as NCCL's
**tree** runs it: each node sums its GPUs' buffers over NVLink first, then a double binary tree over the nodes
(two trees, each carrying half the buffer, up to reduce and down to broadcast) moves the node sums. Its latency
has tuning.cc's tree form, base + 2·((t/N - 1)·α_intra + log2(N)·α_inter) for t ranks on N nodes (a phase
up, a phase down), priced with the ring's per-step α that :func:`ring_terms` uses (NCCL's own tree α differ,
and change between versions); its bandwidth term carries the bytes that leave a node on average,
2(N-1)/N of the buffer (the busiest nodes, interior in one tree, send up to twice the buffer: NVIDIA/nccl#457),
through the node's NICs, against a ring's 2(t-1)/t. Two nodes of 4 GPUs: 1 buffer per node, not 1.75.

Left out: NCCL may also run an all-gather or a reduce-scatter inside a node as NVLS (NVLink SHARP), and the
all-reduce ``cluster.collective_time`` prices as NVLS; this module compares ring protocols only. The existing
functions of ``cluster`` are left as they are: their Simple figures are an upper bound on a small collective's
latency, and within a few percent in LL128's band.
"""

from .model import GPU, NCCL_BASE_LATENCY, node_busbw, ring_steps, ring_terms

__all__ = ["NCCL_LL", "NCCL_LL128", "PROTOCOLS", "protocol_terms", "cheapest_protocol", "ll128_band",
           "tree_all_reduce_terms"]

# Ring / LL inside one node (tuning.cc: baseLatencies Ring LL, hwLatencies NVLINK Ring LL, llMaxBws Hopper-N1).
NCCL_LL = {"base": 6.6e-6, "alpha": 0.6e-6, "max_busbw": 141e9, "busbw_share": 0.5}
# Ring / LL128 inside one node (tuning.cc: baseLatencies Ring LL128, hwLatencies NVLINK Ring LL128, busBw * 0.92).
NCCL_LL128 = {"base": 14.0e-6, "alpha": 1.9e-6, "busbw_share": 0.92}
PROTOCOLS = ("ll", "ll128", "simple")


def protocol_terms(op: str, nbytes: float, world: int, gpu: GPU, protocol: str = "ll") -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of one ring collective inside one node (NVLink), as NCCL's cost
    model prices it for ``protocol``: ``"simple"`` is exactly :func:`ring_terms` (``link="nvlink"``), ``"ll"``
    the LL protocol, ``"ll128"`` the LL128 one. ``nbytes`` is the FULL tensor, as for :func:`ring_terms`."""
    if protocol == "simple":
        return ring_terms(op, nbytes, world, gpu, "nvlink")
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    steps = ring_steps(op, world)
    if world <= 1:
        return 0.0, 0.0
    if protocol == "ll":
        figures = NCCL_LL
        busbw = min(NCCL_LL["max_busbw"], NCCL_LL["busbw_share"] * gpu.nvlink_busbw)
    else:
        figures = NCCL_LL128
        busbw = NCCL_LL128["busbw_share"] * gpu.nvlink_busbw
    return steps * nbytes / world / busbw, figures["base"] + steps * figures["alpha"]


def cheapest_protocol(op: str, nbytes: float, world: int, gpu: GPU) -> tuple[str, float]:
    """(protocol, seconds): the cheapest of LL, LL128 and Simple for this ring collective inside one node, as
    NCCL picks among them."""
    times = {p: sum(protocol_terms(op, nbytes, world, gpu, p)) for p in PROTOCOLS}
    best = min(times, key=times.get)
    return best, times[best]


def ll128_band(op: str, world: int, gpu: GPU) -> tuple[float, float] | None:
    """(lowest, highest) bytes of the full tensor for which LL128 is the cheapest protocol, or None if it never
    is. Each protocol's time is linear in the bytes, so the band runs from where LL128 overtakes LL to where
    Simple overtakes LL128."""
    def cross(a, b):  # bytes at which protocols a and b cost the same (a has the lower latency)
        bw_a, lat_a = protocol_terms(op, 1.0, world, gpu, a)
        bw_b, lat_b = protocol_terms(op, 1.0, world, gpu, b)
        return (lat_b - lat_a) / (bw_a - bw_b)
    low, high = cross("ll", "ll128"), cross("ll128", "simple")
    return (low, high) if low < high else None


def tree_all_reduce_terms(nbytes: float, world: int, gpu: GPU, nodes: int) -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of one all-reduce of a ``nbytes`` buffer over ``world`` ranks spread
    evenly over ``nodes`` nodes, run as NCCL's tree: summed inside each node over NVLink, then a double binary
    tree across the nodes. Latency: ``NCCL_BASE_LATENCY + 2·((world/nodes - 1)·nvlink_alpha +
    floor(log2(nodes))·ib_alpha)``, tuning.cc's tree form with the ring's per-step figures (tuning.cc raises an
    intra-node step to 3·netOverhead on rings only, so a tree's stays at ``nvlink_alpha``). Bandwidth: the
    ``2(nodes-1)/nodes`` buffers that leave a node on average, through its ``world/nodes`` NICs (their busBw, at
    most NVLink's), as :func:`ring_terms` gives a node's rings. One node: the ring's price (NVLS), as
    :func:`ring_terms`."""
    if world <= 1:
        return 0.0, 0.0
    if nodes <= 1:
        return ring_terms("all_reduce", nbytes, world, gpu, "nvlink")
    bw, per_node = node_busbw(world, nodes, gpu, "tree_all_reduce_terms"), world // nodes
    latency = NCCL_BASE_LATENCY + 2 * ((per_node - 1) * gpu.nvlink_alpha + (nodes.bit_length() - 1) * gpu.ib_alpha)
    return 2 * (nodes - 1) / nodes * nbytes / bw, latency

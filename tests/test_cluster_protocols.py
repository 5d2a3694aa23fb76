"""cluster.protocols: NCCL's LL and LL128 protocols beside Simple for a ring inside one node."""
import math

import pytest

from tensorplay_edu import cluster
from tensorplay_edu.cluster.protocols import (NCCL_LL, NCCL_LL128, cheapest_protocol, ll128_band, protocol_terms,
                                             tree_all_reduce_terms)

H100 = cluster.GPUS["h100"]


def test_simple_is_ring_terms_unchanged():
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        for n in (64e3, 134e6):
            assert protocol_terms(op, n, 8, H100, "simple") == cluster.ring_terms(op, n, 8, H100, "nvlink")


def test_ll_figures_from_tuning_cc():
    bw, lat = protocol_terms("all_gather", 64e3, 8, H100, "ll")
    assert math.isclose(lat, 6.6e-6 + 7 * 0.6e-6)
    assert math.isclose(bw, 7 / 8 * 64e3 / 141e9)                      # Hopper's LL cap, below half of 370
    _, lat_ar = protocol_terms("all_reduce", 64e3, 8, H100, "ll")
    assert math.isclose(lat_ar, NCCL_LL["base"] + 14 * NCCL_LL["alpha"])
    assert protocol_terms("all_gather", 64e3, 1, H100, "ll") == (0.0, 0.0)


def test_ll128_figures_from_tuning_cc():
    bw, lat = protocol_terms("all_gather", 8e6, 8, H100, "ll128")
    assert math.isclose(lat, 14.0e-6 + 7 * 1.9e-6)
    assert math.isclose(bw, 7 / 8 * 8e6 / (0.92 * H100.nvlink_busbw))
    _, lat_ar = protocol_terms("all_reduce", 8e6, 8, H100, "ll128")
    assert math.isclose(lat_ar, NCCL_LL128["base"] + 14 * NCCL_LL128["alpha"])
    # the outside reading's table, 8-rank NVLink all-gather, µs: Simple 51.1, LL 60.4, LL128 47.9 at 8 MB
    got = {p: sum(protocol_terms("all_gather", 8e6, 8, H100, p)) * 1e6 for p in ("simple", "ll", "ll128")}
    assert [round(got[p], 1) for p in ("simple", "ll", "ll128")] == [51.1, 60.4, 47.9], got


def test_ll_small_ll128_middle_simple_large():
    proto, seconds = cheapest_protocol("all_gather", 64e3, 8, H100)
    assert proto == "ll" and seconds < 0.4 * sum(cluster.ring_terms("all_gather", 64e3, 8, H100))
    assert cheapest_protocol("all_gather", 8e6, 8, H100)[0] == "ll128"
    assert cheapest_protocol("all_gather", 16e6, 8, H100)[0] == "ll128"
    assert cheapest_protocol("all_gather", 134e6, 8, H100)[0] == "simple"
    assert cheapest_protocol("all_reduce", 32.0, 8, H100)[0] == "ll"    # notebook 09's amax
    # the reading's figure: with LL a 64 KB all-gather at t = 4 takes about 0.75-0.8 of its time at t = 8
    ratio = sum(protocol_terms("all_gather", 64e3, 4, H100)) / sum(protocol_terms("all_gather", 64e3, 8, H100))
    assert 0.75 < ratio < 0.8, ratio


def test_ll128_band_is_where_it_wins_and_small_gain():
    low, high = ll128_band("all_gather", 8, H100)
    assert 4e6 < low < 5e6 and 23e6 < high < 25e6, (low, high)
    for n in (0.99 * low, 1.01 * low, 0.99 * high, 1.01 * high):
        assert (cheapest_protocol("all_gather", n, 8, H100)[0] == "ll128") == (low < n < high), n
    # inside the band LL128 saves under 7% against the better of the other two
    for n in (low, (low * high) ** 0.5, high):
        other = min(sum(protocol_terms("all_gather", n, 8, H100, p)) for p in ("ll", "simple"))
        assert cheapest_protocol("all_gather", n, 8, H100)[1] > 0.93 * other
    assert ll128_band("all_reduce", 8, H100) is not None
    assert ll128_band("all_gather", 4, H100) is None                   # 3 steps: too few for LL128's α to pay


def test_bad_protocol():
    with pytest.raises(ValueError):
        protocol_terms("all_gather", 1e3, 8, H100, "ll64")


def test_tree_all_reduce_across_nodes():
    n = 134e6                                                            # one [1, 8192, 8192] bf16 activation
    bw, lat = tree_all_reduce_terms(n, 8, H100, nodes=2)                 # 2 nodes x 4 GPUs: one buffer leaves a node
    assert math.isclose(bw, n / (4 * H100.ib_busbw))
    assert math.isclose(lat, cluster.NCCL_BASE_LATENCY + 2 * (3 * H100.nvlink_alpha + 1 * H100.ib_alpha))
    ring_bw, ring_lat = cluster.ring_terms("all_reduce", n, 8, H100, "ib", nodes=2)
    assert math.isclose(ring_bw / bw, 2 * 7 / 8) and lat < ring_lat          # the ring sends 2(t-1)/t buffers
    assert sum(cluster.ring_terms("all_reduce", n, 8, H100)) < bw + lat       # still over NVLink (NVLS)
    # one GPU per node: the tree's bytes are the ring's, 2(N-1)/N, and its latency grows as log2(N), not N
    bw8, lat8 = tree_all_reduce_terms(n, 8, H100, nodes=8)
    assert math.isclose(bw8, cluster.ring_terms("all_reduce", n, 8, H100, "ib")[0])
    assert math.isclose(lat8, cluster.NCCL_BASE_LATENCY + 2 * 3 * H100.ib_alpha)
    assert tree_all_reduce_terms(n, 8, H100, nodes=1) == cluster.ring_terms("all_reduce", n, 8, H100, "nvlink")
    assert tree_all_reduce_terms(n, 1, H100, nodes=1) == (0.0, 0.0)
    with pytest.raises(ValueError):
        tree_all_reduce_terms(n, 8, H100, nodes=3)

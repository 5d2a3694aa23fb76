"""cluster.protocols: NCCL's LL protocol beside Simple for a ring inside one node."""
import math

import pytest

from tensorplay_edu import cluster
from tensorplay_edu.cluster import NCCL_LL, cheapest_protocol, protocol_terms

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


def test_ll_for_small_simple_for_large():
    proto, seconds = cheapest_protocol("all_gather", 64e3, 8, H100)
    assert proto == "ll" and seconds < 0.4 * sum(cluster.ring_terms("all_gather", 64e3, 8, H100))
    assert cheapest_protocol("all_gather", 134e6, 8, H100)[0] == "simple"
    # the reading's figure: with LL a 64 KB all-gather at t = 4 takes about 0.75-0.8 of its time at t = 8
    ratio = sum(protocol_terms("all_gather", 64e3, 4, H100)) / sum(protocol_terms("all_gather", 64e3, 8, H100))
    assert 0.75 < ratio < 0.8, ratio


def test_bad_protocol():
    with pytest.raises(ValueError):
        protocol_terms("all_gather", 1e3, 8, H100, "ll128")

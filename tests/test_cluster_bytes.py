"""cluster.dp_bytes (the bytes dp_seconds prices)."""

import pytest

from tensorplay_edu.cluster import GPUS, MODELS, Setup, bytes_sent, dp_bytes, dp_seconds

M70, H100 = MODELS["llama3-70b"], GPUS["h100"]


def test_fsdp_bytes_count_every_unit_and_not_the_batch():
    s = Setup(tp=8, sp=True, loss_parallel=True, dp=8, fsdp=True, batch=1, seq=8192)
    block, edge = M70.layer_params() / 8, M70.vocab * M70.dim / 8
    want = 7 / 8 * (M70.layers * block * (2 * 2 + 4) + 2 * edge * (2 * 2 + 4))  # 2 bf16 gathers, 1 fp32 scatter
    got = dp_bytes(M70, s)
    assert got == {"per_micro_batch": pytest.approx(want), "per_step": 0.0}
    assert dp_bytes(M70, Setup(tp=8, sp=True, dp=8, fsdp=True, batch=4, seq=8192)) == got  # per micro-batch
    assert 7 / 8 * 8 * M70.params() / 8 == pytest.approx(want, rel=0.01)  # ~ (dp-1)/dp x 8 bytes x params / tp
    bf16 = dp_bytes(M70, Setup(tp=8, sp=True, dp=8, fsdp=True, reduce_fp32=False))["per_micro_batch"]
    assert bf16 == pytest.approx(want * 6 / 8)


def test_fsdp_bytes_are_what_dp_seconds_prices():
    s = Setup(tp=8, sp=True, dp=8, fsdp=True)  # one rank of each DP group per node: IB at one NIC's busBw
    seconds, nbytes = dp_seconds(M70, s, H100)["per_micro_batch"], dp_bytes(M70, s)["per_micro_batch"]
    assert nbytes / H100.ib_busbw < seconds < 1.03 * nbytes / H100.ib_busbw  # + the latencies: 2%


def test_ddp_bytes_one_all_reduce_per_step():
    s = Setup(tp=2, dp=4)
    want = bytes_sent("all_reduce", 4 * (M70.params() - M70.norm_params()) / 2, 4)
    assert dp_bytes(M70, s) == {"per_micro_batch": 0.0, "per_step": pytest.approx(want)}
    assert dp_bytes(M70, Setup(tp=8)) == {"per_micro_batch": 0.0, "per_step": 0.0}

"""Float8 tensorwise tensor parallelism (tensorplay_edu.float8) against one process: the same
float8 model on one device (the same scales; only summation order differs), the high-precision
model over 30 steps, and every collective of a step (float8 all-gathers at 1 byte per element)."""

import functools
import math
from collections import Counter

import pytest

import rank_float8
import rank_parallelize_module
from checks import clean
from tensorplay_edu import launch

L, B, S, H = 2, 2, 12, 48  # rank_float8.ARGS and its batch


@pytest.mark.parametrize("plan", ["vanilla", "full"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_float8_tp_equals_the_float8_model_on_one_device(plan, world_size):
    """float64 model, matmuls emulated in float64: each cast sees the same global amax, and values that
    differ from one device's only by summation order (~1e-16, far below float8's rounding; not identical by
    construction, so a value on a rounding boundary could flip): rtol 1e-9 on everything."""
    clean(launch(functools.partial(rank_float8.against_one_device, plan, "float64"), world_size), at_least=180)


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_float8_tp_with_scaled_mm_equals_one_device(plan):
    """float32 model: torch._scaled_mm (float32 accumulation) on both sides (rtol 2e-5), trained with SGD
    (AdamW's weights are compared in float64 above: rank_float8.against_one_device says why)."""
    clean(launch(functools.partial(rank_float8.against_one_device, plan, "float32"), 4), at_least=90)




@pytest.mark.parametrize("world_size", [2, 4])
def test_apply_tp_with_enable_float8_tensorwise_tp(world_size):
    """tensorplay_edu.models.apply_tp always; torchtitan's verbatim text too when ../shared/seeds is
    there, with only its float8 import pointed at tensorplay_edu.float8."""
    seed = rank_parallelize_module.seed_apply_tp_text()
    sources = [None] + ([seed] if seed else [])
    for source in sources:
        assert source is None or "torchao.float8.float8_tensor_parallel" in source
        clean(launch(functools.partial(rank_float8.seed_float8, source), world_size), at_least=180)


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_float8_tp_trains_like_high_precision(plan):
    """30 AdamW steps: the float8 TP loss stays within 5% of the high-precision single-device loss (measured:
    2.4% at worst, near the end where the loss is small; 0.015 absolute)."""
    losses = launch(functools.partial(rank_float8.against_high_precision, plan), 2)[0]
    f8, hp = losses["float8 tp"], losses["high precision"]
    assert len(f8) == 30 and f8[-1] < f8[0] / 3  # it learns
    worst = max(abs(a - b) / b for a, b in zip(f8, hp))
    assert worst < 0.05, worst


def _grouped(records):
    """{(phase, op, dtype, 'scalar' or 'tensor'): (count, bytes)}"""
    out = Counter(), Counter()
    for phase, op, dtype, shape, nbytes, _ in records:
        key = (phase, op, dtype, "scalar" if shape == () else "tensor")
        out[0][key] += 1
        out[1][key] += nbytes
    return {k: (out[0][k], out[1][k]) for k in out[0]}


@pytest.mark.parametrize("t", [2, 4])
def test_collectives_of_a_float8_step_full_plan(t):
    """SP + float8: the block inputs are gathered in e4m3 and wo/w2's output gradients in e5m2, at 1 byte
    per element; sums stay in float32; one max all-reduce per sharded tensor cast."""
    act = (t - 1) * math.ceil(S / t) * B * H  # elements each rank sends to gather / scatter one [b, s, h]
    amax = 2 * (t - 1) * 4  # an all-reduce of one float32
    got = _grouped(launch(functools.partial(rank_float8.step_records, "full", True), t)[0])
    want = {
        ("forward", "all_gather", "float8_e4m3fn", "tensor"): (2 * L, 2 * L * act),  # attention, feed_forward
        ("forward", "all_gather", "float32", "tensor"): (1, 4 * act),  # in front of the (high-precision) output
        ("forward", "reduce_scatter", "float32", "tensor"): (2 * L + 1, (2 * L + 1) * 4 * act),
        ("forward", "all_reduce", "float32", "scalar"): (11 * L, 11 * L * amax),  # 2 inputs, 7 weights, 2 rowwise in
        ("forward", "all_reduce", "float32", "tensor"): (3, None),  # loss_parallel
        ("backward", "all_gather", "float8_e5m2", "tensor"): (2 * L, 2 * L * act),  # wo, w2 output gradients
        ("backward", "all_gather", "float32", "tensor"): (1, 4 * act),  # the embedding's
        ("backward", "reduce_scatter", "float32", "tensor"): (2 * L + 1, (2 * L + 1) * 4 * act),
        ("backward", "all_reduce", "float32", "scalar"): (7 * L, 7 * L * amax),  # 7 output gradients per block
        ("backward", "all_reduce", "float32", "tensor"): (2 * L + 1, None),  # the norm weights
    }
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in want.items()}
    for key, (_, nbytes) in want.items():
        assert nbytes is None or got[key][1] == nbytes, (key, got[key], nbytes)
    hp = _grouped(launch(functools.partial(rank_float8.step_records, "full", False), t)[0])
    assert hp[("forward", "all_gather", "float32", "tensor")] == (2 * L + 1, (2 * L + 1) * 4 * act)  # 4x the bytes


@pytest.mark.parametrize("t", [2, 4])
def test_collectives_of_a_float8_step_vanilla_plan(t):
    """No sequence parallelism: nothing is gathered in float8 (replicated inputs are cast locally);
    the all-reduces of activations stay float32; max all-reduces for weight shards, rowwise inputs
    and column-sharded output gradients."""
    full = 2 * (t - 1) * math.ceil(B * S * H / t) * 4  # an all-reduce of one float32 [b, s, h]
    amax = 2 * (t - 1) * 4
    got = _grouped(launch(functools.partial(rank_float8.step_records, "vanilla", True), t)[0])
    want = {
        ("forward", "all_reduce", "float32", "tensor"): (2 * L + 1, (2 * L + 1) * full),  # g: wo, w2, embedding
        ("forward", "all_reduce", "float32", "scalar"): (9 * L, 9 * L * amax),  # 7 weights, 2 rowwise inputs
        ("forward", "all_gather", "float32", "tensor"): (1, None),  # the logits
        ("backward", "all_reduce", "float32", "tensor"): (2 * L + 1, (2 * L + 1) * full),  # f per block input, output
        ("backward", "all_reduce", "float32", "scalar"): (5 * L, 5 * L * amax),  # wq wk wv w1 w3 output gradients
    }
    assert got == {k: (v[0], got.get(k, (0, 0))[1] if v[1] is None else v[1]) for k, v in want.items()}


def test_scaling_as_torchao():
    import torch

    from tensorplay_edu.float8.scaling import E4M3, E5M2, amax, cast, quantize, to_scale

    x = torch.tensor([0.5, -3.0, 1e-3, 2.0])
    q = quantize(x, E4M3)
    assert q.scale.dtype == torch.float32 and q.scale == torch.tensor(448 / 3.0, dtype=torch.float64).float()
    assert q.data.dtype == E4M3 and q.data.float().abs().max() == 448  # amax lands on FP8_MAX
    assert torch.allclose(q.dequantize(torch.float32), x, rtol=0.07, atol=1e-3)  # 3 mantissa bits
    assert to_scale(torch.tensor(0.0), E4M3) == torch.tensor(448 / 1e-12, dtype=torch.float64).float()  # eps
    huge = torch.tensor([1e9, -1e9, float("inf")])
    assert cast(huge, torch.tensor(1.0), E5M2).float().tolist() == [57344.0, -57344.0, 57344.0]  # saturates
    assert huge[:2].to(E5M2).float().isinf().all()  # where a plain CPU cast does not
    assert amax(torch.zeros(0)) == 0  # an empty piece (a rank holding no rows)


def test_float8_matmul_paths_agree():
    import torch

    from tensorplay_edu.float8.float8_linear import float8_mm
    from tensorplay_edu.float8.scaling import E4M3, quantize

    a, b = quantize(torch.randn(8, 32), E4M3), quantize(torch.randn(32, 16), E4M3)
    exact = (a.data.double() @ b.data.double()) / (a.scale.double() * b.scale.double())
    scaled_mm = float8_mm(a.data, a.scale, b.data, b.scale, torch.float32, emulate=False)  # torch._scaled_mm
    emulated = float8_mm(a.data, a.scale, b.data, b.scale, torch.float32, emulate=True)
    assert torch.allclose(scaled_mm.double(), exact, rtol=1e-5, atol=1e-5)
    assert torch.allclose(emulated.double(), exact, rtol=1e-5, atol=1e-5)
    assert torch.allclose(float8_mm(a.data, a.scale, b.data, b.scale, torch.float64, False), exact, rtol=1e-12)
    # what a GPU gets when a shard is no multiple of 16 (here K = 20, N = 12): zero padding changes nothing
    c, d = quantize(torch.randn(8, 20), E4M3), quantize(torch.randn(20, 12), E4M3)
    plain = float8_mm(c.data, c.scale, d.data, d.scale, torch.float32, emulate=False, pad_to=1)
    padded = float8_mm(c.data, c.scale, d.data, d.scale, torch.float32, emulate=False, pad_to=16)
    assert padded.shape == (8, 12) and torch.equal(padded, plain)


def test_float8_is_gathered_never_summed():
    results = launch(rank_float8.float8_collectives, 3)
    assert all(r == {"gathered": True, "sum refused": True} for r in results), results

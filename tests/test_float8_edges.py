"""The edges of float8 training and float8 tensor parallelism, against one device:

* a Float8Linear under the plain ColwiseParallel / RowwiseParallel (torchtitan's rowwise recipes
  and the seed's apply_tp with enable_float8_tensorwise_tp=False do this): global amaxes, a float8
  row-split matmul, high-precision communication, equal to the float8 model on one device;
* biased Float8Linears under the float8 and the plain styles (each bias added once);
* Float8Linear's three products against float64 autograd on the dequantized operands (a check
  that shares no code with the package's rescaling);
* the emulation's numerics against torch._scaled_mm (float32 products, one cast), float64 amaxes;
* torchtitan's converter calls of Float8LinearConfig.

On main before issue 18: plain styles gave per-rank amaxes (colwise) and a high-precision row
split; the emulation multiplied in bf16 (47.7-48.5 dB); Float8LinearConfig took only `emulate`."""

import functools
import math

import pytest
import torch

import rank_float8_edges
import rank_parallelize_module
from checks import clean
from tensorplay_edu import launch
from tensorplay_edu.float8 import Float8Linear, Float8LinearConfig
from tensorplay_edu.float8.float8_linear import float8_mm
from tensorplay_edu.float8.scaling import E4M3, E5M2, amax, quantize, to_scale


@pytest.mark.parametrize("world_size", [2, 3])
def test_float8_linear_under_the_plain_styles_through_the_seeds_apply_tp(world_size):
    seed = rank_parallelize_module.seed_apply_tp_text()
    for source in [None] + ([seed] if seed else []):
        clean(launch(functools.partial(rank_float8_edges.plain_styles_seed, source), world_size), at_least=180)


def test_float8_linear_under_the_plain_styles_full_plan():
    clean(launch(rank_float8_edges.plain_styles_full_plan, 2), at_least=180)


def test_plain_styles_take_global_amaxes_and_move_high_precision():
    got = launch(rank_float8_edges.plain_styles_amaxes, 2)[0]
    assert got["scalar all-reduces"] > 0 and got["float8 moved"] == [], got


@pytest.mark.parametrize("out", ["replicate", "shard0"])
@pytest.mark.parametrize("styles", ["float8", "plain"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_biased_float8_mlp(world_size, styles, out):
    clean(launch(rank_float8_edges.biased_mlp, world_size, styles, out), at_least=44)


@pytest.mark.parametrize("config", ["recipe", "fsdp all-gather, emulate", "recompute weight", "power of 2 scales"])
def test_torchtitans_converter_calls(config):
    """Each config in float64 (SGD and AdamW) and, but the emulated one, in float32 through torch._scaled_mm (SGD)."""
    clean(launch(rank_float8_edges.torchtitan_converter, 2, config), at_least=180 if "emulate" in config else 270)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("recompute", [False, True])
def test_the_three_products_against_float64_autograd_on_dequantized_operands(dtype, tol, recompute):
    torch.manual_seed(0)
    lin = Float8Linear(24, 16, bias=False, config=Float8LinearConfig(force_recompute_fp8_weight_in_bwd=recompute))
    lin = lin.to(dtype)
    x = (3 * torch.randn(5, 24, dtype=dtype)).requires_grad_()
    g = 40 * torch.randn(5, 16, dtype=dtype)
    lin(x).backward(g)
    y = lin(x.detach())
    # the reference: dequantize by hand (data / scale, in float64) and let autograd multiply
    x8, w8, g8 = quantize(x.detach(), E4M3), quantize(lin.weight.detach(), E4M3), quantize(g, E5M2)
    xd, wd = (t.data.double() / t.scale.double() for t in (x8, w8))
    xd.requires_grad_(), wd.requires_grad_()
    y_ref = xd @ wd.t()
    y_ref.backward(g8.data.double() / g8.scale.double())
    for what, got, want in (("y", y, y_ref), ("grad x", x.grad, xd.grad), ("grad W", lin.weight.grad, wd.grad)):
        torch.testing.assert_close(got.double(), want.detach(), rtol=tol, atol=tol * want.abs().max().item(),
                                   msg=what)



def test_recompute_casts_the_weight_again_with_the_forward_scale(monkeypatch):
    """force_recompute_fp8_weight_in_bwd, as torchao: backward casts the weight with the scale saved in forward,
    so the only amax it takes is the output gradient's (no second weight amax all-reduce under TP)."""
    import tensorplay_edu.float8.float8_linear as fl

    calls, real = [], fl.quantize
    monkeypatch.setattr(fl, "quantize", lambda x, fp8, *a, **k: calls.append(fp8) or real(x, fp8, *a, **k))
    lin = Float8Linear(24, 16, bias=False, config=Float8LinearConfig(force_recompute_fp8_weight_in_bwd=True)).double()
    y = lin(torch.randn(5, 24, dtype=torch.float64))
    assert calls == [E4M3, E4M3]  # forward: the input and the weight
    calls.clear()
    y.sum().backward()
    assert calls == [E5M2]

def _sqnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    noise = (x - ref).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(ref.pow(2).sum().item() / noise)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_emulation_computes_in_float32_as_scaled_mm(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 96, generator=g).to(dtype), torch.randn(96, 48, generator=g).to(dtype)
    qa, qb = quantize(a, E4M3), quantize(b.t().contiguous(), E4M3)
    ref = (qa.data.double() / qa.scale.double()) @ (qb.data.t().double() / qb.scale.double())  # the exact product
    emulated = float8_mm(qa.data, qa.scale, qb.data.t(), qb.scale, dtype, emulate=True)
    kernel = float8_mm(qa.data, qa.scale, qb.data.t(), qb.scale, dtype, emulate=False)
    assert emulated.dtype == kernel.dtype == dtype
    assert abs(_sqnr(emulated.double(), ref) - _sqnr(kernel.double(), ref)) < 0.5  # was 7 dB below
    assert _sqnr(emulated.double(), kernel.double()) > 45  # the same float32 products (measured: identical)


def test_float64_amax_and_scale_are_not_rounded_to_float32():
    x = torch.tensor([1.0 + 2.0**-40, -0.5], dtype=torch.float64)  # 1 + 2^-40 is 1.0 in float32
    assert amax(x).dtype == torch.float64 and amax(x).item() == 1.0 + 2.0**-40
    assert to_scale(amax(x), E4M3).item() == torch.tensor(448 / (1.0 + 2.0**-40)).float().item()


def test_power_of_2_scales():
    scale = to_scale(torch.tensor(3.0), E4M3, power_of_2=True)
    assert scale.item() == 128.0  # 448 / 3 = 149.3, rounded down to a power of 2


def test_float8_linear_config_fields_and_recipes():
    from tensorplay_edu.float8 import precompute_float8_dynamic_scale_for_fsdp

    cfg = Float8LinearConfig.from_recipe_name("tensorwise")
    assert cfg == Float8LinearConfig()
    for recipe in ("rowwise", "rowwise_with_gw_hp"):
        with pytest.raises(NotImplementedError, match="only 'tensorwise'"):
            Float8LinearConfig.from_recipe_name(recipe)
    with pytest.raises(ValueError, match="recipe_name must be one of"):
        Float8LinearConfig.from_recipe_name("tensorwize")
    with pytest.raises(TypeError, match="cast_config_input"):
        Float8LinearConfig(cast_config_input=None)  # a field torchao has and this package does not
    lin = Float8Linear(16, 16, config=Float8LinearConfig(force_recompute_fp8_weight_in_bwd=True,
                                                         round_scales_to_power_of_2=True))
    assert lin.float8_spec.recompute_weight and lin.float8_spec.power_of_2
    assert precompute_float8_dynamic_scale_for_fsdp(lin) is None

"""Rank code for the edges of float8 tensor parallelism: a Float8Linear under the plain
(high-precision) styles, biased Linears under the float8 styles, torchtitan's converter calls."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn

from checks import Checker
from rank_float8 import against_one_device, float8_llama
from rank_parallel import train_compare
from tensorplay_edu import CommDebugMode, Replicate, Shard, init_device_mesh
from tensorplay_edu.float8 import Float8LinearConfig, convert_to_float8_training
from tensorplay_edu.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, parallelize_llama
from tensorplay_edu.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def plain_styles_seed(source: str | None) -> tuple[list[str], int]:
    """torchtitan's apply_tp with enable_float8_tensorwise_tp=False on a converted model: the plain
    styles, global amaxes, communication in high precision; equal to the float8 model on one device."""
    from rank_parallelize_module import seed_apply_tp

    return against_one_device("vanilla", "float64", apply=seed_apply_tp(source, float8=False))


def plain_styles_full_plan() -> tuple[list[str], int]:
    """The full plan (sequence parallelism) with the plain styles on a converted model."""
    return against_one_device("full", "float64", apply=lambda m, mesh: parallelize_llama(m, mesh, "full"))


def plain_styles_amaxes() -> dict:
    """What a step of the vanilla plan with plain styles issues: amax all-reduces (one number each)
    beside the high-precision all-reduces of activations."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = parallelize_llama(float8_llama(), mesh, "vanilla")
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    with CommDebugMode() as comm:
        llama_loss(model(tokens), tokens).backward()
    return {"scalar all-reduces": sum(r.op == "all_reduce" and r.shape == () for r in comm.records),
            "float8 moved": sorted({r.dtype for r in comm.records if "float8" in r.dtype})}


def _mlp(bias: bool = True):
    return convert_to_float8_training(nn.Sequential(nn.Linear(10, 16, bias=bias), nn.ReLU(),
                                                    nn.Linear(16, 10, bias=bias)))


def biased_mlp(styles: str, out: str) -> tuple[list[str], int]:
    """A biased Float8Linear MLP, Colwise then Rowwise (output Replicate or Shard(0)), against the same
    float8 MLP on one device: each bias added once, its gradient whole."""
    colwise, rowwise = (Float8ColwiseParallel, Float8RowwiseParallel) if styles == "float8" else \
        (ColwiseParallel, RowwiseParallel)
    out_layout = Replicate() if out == "replicate" else Shard(0)
    plan = lambda m, mesh: parallelize_module(m, mesh, {"0": colwise(), "2": rowwise(output_layouts=out_layout)})  # noqa: E731
    return train_compare(f"float8 MLP {styles} styles -> {out}", _mlp, plan,
                         lambda g, dt: torch.randn(12, 10, generator=g, dtype=dt), out_layout=out_layout,
                         dtype=torch.float64)


def module_filter_fn(mod: nn.Module, fqn: str, filter_fqns: list[str]) -> bool:
    """torchtitan's filter (components/quantization/utils.py), in our words: a Linear whose dims are
    multiples of 16 and whose path names none of filter_fqns."""
    if not isinstance(mod, nn.Linear):
        return False
    dims_ok = mod.in_features % 16 == 0 and mod.out_features % 16 == 0
    return dims_ok and not any(f in fqn for f in filter_fqns)


def torchtitan_converter(config_name: str) -> tuple[list[str], int]:
    """The model converted the ways torchtitan's converter builds its config, trained under the float8
    styles against the same config on one device."""
    configs = {
        "recipe": lambda: Float8LinearConfig.from_recipe_name("tensorwise"),
        "fsdp all-gather, emulate": lambda: Float8LinearConfig(enable_fsdp_float8_all_gather=True, emulate=True),
        "recompute weight": lambda: Float8LinearConfig(force_recompute_fp8_weight_in_bwd=True),
        "power of 2 scales": lambda: Float8LinearConfig(round_scales_to_power_of_2=True),
    }
    args = ModelArgs(dim=48, n_layers=2, n_heads=12, vocab_size=50, max_seq_len=24, ffn_hidden=64)

    def build():
        model = Transformer(args)
        return convert_to_float8_training(model, config=configs[config_name](),
                                          module_filter_fn=functools.partial(module_filter_fn, filter_fqns=["output"]))

    labels = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(5))

    def loss_of(logits):
        from tensorplay_edu.models import loss_context
        from tensorplay_edu import DTensor
        with loss_context("full" if isinstance(logits, DTensor) else "vanilla"):
            return llama_loss(logits, labels)

    check = Checker()
    fails, n = [], 0
    # float64 (matmuls emulated): SGD and AdamW; float32 (torch._scaled_mm): SGD, as rank_float8.against_one_device
    for dtype in (torch.float64,) if config_name == "fsdp all-gather, emulate" else (torch.float64, torch.float32):
        more, count = train_compare(f"converter {config_name}", build,
                                    lambda model, mesh: parallelize_llama(model, mesh, "full", float8=True),
                                    lambda g, dt: torch.randint(0, 50, (2, 12), generator=g), loss_of=loss_of,
                                    dtype=dtype, input_grad=False,
                                    optimizers=("sgd", "adamw") if dtype == torch.float64 else ("sgd",))
        fails, n = fails + more, n + count
    converted = build()
    kinds = {type(m).__name__ for name, m in converted.named_modules() if name.startswith("layers")}
    check("the blocks' Linears are Float8Linears", "Float8Linear" in kinds and "Linear" not in kinds)
    check("the output layer stays high precision", type(converted.output) is nn.Linear)
    return fails + check.fails, n + check.n

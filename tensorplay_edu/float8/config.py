"""Float8LinearConfig: torchao's fields that torchtitan's float8 converter passes, with what
each one does here.

torchtitan builds its config one of three ways (tensorwise recipe):
``Float8LinearConfig(enable_fsdp_float8_all_gather=..., emulate=...)``,
``Float8LinearConfig.from_recipe_name("tensorwise")`` and, in older releases, with
``force_recompute_fp8_weight_in_bwd=...``; then ``convert_to_float8_training(model,
config=config, module_filter_fn=...)``, and after each optimizer step, when FSDP float8
all-gathers are on, ``precompute_float8_dynamic_scale_for_fsdp(model)``.  All of these run:

=================================  =========================================================
field                              here
=================================  =========================================================
``emulate``                        never ``torch._scaled_mm``: the float8 operands upcast, the
                                   products and the rescale in float32 (float64 for a float64
                                   model), one cast to the output dtype (torchao's emulation)
``force_recompute_fp8_weight_      the float8 weight is not saved for backward: it is cast
in_bwd``                           again from the high-precision weight with the scale saved
                                   in forward (the same values, no second amax all-reduce), as
                                   torchao's ``Float8Linear.forward``; torchao plans to deprecate
                                   the flag (ao#2251; the open ao#2356 makes it a no-op)
``round_scales_to_power_of_2``     each scale rounded down to a power of 2 (torchao's rowwise
                                   recipes use it; exact rescaling)
``enable_fsdp_float8_all_gather``  accepted, changes nothing: FSDP2 all-gathers the weight in
                                   its own dtype and each rank then casts it with the global
                                   amax, the same float8 weight torchao's float8 all-gather
                                   makes, for 2 or 4 times its all-gather bytes
``pad_inner_dim``                  accepted, changes nothing: on a GPU the inner dims are
                                   always zero-padded to multiples of 16 (``float8_mm``)
=================================  =========================================================

Only the tensorwise recipe exists here: ``from_recipe_name("rowwise")`` is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

__all__ = ["Float8LinearConfig", "precompute_float8_dynamic_scale_for_fsdp"]

_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


@dataclass(frozen=True)
class Float8LinearConfig:
    emulate: bool = False
    force_recompute_fp8_weight_in_bwd: bool = False
    round_scales_to_power_of_2: bool = False
    enable_fsdp_float8_all_gather: bool = False
    pad_inner_dim: bool = False

    @classmethod
    def from_recipe_name(cls, recipe_name) -> "Float8LinearConfig":
        """torchao's named recipes; this package implements ``"tensorwise"`` (torchao's default)."""
        name = getattr(recipe_name, "value", recipe_name)  # torchao's Float8LinearRecipeName enum, or its string
        if name == "tensorwise":
            return cls()
        if name in _RECIPES:
            raise NotImplementedError(f"Float8LinearConfig.from_recipe_name({name!r}): only 'tensorwise' is "
                                      "implemented here (one scale per tensor); rowwise scaling is not")
        raise ValueError(f"Float8LinearConfig.from_recipe_name({name!r}): recipe_name must be one of {_RECIPES}")


def precompute_float8_dynamic_scale_for_fsdp(module: nn.Module) -> None:
    """torchao's hook after each optimizer step for FSDP float8 all-gathers: nothing to do here
    (the weights are cast, with their global amax, when the forward reads them)."""
    return None

"""What every style shares: the base class, a module's path, and the claims that catch a
module parallelized twice (a second style would shard twice, or gather twice)."""

from __future__ import annotations

from torch import nn

from ..mesh import DeviceMesh
from ..placement import Placement

__all__ = ["ParallelStyle", "fqn", "claim", "one_placement"]


class ParallelStyle:
    """A way to parallelize one module: subclasses implement ``_apply(module, device_mesh)``.

    ``claims`` names what a style takes over on a module: ``"shard"`` (its parameters and
    forward), ``"input"`` or ``"output"`` (a hook converting them).  Each may be taken once:
    a second style claiming the same thing would shard twice or convert twice.
    ``_validate`` raises, without changing anything, the errors ``_apply`` would raise, so
    that ``parallelize_module`` can check a whole plan before it shards anything.
    """

    src_data_rank: int | None = 0
    claims: tuple[str, ...] = ()

    def _validate(self, module: nn.Module) -> None:
        for claim in self.claims:
            taken = getattr(module, "_tp_claims", {}).get(claim)
            if taken:
                raise RuntimeError(_TWICE[claim].format(style=type(self).__name__, path=fqn(module), by=taken))

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        raise NotImplementedError

    def param_placements(self, module: nn.Module) -> dict[tuple[nn.Module, str], Placement] | None:
        """Where ``_apply`` will put each parameter it shards, ``{(owner, name): placement}``
        (``{}``: it shards none; ``None``: unknown).  parallelize_module checks tied weights with it."""
        return None


_TWICE = {
    "shard": "distribute_module should only be called once on a module, but it has already been called on this "
             "module! ({style} on '{path}', already parallelized by {by})",
    "input": "{style} on '{path}': its inputs are already converted by {by}; a second input hook would convert "
             "them twice (e.g. gather twice). Use one PrepareModuleInput per module.",
    "output": "{style} on '{path}': its outputs are already converted by {by}; a second output hook would convert "
              "them twice. Use one PrepareModuleOutput per module.",
}


def fqn(module: nn.Module) -> str:
    """The module's path as parallelize_module saw it (its class name otherwise)."""
    return getattr(module, "_tp_fqn", "") or type(module).__name__


def claim(style: ParallelStyle, module: nn.Module) -> None:
    """Check that ``style`` may be applied to ``module``, then record what it takes over."""
    style._validate(module)
    if not hasattr(module, "_tp_claims"):
        module._tp_claims = {}
    for what in style.claims:
        module._tp_claims[what] = type(style).__name__


def one_placement(style: ParallelStyle, **layouts) -> None:
    """Refuse a layout argument that is not one Placement, at construction (not at the first forward)."""
    for arg, value in layouts.items():
        if value is not None and not isinstance(value, Placement):
            kind = f"a {type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list)) else \
                f"{value!r}, a {type(value).__name__}"
            raise TypeError(f"{type(style).__name__}({arg}=...) takes one Placement (the layout on the 1-D TP "
                            f"mesh), got {kind}: e.g. {arg}=Shard(-1) or {arg}=Replicate()")

"""parallelize_module: apply a style, or a plan ``{module path: style}``, to a model.

Paths are matched one dotted level at a time with ``fnmatch`` (``layers.*.attention.wq``:
a ``*`` never crosses a dot); ``""`` is the module itself.  Unlike PyTorch, which only
warns, a key that matches no module is a ValueError listing the closest real paths:
a typo would otherwise silently leave a layer unsharded.

The whole plan is checked before anything is sharded (unknown keys, a style on a module
it cannot handle, two styles claiming one module, a module parallelized before): a plan
with a mistake changes nothing, so the corrected plan can be applied to the same model.
"""

from __future__ import annotations

import difflib
import fnmatch
import warnings

from torch import nn

from ..mesh import DeviceMesh, get_current_mesh
from .style import ParallelStyle

__all__ = ["parallelize_module"]


def _matches(module: nn.Module, path: str, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """Submodules whose path (relative to ``module``) matches ``path`` level by level."""
    if path == "":
        return [(prefix, module)]
    token, _, rest = path.partition(".")
    found = []
    for name, child in module.named_children():
        if fnmatch.fnmatch(name, token):
            found += _matches(child, rest, f"{prefix}{name}." if rest else f"{prefix}{name}")
    return found


def parallelize_module(module: nn.Module, device_mesh: DeviceMesh | None = None, parallelize_plan=None, *,
                       src_data_rank: int | None = 0) -> nn.Module:
    """Parallelize ``module`` in place with a style or a plan; returns ``module``.

    Args:
        device_mesh: a 1-D mesh (``mesh["tp"]`` of a bigger one); default: the mesh of ``with mesh:``.
        parallelize_plan: a ParallelStyle, or a dict from module path to ParallelStyle.
        src_data_rank: the rank whose parameters are scattered / broadcast; ``None`` = keep each rank's own.
    """
    device_mesh = device_mesh if device_mesh is not None else get_current_mesh()
    if device_mesh is None:
        raise RuntimeError("No device mesh is currently active! Pass device_mesh or call inside `with mesh:`.")
    if device_mesh.ndim != 1:
        raise ValueError(f"Tensor Parallel only accepts a 1D DeviceMesh, but found {device_mesh.ndim}D! If you have "
                         'a 2-D or N-D device_mesh, consider passing in device_mesh["tp"]')
    if parallelize_plan is None:
        warnings.warn("No parallelize_plan is provided and auto-parallel is not supported at the moment, "
                      "so this parallelize_module call will do nothing.")
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        parallelize_plan = {"": parallelize_plan}
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"Expect Union[ParallelStyle, Dict[str, ParallelStyle]] for parallelize_plan, "
                        f"{type(parallelize_plan)} found!")
    base = getattr(module, "_tp_fqn", "")
    for name, sub in module.named_modules():  # paths for errors and CommDebugMode, from the outermost call
        if not hasattr(sub, "_tp_fqn"):
            sub._tp_fqn = f"{base}.{name}" if base and name else (name or base)
    work = _resolve_plan(module, parallelize_plan)  # every error is raised here, before anything changes
    for style, target in work:
        style.src_data_rank = src_data_rank
        style._apply(target, device_mesh)
    return module


def _resolve_plan(module: nn.Module, plan: dict) -> list[tuple[ParallelStyle, nn.Module]]:
    """The (style, module) pairs of a plan, checked as a whole without changing anything."""
    work, claimed = [], {}  # claimed: (id of a module, what) -> the plan key that takes it
    for path, style in plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"parallelize_plan['{path}'] is a {type(style).__name__}, not a ParallelStyle")
        hits = _matches(module, path)
        if not hits:
            every = [name for name, _ in module.named_modules() if name]
            close = difflib.get_close_matches(path, every, n=5, cutoff=0.5) or every[:5]
            raise ValueError(f"parallelize_plan key '{path}' matches no submodule of {type(module).__name__}; "
                             f"closest existing paths: {close}")
        for name, target in hits:
            style._validate(target)
            for what in style.claims:
                other = claimed.setdefault((id(target), what), path)
                if other != path:
                    raise ValueError(f"parallelize_plan keys '{other}' and '{path}' both match '{name or '(root)'}' "
                                     f"and would both take its {what}: make the keys match disjoint modules")
            work.append((style, target))
    return work

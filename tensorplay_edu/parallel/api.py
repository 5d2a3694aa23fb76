"""parallelize_module: apply a style, or a plan ``{module path: style}``, to a model.

Paths are matched one dotted level at a time with ``fnmatch`` (``layers.*.attention.wq``:
a ``*`` never crosses a dot); ``""`` is the module itself.  Unlike PyTorch, which only
warns, a key that matches no module is a ValueError listing the closest real paths:
a typo would otherwise silently leave a layer unsharded.

The whole plan is checked before anything is sharded (unknown keys, a style on a module
it cannot handle, two styles claiming one module, a module parallelized before, a tied
weight the plan would cut two ways): a plan with a mistake changes nothing, so the
corrected plan can be applied to the same model.

**Tied weights** (``output.weight = tok_embeddings.weight``, GPT-2 style) stay tied when the
plan lays every use out alike: a vocab-parallel embedding (RowwiseParallel, ``Shard(0)``)
and a vocabulary-split output (ColwiseParallel, ``Shard(0)``) both hold the same
``[V/t, h]`` rows, so they share one piece, one ``nn.Parameter``, whose gradient is the sum
of both uses, as on one device.  PyTorch unties them silently; here a tie the plan cannot
keep (the layouts differ, or only one use is in the plan) is a ValueError.

**Shapes**: every rank must build the same model.  Before scattering from
``src_data_rank`` one all-gather of one number (a digest of every parameter's name, shape
and dtype) checks that they did; a mismatch is an error naming the first differing
parameter, not a scatter of garbage.
"""

from __future__ import annotations

import difflib
import fnmatch
import warnings
from collections import defaultdict

from torch import nn

from ..distribute import check_same_parameters
from ..mesh import DeviceMesh, get_current_mesh
from .hf_whole import guard_hf
from .params import param_layout
from .rng import mark_model_inputs, reset_streams_hook
from .base import ParallelStyle

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
    if isinstance(parallelize_plan, ParallelStyle) or not isinstance(parallelize_plan, dict) and \
            type(parallelize_plan).__module__.startswith("torch.distributed.tensor.parallel"):
        parallelize_plan = {"": parallelize_plan}  # (PyTorch's style: refused by name below)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"Expect Union[ParallelStyle, Dict[str, ParallelStyle]] for parallelize_plan, "
                        f"{type(parallelize_plan)} found!")
    outermost = not hasattr(module, "_tp_fqn")  # not inside a module parallelized before
    base = getattr(module, "_tp_fqn", "")
    for name, sub in module.named_modules():  # paths for errors and CommDebugMode, from the outermost call
        if not hasattr(sub, "_tp_fqn"):
            sub._tp_fqn = f"{base}.{name}" if base and name else (name or base)
    work = _resolve_plan(module, parallelize_plan)  # every error is raised here, before anything changes
    for style, _ in work:
        for check in getattr(style, "mesh_checks", ()):  # what a plan's maker checks against the mesh (hf.py)
            check(device_mesh)
    ties, later = _check_ties(module, work)
    with check_same_parameters(_distributed(module, work), device_mesh, src_data_rank):  # one tiny collective
        for style, target in work:
            style.src_data_rank = src_data_rank
            style._apply(target, device_mesh)
    _retie(ties)
    guard_hf()  # HF's save_pretrained and init see whole tensors (hf_whole.py)
    if later:  # ties with a use left out of this plan: tied again, alike, by the first forward
        if not hasattr(module, "_tp_ties_to_check"):
            module._tp_ties_to_check = []
            module.register_forward_pre_hook(_check_ties_again)
        module._tp_ties_to_check += later
    if outermost:  # outside the modules you parallelized, dropout draws from the shared stream (rng.py)
        module.register_forward_pre_hook(mark_model_inputs, prepend=True, with_kwargs=True)
        module.register_forward_hook(reset_streams_hook)
    return module


def _resolve_plan(module: nn.Module, plan: dict) -> list[tuple[ParallelStyle, nn.Module]]:
    """The (style, module) pairs of a plan, checked as a whole without changing anything."""
    work, claimed = [], {}  # claimed: (id of a module, what) -> the plan key that takes it
    for path, style in plan.items():
        if not isinstance(style, ParallelStyle):
            torch_s = type(style).__module__.startswith("torch.distributed.tensor.parallel")
            raise TypeError(f"parallelize_plan['{path}'] is a {type(style).__name__}, not a ParallelStyle" + (
                f": PyTorch's torch.distributed.tensor.parallel.{type(style).__name__}. tensorplay_edu's "
                f"parallelize_module takes tensorplay_edu.parallel.{type(style).__name__} (the same arguments): "
                "import the styles from tensorplay_edu.parallel" if torch_s else ""))
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


def _distributed(module: nn.Module, work) -> list[tuple[str, object]]:
    """(path, parameter) of every parameter the plan will scatter or broadcast (a style that does
    not say which: all of its module's)."""
    paths = {id(m): path for path, m in module.named_modules()}
    out = []
    for style, target in work:
        placements = style.param_placements(target)
        owners = [(o, n) for o, n in placements] if placements is not None else \
            [(o, n) for o in target.modules() for n in o._parameters]
        for owner, name in owners:
            if owner._parameters.get(name) is not None:
                out.append((f"{paths[id(owner)]}.{name}".lstrip("."), owner._parameters[name]))
    return out


def _check_ties(module: nn.Module, work) -> tuple[list, list]:
    """The tied parameters of ``module`` (one object under several names), checked against the
    plan: every use must get the same layout, or none.  Returns the groups to tie again, and the
    groups with a use this plan leaves whole: PyTorch's examples parallelize ``output`` in a
    second call and tie it again by hand (``output.weight = tok_embeddings.weight``), so those
    are checked at the first forward instead (:func:`_check_ties_again`)."""
    uses = defaultdict(list)  # id(param) -> [(path, owner, name)]
    for path, owner in module.named_modules():
        for name, param in owner._parameters.items():
            if param is not None:
                uses[id(param)].append((f"{path}.{name}" if path else name, owner, name))
    planned, unknown = {}, set()
    for style, target in work:
        placements = style.param_placements(target)
        if placements is None:
            unknown.update(id(owner) for owner in target.modules())
        else:
            planned.update({(id(owner), name): p for (owner, name), p in placements.items()})
    groups, later = [], []
    for group in (g for g in uses.values() if len(g) > 1):
        if any(id(owner) in unknown for _, owner, _ in group):
            groups.append(group)  # a style that does not say: checked after it ran
            continue
        layouts = {path: planned.get((id(owner), name)) for path, owner, name in group}
        given = {repr(p) for p in layouts.values() if p is not None}
        if len(given) > 1:
            raise ValueError(_tie_error(layouts))
        if given and None in layouts.values():
            later.append(group)  # one use left whole by this call
        elif given:
            groups.append(group)
    return groups, later


def _check_ties_again(module: nn.Module, inputs) -> None:
    """A forward pre-hook: every tie that a plan cut in part is one parameter again, laid out alike."""
    for group in module._tp_ties_to_check:
        params = [owner._parameters.get(name) for _, owner, name in group]
        layouts = {path: _placements(getattr(owner, "_tp_layouts", {}).get(name)) for path, owner, name in group}
        if any(p is not params[0] for p in params) or len(set(map(repr, layouts.values()))) > 1:
            raise ValueError(_tie_error(layouts, untied=True))
    module._tp_ties_to_check.clear()


def _placements(layout):
    return None if layout is None else list(layout.placements)


def _retie(groups) -> None:
    """Each tied group shares its first member's piece again (same values: the same source tensor)."""
    for group in groups:
        (first_path, first_owner, first_name), rest = group[0], group[1:]
        param = first_owner._parameters[first_name]
        for path, owner, name in rest:
            other = owner._parameters[name]
            if repr(_layout_of(other)) != repr(_layout_of(param)):
                raise ValueError(_tie_error({first_path: _layout_of(param), path: _layout_of(other)}))
            owner._parameters[name] = param
            if first_name in getattr(first_owner, "_tp_layouts", {}):  # one layout object for one parameter
                owner._tp_layouts[name] = first_owner._tp_layouts[first_name]


def _layout_of(param):
    return _placements(param_layout(param))


def _tie_error(layouts: dict, untied: bool = False) -> str:
    said = ", ".join(f"'{path}' {'left whole' if p is None else repr(p)}" for path, p in layouts.items())
    what = ("were tied when parallelize_module saw them, and at this forward are separate or laid out apart"
            if untied else "are one tied parameter, and the plan lays them out differently")
    return (f"parallelize_module: {' and '.join(repr(p) for p in layouts)} {what} ({said}): they would silently "
            "train as separate parameters. Give every use the same layout (a vocab-parallel embedding, "
            "RowwiseParallel(input_layouts=Replicate()), and a vocabulary-split output, ColwiseParallel, both hold "
            "[V/t, h] rows on Shard(0)), in one parallelize_module call or in several followed by tying them again "
            "(output.weight = tok_embeddings.weight), or untie them first (e.g. output.weight = "
            "nn.Parameter(output.weight.clone())).")

"""PrepareModuleInput / PrepareModuleOutput / PrepareModuleInputOutput: convert a
module's inputs or outputs between layouts, nothing else (no parameters are touched).

``input_layouts`` says what the inputs are (a plain tensor is wrapped as that layout),
``desired_input_layouts`` what the module wants; a difference is a redistribute, i.e.
one row of the transition table.  ``None`` leaves that input alone.  These styles use
plain hooks, so they can be stacked with the others on one module; but one module takes
one input conversion and one output conversion (PyTorch would stack a second
PrepareModuleInput and gather twice; here it is an error).
"""

from __future__ import annotations

import torch
from torch import nn

from ..debug import module_scope
from ..dtensor import DTensor
from ..mesh import DeviceMesh
from ..placement import Placement, Replicate, Shard
from .rng import follow_layout
from .base import ParallelStyle, claim, fqn
from .style import fused, to_layout

__all__ = ["PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput"]


def _tuple(layouts):
    return (layouts,) if isinstance(layouts, Placement) else layouts


def _convert(x, layout, desired, mesh, use_local, module):
    """One input or output: wrap as ``layout``, move to ``desired``, unwrap if asked."""
    if layout is None:
        return x
    with module_scope(fqn(module)):  # what it costs, forward and backward, is this module's
        if not isinstance(x, DTensor):
            if not isinstance(x, torch.Tensor):
                raise AssertionError(f"expecting input to be a torch.Tensor! ('{fqn(module)}' got {type(x).__name__})")
            x = DTensor.from_local(x, mesh, [layout])
        if isinstance(desired, Replicate) and isinstance(x.placements[0], Shard):
            stand_in = fused("gather", module, x, mesh)  # (a fusion gathers it with its readers' matmuls)
            if stand_in is not None:
                return stand_in
        if desired is not None:
            x = to_layout(x, desired)  # Shard(1) -> Replicate: SP's all-gather (backward: its reduce-scatter)
    return x.to_local() if use_local else x


def _follow(desired, module, mesh, values) -> None:
    """The random stream for what the module's code gets: its own per rank if every converted
    tensor is sharded, the shared one if any is replicated (see rng.py).  ``desired``: the
    converted tensors' layouts (``_stream`` of the desired layouts, worked out once)."""
    if desired:
        tensors = [v for v in values if isinstance(v, (torch.Tensor, DTensor))]
        sharded = [isinstance(p, Shard) for p in desired]
        mixed = any(sharded) != all(sharded)  # then the default stream only: no tensor is marked
        for tensor in tensors[:1] if mixed else tensors:
            follow_layout(all(sharded), module, mesh, tensor, marks=not mixed)


def _stream(desired) -> list:
    """The layouts that decide the random stream: those of the converted tensors."""
    return [p for p in desired if p is not None]


class PrepareModuleInput(ParallelStyle):
    claims = ("input",)

    def param_placements(self, module):
        return {}  # no parameter is touched

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_output: bool = False):
        self.input_layouts = _tuple(input_layouts)
        self.desired_input_layouts = _tuple(desired_input_layouts)
        self.use_local_output = use_local_output
        if self.input_layouts is not None:
            if self.desired_input_layouts is None:
                raise AssertionError("desired module inputs should not be None!")
            if len(self.input_layouts) != len(self.desired_input_layouts):
                raise AssertionError("input_layouts and desired_input_layouts should have same length!")
        self.input_kwarg_layouts = input_kwarg_layouts or {}
        self.desired_input_kwarg_layouts = desired_input_kwarg_layouts or {}
        if len(self.input_kwarg_layouts) != len(self.desired_input_kwarg_layouts):
            raise AssertionError("input_kwarg_layouts and desired_input_kwarg_layouts should have same length!")
        self.with_kwargs = input_kwarg_layouts is not None

    def __repr__(self):
        return (f"PrepareModuleInput(input_layouts={self.input_layouts}, desired_input_layouts="
                f"{self.desired_input_layouts}, input_kwarg_layouts={self.input_kwarg_layouts}, "
                f"desired_input_kwarg_layouts={self.desired_input_kwarg_layouts}, use_local_output={self.use_local_output})")

    def _prepare_args(self, module, args, mesh):
        if self.input_layouts is None:
            return args
        args = args if isinstance(args, tuple) else (args,)
        if len(args) != len(self.input_layouts):
            raise ValueError(f"module inputs and input_layouts should have same length! ('{fqn(module)}' got "
                             f"{len(args)} inputs, input_layouts has {len(self.input_layouts)})")
        return tuple(self._convert(x, layout, desired, mesh, module)
                     for x, layout, desired in zip(args, self.input_layouts, self.desired_input_layouts))

    def _prepare_kwargs(self, module, kwargs, mesh):
        return {k: self._convert(v, self.input_kwarg_layouts.get(k), self.desired_input_kwarg_layouts.get(k), mesh,
                                 module) for k, v in kwargs.items()}

    def _convert(self, x, layout, desired, mesh, module):
        """One input (the float8 variant overrides this)."""
        return _convert(x, layout, desired, mesh, self.use_local_output, module)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        claim(self, module)
        desired = _stream([*(self.desired_input_layouts or ()), *self.desired_input_kwarg_layouts.values()])
        if self.with_kwargs:
            def hook(mod, args, kwargs):
                args, kwargs = self._prepare_args(mod, args, device_mesh), self._prepare_kwargs(mod, kwargs, device_mesh)
                _follow(desired, mod, device_mesh, [*args, *kwargs.values()])
                return args, kwargs
            module.register_forward_pre_hook(hook, with_kwargs=True)
        else:
            def hook(mod, args):
                args = self._prepare_args(mod, args, device_mesh)
                _follow(desired, mod, device_mesh, args)
                return args
            module.register_forward_pre_hook(hook)
        return module


class PrepareModuleOutput(ParallelStyle):
    claims = ("output",)

    def param_placements(self, module):
        return {}  # no parameter is touched

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output: bool = True):
        self.output_layouts = _tuple(output_layouts)
        self.desired_output_layouts = _tuple(desired_output_layouts)
        self.use_local_output = use_local_output
        if len(self.output_layouts) != len(self.desired_output_layouts):
            raise AssertionError("output_layouts and desired_output_layouts should have same length!")

    def __repr__(self):
        return (f"PrepareModuleOutput(output_layouts={self.output_layouts}, desired_output_layouts="
                f"{self.desired_output_layouts}, use_local_output={self.use_local_output})")

    def _prepare_output(self, module, outputs, mesh):
        single = not isinstance(outputs, tuple)
        outputs = (outputs,) if single else outputs
        if len(outputs) != len(self.output_layouts):
            raise ValueError(f"module outputs and output_layouts should have same length! ('{fqn(module)}' "
                             f"returned {len(outputs)}, output_layouts has {len(self.output_layouts)})")
        out = tuple(_convert(x, layout, desired, mesh, self.use_local_output, module)
                    for x, layout, desired in zip(outputs, self.output_layouts, self.desired_output_layouts))
        return out[0] if len(out) == 1 else out

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        claim(self, module)
        desired = _stream(self.desired_output_layouts)

        def hook(mod, inputs, outputs):
            out = self._prepare_output(mod, outputs, device_mesh)
            _follow(desired, mod, device_mesh, out if isinstance(out, tuple) else (out,))
            return out
        module.register_forward_hook(hook)
        return module


class PrepareModuleInputOutput(ParallelStyle):
    """Both of the above on one module (a plan dict holds one style per key)."""

    claims = ("input", "output")

    def param_placements(self, module):
        return {}

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_input: bool = False, output_layouts,
                 desired_output_layouts, use_local_output: bool = True):
        self.prepare_module_input = PrepareModuleInput(
            input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts, desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_input)
        self.prepare_module_output = PrepareModuleOutput(
            output_layouts=output_layouts, desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output)

    def __repr__(self):
        return f"PrepareModuleInputOutput({self.prepare_module_input!r}, {self.prepare_module_output!r})"

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        self.prepare_module_input._apply(module, device_mesh)
        self.prepare_module_output._apply(module, device_mesh)
        return module

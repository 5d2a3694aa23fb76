"""SequenceParallel: run a per-token module (LayerNorm, RMSNorm, Dropout) on this rank's
slice of the sequence.  No communication in forward; in backward only the parameters'.
Sequence parallelism's all-gather and reduce-scatter are its neighbours': the module after it
(attention, feed_forward) gathers through PrepareModuleInput(input_layouts=Shard(1)), Shard -> Replicate,
and the Rowwise layer before it reduce-scatters (output_layouts=Shard(1): Partial -> Shard).

Parameters stay whole (replicated, broadcast from ``src_data_rank``; ``None`` keeps each
rank's own).  Each rank sees only its tokens, so a parameter's gradient is a partial sum
over the TP group: :mod:`~tensorplay_edu.parallel.grad_sync` all-reduces it as it arrives,
so ``.grad`` is whole when autograd writes it (or, after ``bucket_partial_grads``, all of
them in one all-reduce per step; PyTorch leaves it ``Partial`` and reduces it whenever the
optimizer reads it).

Random numbers inside (``nn.Dropout``, ``F.dropout``, any random op) come from this rank's
own stream (:mod:`.rng`): each rank holds different tokens, so each draws its own mask, as
Megatron-LM runs a sequence-parallel block inside its RNG tracker's fork.

A plain tensor input is taken as already sharded on ``sequence_dim`` (its global length
is local x ranks); a DTensor input is redistributed there.  The output is a
``Shard(sequence_dim)`` DTensor, or its local tensor with ``use_local_output=True``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..debug import module_scope
from ..dtensor import DTensor
from ..mesh import DeviceMesh
from ..placement import Shard
from .rng import follow_layout
from .base import fqn
from .replicated import ReplicatedWithGradAllReduce
from .style import to_layout

__all__ = ["SequenceParallel"]


class SequenceParallel(ReplicatedWithGradAllReduce):
    """ReplicatedWithGradAllReduce (whole parameters, gradients summed) on this rank's slice of the sequence."""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False):
        self.sequence_sharding = (Shard(sequence_dim),)
        self.use_local_output = use_local_output

    def __repr__(self):
        return f"SequenceParallel(sequence_dim={self.sequence_sharding[0].dim}, use_local_output={self.use_local_output})"

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        super()._apply(module, device_mesh)  # whole parameters, gradients summed (its pre-hook runs first)
        module.register_forward_pre_hook(lambda mod, inputs: self._prepare_input(mod, inputs, device_mesh))
        module.register_forward_hook(lambda mod, inputs, out: self._prepare_output(mod, inputs, out, device_mesh))
        return module

    def _prepare_input(self, module, inputs, mesh):
        x, rest = inputs[0], inputs[1:]
        if isinstance(x, DTensor):
            with module_scope(fqn(module)):
                x = to_layout(x, self.sequence_sharding[0])
        elif isinstance(x, torch.Tensor):
            x = DTensor.from_local(x, mesh, self.sequence_sharding)  # [b, s/t, h] taken as this rank's slice
        else:
            raise ValueError(f"expecting input of {fqn(module)} to be a torch.Tensor or DTensor, but got {x!r}")
        module._tp_sequence_length = x.shape[x.placements[0].dim]
        local = x.to_local()
        follow_layout(True, module, mesh, local)  # this rank's tokens: this rank's random stream
        return (local, *rest)

    def _prepare_output(self, module, inputs, out, mesh):
        dim = self.sequence_sharding[0].normalized(out.ndim).dim
        shape = list(out.shape)
        shape[dim] = module._tp_sequence_length
        dt = DTensor.from_local(out, mesh, [Shard(dim)], shape=shape)
        return dt.to_local() if self.use_local_output else dt

"""ReplicatedWithGradAllReduce: a module whose parameters stay whole on every rank while it runs on this rank's
part of the activations, so that their gradients are addends over the TP group.

Qwen3's per-head ``q_norm`` / ``k_norm`` sit between the column-split ``q_proj`` / ``k_proj`` and attention: each
rank normalises its own heads ``[b, s, H/t, hd]`` with the one ``[hd]`` weight.  Forward: nothing to send, the
input is already this rank's.  Backward: this rank's weight gradient covers only its heads, an addend of the
whole (``Partial``), made whole by :mod:`.grad_sync` as it arrives: Partial -> Replicate, an all-reduce per
parameter (``f̄`` on the gradient), or all of them in one bucket with ``bucket_partial_grads``.

transformers' style of the same name (``"replicated_with_grad_allreduce"``) all-reduces ``.grad`` in a hook
that runs after autograd has added the new addend to it, so on a second micro-batch it sums the first one's
already-whole gradient again; here each backward's addend is summed before it is added.

:class:`~.sequence.SequenceParallel` is this style plus a sequence-sharded input and output.
"""

from __future__ import annotations

from torch import nn

from ..mesh import DeviceMesh
from ..placement import Replicate
from .base import ParallelStyle, claim, fqn
from .grad_sync import hooked, partial_gradient
from .params import attach_own_layouts, buffers_to_mesh, distribute_param

__all__ = ["ReplicatedWithGradAllReduce", "partial_gradients"]


def partial_gradients(module: nn.Module, mesh: DeviceMesh) -> None:
    """Every parameter's gradient is a partial sum over the TP group: reduce it as it arrives."""
    for sub in module.modules():
        attach_own_layouts(sub)
        for name, param in sub._parameters.items():  # every forward: hooked ones are skipped at a glance
            if param is not None and not hooked(param):
                partial_gradient(sub, name, mesh, f"{fqn(sub)}.{name}")


class ReplicatedWithGradAllReduce(ParallelStyle):
    """Parameters replicated (broadcast from ``src_data_rank``), gradients summed over the TP group."""

    claims = ("shard",)

    def __repr__(self):
        return "ReplicatedWithGradAllReduce()"

    def param_placements(self, module):
        return {(sub, name): Replicate() for sub in module.modules() for name, _ in sub.named_parameters(recurse=False)}

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        """Parameters whole on every rank, buffers on the mesh, gradient hooks on."""
        claim(self, module)
        for (sub, name), placement in self.param_placements(module).items():
            distribute_param(sub, name, placement, device_mesh, self.src_data_rank)
        for sub in module.modules():
            buffers_to_mesh(sub, device_mesh)
        partial_gradients(module, device_mesh)
        # every forward: a parameter replaced since (to_empty, FSDP2, HF's loading) gets its hook again
        module.register_forward_pre_hook(lambda mod, inputs: partial_gradients(mod, device_mesh))
        return module

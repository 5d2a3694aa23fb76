"""Where a ring is right, and the fusion that hands the styles their rings.

The styles ask ``parallel.style.FUSIONS`` before a gather or a reduce-scatter next to a matmul
(see ``FUSIONS`` there); this module registers one fusion there, which answers only while async
TP is on for the mesh (switch.py) and the ring is right for the shapes and the readers.  A
refused ring is logged on the ``tensorplay_edu.async_tp`` logger, and the plain collective runs.
"""

from __future__ import annotations

import torch

from .. import debug
from ..parallel.base import fqn
from ..parallel.style import FUSIONS
from ..placement import chunk_sizes
from .ring import MatmulReduceScatter, RingInput
from .switch import is_async, logger

__all__ = ["ring_refusal", "ring_ok", "ring_ok_rows", "ring_input", "RingFusion"]


def ring_refusal(dim: int, ndim: int, sizes: list[int], readers=()) -> str | None:
    """Why a ring must not replace this all-gather (or reduce-scatter) on ``dim``, or None.

    The rings pass whole rows of the sequence (or batch): each chunk is multiplied by the
    weight on its own.  A shard of the last dim is a slice of the features the matmul sums
    over (no chunk can be multiplied alone); a rank holding no rows has nothing to send
    (gloo would wait for it); a reader with a forward of its own (a Float8Linear under the
    high-precision styles, a Linear subclass) would be bypassed by the ring's plain matmul."""
    if dim == ndim - 1:
        return "the shard is on the last dim (the features the matmul sums over), not on rows"
    if min(sizes) == 0:
        return f"a rank holds no rows ({sizes} over {len(sizes)} ranks)"
    own = [getattr(m, "_tp_fqn", "?") for m in readers if type(m).forward is not torch.nn.Linear.forward]
    if own:
        return f"{own} run a forward of their own (a Float8Linear, a Linear subclass)"
    return None


def ring_ok(x, readers, mesh) -> bool:
    """Async TP on, and a ring right for this sharded input (a DTensor) and its readers?"""
    if not is_async(mesh):
        return False
    dim = x.placements[0].dim
    reason = ring_refusal(dim, x.ndim, chunk_sizes(x.shape[dim], mesh.size()), readers)
    if reason:
        logger.info("async TP: %s runs the synchronous all-gather: %s", debug.current_module() or "a module", reason)
    return reason is None


def ring_ok_rows(dim: int, shape, mesh, owner: str, module=None) -> bool:
    """The same for ``module``'s matmul -> reduce-scatter of an output of ``shape`` onto ``dim``."""
    if not is_async(mesh):
        return False
    reason = ring_refusal(dim, len(shape), chunk_sizes(shape[dim], mesh.size()), [module] if module else ())
    if reason:
        logger.info("async TP: %s runs the synchronous reduce-scatter: %s", owner or "a module", reason)
    return reason is None


def ring_input(x, mesh, readers: list, owner: str) -> RingInput:
    """A sequence-sharded DTensor, to be gathered by a ring fused with ``readers``' matmuls."""
    dim = x.placements[0].dim
    return RingInput(x.to_local(), mesh, dim, chunk_sizes(x.shape[dim], mesh.size()), readers, owner)


class RingFusion:
    """The styles' plug-in: a ring wherever async TP is on and a ring is right, else None."""

    def gather(self, module, x, mesh):
        if not is_async(mesh):
            return None
        readers = [m for m in module.modules() if getattr(m, "_tp_colwise", False)]  # its Colwise Linears
        if readers and ring_ok(x, readers, mesh):
            return ring_input(x, mesh, readers, fqn(module))
        return None

    def matmul_reduce_scatter(self, module, x, mesh, dim):
        if ring_ok_rows(dim, x.shape, mesh, fqn(module), module):
            return MatmulReduceScatter.apply(x, module.weight, mesh, dim)  # [.., s/t, out]
        return None


FUSIONS.append(RingFusion())

"""Async tensor parallelism: an all-gather and its matmuls (or a matmul and its reduce-scatter)
decomposed into ring steps, each transfer overlapping a matmul.

switch.py turns it on (torchtitan's two lines, or ``with enable_async_tp(mesh):``); ring.py holds
the rings; fusion.py plugs them into the styles; timeline.py and measure.py show the overlap.
"""

from . import fusion  # noqa: F401  (registers the rings with the styles)
from .measure import standin_ring, time_gather_matmul, time_standin_ring
from .ring import GatherMatmul, MatmulReduceScatter, RingInput, ring_gather, ring_reduce_scatter
from .switch import _GROUPS, enable_async_tp, enable_symm_mem_for_group, is_async  # noqa: F401

__all__ = ["enable_symm_mem_for_group", "enable_async_tp", "is_async", "RingInput", "GatherMatmul",
           "MatmulReduceScatter", "ring_gather", "ring_reduce_scatter", "time_gather_matmul", "standin_ring",
           "time_standin_ring"]

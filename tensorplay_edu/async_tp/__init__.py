"""Async tensor parallelism: an all-gather and its matmuls (or a matmul and its reduce-scatter)
decomposed into ring steps, each transfer overlapping a matmul (ring.py), and the timeline
that measures the overlap (timeline.py)."""

from .ring import (_GROUPS, GatherMatmul, MatmulReduceScatter, RingInput, enable_async_tp, enable_symm_mem_for_group,
                   is_async, ring_gather, ring_ok, ring_ok_rows, ring_reduce_scatter, time_gather_matmul)

__all__ = ["enable_symm_mem_for_group", "enable_async_tp", "is_async", "ring_ok", "ring_ok_rows", "RingInput",
           "GatherMatmul", "MatmulReduceScatter", "ring_gather", "ring_reduce_scatter", "time_gather_matmul"]

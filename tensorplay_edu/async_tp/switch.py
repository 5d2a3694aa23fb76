"""Turning async TP on: torchtitan's two lines, or an explicit ``with enable_async_tp(mesh):``.

    torch._inductor.config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)

Either way, TP on that mesh runs its all-gathers and reduce-scatters as rings fused with the
matmuls beside them (fusion.py); torch's config is read, never imported or changed here.
"""

from __future__ import annotations

import contextlib
import logging
import sys

__all__ = ["enable_symm_mem_for_group", "enable_async_tp", "is_async", "logger"]

logger = logging.getLogger("tensorplay_edu.async_tp")  # says why a ring was refused (the collective runs)
_GROUPS: set[str] = set()  # what enable_symm_mem_for_group marked (PyTorch keeps such a registry too)
_MESHES: list = []  # the meshes of the active `with enable_async_tp(mesh):` blocks


def enable_symm_mem_for_group(group_name: str) -> None:
    """Mark a TP group for async TP (it runs decomposed while ``torch._inductor.config._micro_pipeline_tp``)."""
    _GROUPS.add(group_name)


@contextlib.contextmanager
def enable_async_tp(mesh):
    """Inside: tensor parallelism on ``mesh`` runs decomposed (torch's config untouched)."""
    _MESHES.append(mesh)
    try:
        yield
    finally:
        _MESHES.remove(mesh)


def is_async(mesh) -> bool:
    """Does TP on this (1-D) mesh run decomposed now?"""
    if mesh.size() == 1:
        return False
    if any(m == mesh for m in _MESHES):
        return True
    config = sys.modules.get("torch._inductor.config")  # set by torchtitan's line; never imported here
    return bool(_GROUPS and config is not None and getattr(config, "_micro_pipeline_tp", False)  # (the config's
                and mesh.get_group().group_name in _GROUPS)  # getattr is slow: skipped while no group is marked)

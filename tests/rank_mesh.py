"""Rank code for tests/test_mesh.py: DeviceMesh inside launched ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist

from checks import raises
from tensorplay_edu import DTensor, Shard, init_device_mesh


def mesh_api() -> tuple[list[str], int]:
    """init_device_mesh inside launched ranks: 1-D facts, errors, `with mesh:`."""
    from tensorplay_edu import DeviceMesh
    from tensorplay_edu.mesh import get_current_mesh

    world, rank = dist.get_world_size(), dist.get_rank()
    fails, n = [], 0
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    facts = {
        "size": (mesh.size(), world), "size(0)": (mesh.size(0), world), "ndim": (mesh.ndim, 1),
        "rank": (mesh.get_rank(), rank), "local": (mesh.get_local_rank(), rank), "local(tp)": (mesh.get_local_rank("tp"), rank),
        "group": (dist.get_process_group_ranks(mesh.get_group()), list(range(world))),
        "sub is self": (mesh["tp"].mesh.tolist(), list(range(world))), "eq": (mesh == DeviceMesh("cpu", list(range(world)), mesh_dim_names=("tp",)), True),
        "repr": (repr(mesh), f"DeviceMesh('cpu', {list(range(world))}, mesh_dim_names=('tp',))"),
    }
    with mesh:
        facts["current"] = (get_current_mesh() is mesh, True)
        d = DTensor.from_local(torch.ones(2, 3), placements=[Shard(0)])
        facts["from_local uses current mesh"] = (d.device_mesh is mesh and d.shape == torch.Size([2 * world, 3]), True)
    facts["current after"] = (get_current_mesh(), None)
    for key, (got, want) in facts.items():
        n += 1
        if got != want:
            fails.append(f"mesh {key}: {got!r} != {want!r}")
    raises(fails, "shape mismatch", ValueError, lambda: init_device_mesh("cpu", (world + 1,)), "mesh_shape")
    raises(fails, "names mismatch", ValueError, lambda: init_device_mesh("cpu", (world,), mesh_dim_names=("a", "b")), "mesh_dim_names")
    raises(fails, "unknown name", KeyError, lambda: mesh["dp"], "dp")
    raises(fails, "no mesh", ValueError, lambda: DTensor.from_local(torch.ones(1)), "device_mesh")
    if world == 4:
        m2 = init_device_mesh("cpu", (2, 2))
        raises(fails, "2-D get_group needs a dim", RuntimeError, lambda: m2.get_group(), "mesh_dim")
        n += 1
        if m2.size(1) != 2 or m2.shape != (2, 2):
            fails.append("2-D size")
    return fails, n + 4

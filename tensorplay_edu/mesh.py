"""DeviceMesh: ranks arranged in an n-D grid, one process group per mesh dimension.

A 1-D mesh of 4 ranks is plain tensor parallelism.  A 2-D mesh ``[[0, 1], [2, 3]]``
with names ``("dp", "tp")`` puts ranks {0, 1} and {2, 3} in tensor-parallel groups
and {0, 2}, {1, 3} in data-parallel groups; ``mesh["tp"]`` is this rank's row.

Every rank must build the same mesh in the same order: creating a process group is
itself a collective over the default group.

On several nodes (``torchrun --nnodes N``) the ranks of one node are consecutive: node ``k``
holds ranks ``k * LOCAL_WORLD_SIZE`` to ``(k + 1) * LOCAL_WORLD_SIZE - 1``. The mesh is filled
row by row, so its **last** dimension holds consecutive ranks: name it ``"tp"`` and give it a
size that divides ``LOCAL_WORLD_SIZE``, and every TP group stays inside a node, on NVLink.
:func:`tp_across_nodes` says when a mesh breaks that rule (the mesh warns).
"""

from __future__ import annotations

import math
import os
import warnings

import torch
import torch.distributed as dist

from .process_group import check_backend, check_cuda, default_group_timeout, ensure_default_group

__all__ = ["DeviceMesh", "init_device_mesh", "get_current_mesh", "mesh_groups", "tp_across_nodes"]

_MESH_STACK: list["DeviceMesh"] = []
_WARNED: set[str] = set()  # each node-layout warning once per process


def get_current_mesh() -> "DeviceMesh | None":
    """The innermost mesh entered with ``with mesh:``, or None."""
    return _MESH_STACK[-1] if _MESH_STACK else None


def mesh_groups(mesh: torch.Tensor, dim: int) -> list[list[int]]:
    """The groups of ranks along ``dim``: for ``[[0, 1], [2, 3]]``, dim 1 gives the rows
    ``[[0, 1], [2, 3]]`` and dim 0 the columns ``[[0, 2], [1, 3]]``."""
    mesh = torch.as_tensor(mesh)
    return mesh.movedim(dim, -1).reshape(-1, mesh.size(dim)).tolist()


def _tp_dim(ndim: int, mesh_dim_names) -> int | None:
    """The dimension named ``"tp"``; with no names, the last; None if names are given without "tp"."""
    if mesh_dim_names is None:
        return ndim - 1
    return mesh_dim_names.index("tp") if "tp" in mesh_dim_names else None


def tp_across_nodes(mesh, mesh_dim_names=None, local_world_size: int | None = None) -> str | None:
    """Why this mesh's TP groups leave a node, or None when each lies inside one (or nothing says).

    The TP dimension is the one named ``"tp"``, or the last one when the mesh has no names (names
    without ``"tp"``: no TP dimension, nothing to check). ``local_world_size`` (ranks per node)
    defaults to torchrun's ``LOCAL_WORLD_SIZE``; with neither, or with one node only, there is
    nothing to check. Rank ``r`` is on node ``r // local_world_size``, as torchrun numbers the
    ranks of nodes with equal ``--nproc-per-node``.
    """
    mesh = torch.as_tensor(mesh)
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    dim = _tp_dim(mesh.ndim, mesh_dim_names)
    if local_world_size <= 0 or dim is None or int(mesh.max()) < local_world_size:
        return None  # one node (or unknown): every group is inside it
    for group in mesh_groups(mesh, dim):
        nodes = sorted({r // local_world_size for r in group})
        if len(nodes) > 1:
            which = f"'tp' (dim {dim})" if mesh_dim_names else f"the last (dim {dim}, taken as TP)"
            return (f"the mesh {tuple(mesh.shape)}'s TP dimension {which} puts ranks {group} in one TP group, but "
                    f"they sit on nodes {nodes} (LOCAL_WORLD_SIZE={local_world_size} ranks per node, node = rank // "
                    f"{local_world_size})")
    return None


def _warn_if_tp_across_nodes(mesh: torch.Tensor, mesh_dim_names) -> None:
    """Warn (once per process, on the mesh's first rank: one warning per job, not one per rank)
    when a TP group spans nodes; :func:`init_device_mesh` says why a warning and not an error."""
    reason = tp_across_nodes(mesh, mesh_dim_names)
    if reason is None or reason in _WARNED:
        return
    if dist.is_initialized() and dist.get_rank() != int(mesh.flatten()[0]):
        return
    _WARNED.add(reason)
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    warnings.warn(
        f"DeviceMesh: {reason}. TP runs collectives in every layer, forward and backward: its traffic belongs on "
        f"NVLink inside a node (450 GB/s each way on an H100), and the links between nodes are ~9x slower "
        f"(50 GB/s per GPU over 400 Gb/s InfiniBand). Fix: make 'tp' the last dimension with a size that divides "
        f"{per_node}, e.g. init_device_mesh(..., ({mesh.numel() // per_node}, {per_node}), mesh_dim_names=('dp', "
        "'tp')); if that dimension is not tensor-parallel, name the dimensions without 'tp' (mesh_dim_names).",
        UserWarning, stacklevel=4)


class DeviceMesh:
    """An n-D grid of global ranks with one process group per dimension.

    Args:
        device_type: ``"cpu"`` or ``"cuda"``: the tensors it lays out live there, and the default
            group must have a backend for them (``"cpu:gloo,cuda:nccl"`` has both).
        mesh: the grid of global ranks, e.g. ``torch.arange(4).view(2, 2)``.
        mesh_dim_names: optional names, one per dimension, for ``mesh["tp"]``.
    """

    def __init__(self, device_type: str, mesh, *, mesh_dim_names: tuple[str, ...] | None = None, _groups=None):
        self.device_type = device_type
        self.mesh = torch.as_tensor(mesh, dtype=torch.int64, device="cpu")
        self._shape = tuple(self.mesh.shape)  # read on every transition: a tuple, not the tensor
        self._numel = self.mesh.numel()  # size(): read by every hook, so a number, not a tensor method
        if mesh_dim_names is not None:
            mesh_dim_names = tuple(mesh_dim_names)
            if len(mesh_dim_names) != self.mesh.ndim:
                raise ValueError(
                    f"mesh_dim_names {mesh_dim_names} has {len(mesh_dim_names)} names for a "
                    f"{self.mesh.ndim}-D mesh: give one name per dimension"
                )
            if len(set(mesh_dim_names)) != len(mesh_dim_names):
                raise ValueError(f"mesh_dim_names {mesh_dim_names} repeats a name")
        self.mesh_dim_names = mesh_dim_names
        if _groups is not None:  # a sub-mesh reuses its parent's groups: no new collective
            self._groups = list(_groups)
            self._coordinate = self._find_coordinate()
            return
        check_cuda(device_type, f"DeviceMesh('cuda', {self.mesh.tolist()})")
        ensure_default_group(device_type, self.mesh.numel())
        check_backend(device_type)
        world = dist.get_world_size()
        ranks = sorted(self.mesh.flatten().tolist())
        if len(set(ranks)) != len(ranks) or ranks[0] < 0 or ranks[-1] >= world:
            raise ValueError(f"mesh {self.mesh.tolist()} must hold distinct ranks in 0..{world - 1}")
        self._coordinate = self._find_coordinate()
        self._groups = [self._make_group(d) for d in range(self.mesh.ndim)]
        _warn_if_tp_across_nodes(self.mesh, mesh_dim_names)

    def _find_coordinate(self) -> tuple[int, ...]:
        hits = (self.mesh == dist.get_rank()).nonzero()
        if len(hits) == 0:
            raise RuntimeError(f"rank {dist.get_rank()} is not in mesh {self.mesh.tolist()}")
        return tuple(hits[0].tolist())

    def _make_group(self, dim: int):
        """The group along ``dim`` holding this rank (every rank creates every group)."""
        if self.mesh.ndim == 1 and self.mesh.tolist() == list(range(dist.get_world_size())):
            return dist.group.WORLD
        mine, timeout = None, default_group_timeout()
        for line in mesh_groups(self.mesh, dim):
            group = dist.new_group(line, timeout=timeout)
            if dist.get_rank() in line:
                mine = group
        return mine

    # ---- what PyTorch's DeviceMesh offers -------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def _dim(self, mesh_dim: int | str | None) -> int:
        if type(mesh_dim) is int and 0 <= mesh_dim < len(self._shape):  # the table's case, every transition
            return mesh_dim
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(f"this mesh is {self.ndim}-D {self.shape}: pass mesh_dim (an index or a name)")
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"mesh has no dimension named {mesh_dim!r}; its names are {self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        return mesh_dim % self.ndim

    def size(self, mesh_dim: int | str | None = None) -> int:
        """Ranks in the whole mesh, or along one dimension."""
        return self._numel if mesh_dim is None else self._shape[self._dim(mesh_dim)]

    def get_group(self, mesh_dim: int | str | None = None):
        """The process group of one mesh dimension (the only one for a 1-D mesh)."""
        return self._groups[self._dim(mesh_dim)]

    def get_rank(self) -> int:
        """This process's global rank."""
        return dist.get_rank()

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's index along one mesh dimension."""
        return self._coordinate[self._dim(mesh_dim)]

    def get_coordinate(self) -> tuple[int, ...]:
        return self._coordinate

    def __getitem__(self, name: str) -> "DeviceMesh":
        """The 1-D sub-mesh along dimension ``name`` that holds this rank: ``mesh["tp"]``."""
        dim = self._dim(name)
        index = list(self._coordinate)
        index[dim] = slice(None)
        return DeviceMesh(self.device_type, self.mesh[tuple(index)], mesh_dim_names=(name,), _groups=[self._groups[dim]])

    def __enter__(self):
        _MESH_STACK.append(self)
        return self

    def __exit__(self, *exc):
        _MESH_STACK.pop()

    def __deepcopy__(self, memo):
        return self  # a mesh names process groups of this process: a copied model shares them

    def _key(self) -> tuple:
        """What makes two meshes the same, in plain Python (compared in every redistribute:
        no tensor op, so nothing a dispatch mode or a host-sync check would see)."""
        return self.device_type, self.shape, tuple(self.mesh.flatten().tolist()), self.mesh_dim_names

    def __eq__(self, other):
        return other is self or (isinstance(other, DeviceMesh) and self._key() == other._key())

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"


def init_device_mesh(device_type: str, mesh_shape, *, mesh_dim_names: tuple[str, ...] | None = None) -> DeviceMesh:
    """A mesh of ``prod(mesh_shape)`` ranks laid out row-major: ranks 0..n-1.

    Starts the default process group first if nothing has (from torchrun's environment,
    or a one-rank group for a one-rank mesh). ``"cuda"`` on a machine without a usable GPU is
    an error naming the fix (``"cpu"``, or a CUDA build of PyTorch on a GPU machine), before any
    process group starts.

    Row-major puts consecutive ranks, the ranks of one node under torchrun, in the last
    dimension: ``(dp, tp)`` keeps TP inside a node. When ``LOCAL_WORLD_SIZE`` says there are
    several nodes and a TP group (the dimension named ``"tp"``, or the last) would span them, the
    mesh warns once, with the reason (:func:`tp_across_nodes`) and the fix. TP's collectives run
    in every layer and belong on NVLink; the links between nodes are ~9x slower. A warning, not
    an error: the results stay right (only slower), some systems join the GPUs of several hosts
    in one NVLink domain (GB200 NVL72), and a mesh built to measure the slow case must stay
    possible. (PyTorch's own ``init_device_mesh`` does not check at all.)
    """
    mesh_shape = tuple(mesh_shape)
    n = math.prod(mesh_shape)
    check_cuda(device_type, f"init_device_mesh('cuda', {mesh_shape})")
    ensure_default_group(device_type, n)
    if n != dist.get_world_size():
        raise ValueError(
            f"init_device_mesh: mesh_shape {mesh_shape} holds {n} ranks but the default process group "
            f"has {dist.get_world_size()}: the mesh must cover every rank"
        )
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
    return DeviceMesh(device_type, torch.arange(n).view(mesh_shape), mesh_dim_names=mesh_dim_names)

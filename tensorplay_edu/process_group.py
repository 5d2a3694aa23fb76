"""The default process group: started from the environment as torchrun sets it.

Every mesh builds its groups over the default group, so :class:`~tensorplay_edu.mesh.DeviceMesh`
starts it when nobody did (torchrun, :func:`tensorplay_edu.launch`, a user), as PyTorch's
``init_device_mesh`` does: from RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_*,
or as a one-rank group for a one-rank mesh in a plain notebook.

Which backend (:func:`choose_backend`):

* one GPU for every local rank: ``"cpu:gloo,cuda:nccl"``, one default group with a backend
  for each kind of tensor, as PyTorch starts it: NCCL moves CUDA tensors, gloo CPU ones,
  so a CPU mesh (``init_device_mesh("cpu", ...)``) works on a GPU node too;
* fewer GPUs than local ranks (two ranks on a one-GPU laptop): gloo for everything, with
  a warning, or an error if NCCL was asked for;
* no GPU: gloo.

The timeout is PyTorch's 10 minutes (a rank loading a checkpoint while the others wait in a
collective must not be killed), and NCCL is told its device (``device_id``) up front.  Once the
group has started from the environment, each function of :data:`AFTER_START` runs (the launcher
puts the NCCL rules checker of ``TENSORPLAY_CHECK_NCCL=1`` there).
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["choose_backend", "backends", "current_device", "init_from_env", "ensure_default_group",
           "check_cuda", "check_backend", "default_group_timeout", "AFTER_START"]

AFTER_START: list = []  # functions called (no arguments) once init_from_env has started the group


def choose_backend(gpus: int, local_ranks: int, requested: str | None = None) -> str:
    """The default group's backend for ``local_ranks`` ranks on a node with ``gpus`` GPUs.

    ``requested``: None (choose), ``"nccl"`` (error unless every local rank has a GPU) or ``"gloo"``.
    """
    if requested not in (None, "nccl", "gloo"):
        raise ValueError(f"backend must be None, 'nccl' or 'gloo', got {requested!r}")
    enough = gpus >= local_ranks > 0
    if requested == "nccl" and not enough:
        raise RuntimeError(f"backend='nccl' needs one GPU per local rank: {local_ranks} local ranks, {gpus} GPU(s) "
                           "visible. Start fewer ranks per node (torchrun --nproc-per-node), or use gloo")
    if requested == "gloo" or not enough:
        if requested is None and gpus:
            warnings.warn(f"{local_ranks} local ranks but {gpus} GPU(s): NCCL needs one GPU per rank, so the ranks "
                          "use gloo on the CPU", stacklevel=3)
        return "gloo"
    return "cpu:gloo,cuda:nccl"


def backends() -> dict[str, str]:
    """The default group's backend per device type, e.g. ``{"cpu": "gloo", "cuda": "nccl"}``."""
    if not dist.is_initialized():
        return {}
    config = dist.get_backend_config()  # "cpu:gloo,cuda:nccl"; "cpu:gloo,cuda:gloo" for plain gloo
    return dict(part.split(":") for part in config.split(",") if ":" in part)


def current_device() -> torch.device:
    """The device this rank computes on: its GPU when the default group moves CUDA tensors
    with NCCL, else the CPU."""
    if backends().get("cuda") == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_from_env(timeout: float = 600.0, backend: str | None = None) -> torch.device:
    """Start the default group from torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE /
    MASTER_*, with the backend of :func:`choose_backend`; returns :func:`current_device`."""
    if not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        config = choose_backend(gpus, local_ranks, backend)
        extra = {}
        if "nccl" in config:
            extra["device_id"] = torch.device("cuda", local_rank)  # NCCL knows its device from the start
            torch.cuda.set_device(extra["device_id"])
        dist.init_process_group(config, timeout=timedelta(seconds=timeout), **extra)
        for after_start in AFTER_START:
            after_start()
    return current_device()


def ensure_default_group(device_type: str, world_size: int) -> None:
    """Start the default process group if nobody did (torchrun, our launcher, a user)."""
    if dist.is_initialized():
        return
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        init_from_env()
    elif world_size == 1:  # a one-rank mesh in a plain notebook or script
        backend = "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    else:
        raise RuntimeError(
            f"a {world_size}-rank DeviceMesh needs {world_size} processes: start them with "
            "tensorplay_edu.launch(fn, world_size) or `torchrun --nproc-per-node N`, "
            "then build the mesh inside each rank"
        )


def check_cuda(device_type: str, what: str) -> None:
    """A CUDA mesh needs a CUDA device here: say so, and how to fix it, before anything starts
    (without the check, picking this rank's GPU would divide by a device count of 0)."""
    if device_type != "cuda":
        return
    available = torch.cuda.is_available()
    if not available or torch.cuda.device_count() == 0:
        build = (f"this PyTorch ({torch.__version__}) is a CPU-only build" if torch.version.cuda is None
                 else f"this PyTorch is built for CUDA {torch.version.cuda} but sees no GPU")
        raise RuntimeError(
            f"{what}: this machine has no CUDA device (torch.cuda.is_available() is {available}, "
            f"{torch.cuda.device_count() if available else 0} device(s); {build}). Build the mesh "
            "with 'cpu' (gloo runs every collective on the CPU), or run on a GPU machine with a CUDA build of "
            "PyTorch (pip install torch from the CUDA index: https://pytorch.org/get-started/locally/)")


def check_backend(device_type: str) -> None:
    """The default group must move ``device_type`` tensors: a CPU mesh on an NCCL-only group
    would fail at its first collective ("No backend type associated with device type cpu")."""
    have = backends()
    if device_type not in have:
        raise RuntimeError(
            f"DeviceMesh('{device_type}'): the default process group has no backend for {device_type} tensors "
            f"(it has {dist.get_backend_config()}). Start it with backend='cpu:gloo,cuda:nccl' (one group for both, "
            "as tensorplay_edu.process_group.init_from_env does), or build the mesh on a device type it has: "
            f"{sorted(have)}")


def default_group_timeout():
    """The default group's collective timeout, for the mesh's own groups.

    ``dist.new_group`` would give them gloo's 30 minutes, whatever ``init_process_group``
    (or ``launch(timeout=...)``) asked for: a mismatched collective on ``mesh["dp"]`` would
    then hang a notebook for half an hour instead of failing with the others' timeout.
    """
    for device in ("cpu", "cuda"):
        try:
            return dist.group.WORLD._get_backend(torch.device(device)).options._timeout
        except Exception:  # no backend for that device (or no such internals): try the next
            continue
    return None  # PyTorch's default

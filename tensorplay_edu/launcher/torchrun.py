"""Running under ``torchrun`` (or any launcher that sets RANK / WORLD_SIZE / LOCAL_RANK).

    torchrun --nproc-per-node 2 -m tensorplay_edu.lab.demo

:func:`run_from_env` starts the default group from the environment, runs the worker
function, and ends the rank the way :func:`tensorplay_edu.launch` ends its ranks
(:func:`finish`): barrier, ``destroy_process_group``, flush, ``os._exit``, which avoids
gloo's abort at interpreter exit (pytorch/pytorch#190489).

Which backend (:func:`choose_backend`):

* one GPU for every local rank: ``"cpu:gloo,cuda:nccl"``, one default group with a backend
  for each kind of tensor, as PyTorch starts it: NCCL moves CUDA tensors, gloo CPU ones,
  so a CPU mesh (``init_device_mesh("cpu", ...)``) works on a GPU node too;
* fewer GPUs than local ranks (two ranks on a one-GPU laptop): gloo for everything, with
  a warning, or an error if NCCL was asked for;
* no GPU: gloo.

The timeout is PyTorch's 10 minutes (a rank loading a checkpoint while the others wait
in a collective must not be killed), and NCCL is told its device (``device_id``) up front.
With ``TENSORPLAY_CHECK_NCCL=1`` every rank then checks NCCL's rules
(:class:`~tensorplay_edu.gpu_rules.nccl.NCCLRulesMode`) for the rest of its life.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from ..gpu_rules import nccl as nccl_rules

__all__ = ["choose_backend", "backends", "current_device", "init_from_env", "run_from_env", "finish"]


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


def finish(code: int) -> None:
    """The ending that never aborts: barrier, destroy, flush, ``os._exit``."""
    if code == 0 and dist.is_initialized():
        if nccl_rules.summary():  # TENSORPLAY_CHECK_NCCL=1 and nothing raised
            print(nccl_rules.summary())
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # a peer died after its result was in: nothing left to protect
            code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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
        nccl_rules.from_env()  # TENSORPLAY_CHECK_NCCL=1: check NCCL's rules from here on
    return current_device()


def exit_code(stop: SystemExit) -> int:
    """What the shell would see for ``sys.exit(code)``: None is 0, an int itself, anything else 1."""
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)  # sys.exit("message") prints the message
    return 1


def run_from_env(fn, *args, timeout: float = 600.0, backend: str | None = None) -> None:
    """Under ``torchrun --nproc-per-node N``: start the group, run ``fn(*args)``, end cleanly
    with ``fn``'s exit code (``sys.exit(n)`` in ``fn`` ends the rank with ``n``)."""
    init_from_env(timeout, backend)
    try:
        fn(*args)
    except SystemExit as stop:
        finish(exit_code(stop))
    except BaseException:
        traceback.print_exc()
        finish(1)
    finish(0)

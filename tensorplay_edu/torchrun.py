"""Running under ``torchrun`` (or any launcher that sets RANK / WORLD_SIZE / LOCAL_RANK).

    torchrun --nproc-per-node 2 -m tensorplay_edu.demo

:func:`run_from_env` starts the default group from the environment, runs the worker
function, and ends the rank the way :func:`tensorplay_edu.launch` ends its ranks
(:func:`finish`): barrier, ``destroy_process_group``, flush, ``os._exit``, which avoids
gloo's abort at interpreter exit (pytorch/pytorch#190489).
"""

from __future__ import annotations

import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["current_device", "init_from_env", "run_from_env", "finish"]


def current_device() -> torch.device:
    """The device this rank computes on: ``cuda:LOCAL_RANK`` under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def finish(code: int) -> None:
    """The ending that never aborts: barrier, destroy, flush, ``os._exit``."""
    if code == 0 and dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # a peer died after its result was in: nothing left to protect
            code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def init_from_env(timeout: float = 60.0) -> torch.device:
    """Start the default group from torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_*.

    NCCL on ``cuda:LOCAL_RANK`` when CUDA is there, gloo on the CPU otherwise.
    """
    if not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            backend = "nccl"
        else:
            backend = "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    return current_device()


def run_from_env(fn, *args, timeout: float = 60.0) -> None:
    """Under ``torchrun --nproc-per-node N``: start the group, run ``fn(*args)``, end cleanly."""
    init_from_env(timeout)
    try:
        fn(*args)
    except SystemExit as stop:
        finish(stop.code if isinstance(stop.code, int) else 1)
    except BaseException:
        traceback.print_exc()
        finish(1)
    finish(0)

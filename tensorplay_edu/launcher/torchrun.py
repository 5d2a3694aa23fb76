"""Running under ``torchrun`` (or any launcher that sets RANK / WORLD_SIZE / LOCAL_RANK).

    torchrun --nproc-per-node 2 -m tensorplay_edu.lab.demo

:func:`run_from_env` starts the default group from the environment
(:func:`tensorplay_edu.process_group.init_from_env`: which backend, which device), runs the
worker function, and ends the rank the way :func:`tensorplay_edu.launch` ends its ranks
(:func:`finish`): barrier, ``destroy_process_group``, flush, ``os._exit``, which avoids
gloo's abort at interpreter exit (pytorch/pytorch#190489).

With ``TENSORPLAY_CHECK_NCCL=1`` every rank checks NCCL's rules
(:class:`~tensorplay_edu.gpu_rules.nccl.NCCLRulesMode`) from the moment its group starts
from the environment (this module puts the checker in ``process_group.AFTER_START``).
"""

from __future__ import annotations

import os
import sys
import traceback

import torch.distributed as dist

from .. import process_group
from ..gpu_rules import nccl as nccl_rules
from ..process_group import backends, choose_backend, current_device, init_from_env  # noqa: F401  (re-exported)

__all__ = ["choose_backend", "backends", "current_device", "init_from_env", "run_from_env", "finish"]

process_group.AFTER_START.append(nccl_rules.from_env)  # TENSORPLAY_CHECK_NCCL=1: check NCCL's rules from the start


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

"""Inside one launched rank: its output to a file, its group from the launch's rendezvous file,
its result back to the parent through its pipe, and its clean ending.

:func:`_rank_main` is what :func:`~tensorplay_edu.launcher.launch` starts in each child process.  The
rank ignores Ctrl-C (the parent kills every rank), exits when the parent's pipe closes, sends a
plain copy of its result (float8 tensors as their bytes: they do not pickle), or its traceback,
and ends with barrier, ``destroy_process_group``, flush, ``os._exit``: gloo aborts at interpreter
exit otherwise (pytorch/pytorch#190489).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import traceback
from datetime import timedelta

import cloudpickle
import torch
import torch.distributed as dist

from ..gpu_rules import nccl as nccl_rules
from .torchrun import finish


def _plain(obj):
    """A copy of ``obj`` that outlives this process: tensors detached, cloned, on the CPU."""
    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().clone()
        return _Float8Bytes(obj) if obj.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(o) for o in obj) if not hasattr(obj, "_fields") else type(obj)(*map(_plain, obj))
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


class _Float8Bytes:
    """A float8 tensor on its way back to the parent: its bytes (float8 tensors do not pickle)."""

    def __init__(self, tensor: torch.Tensor):
        self.data, self.dtype = tensor.view(torch.uint8), str(tensor.dtype).removeprefix("torch.")

    def __reduce__(self):
        return _float8_from_bytes, (self.data, self.dtype)


def _float8_from_bytes(data: torch.Tensor, dtype: str) -> torch.Tensor:
    return data.view(getattr(torch, dtype))


def _watch_parent(alive, folder: str) -> None:
    """In a rank: block on the parent's pipe; it closes when the parent ends (or dies): clean up, exit."""
    def watch():
        with contextlib.suppress(Exception):
            alive.recv_bytes()  # nothing is ever sent: this returns (EOFError) when the parent is gone
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(70)

    threading.Thread(target=watch, name="tensorplay-parent-watch", daemon=True).start()


def _rank_main(payload: bytes, rank: int, world_size: int, store_path: str, backend: str, timeout: float,
               threads: int, conn, log_path: str, alive=None, check_nccl: dict | None = None) -> None:
    """Entry point of one launched rank (runs in the child process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it kills every rank
    if alive is not None:
        _watch_parent(alive, os.path.dirname(store_path))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    torch.set_num_threads(threads)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), **(check_nccl or {}))
    try:
        fn, args = cloudpickle.loads(payload)
        wait = timedelta(seconds=timeout)
        store = dist.FileStore(store_path, world_size)
        extra = {}
        if backend == "nccl":  # the first CUDA call of this process: the forkserver never touched CUDA
            extra["device_id"] = torch.device("cuda", rank)
            torch.cuda.set_device(extra["device_id"])
            backend = "cpu:gloo,cuda:nccl"  # CPU meshes keep working beside the GPU ones
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=wait, **extra)
        nccl_rules.from_env(min(30.0, timeout / 2))  # the parent's TENSORPLAY_CHECK_NCCL (set above)
        result = fn(*args)
        try:
            blob = cloudpickle.dumps(_plain(result))
        except Exception as err:
            raise TypeError(f"the function returned {type(result).__name__}, which cannot be sent back: {err}. "
                            "Return plain tensors, numbers, lists or dicts (DTensor: .to_local() or "
                            ".full_tensor()).") from err
        conn.send_bytes(b"R" + blob)
    except BaseException:
        conn.send_bytes(b"E" + traceback.format_exc().encode())
        finish(1)
    finish(0)

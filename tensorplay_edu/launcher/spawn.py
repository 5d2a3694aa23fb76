"""Run one function on several ranks: from a notebook cell, a script or a test.

    from tensorplay_edu import launch
    def work(n):                          # may be defined in a notebook cell
        import torch.distributed as dist
        return dist.get_rank() * n
    launch(work, 4, 10)                   # -> [0, 10, 20, 30]

:func:`launch` forks the ranks from a forkserver, a single-threaded process that has imported torch
once (``fork`` of a threaded notebook kernel can deadlock; ``spawn`` costs seconds per launch).  The
function travels by value with cloudpickle (a notebook's functions have no importable name), and the
ranks meet through a ``FileStore`` in a fresh temporary folder (no port to collide).  Each rank
(:mod:`~tensorplay_edu.launcher.rank`) runs ``torch.set_num_threads(threads)`` (default 1: ranks x
threads must not exceed the cores), writes its output to a file, which the parent prints after the
run with a ``[rank r]`` prefix, and sends back a plain copy of its result (tensors detached, on the
CPU), read while the ranks run.  ``TENSORPLAY_CHECK_NCCL=1`` in the parent makes every rank check
NCCL's rules.

A rank that raises or dies stops them all: the parent kills the others and raises
:class:`RankError`, naming the rank that failed first (:mod:`~tensorplay_edu.launcher.faults`).
Every collective times out after ``timeout`` seconds; ranks still running ``timeout`` seconds after
another finished, and ranks that all use no CPU for that long (a sleep, a lock, ``input()``), are
killed with a ``TimeoutError``.  No rank outlives the call, not even on Ctrl-C or when the parent is
killed (each rank watches a pipe that only the parent holds).

Under torchrun, :func:`~tensorplay_edu.launcher.torchrun.run_from_env` runs the same worker function.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import multiprocessing as mp
import multiprocessing.spawn as mp_spawn
import multiprocessing.connection  # noqa: F401  (mp.connection.wait)
import multiprocessing.forkserver  # noqa: F401  (mp.forkserver, mp.resource_tracker)
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import types

import cloudpickle
import torch

from ..gpu_rules import nccl as nccl_rules
from .faults import _GRACE, _IDLE_EXTRA, RankError, _check_arguments, _IdleWatch, _kind, _rank_error, _read
from .rank import _rank_main
from .torchrun import current_device, init_from_env, run_from_env  # noqa: F401  (re-exported)

__all__ = ["launch", "RankError", "run_from_env", "init_from_env", "current_device"]

_LOCK = threading.Lock()


def _context(start_method: str):
    with _LOCK:
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "cloudpickle"])
            mp.resource_tracker.ensure_running()  # first: starting it unblocks SIGINT
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])  # the forkserver inherits it until
            try:  # it ignores SIGINT, so a Ctrl-C while it imports torch does not kill it with a traceback
                mp.forkserver.ensure_running()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return ctx


@contextlib.contextmanager
def _ctrl_c_held_back():
    """Hold a Ctrl-C back while the ranks start, then raise it: by then each rank is known and can be killed."""
    pressed, hold = [], threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler  # else no KeyboardInterrupt comes here
    if hold:
        signal.signal(signal.SIGINT, lambda *_: pressed.append(True))
    try:
        yield
    finally:
        if hold:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if pressed:
            raise KeyboardInterrupt from None  # in place of whatever else went wrong meanwhile


@contextlib.contextmanager
def _without_main():
    """Start processes without re-running the parent's ``__main__`` in each of them.

    ``spawn`` and ``forkserver`` normally re-import the main script in every child so
    that functions can be found by name; ours travel by value (cloudpickle), and
    re-running a script without an ``if __name__ == "__main__":`` guard would launch
    again from inside the rank.  So the preparation data leaves the main module out.
    """
    original = mp_spawn.get_preparation_data

    def preparation_data(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    with _LOCK:
        mp_spawn.get_preparation_data = preparation_data
        try:
            yield
        finally:
            mp_spawn.get_preparation_data = original


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, plus modules of a ModuleType subclass (torch's config modules, e.g.
    ``torch._inductor.config``, which a function sets for async TP) sent by name."""

    def reducer_override(self, obj):
        if isinstance(obj, types.ModuleType) and type(obj) is not types.ModuleType and obj.__name__ in sys.modules:
            return importlib.import_module, (obj.__name__,)
        return super().reducer_override(obj)


def _dumps(obj) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer).dump(obj)
    return buffer.getvalue()


def launch(fn, world_size: int = 2, *args, backend: str = "gloo", timeout: float = 60.0, threads: int = 1,
           start_method: str = "forkserver") -> list:
    """Run ``fn(*args)`` on ``world_size`` ranks; return their results in rank order.

    Args:
        fn: any function, including one defined in a notebook cell or a lambda.
        world_size: number of ranks (processes).
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank, ``cuda:rank``; the group then
            has gloo for CPU tensors too: ``"cpu:gloo,cuda:nccl"``).
        timeout: seconds a collective may wait before it fails (at most 60 by default).
        threads: intra-op threads per rank.
        start_method: ``"forkserver"`` (default), ``"spawn"`` or ``"fork"``.

    Raises:
        RankError: a rank raised (its traceback is in the message) or died.
        TimeoutError: ranks still running ``timeout`` seconds after another finished.
    """
    _check_arguments(fn, world_size, timeout, threads, backend)
    if backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < world_size):
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise RuntimeError(f"launch(backend='nccl') needs {world_size} CUDA devices, found {found}: "
                           "use backend='gloo' on the CPU")
    ctx = _context(start_method)
    check_nccl = {k: os.environ.get(k, "") for k in (nccl_rules.ENV, nccl_rules.ENV_TIMEOUT)}  # (forkserver: old env)
    payload = _dumps((fn, args))
    logdir = tempfile.mkdtemp(prefix="tensorplay_ranks_")  # rendezvous file and rank logs
    store_path = os.path.join(logdir, "rendezvous")
    logs = [os.path.join(logdir, f"rank{r}.log") for r in range(world_size)]
    procs, conns = [], []
    alive, parent_end = ctx.Pipe(duplex=False)  # the ranks watch `alive`; only this process holds `parent_end`
    try:
        with _ctrl_c_held_back(), _without_main():
            for r in range(world_size):
                recv, send = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_rank_main, name=f"tensorplay-rank{r}", daemon=True,
                                args=(payload, r, world_size, store_path, backend, timeout, threads, send, logs[r],
                                      alive, check_nccl))
                p.start()
                send.close()
                procs.append(p)
                conns.append(recv)
        results = _collect(procs, conns, timeout, logs)
        for p in procs:  # let them finish their barrier -> destroy -> exit
            p.join(timeout=5)
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join()
        for c in (*conns, alive, parent_end):
            c.close()
        _print_logs(logs)
        shutil.rmtree(logdir, ignore_errors=True)


def _collect(procs, conns, timeout: float, logs) -> list:
    """Read every rank's result as it arrives; fail fast on the first error or death.

    A rank's pipe reaches end-of-file only when its process is gone, so a rank that
    dies without a word (``os._exit``, a signal, a crash) shows up here too.  A rank
    that only lost its peer waits up to ``_GRACE`` s for the error of the rank that died.
    """
    results, failed, first_done_at, grace_end = {}, [], None, None
    pending = {c: r for r, c in enumerate(conns)}
    idle = _IdleWatch(procs, timeout + _IDLE_EXTRA)
    while pending:
        if failed and (any(kind != "peer" for _, _, kind in failed) or time.monotonic() >= grace_end):
            break  # the root cause is in, or it had its grace period
        end = grace_end or (first_done_at and first_done_at + timeout)
        left = None if end is None else max(0.0, end - time.monotonic())
        if left == 0 and not failed:
            raise TimeoutError(
                f"ranks {sorted(pending.values())} were still running {timeout:g} s after another rank "
                "finished: they are probably waiting in a collective the others never issued (a mismatched "
                "or skipped collective). They were killed; raise launch(timeout=...) if they were just slow.")
        if not failed and idle.all_idle(sorted(pending.values())):
            raise TimeoutError(
                f"ranks {sorted(pending.values())} used no CPU for {idle.window:g} s and returned nothing: each is "
                "waiting outside any collective (a sleep, a lock, input(), a queue nobody fills). They were "
                "killed; if they wait on purpose, raise launch(timeout=...).")
        for conn in mp.connection.wait(list(pending), timeout=1.0 if left is None else min(left, 1.0)):
            r = pending.pop(conn)
            try:
                msg = conn.recv_bytes()
            except EOFError:  # died without a word: gloo's last words may be in its log
                procs[r].join(timeout=5)
                msg = b"D" + _read(logs[r])[-4000:].encode()
            if msg[:1] == b"R":
                results[r] = cloudpickle.loads(msg[1:])
                first_done_at = first_done_at or time.monotonic()
            else:
                failed.append((r, msg[1:].decode() if msg[:1] == b"E" else "", _kind(msg[1:].decode())))
        if failed and grace_end is None:
            grace_end = time.monotonic() + _GRACE
    if failed:
        raise _rank_error(failed, procs, results)
    return [results[r] for r in range(len(procs))]


def _print_logs(logs) -> None:
    """Each rank's output, in rank order, every line prefixed with its rank."""
    for r, path in enumerate(logs):
        for line in _read(path).splitlines():
            print(f"[rank {r}] {line}")
    sys.stdout.flush()

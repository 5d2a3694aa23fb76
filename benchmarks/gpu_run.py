"""Run one `make gpu-check` check under torchrun, and prove where it ran.

    torchrun --standalone --nproc-per-node 8 benchmarks/gpu_run.py -m tensorplay_edu.lab.demo --steps 10
    torchrun --standalone --nproc-per-node 8 benchmarks/gpu_run.py benchmarks/gpu_measure.py --check d

A check that falls back to gloo on the CPU (``LOCAL_WORLD_SIZE`` missing, a CPU build of
torch) would still print its OK line, so every check of ``benchmarks/gpu_check.sh`` starts
through this wrapper, which

1. starts the default group itself (:func:`tensorplay_edu.launcher.torchrun.init_from_env`) with a
   SHORT timeout, ``GPU_CHECK_NCCL_TIMEOUT`` seconds (default 180): below the script's
   per-check kill, so that on a hang NCCL's watchdog fires first and, with the flight
   recorder on (``TORCH_NCCL_TRACE_BUFFER_SIZE``, ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, set by the
   script), dumps which collective each rank was stuck in. The check's own
   ``run_from_env`` then finds the group started and keeps it;
2. prints the backend and each rank's device (rank 0, one line starting ``gpu_run: ran on:``);
3. with ``GPU_CHECK_DEVICE=cuda`` (the script sets it on a GPU machine) REQUIRES NCCL for
   CUDA tensors and a CUDA device on every rank, and exits 1 before the check runs otherwise;
4. runs the check (a module with ``-m``, or a script) with a ``TorchDispatchMode`` that sees
   every collective as an op of namespace ``c10d`` (``torch.distributed``'s own: ours, DDP's,
   PyTorch's DTensor redistributions) or ``_c10d_functional`` (the functional collectives that
   PyTorch's TP and async TP go through; their ``wait_tensor`` and ``_wrap_tensor_autograd`` are
   not collectives) and notes
   its tensors' device;
5. when the check ends, prints how many collectives ran on which device (rank 0, one line
   starting ``gpu_run: collectives``) and, under ``GPU_CHECK_DEVICE=cuda``, turns a clean exit
   into status 1 if any ran on the CPU or none on CUDA. ``GPU_CHECK_WATCH=0`` leaves steps 4
   and 5 out: a dispatch mode costs host time on every aten op, so the timed checks turn it off
   (and check their own tensors' device).

Object collectives (``all_gather_object``, ``broadcast_object_list``, ``gather_object``,
``scatter_object_list``: the checks' report bookkeeping) are NOT counted: on a
``cpu:gloo,cuda:nccl`` group PyTorch runs them on the CPU by rule (``_get_object_coll_device`` in
``torch/distributed/distributed_c10d.py``: a pickled object lives in CPU memory), so counting
them would fail every correct GPU run. The wrapper pauses the count inside them and reports
them on their own ("n object collectives on cpu (PyTorch's rule)").

Step 5 runs inside the check's own ending: ``run_from_env`` ends a rank with
``tensorplay_edu.launcher.torchrun.finish`` (``os._exit``), so the wrapper puts its report in front of it.
The ranks first exchange their exit codes (bounded by the collective timeout): the report's
collective runs only when every rank ended cleanly, so a rank that fails (the demo exits 1 on
rank 0 alone on a FAIL) never leaves the others waiting in it.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))


COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional")  # torch.distributed's ops; the functional ones
NOT_COLLECTIVES = ("wait_tensor", "_wrap_tensor_autograd")  # _c10d_functional's wait for an earlier result, and
                                                           # its wrapping of one for autograd: no communication
OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list")


class CollectiveDevices(TorchDispatchMode):
    """Counts the collectives (ops of ``COLLECTIVE_NAMESPACES``, ours and PyTorch's) by the device
    of their first tensor argument; every other op passes through untouched.

    While it is entered, ``torch.distributed``'s object collectives are wrapped: inside them the
    count pauses (PyTorch picks their device, the CPU on a ``cpu:gloo,cuda:nccl`` group) and
    ``objects`` counts the calls by that device instead."""

    def __init__(self):
        super().__init__()
        self.devices: Counter = Counter()
        self.objects: Counter = Counter()  # object collectives, by the device PyTorch ran them on
        self._paused = 0
        self._saved: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if (not self._paused and func.namespace in COLLECTIVE_NAMESPACES
                and func.overloadpacket.__name__ not in NOT_COLLECTIVES):
            first = next((a for a in _tensors(args) if isinstance(a, torch.Tensor)), None)
            if first is not None:
                self.devices[first.device.type] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        from torch.distributed import distributed_c10d

        for name in OBJECT_COLLECTIVES:
            plain = getattr(distributed_c10d, name)
            self._saved[name] = plain
            wrapped = self._uncounted(plain)
            setattr(distributed_c10d, name, wrapped)
            setattr(dist, name, wrapped)  # `dist.all_gather_object(...)` looks it up here, at call time
        return super().__enter__()

    def __exit__(self, *exc):
        from torch.distributed import distributed_c10d

        for name, plain in self._saved.items():
            setattr(distributed_c10d, name, plain)
            setattr(dist, name, plain)
        self._saved = {}
        return super().__exit__(*exc)

    def _uncounted(self, plain):
        def wrapped(*args, **kwargs):
            try:  # PyTorch's own pick (private; the group may come positionally: then the default group's)
                from torch.distributed.distributed_c10d import _get_object_coll_device
                device = _get_object_coll_device(kwargs.get("group"))
            except Exception:
                device = "a device PyTorch picks"
            self.objects[device] += 1
            self._paused += 1
            try:
                return plain(*args, **kwargs)
            finally:
                self._paused -= 1

        wrapped.__wrapped__ = plain
        return wrapped


def _tensors(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _tensors(a)
        else:
            yield a


def _gather(obj) -> list:
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, obj)  # plain torch.distributed: the report's bookkeeping
    return everyone


def backend_line(require: str) -> tuple[str, bool]:
    """The ``gpu_run: ran on: ...`` line and whether it meets ``require`` ("cuda" or "")."""
    from tensorplay_edu.launcher.torchrun import backends, current_device

    device = current_device()
    devices = _gather(str(device))
    config = dist.get_backend_config()
    ok = not require or (backends().get("cuda") == "nccl" and all(d.startswith("cuda") for d in devices))
    line = (f"gpu_run: ran on: {backends().get(device.type, '?')} on {len(devices)} {device.type} rank(s) "
            f"(backend {config}; {', '.join(devices)})")
    if require:
        line += f"; required: nccl on a CUDA device per rank: {'yes' if ok else 'NO'}"
    return line, ok


def collectives_line(seen: Counter, require: str, objects: Counter | None = None) -> tuple[str, bool]:
    """The ``gpu_run: collectives ...`` line (every rank's counts) and whether it meets ``require``;
    ``objects`` (the object collectives, not counted in ``seen``) are reported on their own."""
    everyone = _gather((dict(seen), dict(objects or {})))
    total: Counter = Counter()
    total_objects: Counter = Counter()
    for counts, object_counts in everyone:
        total.update(counts)
        total_objects.update(object_counts)
    ok = not require or (total.get("cpu", 0) == 0 and total.get("cuda", 0) > 0)
    parts = ", ".join(f"{n} on {dev}" for dev, n in sorted(total.items())) or "none"
    line = (f"gpu_run: collectives over all ranks (torch.distributed, seen as c10d and _c10d_functional ops): "
            f"{parts}")
    if require:
        line += f"; required: all on cuda: {'yes' if ok else 'NO'}"
    if total_objects:
        line += "; not counted: " + ", ".join(f"{n} object collectives on {dev}"
                                              for dev, n in sorted(total_objects.items())) + " (PyTorch's rule)"
    return line, ok


def _close_and_exit(code: int) -> None:
    """Every rank calls this together (they all know the codes): barrier and destroy on all of them, then
    ``os._exit(code)`` (``torchrun.finish`` would skip the barrier on the failing rank alone and leave
    the others waiting in theirs)."""
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        code = code or 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str]) -> None:
    from tensorplay_edu.launcher import torchrun

    if not argv or (argv[0] == "-m" and len(argv) < 2):
        raise SystemExit("usage: gpu_run.py -m MODULE [ARGS...] | gpu_run.py SCRIPT [ARGS...] (under torchrun)")
    require = os.environ.get("GPU_CHECK_DEVICE", "")
    if require not in ("", "cuda"):
        raise SystemExit(f"gpu_run.py: GPU_CHECK_DEVICE must be 'cuda' or unset, got {require!r}")
    timeout = float(os.environ.get("GPU_CHECK_NCCL_TIMEOUT", "180"))
    torchrun.init_from_env(timeout=timeout)
    line, ok = backend_line(require)
    if dist.get_rank() == 0:
        print(line + f"; collective timeout {timeout:.0f} s", flush=True)
    if not ok:
        torchrun.finish(1)
    watch = os.environ.get("GPU_CHECK_WATCH", "1") != "0"
    mode = CollectiveDevices() if watch else contextlib.nullcontext()
    plain_finish = torchrun.finish
    ended = []

    def finish(code: int) -> None:  # the check's ending, with the device report in front of it
        if ended:  # once per rank: a second call means the first broke part-way: end, no barrier
            plain_finish(code or 1)
        ended.append(code)
        mode.__exit__(None, None, None)
        try:  # every rank's code first: the report's collective runs only when all ended cleanly
            codes = _gather(code)
        except Exception as err:  # a rank died before its ending: the collective timeout ended the wait
            print(f"gpu_run: rank {dist.get_rank()}: exchanging exit codes failed ({type(err).__name__})",
                  flush=True)
            plain_finish(code or 1)
        if any(codes):  # some rank failed: close the group on every rank together, each with its own code
            _close_and_exit(code)
        if watch:
            line, ok = collectives_line(mode.devices, require, mode.objects)
            if dist.get_rank() == 0:
                print(line, flush=True)
            code = 0 if ok else 1
        elif dist.get_rank() == 0:
            print("gpu_run: collectives not watched (GPU_CHECK_WATCH=0: a timed check, which checks its own "
                  "tensors' device)", flush=True)
        plain_finish(code)

    torchrun.finish = finish
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        target, run = argv[1], runpy.run_module
    else:
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        target, run = argv[0], runpy.run_path
    mode.__enter__()
    try:
        run(target, run_name="__main__")
    except SystemExit as stop:
        finish(torchrun.exit_code(stop))
    except BaseException:
        import traceback
        traceback.print_exc()
        finish(1)
    finish(0)  # a check that returned without run_from_env's ending


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    main(sys.argv[1:])

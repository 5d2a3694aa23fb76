"""No host synchronisation in a training step, checked where the step really runs.

    torchrun --standalone --nproc-per-node 2 benchmarks/gpu_sync_check.py

Every rank builds the small Llama under the vanilla and the full plan on
``current_device()`` (its GPU when the default group is "cpu:gloo,cuda:nccl", else the
CPU), runs a warm-up step, then checks one training step (forward, loss, backward):

* on any device, a ``TorchDispatchMode`` counts the aten ops that copy a value from the
  device to the host (``SYNCS``: on a GPU each one waits for every queued kernel); there
  must be none;
* on a GPU, the step runs twice more: under ``torch.cuda.set_sync_debug_mode("warn")``,
  where every synchronising CUDA call (a device-to-host copy, a stream synchronisation)
  warns, and the warnings are counted; then under ``"error"``, where the first one raises.
  Both must stay silent. On the CPU this part is skipped, with a message saying so.

The ranks exchange their findings; rank 0 prints one verdict line, last, starting with
"PASS host syncs:" or "FAIL host syncs:", and every rank exits 0 or 1 accordingly.
(tests/test_devices.py makes the dispatch-mode check on launched CPU ranks; this script
is the one ``benchmarks/gpu_check.sh`` runs under torchrun on the GPUs.)
"""

from __future__ import annotations

import warnings
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from tensorplay_edu import init_device_mesh
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
from tensorplay_edu.torchrun import current_device, run_from_env

# Ops that copy a value from the device to the host: on a GPU each one waits for every queued kernel.
SYNCS = ("aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.equal")
# 8 heads and a 16-token sequence split over 1, 2, 4 or 8 ranks (the full plan shards the sequence).
ARGS = ModelArgs(dim=64, n_layers=2, n_heads=8, vocab_size=64, max_seq_len=16)
PLANS = ("vanilla", "full")


class CountOps(TorchDispatchMode):
    """Every aten op that runs while it is active, by name (e.g. "aten._local_scalar_dense")."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _first_line(text: str) -> str:
    return str(text).strip().splitlines()[0][:200] if str(text).strip() else "?"


def check_plan(plan: str, device: torch.device) -> dict:
    """This rank's findings for one plan: sync ops seen by the dispatch mode; CUDA sync-debug warnings and error."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    torch.manual_seed(0)
    model = parallelize_llama(Transformer(ARGS).to(device), mesh, plan)
    tokens = torch.randint(0, ARGS.vocab_size, (2, ARGS.max_seq_len), generator=torch.Generator().manual_seed(1))
    tokens = tokens.to(device)
    labels = tokens.roll(-1, dims=1)

    def step():
        with loss_context(plan):
            loss = llama_loss(model(tokens), labels)
        loss.backward()
        return loss

    step()  # warm-up: lazy initialisation (cuBLAS handles, NCCL communicators) may synchronise once
    model.zero_grad(set_to_none=True)
    found = {"plan": plan, "syncs": {}, "ops": 0, "warnings": [], "error": None, "cuda": device.type == "cuda"}
    with CountOps() as seen:
        step()
    found["syncs"] = {op: n for op, n in seen.ops.items() if op in SYNCS}
    found["ops"] = sum(seen.ops.values())
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()  # the queue is empty; what follows is the step alone
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        found["warnings"] = [_first_line(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
        except RuntimeError as err:
            found["error"] = _first_line(err)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
    return found


def main() -> None:
    device, world, rank = current_device(), dist.get_world_size(), dist.get_rank()
    mine = [check_plan(plan, device) for plan in PLANS]
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)  # plain torch.distributed: the report's bookkeeping
    bad = []
    for r, findings in enumerate(everyone):
        for f in findings:
            if f["syncs"]:
                bad.append(f"rank {r} {f['plan']}: {f['syncs']} (dispatch mode)")
            if f["ops"] < 100:
                bad.append(f"rank {r} {f['plan']}: only {f['ops']} aten ops seen: the step did not run under the mode")
            if f["warnings"]:
                bad.append(f"rank {r} {f['plan']}: {len(f['warnings'])} sync-debug warning(s), first: "
                           f"{f['warnings'][0]}")
            if f["error"]:
                bad.append(f"rank {r} {f['plan']}: sync-debug error: {f['error']}")
    if rank == 0:
        config = dist.get_backend_config()
        ops = ", ".join(f"{f['plan']} {f['ops']}" for f in everyone[0])
        print(f"{world} rank(s) on {device.type} ({config}); rank 0's aten ops per checked step: {ops}")
        for line in bad:
            print("  " + line)
        if device.type == "cuda":
            cuda_part = ('torch.cuda.set_sync_debug_mode: no warning under "warn", no error under "error"' if not bad
                         else "torch.cuda.set_sync_debug_mode and the dispatch mode: see above")
        else:
            print(f"SKIP CUDA sync-debug mode (torch.cuda.set_sync_debug_mode): the ranks run on {device.type}, "
                  "no CUDA device; host syncs counted with a TorchDispatchMode only")
            cuda_part = "CUDA sync-debug mode skipped (no CUDA device)"
        what = (f"a training step (forward, loss, backward) of the {' and '.join(PLANS)} plans "
                f"on {world} {device.type} rank(s)")
        if bad:
            print(f"FAIL host syncs: {len(bad)} finding(s) in {what}; {cuda_part}", flush=True)
        else:
            print(f"PASS host syncs: none of {', '.join(s.split('.')[-1] for s in SYNCS)} in {what}; {cuda_part}",
                  flush=True)
    if bad:
        raise SystemExit(1)  # on every rank: they all saw the same findings


if __name__ == "__main__":
    run_from_env(main)

"""No host synchronisation in a training step, checked where the step really runs.

    torchrun --standalone --nproc-per-node 2 benchmarks/gpu_sync_check.py

Every rank builds the small Llama in bf16 on ``current_device()`` (its GPU when the default
group is "cpu:gloo,cuda:nccl", else the CPU) in each case of ``CASES``: the vanilla and the
full plan, the full plan with float8 (the model converted, the float8 styles; on GPUs below
compute capability 8.9 skipped, with the reason) and with async TP. A step is the whole
training step: forward, loss, backward AND the AdamW step. After a warm-up step each case
checks one step:

* on any device, a ``TorchDispatchMode`` counts the aten ops that copy a value from the
  device to the host (``SYNCS``: on a GPU each one waits for every queued kernel); there
  must be none. AdamW's step counters are exempt: they live on the CPU (unless
  ``capturable=True``) and AdamW reads them with ``.item()``, a CPU read that waits for nothing;
* on a GPU, the step runs twice more: under ``torch.cuda.set_sync_debug_mode("warn")``,
  where a synchronising CUDA call that PyTorch's CUDA ops make (a device-to-host copy, a
  ``cudaStreamSynchronize`` / ``cudaDeviceSynchronize``, ``.item()`` on a CUDA tensor) warns,
  and the warnings are counted; then under ``"error"``, where the first one raises. Both must
  stay silent. On the CPU this part is skipped, with a message saying so.

What neither sees: ``torch.distributed``. A collective that blocks the host (``work.wait()`` under
``TORCH_NCCL_BLOCKING_WAIT``, a barrier) does not go through the CUDA calls PyTorch's sync-debug
hook watches, and the ``c10d`` ops are not among the dispatch mode's ``SYNCS``. A host stall inside
a collective shows in a profile (``torch.profiler``), not here.

The ranks exchange their findings; rank 0 prints one verdict line, last, starting with
"PASS host syncs:" or "FAIL host syncs:", and every rank exits 0 or 1 accordingly.
(tests/test_devices.py makes the dispatch-mode check on launched CPU ranks; this script
is the one ``benchmarks/gpu_check.sh`` runs under torchrun on the GPUs.)
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from tensorplay_edu import init_device_mesh
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
from tensorplay_edu import async_tp
from tensorplay_edu.launcher.torchrun import current_device, run_from_env

# Ops that copy a value from the device to the host: on a GPU each one waits for every queued kernel.
SYNCS = ("aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.equal")
# 16 query / 8 key-value heads and a 16-token sequence split over 1, 2, 4 or 8 ranks (the full plan shards it).
ARGS = ModelArgs(dim=128, n_layers=2, n_heads=16, n_kv_heads=8, vocab_size=64, max_seq_len=16)
CASES = (("vanilla", "bf16"), ("full", "bf16"), ("full", "float8"), ("full", "async"))


class CountOps(TorchDispatchMode):
    """Every aten op that runs while it is active, by name (e.g. "aten._local_scalar_dense"); the sync
    ops of ``SYNCS`` only when their tensor is not one of ``exempt`` (data pointers)."""

    def __init__(self, exempt=frozenset()):
        super().__init__()
        self.ops: Counter = Counter()
        self.exempt = exempt

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if not (name in SYNCS and args and isinstance(args[0], torch.Tensor) and args[0].data_ptr() in self.exempt):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _first_line(text: str) -> str:
    return str(text).strip().splitlines()[0][:200] if str(text).strip() else "?"


def float8_skip(device: torch.device) -> str:
    """Why the float8 case cannot run here ("" if it can): CUDA's float8 matmuls need compute capability 8.9."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        return f"float8 matmuls need compute capability 8.9 or above, {torch.cuda.get_device_capability(device)} here"
    return ""


def check_case(plan: str, kind: str, device: torch.device) -> dict:
    """This rank's findings for one case: sync ops seen by the dispatch mode; CUDA sync-debug warnings and error."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Transformer(ARGS)
    if kind == "float8":
        from tensorplay_edu.float8 import convert_to_float8_training
        model = convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "output")
    model = parallelize_llama(model.to(device, torch.bfloat16), mesh, plan, float8=kind == "float8")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, ARGS.vocab_size, (2, ARGS.max_seq_len), generator=torch.Generator().manual_seed(1))
    tokens = tokens.to(device)
    labels = tokens.roll(-1, dims=1)
    fused = (lambda: async_tp.enable_async_tp(mesh)) if kind == "async" else contextlib.nullcontext

    def step():
        with loss_context(plan):
            with fused():
                out = model(tokens)
            loss = llama_loss(out, labels)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: lazy initialisation (cuBLAS handles, NCCL communicators, AdamW's state) may synchronise once
    counters = frozenset(s["step"].data_ptr() for s in opt.state.values()
                         if isinstance(s.get("step"), torch.Tensor) and s["step"].device.type == "cpu")
    found = {"case": f"{plan} {kind}", "syncs": {}, "ops": 0, "warnings": [], "error": None}
    with CountOps(counters) as seen:
        step()
    found["syncs"] = {op: n for op, n in seen.ops.items() if op in SYNCS}
    found["ops"] = sum(seen.ops.values())
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
    skip = float8_skip(device)
    cases = [(plan, kind) for plan, kind in CASES if not (kind == "float8" and skip)]
    mine = [check_case(plan, kind, device) for plan, kind in cases]
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)  # plain torch.distributed: the report's bookkeeping
    bad = []
    for r, findings in enumerate(everyone):
        for f in findings:
            if f["syncs"]:
                bad.append(f"rank {r} {f['case']}: {f['syncs']} (dispatch mode)")
            if f["ops"] < 100:
                bad.append(f"rank {r} {f['case']}: only {f['ops']} aten ops seen: the step did not run under the mode")
            if f["warnings"]:
                bad.append(f"rank {r} {f['case']}: {len(f['warnings'])} sync-debug warning(s), first: "
                           f"{f['warnings'][0]}")
            if f["error"]:
                bad.append(f"rank {r} {f['case']}: sync-debug error: {f['error']}")
    if rank == 0:
        config = dist.get_backend_config()
        ops = ", ".join(f"{f['case']} {f['ops']}" for f in everyone[0])
        print(f"{world} rank(s) on {device.type} ({config}); rank 0's aten ops per checked step: {ops}")
        if skip:
            print(f"SKIP the float8 case: {skip}")
        for line in bad:
            print("  " + line)
        if device.type == "cuda":
            cuda_part = ('torch.cuda.set_sync_debug_mode: no warning under "warn", no error under "error"' if not bad
                         else "torch.cuda.set_sync_debug_mode and the dispatch mode: see above")
        else:
            print(f"SKIP CUDA sync-debug mode (torch.cuda.set_sync_debug_mode): the ranks run on {device.type}, "
                  "no CUDA device; host syncs counted with a TorchDispatchMode only")
            cuda_part = "CUDA sync-debug mode skipped (no CUDA device)"
        what = (f"a training step (forward, loss, backward, AdamW) of {', '.join(f['case'] for f in everyone[0])} "
                f"on {world} {device.type} rank(s) ({config})")
        if bad:
            print(f"FAIL host syncs: {len(bad)} finding(s) in {what}; {cuda_part}", flush=True)
        else:
            print(f"PASS host syncs: none of {', '.join(s.split('.')[-1] for s in SYNCS)} in {what}; {cuda_part}",
                  flush=True)
    if bad:
        raise SystemExit(1)  # on every rank: they all saw the same findings


if __name__ == "__main__":
    run_from_env(main)

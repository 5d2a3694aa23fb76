"""Rank code for NCCLRulesMode (tensorplay_edu.gpu_rules.nccl): training steps that keep NCCL's rules,
and one collective bug per rule, planted on purpose."""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tensorplay_edu import collectives as C
from tensorplay_edu import init_device_mesh
from tensorplay_edu.debug import ddp_comm_hook, module_scope
from tensorplay_edu.float8 import convert_to_float8_training
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
from tensorplay_edu.gpu_rules.nccl import NCCLRuleError, NCCLRulesMode
from tensorplay_edu.async_tp import enable_async_tp

# small enough for 4 ranks on 2 cores (float8_mm pads K and N to 16 under the mode, as on CUDA)
ARGS = ModelArgs(dim=64, n_layers=1, n_heads=4, vocab_size=64, ffn_hidden=128, max_seq_len=32)
SUM = dist.ReduceOp.SUM


def _build(float8: bool) -> Transformer:
    model = Transformer(ARGS)
    return convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn != "output") if float8 else model


def clean_case(plan: str, float8: bool = False, async_tp: bool = False, dp: int = 1, steps: int = 2) -> dict:
    """``steps`` SGD steps of the parallel model under NCCLRulesMode beside the same model on one
    device: this rank's loss on its rows at every step, for both, and what the mode saw."""
    world, dtype = dist.get_world_size(), torch.float32 if float8 else torch.float64
    mesh = init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    ref = _build(float8).to(dtype)
    model = parallelize_llama(copy.deepcopy(ref), mesh["tp"], plan, float8=float8)
    runner = model
    if dp > 1:
        runner = DistributedDataParallel(model, process_group=mesh.get_group("dp"))
        runner.register_comm_hook(mesh.get_group("dp"), ddp_comm_hook)
    tokens = torch.randint(0, ARGS.vocab_size, (2 * dp, 32), generator=torch.Generator().manual_seed(1))  # [b, s]
    labels = tokens.roll(-1, 1)
    rows = slice(2 * mesh.get_local_rank("dp"), 2 * mesh.get_local_rank("dp") + 2)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    losses, ref_losses = [], []
    with NCCLRulesMode(timeout=60) as rules:
        for _ in range(steps):
            with enable_async_tp(mesh["tp"]) if async_tp else contextlib.nullcontext():
                with loss_context(plan):
                    loss = llama_loss(runner(tokens[rows]), labels[rows])
                loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            with torch.no_grad():
                ref_losses.append(llama_loss(ref(tokens[rows]), labels[rows]).item())
            llama_loss(ref(tokens), labels).backward()  # the whole batch: what DDP's averaged gradient is
            ref_opt.step()
            ref_opt.zero_grad()
    return {"losses": losses, "ref_losses": ref_losses, "ops": sorted({(r.op, r.ranks) for r in rules.records}),
            "collectives": len(rules.records), "scaled_mm": rules.scaled_mm_calls}


def clean_cases() -> dict:
    """The plans, float8, async TP and DP x TP, one after the other in one launch (4 ranks)."""
    return {"vanilla": clean_case("vanilla"), "full float8": clean_case("full", float8=True),
            "full async": clean_case("full", async_tp=True), "full dp2": clean_case("full", dp=2)}


def _caught(fn) -> str:
    """The report of the NCCLRuleError ``fn`` raises on this rank ("" if none)."""
    try:
        with NCCLRulesMode(timeout=60):
            fn(dist.get_rank())
    except NCCLRuleError as err:
        return str(err)
    return ""


def planted_bugs() -> dict:
    """One bug per rule, each caught on every rank (so the ranks stay in step for the next)."""
    x = torch.ones(4, 8)

    def other_op(r):  # rank 2 takes another branch
        C.all_reduce(x, SUM, None)
        with module_scope("layers.0.attention.wq"):
            C.all_gather(x, 0, [4] * 4, None) if r == 2 else C.all_reduce(x, SUM, None)

    def other_size(r):
        C.all_reduce(torch.ones(4, 9) if r == 1 else x, SUM, None)

    def uneven_chunks(r):  # rank 3 thinks the chunks are uneven
        C.all_gather(x, 0, [4, 4, 4, 3] if r == 3 else [4] * 4, None)

    def bool_sum(r):
        C.all_reduce(x > 0, SUM, None)

    def bad_dtype(r):
        C.broadcast(x.to(torch.uint16), 0, None)

    def ring(r):  # rank 1 expects a row fewer than rank 0 sends
        C.ring_shift(x, (3, 8) if r == 1 else (4, 8), r, dist.group.WORLD).wait()

    def other_source(r):  # rank 1 thinks it is the source of the scatter
        src = 1 if r == 1 else 0
        C.scatter(x if r == src else None, x, 0, [1] * 4, r, src, None)

    def other_split(r):  # an all-to-all (sequence -> heads) with rank 3's idea of the chunk sizes
        C.all_to_all(torch.ones(1, 8), 0, 1, [1] * 4, [3, 3, 1, 1] if r == 3 else [2] * 4, r, None)  # [1, 8] -> [4, 2]

    def other_layout(r):  # rank 1 passes the same 32 elements as [8, 4]: NCCL would run it (counts agree)
        C.all_reduce(torch.ones(8, 4) if r == 1 else x, SUM, None)

    def other_dtype(r):  # rank 1 sums int32, the others float32: the same shape and bytes, other data
        C.all_reduce(x.int() if r == 1 else x, SUM, None)

    def other_dtype_gather(r):  # rank 3 gathers float64: twice the bytes
        C.all_gather(x.double() if r == 3 else x, 0, [4] * 4, None)

    bugs = {"other_op": other_op, "other_size": other_size, "uneven_chunks": uneven_chunks, "bool_sum": bool_sum,
            "bad_dtype": bad_dtype, "ring": ring, "other_source": other_source, "other_split": other_split,
            "other_layout": other_layout, "other_dtype": other_dtype, "other_dtype_gather": other_dtype_gather}
    return {name: _caught(fn) for name, fn in bugs.items()}


def skipped(timeout: float) -> None:
    """Rank 1 skips the second all-reduce (it is the last collective: rank 1 just goes on)."""
    with NCCLRulesMode(timeout=timeout):
        C.all_reduce(torch.ones(4), SUM, None)
        if dist.get_rank() != 1:
            C.all_reduce(torch.ones(4), SUM, None)


def crossed_groups(timeout: float) -> None:
    """A (2, 2) mesh; ranks 0 and 3 sum over "tp" then "dp", ranks 1 and 2 over "dp" then "tp":
    each waits for a peer that waits for another (a cycle: on NCCL, a hang)."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    order = ("tp", "dp") if dist.get_rank() in (0, 3) else ("dp", "tp")
    with NCCLRulesMode(timeout=timeout):
        for name in order:
            C.all_reduce(torch.ones(4), SUM, mesh.get_group(name))


def store_keys(rounds: int = 30) -> tuple[int, int]:
    """The store's key count after a few checked all-reduces, and after ``rounds`` more (on the world
    and on a pair group): the mode deletes its old fingerprints, so the two are equal."""
    pair = dist.new_group([0, 1])
    counts = []
    with NCCLRulesMode(timeout=60):
        for n in (3, rounds):
            for _ in range(n):
                C.all_reduce(torch.ones(4), SUM, None)
                if dist.get_rank() in (0, 1):
                    C.all_reduce(torch.ones(4), SUM, pair)
            dist.barrier()  # every rank past its deletions (a barrier is not checked)
            counts.append(dist.distributed_c10d._get_default_store().num_keys())
            dist.barrier()
    return counts[0], counts[1]

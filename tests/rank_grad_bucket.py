"""Rank code for the partial-gradient bucket (grad_sync.bucket_partial_grads) against one process:
the optimizer's pre-step hook, clip_grad_norm_, gradient accumulation, DDP over mesh["dp"], the
error for a finalize() per micro-batch, and the collectives of one step."""

from __future__ import annotations

import contextlib
import copy
import functools

import torch
import torch.distributed as dist

from checks import Checker, chunk
from rank_parallel import TOL, full_grads
from tensorplay_edu import CommDebugMode, init_device_mesh
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
from tensorplay_edu.parallel import bucket_partial_grads, clip_grad_norm_, full_state_dict
from tensorplay_edu.parallel.grad_sync import BUCKET_SCOPE

ARGS = ModelArgs(dim=48, n_layers=2, n_heads=12, vocab_size=40, max_seq_len=12)  # heads and tokens split 1-4 ways


def _setup(dp: int, wrap_ddp: bool, bucket: bool = True):
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "tp")) if dp > 1 else \
        init_device_mesh("cpu", (world,))
    tp_mesh = mesh["tp"] if dp > 1 else mesh
    torch.manual_seed(0)
    ref = Transformer(ARGS).double()
    model = parallelize_llama(copy.deepcopy(ref), tp_mesh, "full")
    runner = model
    if wrap_ddp:
        from torch.nn.parallel import DistributedDataParallel
        runner = DistributedDataParallel(model, process_group=mesh.get_group("dp"))
    opt, opt_ref = (torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (model, ref))
    handle = bucket_partial_grads(model, opt) if bucket else None
    dp_rank = mesh.get_local_rank("dp") if dp > 1 else 0
    return model, runner, ref, opt, opt_ref, handle, dp_rank


def train(dp: int = 1, ddp: bool = False, micro=1, via: str = "step", steps: int = 3) -> tuple[list[str], int]:
    """``steps`` AdamW steps of the full plan with the bucket, each of ``micro`` accumulated backwards (a
    number, or one per step), the
    gradients made whole by ``via``: "step" (the optimizer's pre-step hook), "clip" (clip_grad_norm_), or
    "finalize" (an explicit call); losses, every gradient (when read), and the weights against one process."""
    model, runner, ref, opt, opt_ref, handle, dp_rank = _setup(dp, ddp)
    check = Checker(f"bucket dp={dp} ddp={ddp} micro={micro} via={via}")
    close = functools.partial(check.close, **TOL[torch.float64])

    for step in range(steps):
        g = torch.Generator().manual_seed(100 + step)
        micros = micro if isinstance(micro, int) else micro[step]
        batches = [torch.randint(0, 40, (2 * dp, 12), generator=g) for _ in range(micros)]
        for i, tokens in enumerate(batches):
            mine = chunk(tokens, 0, dp, dp_rank) if dp > 1 else tokens
            sync = not ddp or i == micros - 1  # DDP: no_sync() for all but the last micro-batch
            with contextlib.nullcontext() if sync else runner.no_sync():
                with loss_context("full"):
                    loss = llama_loss(runner(mine), mine) / micros
                loss.backward()
            ref_loss = llama_loss(ref(tokens), tokens) / micros
            ref_loss.backward()
            mean = loss.detach().clone()
            if dp > 1:
                dist.all_reduce(mean)  # test bookkeeping: the mean over every rank (the tp ranks agree)
                mean /= dist.get_world_size()
            close(f"step {step} micro {i} loss", mean, ref_loss.detach())
        if via == "clip":
            close(f"step {step} clipped norm", clip_grad_norm_(model.parameters(), 0.5),
                  torch.nn.utils.clip_grad_norm_.__wrapped__(ref.parameters(), 0.5))
        elif via == "finalize":
            handle.finalize()
            handle.finalize()  # a second call is a no-op
        if via != "step":  # whole now: every gradient against one process
            got = full_grads(model)
            for name, p in ref.named_parameters():
                close(f"step {step} grad {name}", got[name], p.grad)
        for o in (opt, opt_ref):
            o.step()
            o.zero_grad()
    state = full_state_dict(model)
    for name, value in ref.state_dict().items():
        close(f"weights {name} after {steps} steps", state[name], value)
    return check.result()


def finalize_per_micro_batch() -> tuple[list[str], int]:
    """finalize() after each of two accumulated backwards: the second backward raises on every rank."""
    model, runner, ref, opt, opt_ref, handle, _ = _setup(1, False)
    tokens = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    for i in range(2):
        with loss_context("full"):
            loss = llama_loss(model(tokens), tokens)
        try:
            loss.backward()
        except RuntimeError as err:
            ok = i == 1 and "already made whole" in str(err) and "once per optimizer step" in str(err) \
                and "norm.weight" in str(err)
            return ([] if ok else [f"finalize per micro-batch: wrong error at backward {i}: {err}"]), 1
        handle.finalize()
    return ["finalize per micro-batch: no error"], 1


def step_collectives(bucket: bool) -> dict:
    """The collectives of one training step (forward, loss, backward, AdamW step) of the 2-block full plan."""
    model, runner, ref, opt, opt_ref, handle, _ = _setup(1, False, bucket=bucket)
    tokens = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    with CommDebugMode() as comm:
        with loss_context("full"):
            loss = llama_loss(model(tokens), tokens)
        loss.backward()
        opt.step()
    bucket_rows = [r for r in comm.records if r.module == BUCKET_SCOPE]
    norm_rows = [r for r in comm.records if r.op == "all_reduce" and r.module.endswith("norm.weight")]
    return {"forward": comm.get_comm_counts("forward"), "backward": comm.get_comm_counts("backward"),
            "bucket": [(r.op, r.phase, r.shape) for r in bucket_rows], "per_param": len(norm_rows),
            "total": comm.get_total_counts()}


def alternating_norms() -> tuple[list[str], int]:
    """Two sequence-parallel norms, one used per backward, finalize() after each: a norm that got no new
    gradient is not reduced again (its whole gradient would be multiplied by t)."""
    from torch import nn

    from tensorplay_edu.parallel import SequenceParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    ref = nn.ModuleDict({"a": nn.LayerNorm(8), "b": nn.LayerNorm(8)}).double()
    model = parallelize_module(copy.deepcopy(ref), mesh, {"a": SequenceParallel(), "b": SequenceParallel()})
    bucket = bucket_partial_grads(model)
    x = torch.randn(2, 4 * dist.get_world_size(), 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mine = chunk(x, 1, dist.get_world_size(), dist.get_rank())
    fails = []
    for which in ("a", "b"):
        (model[which](mine).to_local() ** 2).sum().backward()
        (ref[which](x) ** 2).sum().backward()
        bucket.finalize()
    for which in ("a", "b"):
        for name, p in ref[which].named_parameters():
            got = model[which].get_parameter(name).grad
            if not torch.allclose(got, p.grad, **TOL[torch.float64]):
                fails.append(f"alternating norms: {which}.{name}")
    return fails, 4


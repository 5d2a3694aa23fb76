"""Bugs 7, 8 and 9 of notebook 08b (a collective behind ``if rank == 0`` under NCCLRulesMode; dropout seeded three
ways; TP ranks fed different batches), as workers that notebook 08c runs again side by side.

Each worker runs on every rank under ``launch`` and returns plain values, with the bug and with its fix, so that
the notebook can compare them.  08b teaches each bug step by step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..dtensor import DTensor
from ..gpu_rules.nccl import NCCLRuleError, NCCLRulesMode
from ..mesh import init_device_mesh
from ..models import Transformer, llama_loss, parallelize_llama
from ..parallel import ColwiseParallel, RowwiseParallel, clip_grad_norm_, parallelize_module
from ..placement import Replicate, Shard
from .bug_zoo_plans import ARGS
from .bug_zoo_tp import f64, gap, make_mlp


def train_and_log(model, tokens, only_rank_0, steps, norms):
    """``steps`` steps; the gradient norm computed (a collective) on rank 0 only (the bug) or on every rank."""
    for _ in range(steps):
        llama_loss(model(tokens), tokens.roll(-1, 1)).backward()
        if dist.get_rank() == 0 or not only_rank_0:  # the bug: a collective behind a rank test
            norms.append(clip_grad_norm_(model.parameters(), max_norm=1e9).item())
        model.zero_grad()


def log_the_norm(only_rank_0, steps=2):
    """Bug 7: two training steps under NCCLRulesMode; the rules' report, how many collectives it checked, the norms."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = parallelize_llama(Transformer(ARGS).double(), mesh, "vanilla")
    tokens = torch.randint(0, ARGS.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))  # [b, s]
    rules, norms, report = NCCLRulesMode(timeout=30), [], ""
    try:
        with rules:
            train_and_log(model, tokens, only_rank_0, steps, norms)
    except NCCLRuleError as err:
        report = str(err)
    return {"report": report, "checked": len(rules.records), "norms": norms}


def both():
    """Bug 7 with the bug, then fixed."""
    return {"bug": log_the_norm(True), "fixed": log_the_norm(False)}


class DropMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(8, 32, bias=False)  # colwise: local out [N, 32/t]
        self.w2 = nn.Linear(32, 8, bias=False)  # rowwise: out [N, 8], whole on every rank after the sum

    def forward(self, x):  # x: [N, 8]
        h = F.dropout(F.relu(self.w1(x)) + 1.0, 0.5, True)  # sharded: this rank's features (+1: no zero before the mask)
        self.kept = h != 0  # [N, 32/t]: the mask this rank drew
        return F.dropout(self.w2(h), 0.5, True)  # replicated


def dropout_streams(how):
    """Bug 8: the MLP with dropout under PyTorch's styles (one seed, or seed + rank) or ours (one seed); this rank's
    mask on its features and the replicated output."""
    r, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    mlp = DropMLP().double()
    if how == "tensorplay_edu, one seed":
        parallelize_module(mlp, init_device_mesh("cpu", (world,)), {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    else:  # PyTorch's own styles
        from torch.distributed.device_mesh import init_device_mesh as torch_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel as TorchColwise, RowwiseParallel as TorchRowwise
        from torch.distributed.tensor.parallel import parallelize_module as torch_parallelize
        torch_parallelize(mlp, torch_mesh("cpu", (world,)), {"w1": TorchColwise(), "w2": TorchRowwise()})
    torch.manual_seed(1234 + (r if how == "PyTorch, seed + rank" else 0))
    y = mlp(torch.randn(8, 8, dtype=f64, generator=torch.Generator().manual_seed(3)))  # [N, 8]
    return {"kept": mlp.kept, "y": y.detach()}


def compare_ranks(per_rank):
    """Do all ranks' masks on their own features agree, and how far apart are the replicated outputs?"""
    masks = torch.stack([r["kept"].flatten().double() for r in per_rank])  # [t, N * 32/t]
    corr = torch.corrcoef(masks)  # [t, t]: rank against rank
    return {"sharded masks all equal": all(torch.equal(r["kept"], per_rank[0]["kept"]) for r in per_rank),
            "mask correlation": corr[~torch.eye(len(per_rank), dtype=torch.bool)].mean().item(),  # mean over pairs
            "replicas apart": max(gap(r["y"], per_rank[0]["y"]) for r in per_rank)}


def batch_seed(seed_by):
    """The random seed of this rank's batch."""
    if seed_by == "global rank":
        return dist.get_rank()  # the bug: every rank of the TP group draws a batch of its own
    return 0  # the fix: the data-parallel rank, one for the whole TP group (there is one group here)


def fed(seed_by):
    """Bug 9: the MLP on this rank's batch; every rank's batch sum, and what run_check=True hands it."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = make_mlp()
    parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(batch_seed(seed_by)), dtype=f64)  # [N, 8]
    sums = DTensor.from_local(x.sum().reshape(1), mesh, [Shard(0)]).full_tensor()  # [t]: every rank's batch sum
    checked = DTensor.from_local(x, mesh, [Replicate()], run_check=True).to_local()
    return {"x": x, "y": model(x).detach(), "sums": sums, "run_check": checked,
            "y_run_check": model(checked).detach()}  # the step fed the broadcast batch

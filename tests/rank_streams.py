"""Rank code for random streams by region: dropout on sharded activations draws a mask of its own
on each rank, on replicated activations the same mask everywhere (module, functional and
scaled_dot_product_attention's dropout_p), masks change from step to step, a seed reproduces
them, checkpointing recomputes them, eval draws nothing."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from checks import Checker, gather_all
from tensorplay_edu import Replicate, Shard, init_device_mesh
from tensorplay_edu.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                     parallelize_module)

P = 0.5


class FFN(nn.Module):
    """T5's DenseReluDense and the residual dropout after it: fc1 (colwise) -> relu -> dropout ->
    fc2 (rowwise) -> dropout.  ``functional``: the first dropout is F.dropout in forward."""

    def __init__(self, h=8, f=96, functional=False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)
        self.drop1, self.drop2, self.functional = nn.Dropout(P), nn.Dropout(P), functional
        self.seen = {}
        with torch.no_grad():  # positive everywhere: a zero is a dropped element, nothing else
            self.fc1.weight.fill_(1.0)
            self.fc2.weight.fill_(1.0)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        h = F.dropout(h, P, self.training) if self.functional else self.drop1(h)
        self.seen["inner"] = h.detach() != 0  # [b, s, f/t]: sharded
        out = self.drop2(self.fc2(h))
        self.seen["outer"] = out.detach() != 0  # [b, s, h] replicated, or [b, s/t, h] under SP
        return out


class Attention(nn.Module):
    """Heads on this rank, scaled_dot_product_attention with dropout_p, then wo and a residual dropout.
    wq = wk = 0 makes every attention row uniform and wv = 1 every head identical: two ranks' heads
    differ after attention only if their dropout masks differ."""

    def __init__(self, h=8, heads=12, head_dim=4):  # 12 heads: whole heads on 2, 3 or 4 ranks, 2 or more each
        super().__init__()
        self.head_dim = head_dim
        self.wq, self.wk = nn.Linear(h, heads * head_dim, bias=False), nn.Linear(h, heads * head_dim, bias=False)
        self.wv, self.wo = nn.Linear(h, heads * head_dim, bias=False), nn.Linear(heads * head_dim, h, bias=False)
        self.resid, self.seen = nn.Dropout(P), {}
        with torch.no_grad():
            for lin, value in ((self.wq, 0.0), (self.wk, 0.0), (self.wv, 1.0), (self.wo, 1.0)):
                lin.weight.fill_(value)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=P if self.training else 0.0)  # [b, heads/t, s, hd]
        self.seen["heads"] = o.detach()
        out = self.resid(self.wo(o.transpose(1, 2).reshape(b, s, -1)))
        self.seen["outer"] = out.detach() != 0
        return out


class Drop(nn.Module):
    """Just F.dropout: under SequenceParallel, this rank's tokens."""

    def forward(self, x):
        return F.dropout(x, P, self.training)


def _parallel(module: nn.Module, mesh, sp: bool) -> nn.Module:
    """Colwise then Rowwise; ``sp``: the input sequence-sharded, gathered in front, reduce-scattered after."""
    first = ["fc1"] if isinstance(module, FFN) else ["wq", "wk", "wv"]
    last = "fc2" if isinstance(module, FFN) else "wo"
    plan = {name: ColwiseParallel() for name in first}
    plan[last] = RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel()
    if sp:
        plan[""] = PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate(), use_local_output=True)
    return parallelize_module(module, mesh, plan)


def regions(sp: bool) -> tuple[list[str], int]:
    """Per rank where sharded, shared where replicated; independent masks (about half agree
    between two ranks), about half kept; the generator in step on every rank; new masks each step;
    the same masks again under the same seed; eval draws nothing."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, check = mesh.size(), Checker()
    for name, module in (("FFN", FFN()), ("FFN functional", FFN(functional=True)), ("attention", Attention())):
        model = _parallel(module, mesh, sp)
        x = torch.ones(4, 8 if sp else 8 * t, 8)  # [b, s, h] (this rank's s/t tokens under SP)
        torch.manual_seed(7)
        model(x)
        first = dict(model.seen)
        inner = "heads" if name == "attention" else "inner"
        mine = gather_all(first[inner].float())
        check(f"{name}: ranks draw their own masks on sharded activations",
              all(not torch.equal(mine[0], mine[r]) for r in range(1, t)))
        if name != "attention":
            agree = float((mine[0] == mine[1]).float().mean())
            kept = float(mine[0].mean())
            check(f"{name}: independent masks (ranks agree on {agree:.2f})", 0.38 < agree < 0.62)
            check(f"{name}: about half kept ({kept:.2f})", 0.38 < kept < 0.62)
        else:
            heads = first["heads"]
            check("attention: each head its own mask", not torch.equal(heads[:, 0], heads[:, 1]))
        outer = gather_all(first["outer"].float())
        if sp:  # reduce-scattered to this rank's tokens: its own mask again
            check(f"{name} SP: the residual dropout's masks differ", not torch.equal(outer[0], outer[1]))
        else:  # after the all-reduce: one replicated tensor, one mask
            check(f"{name}: the residual dropout's mask is the same everywhere",
                  all(torch.equal(outer[0], o) for o in outer))
        states = gather_all(torch.get_rng_state())
        check(f"{name}: the default generator stays in step", all(torch.equal(states[0], s) for s in states))
        model(x)
        check(f"{name}: a new step, new masks", not torch.equal(model.seen[inner], first[inner]))
        torch.manual_seed(7)
        model(x)
        check(f"{name}: the same seed, the same masks", torch.equal(model.seen[inner], first[inner])
              and torch.equal(model.seen["outer"], first["outer"]))
        model.eval()
        before = torch.get_rng_state()
        model(x)
        check(f"{name}: eval draws nothing", torch.equal(before, torch.get_rng_state()))
    return check.result()


def sequence_parallel_functional() -> tuple[list[str], int]:
    """F.dropout inside a SequenceParallel module: this rank's tokens, this rank's mask."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checker()
    drop = parallelize_module(Drop(), mesh, SequenceParallel(use_local_output=True))
    torch.manual_seed(3)
    masks = gather_all(drop(torch.ones(2, 16, 32)) != 0)
    check("F.dropout under SP: masks differ", all(not torch.equal(masks[0], m) for m in masks[1:]))
    again = drop(torch.ones(2, 16, 32)) != 0
    check("and change from step to step", not torch.equal(again, masks[dist.get_rank()]))
    return check.result()


def checkpointed(sp: bool) -> tuple[list[str], int]:
    """torch.utils.checkpoint recomputes the same masks: outputs and gradients equal the run
    without checkpointing (the generator's seed says which stream was running)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checker()
    for module in (FFN(functional=True), Attention()):
        model = _parallel(module, mesh, sp)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        runs = []
        for use_checkpoint in (False, True):
            model.zero_grad()
            x = torch.randn(2, 8 if sp else 8 * mesh.size(), 8, generator=torch.Generator().manual_seed(4))
            x.requires_grad_(True)
            torch.manual_seed(21)
            y = checkpoint(model, x, use_reentrant=False) if use_checkpoint else model(x)
            y.pow(2).sum().backward()
            runs.append([y.detach(), x.grad, *(p.grad.clone() for p in model.parameters())])
        check(f"{type(module).__name__} checkpointed: outputs and gradients equal",
              all(torch.equal(a, b) for a, b in zip(*runs)))
    return check.result()


def reproducible_training() -> list[float]:
    """Three AdamW steps of the FFN with dropout under one seed: the losses (compared across runs)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = _parallel(FFN(functional=True), mesh, sp=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(3):
        x = torch.randn(4, 8, 8, generator=torch.Generator().manual_seed(step))
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


class SkipFFN(nn.Module):
    """A replicated tensor dropped between the Colwise and the Rowwise Linear, written three ways:
    ``skip = drop(x)`` before ``down(h)``, ``drop(x)`` after it, and ``drop(x * 2)`` of a tensor
    derived from x.  Each must draw one mask on every rank (the output is replicated); the dropout
    of the hidden units, this rank's own."""

    def __init__(self, way: str, h=8, f=96):
        super().__init__()
        self.up, self.down = nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)
        self.drop, self.drop_h, self.way, self.seen = nn.Dropout(P), nn.Dropout(P), way, {}
        with torch.no_grad():
            self.up.weight.fill_(1.0)
            self.down.weight.fill_(1.0 / f)

    def forward(self, x):
        h = self.drop_h(F.relu(self.up(x)))  # [b, s, f/t]: sharded
        self.seen["inner"] = h.detach() != 0
        if self.way == "before":
            skip = self.drop(x)
            out = self.down(h) + skip
        elif self.way == "after":
            out = self.down(h) + self.drop(x)
        else:
            skip = self.drop(x * 2)
            out = self.down(h) + skip
        self.seen["skip"] = (out - self.down(h)).detach() != 0
        return out


def replicated_dropout_inside_a_region(requires_grad: bool) -> tuple[list[str], int]:
    """The mask follows the tensor, not where the line is written: the replicated skip draws one mask
    on every rank, the hidden units one each.  ``requires_grad``: the input is a leaf that needs a
    gradient (else a plain input marked by the model's hook), through an embedding-like multiply."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checker()
    for way in ("before", "after", "derived") if requires_grad else ("before", "after"):  # (see rng.py on no graph)
        model = parallelize_module(SkipFFN(way), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        x = torch.ones(4, 6, 8, requires_grad=requires_grad)
        torch.manual_seed(5)
        out = model(x)
        outs, skips, inner = gather_all(out.detach()), gather_all(model.seen["skip"].float()), \
            gather_all(model.seen["inner"].float())
        check(f"{way}: the replicated output is the same on every rank", all(torch.equal(outs[0], o) for o in outs))
        check(f"{way}: one skip mask everywhere", all(torch.equal(skips[0], s) for s in skips))
        check(f"{way}: about half the skip kept", 0.3 < float(skips[0].mean()) < 0.7)
        check(f"{way}: the hidden units' masks differ", all(not torch.equal(inner[0], m) for m in inner[1:]))
        if requires_grad:
            out.pow(2).sum().backward()
            grads = gather_all(x.grad)
            check(f"{way}: the input gradient is the same on every rank", all(torch.equal(grads[0], g) for g in grads))
    return check.result()

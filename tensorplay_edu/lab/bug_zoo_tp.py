"""Bugs 1 to 4 of notebooks 08 (clipping on local shards, the global head count in a ``view``, SP norms without
their gradient sum, a raw ``dist.all_reduce`` in the model), as workers that notebook 08c runs again side by side.

Each worker runs on every rank under ``launch`` and returns plain tensors: the run with the bug and the run with
its fix, so that the notebook can measure both against one process.  The notebooks that teach each bug (08)
write it out step by step; this file only gathers them so that 08c's cells can show the comparison.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..dtensor import DTensor
from ..mesh import init_device_mesh
from ..models.llama import RMSNorm
from ..parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, clip_grad_norm_, parallelize_module
from ..placement import Partial, Shard

f64 = torch.float64


def mine(x, dim):
    """This rank's ``torch.chunk`` of a whole tensor along ``dim`` (every size here divides by the world size)."""
    return torch.chunk(x, dist.get_world_size(), dim=dim)[dist.get_rank()]


def gap(x, y):
    """The largest |x - y|."""
    return (x - y).abs().max().item()


def biggest(*xs):
    """The largest |value| in the tensors ``xs``."""
    return max(x.abs().max().item() for x in xs)


class MLP(nn.Module):  # notebook 08, section 1
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(8, 16, bias=False)  # colwise: weight [16, 8] -> local [16/t, 8]
        self.w2 = nn.Linear(16, 8)  # rowwise: weight [8, 16] -> local [8, 16/t]; bias [8] replicated

    def forward(self, x):  # x: [N, 8]
        return self.w2(F.relu(self.w1(x)))


def make_mlp():
    torch.manual_seed(0)
    return MLP().double()


def mlp_data():
    """x [N, 8] and dL/dy [N, 8] of bug 1's step."""
    gen = torch.Generator().manual_seed(5)
    return torch.randn(4, 8, generator=gen, dtype=f64), torch.randn(4, 8, generator=gen, dtype=f64)


def clipped_step(clip, mesh=None):
    """Bug 1: one SGD step (lr 0.1) clipped to norm 1 by ``clip``; the output, the norm ``clip`` returned (what a
    rank logs), and this rank's parameters after it."""
    model = make_mlp()
    if mesh is not None:
        parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    x, dy = mlp_data()
    y = model(x)  # [N, 8]
    (y * dy).sum().backward()
    norm = clip(model.parameters(), 1.0)
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    return {"y": y.detach(), "norm": float(norm), **{n: p.detach() for n, p in model.named_parameters()}}


def clip_workers():
    """Bug 1 with PyTorch's clip_grad_norm_ on this rank's pieces only, and fixed with the package's."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return {"bug": clipped_step(torch.nn.utils.clip_grad_norm_.__wrapped__, mesh),
            "fixed": clipped_step(clip_grad_norm_, mesh)}


def clip_gap(pieces, ref):
    """Largest |parameter - one process| after the step, over every rank's copy of the bias too."""
    w1, w2 = torch.cat([p["w1.weight"] for p in pieces], 0), torch.cat([p["w2.weight"] for p in pieces], 1)
    return max([gap(w1, ref["w1.weight"]), gap(w2, ref["w2.weight"])] + [gap(p["w2.bias"], ref["w2.bias"]) for p in pieces])


def toy_clip_factors(t=4):
    """Bug 1 on the MLP, from its one-process gradients (each rank's norm: its pieces' squares plus the bias's): the
    formula sqrt((S + R)/(S/t + R)), and the worst and the best rank's norm ratio N/n_r."""
    model = make_mlp()
    x, dy = mlp_data()
    (model(x) * dy).sum().backward()
    pieces = {"w1.weight": 0, "w2.weight": 1}  # sharded: colwise rows, rowwise columns
    grads = {n: p.grad for n, p in model.named_parameters()}
    S, R = sum(grads[n].square().sum().item() for n in pieces), grads["w2.bias"].square().sum().item()
    rank_squares = [sum(grads[n].chunk(t, d)[r].square().sum().item() for n, d in pieces.items()) + R for r in range(t)]
    return ((S + R) / (S / t + R)) ** 0.5, ((S + R) / min(rank_squares)) ** 0.5, ((S + R) / max(rank_squares)) ** 0.5


H, hd = 4, 4  # bug 2: heads and head dim (h = 16), on 2 ranks


class Attention(nn.Module):
    def __init__(self, heads_in_view):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(H * hd, H * hd, bias=False) for _ in range(4))
        self.heads_in_view = heads_in_view  # "-1": the head count inferred; "H": the global head count (bug 2)

    def forward(self, x):  # x: [b, s, h]
        b, s, _ = x.shape
        shape = (b, s, -1, hd) if self.heads_in_view == "-1" else (b, s, H, -1)
        q, k, v = (w(x).view(shape).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        return self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))


def attention_out(heads_in_view, mesh=None):
    """Bug 2: the attention's output [b, s, h] with the head count inferred ("-1") or global ("H")."""
    torch.manual_seed(0)
    attn = Attention(heads_in_view).double()
    if mesh is not None:
        parallelize_module(attn, mesh, {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(),
                                        "wo": RowwiseParallel()})
    return attn(torch.randn(2, 8, H * hd, generator=torch.Generator().manual_seed(6), dtype=f64)).detach()


def view_workers():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return {"bug": attention_out("H", mesh), "fixed": attention_out("-1", mesh)}


def make_norm():
    """Bug 3: an RMSNorm whose weight is not all ones, and its data x, dL/dy [b, s, h]."""
    torch.manual_seed(0)
    norm = RMSNorm(8, 1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8, dtype=f64))
    gen = torch.Generator().manual_seed(2)
    return norm, torch.randn(2, 8, 8, generator=gen, dtype=f64), torch.randn(2, 8, 8, generator=gen, dtype=f64)


def sp_norm(fixed):
    """Bug 3: the norm on this rank's tokens [b, s/t, h], plain (the bug) or under SequenceParallel (the fix)."""
    norm, x, dy = make_norm()
    if fixed:
        parallelize_module(norm, init_device_mesh("cpu", (dist.get_world_size(),)), SequenceParallel(use_local_output=True))
    out = norm(mine(x, 1))
    (out * mine(dy, 1)).sum().backward()
    return {"out": out.detach(), "w_grad": norm.weight.grad}


def proj_data():
    """Bug 4: x [b, s, in], w [out, in], dL/dy [b, s, out]."""
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(*shape, generator=gen, dtype=f64) for shape in ((2, 8, 8), (5, 8), (2, 8, 5))]


def sum_then_split(fixed):
    """Bug 4: a rowwise projection summed, then this rank's tokens of it, and its weight's gradient piece."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x, w, dy = proj_data()
    w_r = nn.Parameter(mine(w, 1).clone())  # [out, in/t]
    y = mine(x, -1) @ w_r.T  # this rank's addend [b, s, out]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's warning at backward: no autograd kernel for c10d::allreduce_
        if fixed:  # Partial -> Shard(1): reduce-scatter forward, all-gather backward
            y_mine = DTensor.from_local(y, mesh, [Partial()]).redistribute(mesh, [Shard(1)]).to_local()
        else:  # bug 4: in place, invisible to autograd
            dist.all_reduce(y)
            y_mine = mine(y, 1)
        (y_mine * mine(dy, 1)).sum().backward()
    return {"y": y_mine.detach(), "grad": w_r.grad}

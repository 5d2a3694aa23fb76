"""Rank code for loss_parallel: against F.cross_entropy on the full logits."""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rank_api import _raises
from rank_checks import chunk
from tensorplay_edu import CommDebugMode, DTensor, Shard, init_device_mesh
from tensorplay_edu.parallel import loss_parallel

TOL = dict(rtol=1e-10, atol=1e-12)


def _logits(shape, g, mesh):
    full = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    t, r = mesh.size(), mesh.get_local_rank()
    local = chunk(full, 1 if len(shape) >= 2 else 0, t, r).clone().requires_grad_(True)
    dt = DTensor.from_local(local, mesh, [Shard(1 if len(shape) >= 2 else 0)], shape=shape)
    return full.requires_grad_(True), local, dt


def cross_entropy_options() -> tuple[list[str], int]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    fails, n = [], 0
    shapes = [(6, 11), (4, 11, 3), (3, 50257)]
    for i, (shape, reduction, ignore, weighted, eps) in enumerate(itertools.product(
            shapes, ["none", "mean", "sum"], [-100, 3], [False, True], [0.0, 0.1])):
        if shape[1] == 50257 and (weighted or ignore == 3):  # the big vocab: a few cases suffice
            continue
        g = torch.Generator().manual_seed(i)
        full, local, dt = _logits(shape, g, mesh)
        before = local.detach().clone()
        target_shape = (shape[0], *shape[2:])
        target = torch.randint(0, shape[1], target_shape, generator=g)
        target.view(-1)[::4] = ignore  # some ignored rows
        weight = torch.rand(shape[1], generator=g, dtype=torch.float64) + 0.5 if weighted else None
        kw = dict(weight=weight, ignore_index=ignore, reduction=reduction, label_smoothing=eps)
        ref = F.cross_entropy(full, target, **kw)
        out_w = torch.randn(ref.shape, generator=g, dtype=torch.float64)
        (ref * out_w).sum().backward()
        with CommDebugMode() as comm:
            with loss_parallel():
                loss = F.cross_entropy(dt, target, **kw)
            fwd = comm.get_comm_counts()
            (loss * out_w).sum().backward()  # outside the context: fine here
        label = f"CE {shape} {reduction} ignore={ignore} weight={weighted} eps={eps}"
        n += 4
        if not torch.allclose(loss.detach(), ref.detach(), **TOL):
            fails.append(f"{label}: loss {loss} != {ref}")
        if not torch.allclose(local.grad, chunk(full.grad, 1, t, r), **TOL):
            fails.append(f"{label}: logits gradient differs")
        want = {} if t == 1 else {"all_reduce": 3}
        if fwd != want or comm.get_comm_counts("backward"):
            fails.append(f"{label}: collectives forward {fwd} backward {comm.get_comm_counts('backward')}")
        if not torch.equal(local.detach(), before):
            fails.append(f"{label}: logits modified in place")
    return fails, n


def log_softmax_paths() -> tuple[list[str], int]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    fails, n = [], 0
    g = torch.Generator().manual_seed(7)
    target = torch.randint(0, 13, (5,), generator=g)
    # nll_loss(log_softmax): fused, 3 all-reduces forward, none backward
    full, local, dt = _logits((5, 13), g, mesh)
    F.nll_loss(F.log_softmax(full, 1), target).backward()
    with CommDebugMode() as comm, loss_parallel():
        loss = F.nll_loss(F.log_softmax(dt, dim=1), target)
        loss.backward()
    n += 3
    if not torch.allclose(loss, F.nll_loss(F.log_softmax(full.detach(), 1), target), **TOL):
        fails.append("nll(log_softmax) loss")
    if not torch.allclose(local.grad, chunk(full.grad, 1, t, r), **TOL):
        fails.append("nll(log_softmax) gradient")
    if comm.get_comm_counts("forward") != ({} if t == 1 else {"all_reduce": 3}) or comm.get_comm_counts("backward"):
        fails.append(f"nll(log_softmax) collectives {comm.get_comm_counts('forward')} / {comm.get_comm_counts('backward')}")
    # a log_softmax that feeds something else still gets its true gradient (#190746)
    full, local, dt = _logits((5, 13), g, mesh)
    w = torch.randn(5, 13, generator=g, dtype=torch.float64)
    (F.log_softmax(full, 1) * w).sum().backward()
    with loss_parallel():
        lp = F.log_softmax(dt, dim=1)
        (lp.to_local() * chunk(w, 1, t, r)).sum().backward()
    n += 2
    if not torch.allclose(lp.full_tensor().detach(), F.log_softmax(full.detach(), 1), **TOL):
        fails.append("standalone log_softmax value")
    if not torch.allclose(local.grad, chunk(full.grad, 1, t, r), **TOL):
        fails.append("standalone log_softmax gradient")
    # nll_loss of any class-sharded DTensor (not from log_softmax): -w_y x_y, gradient local
    full, local, dt = _logits((5, 13), g, mesh)
    weight = torch.rand(13, generator=g, dtype=torch.float64) + 0.5
    tgt = target.clone()
    tgt[1] = -100
    F.nll_loss(full, tgt, weight=weight).backward()
    with CommDebugMode() as comm, loss_parallel():
        got = F.nll_loss(dt, tgt, weight=weight)
        got.backward()
    n += 3
    if not torch.allclose(got, F.nll_loss(full.detach(), tgt, weight=weight), **TOL):
        fails.append("plain nll_loss value")
    if not torch.allclose(local.grad, chunk(full.grad, 1, t, r), **TOL):
        fails.append("plain nll_loss gradient")
    if comm.get_comm_counts() != ({} if t == 1 else {"all_reduce": 1}):
        fails.append(f"plain nll_loss collectives {comm.get_comm_counts()}")
    # nn.CrossEntropyLoss goes through F.cross_entropy
    full, local, dt = _logits((5, 13), g, mesh)
    with loss_parallel():
        got = torch.nn.CrossEntropyLoss()(dt, target)
    n += 1
    if not torch.allclose(got, F.cross_entropy(full.detach(), target), **TOL):
        fails.append("nn.CrossEntropyLoss")
    # errors
    bad = DTensor.from_local(torch.randn(2, 13), mesh, [Shard(0)])
    with loss_parallel():
        _raises(fails, "logits sharded on the batch dim", ValueError, lambda: F.cross_entropy(bad, torch.zeros(2 * t, dtype=torch.long)),
                "loss_parallel", "dimension 1")
        _raises(fails, "target out of range", IndexError, lambda: F.cross_entropy(dt, torch.full((5,), 13)), "13", "out of bounds")
        _raises(fails, "soft targets", NotImplementedError, lambda: F.cross_entropy(dt, torch.rand(5, 13)), "class-index")
        _raises(fails, "label_smoothing range", ValueError, lambda: F.cross_entropy(dt, target, label_smoothing=1.5), "label_smoothing")
    _raises(fails, "outside the context", NotImplementedError, lambda: F.cross_entropy(dt, target), "cross_entropy", ".full_tensor()")
    return fails, n + 5

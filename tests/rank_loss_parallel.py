"""Rank code for tests/test_loss_parallel.py (1-D meshes) and tests/test_loss_parallel_2d.py: loss_parallel
against F.cross_entropy on the full logits."""

from __future__ import annotations

import contextlib
import itertools

import torch
import torch.distributed as dist
import torch.nn.functional as F

from checks import chunk, raises
import tensorplay_edu.collectives as _collectives
from tensorplay_edu import CommDebugMode, DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from tensorplay_edu.parallel import loss_parallel
from tensorplay_edu.parallel.loss import _HANDLERS

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
        raises(fails, "logits sharded on the batch dim", ValueError, lambda: F.cross_entropy(bad, torch.zeros(2 * t, dtype=torch.long)),
                "loss_parallel", "dimension 1")
        raises(fails, "target out of range", RuntimeError, lambda: F.cross_entropy(dt, torch.full((5,), 13)), "out of bounds")
        raises(fails, "soft targets", NotImplementedError, lambda: F.cross_entropy(dt, torch.rand(5, 13)), "class-index")
        raises(fails, "label_smoothing range", ValueError, lambda: F.cross_entropy(dt, target, label_smoothing=1.5), "label_smoothing")
    raises(fails, "outside the context", NotImplementedError, lambda: F.cross_entropy(dt, target), "cross_entropy", ".full_tensor()")
    return fails, n + 5


# ---- N-D meshes (DP x TP, CP x TP, ...): issue 8 --------------------------------------------------

TOLS = {torch.float64: TOL, torch.float32: dict(rtol=1e-5, atol=1e-5)}

# mesh dim names -> (logits placements, the target placements the spec derives from them), written out by hand
LAYOUTS = {
    ("dp", "tp"): ([Shard(0), Shard(1)], [Shard(0), Replicate()]),
    ("rep", "tp"): ([Replicate(), Shard(1)], [Replicate(), Replicate()]),
    ("tp", "dp"): ([Shard(1), Shard(0)], [Replicate(), Shard(0)]),
    ("cp", "tp"): ([Shard(2), Shard(1)], [Shard(1), Replicate()]),  # (batch, class, seq): seq dim 2 -> target dim 1
}
SHAPES = {  # even; uneven rows (7 over 2) and classes (15 over 2); 3-D logits; a rank with no rows at all
    ("dp", "tp"): [(8, 16), (7, 15), (5, 15, 3), (1, 15)],
    ("rep", "tp"): [(8, 16), (7, 15)],
    ("tp", "dp"): [(8, 16), (7, 15)],
    ("cp", "tp"): [(4, 16, 6), (3, 15, 7)],
}


@contextlib.contextmanager
def _spy_all_reduce():
    """Record the global ranks of each all-reduce's group (CommDebugMode keeps only its size)."""
    seen, original = [], _collectives.all_reduce

    def spy(x, op, group):
        out = original(x, op, group)
        if dist.get_world_size(group) > 1 and x.numel():  # what the collective really issues
            seen.append((sorted(dist.get_process_group_ranks(group)), tuple(x.shape)))
        return out

    _collectives.all_reduce = spy
    try:
        yield seen
    finally:
        _collectives.all_reduce = original


def _line(mesh, j: int) -> list[int]:
    """The global ranks of the group along mesh dim j that holds this rank."""
    index = list(mesh.get_coordinate())
    index[j] = slice(None)
    return sorted(mesh.mesh[tuple(index)].reshape(-1).tolist())


def _check_counts(fails, label, comm, spy, mesh, tp, row_dims, tp_calls, rows_calls, has_rows):
    """``tp_calls`` all-reduces on the TP group, then ``rows_calls`` on the row dims' groups, none in backward."""
    want = [_line(mesh, tp)] * (tp_calls if has_rows and mesh.size(tp) > 1 else 0)
    want += [_line(mesh, j) for j in row_dims if mesh.size(j) > 1] * rows_calls
    got = [ranks for ranks, _ in spy]
    if got != want:
        fails.append(f"{label}: all-reduce groups {got}, expected {want}")
    fwd = [(r.op, r.group_size) for r in comm.records if r.phase == "forward"]
    if fwd != [("all_reduce", len(w)) for w in want]:
        fails.append(f"{label}: forward collectives {fwd}")
    if comm.get_comm_counts("backward"):
        fails.append(f"{label}: backward issued {comm.get_comm_counts('backward')}")
    if any(r.module != "loss_parallel" for r in comm.records):
        fails.append(f"{label}: collectives outside the loss_parallel scope {comm.table()}")


def _local_rows(shape, mesh, placements) -> int:
    """How many logits rows this rank holds (torch.chunk on every sharded non-class dim)."""
    n = 1
    for d, size in enumerate(shape):
        if d == 1:
            continue
        for j, p in enumerate(placements):
            if p == Shard(d):
                size = chunk(torch.empty(size), 0, mesh.size(j), mesh.get_local_rank(j)).numel()
        n *= size
    return n


def multi_dim_cross_entropy(names: tuple, dtype_name: str) -> tuple[list[str], int]:
    """F.cross_entropy on a (2, 2) mesh against one process: loss, input gradient, collectives."""
    dtype = getattr(torch, dtype_name)
    tol = TOLS[dtype]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    x_pl, t_pl = LAYOUTS[names]
    tp = [j for j, p in enumerate(x_pl) if p == Shard(1)][0]
    row_dims = [j for j, p in enumerate(x_pl) if isinstance(p, Shard) and j != tp]
    fails, n = [], 0
    options = itertools.product(SHAPES[names], ["none", "mean", "sum"], [-100, 3], [False, True], [0.0, 0.1])
    for i, (shape, reduction, ignore, weighted, eps) in enumerate(options):
        if dtype == torch.float32 and (ignore == 3 or shape[0] == 1):
            continue  # float32: half the grid is plenty
        g = torch.Generator().manual_seed(1000 + i)
        x = (torch.randn(shape, generator=g, dtype=dtype) * 3).requires_grad_(True)
        target = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
        target.view(-1)[1::3] = ignore  # ignored rows, unevenly spread over the row shards
        weight = torch.rand(shape[1], generator=g, dtype=dtype) + 0.5 if weighted else None
        kw = dict(weight=weight, ignore_index=ignore, reduction=reduction, label_smoothing=eps)
        ref = F.cross_entropy(x, target, **kw)
        out_w = torch.randn(ref.shape, generator=g, dtype=dtype)
        (ref * out_w).sum().backward()
        dist_x = distribute_tensor(x.detach().clone().requires_grad_(True), mesh, x_pl)
        dist_t = distribute_tensor(target, mesh, t_pl)
        local_w = distribute_tensor(out_w, mesh, t_pl).to_local() if reduction == "none" else out_w
        has_rows = _local_rows(shape, mesh, x_pl) > 0
        label = f"{names} {dtype_name} {shape} {reduction} ignore={ignore} weight={weighted} eps={eps}"
        with _spy_all_reduce() as spy, CommDebugMode() as comm:
            with loss_parallel():
                loss = F.cross_entropy(dist_x, dist_t, **kw)
            got = loss.to_local() if isinstance(loss, DTensor) else loss
            (got * local_w).sum().backward()
        n += 6
        _check_counts(fails, label, comm, spy, mesh, tp, row_dims, 3, 0 if reduction == "none" else 1, has_rows)
        if reduction == "none" and row_dims:
            if not (isinstance(loss, DTensor) and list(loss.placements) == t_pl and loss.shape == target.shape):
                fails.append(f"{label}: 'none' should be a DTensor {t_pl} of shape {list(target.shape)}, got {loss!r}")
                continue
            value = loss.full_tensor()
        else:
            value = loss
            if isinstance(loss, DTensor) or loss.shape != ref.shape:
                fails.append(f"{label}: expected a plain tensor of shape {list(ref.shape)}, got {type(loss).__name__}")
                continue
        if value.dtype != dtype or not torch.allclose(value.detach(), ref.detach(), equal_nan=True, **tol):
            fails.append(f"{label}: loss {value} != {ref}")
        grad = dist_x.grad
        if grad is None or list(grad.placements) != x_pl or not torch.allclose(grad.full_tensor(), x.grad,
                                                                                equal_nan=True, **tol):
            fails.append(f"{label}: logits gradient differs")
    return fails, n


def none_through_full_tensor(names: tuple) -> tuple[list[str], int]:
    """PyTorch feeds 'none' a replicated gradient; ours: full_tensor() of the per-row DTensor, then backward."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    x_pl, t_pl = LAYOUTS[names]
    shape = SHAPES[names][1]
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    target = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
    weight = torch.rand(shape[1], generator=g, dtype=torch.float64) + 0.5
    ref = F.cross_entropy(x, target, weight, reduction="none")
    ref.sum().backward()
    dist_x = distribute_tensor(x.detach().clone().requires_grad_(True), mesh, x_pl)
    with loss_parallel():
        loss = F.cross_entropy(dist_x, distribute_tensor(target, mesh, t_pl), weight, reduction="none")
    full = loss.full_tensor() if isinstance(loss, DTensor) else loss
    with CommDebugMode() as comm:
        full.sum().backward()
    fails = []
    if not torch.allclose(full.detach(), ref.detach(), **TOL):
        fails.append(f"{names}: 'none' through full_tensor: value")
    if not torch.allclose(dist_x.grad.full_tensor(), x.grad, **TOL):
        fails.append(f"{names}: 'none' through full_tensor: gradient")
    if comm.get_comm_counts():
        fails.append(f"{names}: 'none' through full_tensor: backward issued {comm.get_comm_counts()}")
    return fails, 3


def global_mean_denominator() -> tuple[list[str], int]:
    """pytorch/pytorch#185167: "mean" over batch shards needs the global denominator; the
    average of the ranks' own means is wrong when rows or ignored tokens are uneven."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(7, 15, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    target = torch.randint(0, 15, (7,), generator=g)
    target[[0, 1, 2]] = -100  # 1 valid row of 4 on dp rank 0, 3 of 3 on dp rank 1
    ref = F.cross_entropy(x, target)
    ref.backward()
    dist_x = distribute_tensor(x.detach().clone().requires_grad_(True), mesh, [Shard(0), Shard(1)])
    with loss_parallel():
        loss = F.cross_entropy(dist_x, distribute_tensor(target, mesh, [Shard(0), Replicate()]))
    loss.backward()
    local_means = [F.cross_entropy(x.detach()[rows], target[rows]) for rows in (slice(0, 4), slice(4, 7))]
    fails = []
    if not torch.allclose(loss, ref, **TOL) or not torch.allclose(dist_x.grad.full_tensor(), x.grad, **TOL):
        fails.append("global mean: value or gradient differs")
    if torch.allclose(sum(local_means) / 2, ref, rtol=1e-3):
        fails.append("global mean: the data should tell a local denominator apart")
    return fails, 2


def degenerate_meshes(shape: tuple, names: tuple) -> tuple[list[str], int]:
    """(1, 4): a one-rank row dim costs no extra all-reduce; (4, 1): a one-rank TP dim costs none of the three."""
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(9, 13, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    target = torch.randint(0, 13, (9,), generator=g)
    target[2] = -100
    ref = F.cross_entropy(x, target, label_smoothing=0.2)
    ref.backward()
    dist_x = distribute_tensor(x.detach().clone().requires_grad_(True), mesh, [Shard(0), Shard(1)])
    dist_t = distribute_tensor(target, mesh, [Shard(0), Replicate()])
    with _spy_all_reduce() as spy, CommDebugMode() as comm, loss_parallel():
        loss = F.cross_entropy(dist_x, dist_t, label_smoothing=0.2)
        loss.backward()
    fails = []
    has_rows = _local_rows((9, 13), mesh, [Shard(0), Shard(1)]) > 0
    _check_counts(fails, f"mesh {shape}", comm, spy, mesh, 1, [0], 3, 1, has_rows)
    if not torch.allclose(loss, ref, **TOL) or not torch.allclose(dist_x.grad.full_tensor(), x.grad, **TOL):
        fails.append(f"mesh {shape}: value or gradient differs")
    return fails, 2


def multi_dim_log_softmax_paths() -> tuple[list[str], int]:
    """log_softmax, nll_loss (fused and not), nn.CrossEntropyLoss on a (dp, tp) mesh."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    pl, t_pl, tp_ranks = [Shard(0), Shard(1)], [Shard(0), Replicate()], _line(mesh, 1)
    fails, n = [], 0
    g = torch.Generator().manual_seed(21)

    def fresh(shape, placements=pl):
        x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
        return x, distribute_tensor(x.detach().clone().requires_grad_(True), mesh, placements)

    target = torch.randint(0, 15, (7,), generator=g)
    target[[1, 5]] = -100
    dist_t = distribute_tensor(target, mesh, t_pl)
    weight = torch.rand(15, generator=g, dtype=torch.float64) + 0.5
    # fused nll_loss(log_softmax): 3 TP all-reduces + 1 over dp, none backward
    x, dx = fresh((7, 15))
    F.nll_loss(F.log_softmax(x, 1), target, weight=weight).backward()
    with _spy_all_reduce() as spy, CommDebugMode() as comm, loss_parallel():
        loss = F.nll_loss(F.log_softmax(dx, dim=1), dist_t, weight=weight)
        loss.backward()
    n += 3
    _check_counts(fails, "fused nll(log_softmax)", comm, spy, mesh, 1, [0], 3, 1, True)
    if not torch.allclose(loss, F.nll_loss(F.log_softmax(x.detach(), 1), target, weight=weight), **TOL):
        fails.append("fused nll(log_softmax): value")
    if not torch.allclose(dx.grad.full_tensor(), x.grad, **TOL):
        fails.append("fused nll(log_softmax): gradient")
    # a standalone log_softmax: 2 TP all-reduces forward, 1 TP all-reduce backward
    x, dx = fresh((7, 15))
    w = torch.randn(7, 15, generator=g, dtype=torch.float64)
    (F.log_softmax(x, 1) * w).sum().backward()
    w_local = distribute_tensor(w, mesh, pl).to_local()
    with _spy_all_reduce() as spy, CommDebugMode() as comm, loss_parallel():
        lp = F.log_softmax(dx, dim=1)
        (lp.to_local() * w_local).sum().backward()
    n += 3
    if [r for r, _ in spy] != [tp_ranks] * 3 or comm.get_comm_counts("backward") != {"all_reduce": 1}:
        fails.append(f"standalone log_softmax: groups {spy}, backward {comm.get_comm_counts('backward')}")
    if list(lp.placements) != pl or not torch.allclose(lp.full_tensor().detach(), F.log_softmax(x.detach(), 1), **TOL):
        fails.append("standalone log_softmax: value")
    if not torch.allclose(dx.grad.full_tensor(), x.grad, **TOL):
        fails.append("standalone log_softmax: gradient")
    # log_softmax over the last dim of (batch, seq, vocab), vocab on tp, then a local softmax over an unsharded dim
    x, dx = fresh((4, 3, 15), [Shard(0), Shard(2)])
    with CommDebugMode() as comm, loss_parallel():
        lp = F.log_softmax(dx, dim=-1)
        whole = F.log_softmax(dx, dim=1)
    n += 2
    if not torch.allclose(lp.full_tensor(), F.log_softmax(x, -1), **TOL) or comm.get_comm_counts() != {"all_reduce": 2}:
        fails.append(f"log_softmax(dim=-1): value or collectives {comm.get_comm_counts()}")
    if not torch.allclose(whole.full_tensor(), F.log_softmax(x, 1), **TOL):
        fails.append("log_softmax over an unsharded dim")
    # nll_loss of log-probabilities (not from log_softmax): 1 TP all-reduce + 1 over dp
    x, dx = fresh((7, 15))
    F.nll_loss(x, target, weight=weight, reduction="sum").backward()
    with _spy_all_reduce() as spy, CommDebugMode() as comm, loss_parallel():
        got = F.nll_loss(dx, dist_t, weight=weight, reduction="sum")
        got.backward()
    n += 3
    _check_counts(fails, "plain nll_loss", comm, spy, mesh, 1, [0], 1, 1, True)
    if not torch.allclose(got, F.nll_loss(x.detach(), target, weight=weight, reduction="sum"), **TOL):
        fails.append("plain nll_loss: value")
    if not torch.allclose(dx.grad.full_tensor(), x.grad, **TOL):
        fails.append("plain nll_loss: gradient")
    # nn.CrossEntropyLoss, label smoothing and weight, mean
    x, dx = fresh((7, 15))
    with loss_parallel():
        got = torch.nn.CrossEntropyLoss(weight=weight, label_smoothing=0.1)(dx, dist_t)
    n += 1
    if not torch.allclose(got, F.cross_entropy(x.detach(), target, weight, label_smoothing=0.1), **TOL):
        fails.append("nn.CrossEntropyLoss")
    return fails, n


def multi_dim_errors() -> tuple[list[str], int]:
    """PyTorch 2.13's errors on N-D meshes, plus ours for a target laid out wrongly."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    fails = []
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 16, generator=g)
    target = torch.randint(0, 16, (8,), generator=g)
    partial = DTensor.from_local(torch.randn(4, 8), mesh, [Partial(), Shard(1)])
    no_tp = distribute_tensor(x, mesh, [Shard(0), Replicate()])
    good = distribute_tensor(x, mesh, [Shard(0), Shard(1)])
    rep_t = distribute_tensor(target, mesh, [Replicate(), Replicate()])
    with loss_parallel():
        for reduction in ("sum", "none", "mean"):
            raises(fails, f"Partial on the non-TP dim ({reduction})", ValueError,
                    lambda: F.cross_entropy(partial, rep_t, reduction=reduction),
                    "loss_parallel() expects non-TP mesh dims to be Shard or Replicate, got P(sum) at dim 0.")
        raises(fails, "Partial non-TP dim, log_softmax", ValueError, lambda: F.log_softmax(partial, 1),
                "Shard or Replicate")
        raises(fails, "no mesh dim shards the classes", ValueError, lambda: F.cross_entropy(no_tp, rep_t),
                "loss_parallel() requires exactly one mesh dim to shard tensor dimension 1, but got placements",
                "with 0 such mesh dim(s).", "ColwiseParallel")
        raises(fails, "plain target on a dp-sharded mesh", ValueError,
                lambda: F.cross_entropy(good, target, reduction="sum"), "requires a DTensor",
                "[Shard(dim=0), Replicate()]")
        raises(fails, "DTensor target laid out wrongly", ValueError, lambda: F.cross_entropy(good, rep_t),
                "(Replicate(), Replicate())", "(Shard(dim=0), Replicate())")
        short = distribute_tensor(target[:6], mesh, [Shard(0), Replicate()])
        raises(fails, "target of the wrong shape", ValueError, lambda: F.cross_entropy(good, short), "[6]", "[8]")
    return fails, 8


def nested_contexts() -> tuple[list[str], int]:
    """An inner ``with loss_parallel()`` must not switch the outer one off; exit restores what was there."""
    from tensorplay_edu.dtensor import _TORCH_FUNCTIONS, register_torch_function

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    fails = []
    g = torch.Generator().manual_seed(4)
    full, local, dt = _logits((5, 13), g, mesh)
    target = torch.randint(0, 13, (5,), generator=g)
    ref = F.cross_entropy(full.detach(), target)
    with loss_parallel():
        with loss_parallel():
            inner = F.cross_entropy(dt, target)
        after_inner = F.cross_entropy(dt, target)  # the outer block is still active
    if not (torch.allclose(inner, ref, **TOL) and torch.allclose(after_inner, ref, **TOL)):
        fails.append("nested: values")
    if any(f in _TORCH_FUNCTIONS for f in _HANDLERS):
        fails.append("nested: handlers left registered after the outer block")
    raises(fails, "after the outer block", NotImplementedError, lambda: F.cross_entropy(dt, target), "cross_entropy")
    sentinel = object()  # a handler someone else registered before: restored, not dropped
    register_torch_function(F.nll_loss, sentinel)
    try:
        with loss_parallel():
            pass
        if _TORCH_FUNCTIONS.get(F.nll_loss) is not sentinel:
            fails.append("nested: the handler registered before the block was not restored")
    finally:
        register_torch_function(F.nll_loss, None)
    return fails, 4


def one_dim_unchanged() -> tuple[list[str], int]:
    """1-D mesh: plain tensors back for every reduction, 3 all-reduces on the whole group, none backward."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    fails, n = [], 0
    for i, reduction in enumerate(["none", "mean", "sum"]):
        g = torch.Generator().manual_seed(40 + i)
        full, local, dt = _logits((7, 15), g, mesh)
        target = torch.randint(0, 15, (7,), generator=g)
        target[3] = -100
        ref = F.cross_entropy(full, target, reduction=reduction)
        ref.sum().backward()
        with _spy_all_reduce() as spy, CommDebugMode() as comm:
            with loss_parallel():
                loss = F.cross_entropy(dt, target, reduction=reduction)
            loss.sum().backward()
        n += 4
        if isinstance(loss, DTensor) or not torch.allclose(loss.detach(), ref.detach(), **TOL):
            fails.append(f"1-D {reduction}: {loss!r}")
        if not torch.allclose(local.grad, chunk(full.grad, 1, t, r), **TOL):
            fails.append(f"1-D {reduction}: gradient")
        shapes = [s for _, s in spy]
        if [ranks for ranks, _ in spy] != [list(range(t))] * 3 or shapes != [(7,), (7,), (1, 7)]:
            fails.append(f"1-D {reduction}: all-reduces {spy}")
        if comm.get_comm_counts("forward") != {"all_reduce": 3} or comm.get_comm_counts("backward"):
            fails.append(f"1-D {reduction}: collectives {comm.get_comm_counts('forward')} / "
                         f"{comm.get_comm_counts('backward')}")
    return fails, n


def extreme_logits(dtype_name: str) -> tuple[list[str], int]:
    """Large offsets and scales (the max all-reduce matters: with a sum in its place, exp overflows or the
    shift is wrong and the loss is inf / nan): checked finite and equal to F.cross_entropy on the whole logits,
    for the loss, its logits gradient, and the log_softmax -> nll_loss path."""
    dtype = getattr(torch, dtype_name)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    fails, n = [], 0
    cases = [("+30", 1.0, 30.0), ("-100", 1.0, -100.0), ("x50", 50.0, 0.0), ("x20 +1000", 20.0, 1000.0),
             ("one class far ahead", 1.0, "spike")]
    for i, (name, scale, offset) in enumerate(cases):
        for shape, eps in (((7, 13), 0.0), ((5, 4, 3), 0.1)):
            g = torch.Generator().manual_seed(100 + i)
            full = torch.randn(shape, generator=g, dtype=torch.float64) * scale
            if offset == "spike":  # one class per row 60 above the rest: the max sits on one rank
                full.view(shape[0], shape[1], -1)[:, shape[1] - 1] += 60
            else:
                full += offset
            full = full.to(dtype).requires_grad_(True)
            local = chunk(full.detach(), 1, t, r).clone().requires_grad_(True)
            dt = DTensor.from_local(local, mesh, [Shard(1)], shape=shape)
            target = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
            ref = F.cross_entropy(full, target, label_smoothing=eps)
            ref.backward()
            with loss_parallel():
                loss = F.cross_entropy(dt, target, label_smoothing=eps)
                loss.backward()
                local2 = local.detach().clone().requires_grad_(True)
                dt2 = DTensor.from_local(local2, mesh, [Shard(1)], shape=shape)
                nll = F.nll_loss(F.log_softmax(dt2, 1), target)
                nll.backward()
            label = f"{dtype_name} {name} {shape} eps={eps}"
            n += 4
            if not (torch.isfinite(loss) and torch.isfinite(local.grad).all()):
                fails.append(f"{label}: not finite: loss {loss.item()}")
            if not torch.allclose(loss.detach(), ref.detach(), **tol):
                fails.append(f"{label}: loss {loss.item()} != {ref.item()}")
            if not torch.allclose(local.grad, chunk(full.grad, 1, t, r), **tol):
                fails.append(f"{label}: logits gradient differs")
            if eps == 0.0 and not (torch.allclose(nll.detach(), ref.detach(), **tol)
                                   and torch.allclose(local2.grad, chunk(full.grad, 1, t, r), **tol)):
                fails.append(f"{label}: log_softmax -> nll_loss {nll.item()} != {ref.item()} (or its gradient)")
    return fails, n


def one_buffer() -> tuple[list[str], int]:
    """The cross-entropy keeps one [N, V/t] tensor for backward (the softmax, not the logits), returns its
    gradient in that same buffer, and refuses a second backward with a clear error."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    fails, n = [], 0
    shape = (6, 40)
    full = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    local = chunk(full, 1, t, r).clone().requires_grad_(True)
    target = torch.arange(6) * 5
    big = []

    def pack(x):
        if x.dim() == 2 and x.shape[1] == local.shape[1]:
            big.append(x)
        return x

    with loss_parallel(), torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = F.cross_entropy(DTensor.from_local(local, mesh, [Shard(1)], shape=shape), target, label_smoothing=0.1)
    n += 3
    if len(big) != 1 or big[0].data_ptr() == local.data_ptr():
        fails.append(f"saved for backward: {len(big)} [N, V/t] tensors (want 1, the softmax, not the logits)")
    softmax = torch.softmax(full, 1)
    if big and not torch.allclose(big[0], chunk(softmax, 1, t, r), rtol=1e-12, atol=1e-15):
        fails.append("the saved [N, V/t] tensor is not this rank's slice of the softmax")
    ptr = big[0].data_ptr() if big else None
    grads = torch.autograd.grad(loss, local, retain_graph=True)
    if grads[0].data_ptr() != ptr:
        fails.append("the gradient is not written into the softmax buffer")
    try:
        torch.autograd.grad(loss, local)
        fails.append("a second backward through the same loss ran")
    except RuntimeError as e:
        if "runs once" not in str(e):
            fails.append(f"second backward: unclear error {e}")
    return fails, n

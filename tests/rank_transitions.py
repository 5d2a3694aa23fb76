"""Rank code for tests/test_transitions.py (kept free of pytest so ranks start light).

Every check compares against single-process math: all ranks build the same global
tensors from fixed seeds, so each rank knows what its piece and its gradient must be.
Each worker returns a list of failure strings and the number of checks it made, so a
test can assert both "no failures" and "it really checked".
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from checks import chunk, gather_all
from tensorplay_edu import CommDebugMode, DTensor, Partial, Replicate, Shard, init_device_mesh

# What the table must issue, written out independently of tensorplay_edu.transition.TABLE.
FORWARD_OP = {
    ("S", "R"): "all_gather", ("P", "R"): "all_reduce", ("P", "S"): "reduce_scatter",
    ("R", "S"): None, ("S", "S"): "all_to_all", ("R", "P"): None, ("S", "P"): "all_gather",
}


# torch.testing's defaults for float32; float64 tight.
TOL = {torch.float32: dict(rtol=1.3e-6, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


def kind(p) -> str:
    return {Shard: "S", Replicate: "R", Partial: "P"}[type(p)]


def layout(x: torch.Tensor, p, t: int, r: int, addends=None) -> torch.Tensor:
    """This rank's local tensor for global ``x`` in placement ``p``."""
    if isinstance(p, Shard):
        return chunk(x, p.dim % x.ndim, t, r)
    if isinstance(p, Partial):
        return addends[r]
    return x


def expected_bytes(op, shape, dtype, t, src, dst) -> int:
    """Ring accounting, computed from the global shape (padded to ceil(n / t) rows)."""
    item = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for s in shape:
        numel *= s
    if op == "all_reduce":
        return 2 * (t - 1) * -(-numel // t) * item
    dim = (src.dim if op == "all_gather" else dst.dim) % len(shape)
    if op == "all_to_all":  # local block padded on src dim, full dst dim padded to t blocks
        rows_src = -(-shape[src.dim % len(shape)] // t)
        rows_dst = -(-shape[dst.dim % len(shape)] // t)
        other = numel // (shape[src.dim % len(shape)] * shape[dst.dim % len(shape)]) if numel else 0
        return (t - 1) * rows_src * rows_dst * other * item
    rows = -(-shape[dim] // t)
    other = numel // shape[dim] if shape[dim] else 0
    return (t - 1) * rows * other * item


def check_transition(mesh, shape, src, dst, dtype, partial_grad: bool, seed: int) -> list[str]:
    """One src -> dst move on a 1-D mesh: values, gradient, collective counts and bytes."""
    t, r = mesh.size(), mesh.get_local_rank()
    name = f"t={t} {list(shape)} {src}->{dst} {dtype} partial_grad={partial_grad}"
    fails = []
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=dtype)
    addends = [torch.randn(shape, generator=g, dtype=dtype) for _ in range(t)]
    if isinstance(src, Partial):
        x = sum(addends[1:], addends[0].clone())
    grads = [torch.randn(shape, generator=g, dtype=dtype) for _ in range(t)]
    grad = sum(grads[1:], grads[0].clone()) if partial_grad else grads[0]

    leaf = layout(x, src, t, r, addends).clone().requires_grad_(True)
    dt = DTensor.from_local(leaf, mesh, [src], shape=shape)
    with CommDebugMode() as fwd:
        out = dt.redistribute(mesh, [dst])
    if isinstance(dst, Partial):  # check the sum, not one rank's addend
        got = out.to_local(grad_placements=[Partial()] if partial_grad else None)
        total = torch.stack([torch.as_tensor(v) for v in gather_all(got.detach())]).sum(0)
        if not torch.allclose(total, x, **TOL[dtype]):
            fails.append(f"{name}: sum of Partial pieces differs from the global tensor")
    else:
        got = out.to_local(grad_placements=[Partial()] if partial_grad else None)
        want = layout(x, dst, t, r)
        if isinstance(src, Partial):  # a sum in another order: float tolerance
            ok = got.shape == want.shape and torch.allclose(got, want, **TOL[dtype])
        else:  # gathers, chunks and all-to-alls only copy: bit-exact
            ok = got.shape == want.shape and torch.equal(got, want)
        if not ok:
            fails.append(f"{name}: forward value differs")
    # counts and bytes
    same = src == dst or (isinstance(src, Shard) and isinstance(dst, Shard)
                          and src.dim % len(shape) == dst.dim % len(shape))
    empty = x.numel() == 0  # an empty global tensor moves nothing
    op = None if t == 1 or same or empty else FORWARD_OP[(kind(src), kind(dst))]
    want_counts = {op: 1} if op else {}
    if fwd.get_comm_counts() != want_counts:
        fails.append(f"{name}: forward collectives {fwd.get_comm_counts()} != {want_counts}")
    elif op:
        nb = expected_bytes(op, shape, dtype, t, src, dst)
        if fwd.get_total_bytes() != nb:
            fails.append(f"{name}: forward bytes {fwd.get_total_bytes()} != {nb}")
    # backward: the gradient of the one logical loss <out, grad>
    g_local = grads[r] if partial_grad else layout(grad, dst if not isinstance(dst, Partial) else Replicate(), t, r)
    with CommDebugMode() as bwd:
        (got * g_local).sum().backward()
    want_grad = layout(grad, src if not isinstance(src, Partial) else Replicate(), t, r)
    if leaf.grad is None or leaf.grad.shape != want_grad.shape or not torch.allclose(leaf.grad, want_grad, **TOL[dtype]):
        fails.append(f"{name}: input gradient differs")
    gkind = "P" if partial_grad else ("R" if isinstance(dst, Partial) else kind(dst))
    skind = "R" if isinstance(src, Partial) else kind(src)
    same_shard = gkind == skind == "S" and src.dim % len(shape) == dst.dim % len(shape)
    bop = None if t == 1 or empty or gkind == skind and (gkind != "S" or same_shard) else FORWARD_OP[(gkind, skind)]
    want_b = {bop: 1} if bop else {}
    if bwd.get_comm_counts("backward") != want_b or bwd.get_total_counts("forward"):
        fails.append(f"{name}: backward collectives {bwd.get_comm_counts('backward')} != {want_b}")
    return fails


SHAPES = [(10, 7), (2, 5), (6, 4, 9), (8, 12), (3,), (0, 4)]
DTYPES = [torch.float32, torch.float64]


def all_placements(ndim: int):
    return [Shard(d) for d in range(ndim)] + [Shard(-1), Replicate(), Partial()]


def exhaustive_transitions() -> tuple[list[str], int]:
    """Every src -> dst pair on every shape and dtype, with both gradient kinds."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    fails, n, seed = [], 0, 0
    for shape in SHAPES:
        for dtype in DTYPES:
            for src in all_placements(len(shape)):
                for dst in all_placements(len(shape)):
                    grad_kinds = [False, True] if not isinstance(dst, Shard) else [False]
                    for partial_grad in grad_kinds:
                        seed += 1
                        fails += check_transition(mesh, shape, src, dst, dtype, partial_grad, seed)
                        n += 1
    return fails, n


def listed_transitions(cases) -> tuple[list[str], int]:
    """Cases drawn by hypothesis in the parent: (shape, src, dst, dtype name, partial_grad)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    fails = []
    for i, (shape, src, dst, dtype, partial_grad) in enumerate(cases):
        fails += check_transition(mesh, shape, src, dst, getattr(torch, dtype), partial_grad, 1000 + i)
    return fails, len(cases)


def three_consumers() -> dict:
    """Shard(1) -> Replicate read by three matmuls on sharded weights (wq, wk, wv).

    Their input gradients are partial sums, declared with to_local(grad_placements);
    autograd adds the three up first, so the backward is ONE reduce-scatter.
    """
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 6, 8, generator=g, dtype=torch.float64)  # [b, s, h]
    ws = [torch.randn(8, 4 * t, generator=g, dtype=torch.float64) for _ in range(3)]  # [h, 4t]
    # single process
    x_ref = x.clone().requires_grad_(True)
    sum((x_ref @ w).square().sum() for w in ws).backward()
    # tensor parallel: sequence-sharded x, column-sharded weights
    x_local = chunk(x, 1, t, r).clone().requires_grad_(True)  # [b, s/t, h]
    x_sp = DTensor.from_local(x_local, mesh, [Shard(1)], shape=x.shape)
    with CommDebugMode() as comm:
        full = x_sp.redistribute(mesh, [Replicate()])  # all-gather   [b, s, h]
        loss = 0
        for w in ws:
            y = full.to_local(grad_placements=[Partial()]) @ chunk(w, 1, t, r)  # [b, s, 4t/t]
            loss = loss + y.square().sum()
        loss.backward()
    return {
        "forward": comm.get_comm_counts("forward"),
        "backward": comm.get_comm_counts("backward"),
        "grad_ok": bool(torch.allclose(x_local.grad, chunk(x_ref.grad, 1, t, r), **TOL[torch.float64])),
    }


def two_d_mesh() -> tuple[list[str], int]:
    """A 2 x 2 mesh named (dp, tp): sub-meshes, and moves on both mesh dims at once."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    fails, n = [], 0
    tp, dp = mesh["tp"], mesh["dp"]
    facts = {
        "ndim": (mesh.ndim, 2), "size": (mesh.size(), 4), "tp.size": (tp.size(), 2), "tp.ndim": (tp.ndim, 1),
        "tp.local": (tp.get_local_rank(), rank % 2), "dp.local": (dp.get_local_rank(), rank // 2),
        "coord": (mesh.get_coordinate(), (rank // 2, rank % 2)), "get_rank": (tp.get_rank(), rank),
        "tp.ranks": (tp.mesh.tolist(), [rank // 2 * 2, rank // 2 * 2 + 1]), "dp.ranks": (dp.mesh.tolist(), [rank % 2, rank % 2 + 2]),
        "tp.group": (dist.get_process_group_ranks(tp.get_group()), [rank // 2 * 2, rank // 2 * 2 + 1]),
        "dp.group": (dist.get_process_group_ranks(mesh.get_group("dp")), [rank % 2, rank % 2 + 2]),
        "device_type": (mesh.device_type, "cpu"),
    }
    for key, (got, want) in facts.items():
        n += 1
        if got != want:
            fails.append(f"2-D mesh {key}: {got} != {want}")
    moves = [
        ([Shard(0), Shard(1)], [Replicate(), Replicate()]),
        ([Replicate(), Replicate()], [Shard(0), Shard(1)]),
        ([Shard(0), Shard(1)], [Shard(1), Shard(0)]),
        ([Replicate(), Shard(0)], [Shard(0), Replicate()]),
        ([Shard(1), Replicate()], [Replicate(), Shard(1)]),
        ([Partial(), Shard(0)], [Replicate(), Shard(0)]),
        ([Shard(0), Partial()], [Shard(0), Shard(1)]),
        ([Partial(), Partial()], [Replicate(), Replicate()]),
    ]
    g = torch.Generator().manual_seed(11)
    for src, dst in moves:
        for shape in [(6, 10), (5, 3)]:
            n += 1
            x = torch.randn(shape, generator=g, dtype=torch.float64)
            noise = [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(4)]
            grad = torch.randn(shape, generator=g, dtype=torch.float64)
            local = x
            for i, p in enumerate(src):  # this rank's piece: shard / split into addends per mesh dim
                t, c = mesh.size(i), mesh.get_local_rank(i)
                if isinstance(p, Shard):
                    local = chunk(local, p.dim, t, c)
            n_partial = sum(isinstance(p, Partial) for p in src)
            if n_partial:  # x split into 2**n_partial addends, one per coordinate on the Partial dims
                coords = mesh.get_coordinate()
                partial_coords = [c for c, p in zip(coords, src) if isinstance(p, Partial)]
                pid = sum(c * 2 ** k for k, c in enumerate(partial_coords))
                pieces = [noise[j] for j in range(2 ** n_partial)]
                pieces[0] = x - sum(pieces[1:])
                local = pieces[pid]
                for i, p in enumerate(src):
                    if isinstance(p, Shard):
                        local = chunk(local, p.dim, mesh.size(i), mesh.get_local_rank(i))
            leaf = local.clone().requires_grad_(True)
            out = DTensor.from_local(leaf, mesh, src, shape=shape).redistribute(mesh, dst)
            want = x
            for i, p in enumerate(dst):
                if isinstance(p, Shard):
                    want = chunk(want, p.dim, mesh.size(i), mesh.get_local_rank(i))
            got = out.to_local()
            if got.shape != want.shape or not torch.allclose(got, want, **TOL[torch.float64]):
                fails.append(f"2-D {src}->{dst} {shape}: forward differs")
            g_local = grad
            for i, p in enumerate(dst):
                if isinstance(p, Shard):
                    g_local = chunk(g_local, p.dim, mesh.size(i), mesh.get_local_rank(i))
            (got * g_local).sum().backward()
            want_grad = grad
            for i, p in enumerate(src):
                if isinstance(p, Shard):
                    want_grad = chunk(want_grad, p.dim, mesh.size(i), mesh.get_local_rank(i))
            if not torch.allclose(leaf.grad, want_grad, **TOL[torch.float64]):
                fails.append(f"2-D {src}->{dst} {shape}: gradient differs")
    return fails, n

"""Rank code for tests/test_dtensor.py: DTensor, distribute_tensor."""

from __future__ import annotations

import torch
import torch.distributed as dist

from checks import Checker, chunk, raises
from tensorplay_edu import CommDebugMode, DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from tensorplay_edu.debug import module_scope


def dtensor_api() -> tuple[list[str], int]:
    """from_local / distribute_tensor / full_tensor / loss-path ops / errors."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    check = Checker()
    g = torch.Generator().manual_seed(3)
    own = torch.Generator().manual_seed(100 + r)  # per-rank data, for src_data_rank=None
    # distribute_tensor -> full_tensor is bit-exact, for every placement and source rank
    for shape in [(10, 7), (2, 3), (4, 5, 6)]:
        x = torch.randn(shape, generator=g)
        for p in [Shard(0), Shard(1), Shard(-1), Replicate(), Partial()]:
            for src in [0, t - 1, None]:
                mine = x if src is not None or r == 0 else torch.randn(shape, generator=own)
                d = distribute_tensor(mine, mesh, [p], src_data_rank=src)
                check(f"distribute_tensor {shape} {p} src={src}: shape", d.shape == torch.Size(shape))
                if src is not None:
                    check(f"distribute->full {shape} {p} src={src} bit-exact", torch.equal(d.full_tensor(), x))
                elif isinstance(p, Shard):  # no communication: my own chunk of my own data
                    check(f"distribute {p} src=None local", torch.equal(d.to_local(), chunk(mine, p.dim % len(shape), t, r)))
    # src_data_rank=None and Partial: every rank's own tensor is its addend, the global tensor their sum
    own_x = torch.full((3, 2), float(r + 1))
    summed = distribute_tensor(own_x, mesh, [Partial()], src_data_rank=None).full_tensor()
    check("Partial with src_data_rank=None sums every rank's own data",
          torch.equal(summed, torch.full((3, 2), float(t * (t + 1) // 2))))
    # the source rank's data wins; others' data is ignored
    x0 = torch.full((5, 4), float(dist.get_rank()))
    check("src_data_rank=last broadcasts its data",
          torch.equal(distribute_tensor(x0, mesh, [Replicate()], src_data_rank=t - 1).to_local(), torch.full((5, 4), float(t - 1))))
    # comm kinds of distribute_tensor
    with CommDebugMode() as comm:
        distribute_tensor(torch.zeros(8, 3), mesh, [Shard(0)])
        distribute_tensor(torch.zeros(8, 3), mesh, [Replicate()])
        distribute_tensor(torch.zeros(8, 3), mesh, [Shard(0)], src_data_rank=None)
    check(f"distribute_tensor collectives {comm.get_comm_counts()}",
          comm.get_comm_counts() == ({} if t == 1 else {"all_gather": 2, "scatter": 1, "broadcast": 1}))
    check("... the all-gathers are the shape checks (one number each)",
          all(r.module == "distribute_tensor (shape check)" and r.shape == (t,) for r in comm.records
              if r.op == "all_gather"))
    # from_local: even inference, uneven via shape=, wrong shape named
    loc = torch.randn(3, 4)
    check("from_local infers even shape", DTensor.from_local(loc, mesh, [Shard(0)]).shape == torch.Size([3 * t, 4]))
    check("from_local Replicate shape", DTensor.from_local(loc, mesh, [Replicate()]).shape == torch.Size([3, 4]))
    ten = torch.randn(10, 2)
    d = DTensor.from_local(chunk(ten, 0, t, r), mesh, [Shard(0)], shape=(10, 2))
    check("from_local uneven full_tensor", torch.equal(d.full_tensor(), ten))
    if t > 1:
        raises(check.fails, "from_local wrong shape", ValueError,
                lambda: DTensor.from_local(torch.randn(1, 2), mesh, [Shard(0)], shape=(10 * t, 2)), "shape=")
    raises(check.fails, "from_local stride without shape", ValueError,
            lambda: DTensor.from_local(loc, mesh, [Replicate()], stride=(4, 1)), "shape")
    raises(check.fails, "placements length", ValueError, lambda: DTensor.from_local(loc, mesh, [Shard(0), Shard(1)]),
            "one placement per mesh dimension")
    raises(check.fails, "Shard dim out of range", ValueError, lambda: DTensor.from_local(loc, mesh, [Shard(2)]), "Shard(2)")
    # run_check: replicas are made equal (rank 0's) and shapes are checked
    mine = torch.full((2, 2), float(dist.get_rank()), requires_grad=True)
    rc = DTensor.from_local(mine, mesh, [Replicate()], run_check=True)
    check("run_check broadcasts rank 0's replica", torch.equal(rc.to_local().detach(), torch.zeros(2, 2)))
    rc.to_local().sum().backward()
    check("run_check keeps the gradient path", mine.grad is not None and torch.equal(mine.grad, torch.ones(2, 2)))
    if t > 1:
        # each rank infers an even global shape from its own piece; only run_check sees they disagree
        raises(check.fails, "run_check catches inconsistent local shapes", ValueError,
                lambda: DTensor.from_local(torch.randn(3 if r == 0 else 2, 3), mesh, [Shard(0)], run_check=True),
                "run_check")
    # non-leaf and placement errors of distribute_tensor
    leaf = torch.randn(4, requires_grad=True)
    raises(check.fails, "distribute non-leaf", RuntimeError, lambda: distribute_tensor(leaf * 2, mesh, [Replicate()]), "leaf")
    # Shard(-1) -> Shard(last) costs nothing
    s = torch.randn(2, 3, 4 * t)
    dneg = DTensor.from_local(chunk(s, 2, t, r), mesh, [Shard(-1)], shape=s.shape)
    with CommDebugMode() as comm:
        moved = dneg.redistribute(mesh, [Shard(2)])
    check("Shard(-1) -> Shard(2) is free", comm.get_total_counts() == 0 and torch.equal(moved.to_local(), dneg.to_local()))
    check("placements are normalised", dneg.placements == (Shard(2),))
    # loss-path ops keep the sharded (vocab) dim whole, and gradients flow through them
    logits = torch.randn(2, 3, 5 * t, generator=g, dtype=torch.float64)  # [b, s, V]
    lf = chunk(logits, 2, t, r).clone().requires_grad_(True)  # [b, s, V/t]
    lt = DTensor.from_local(lf, mesh, [Shard(2)], shape=logits.shape)
    flat = lt.flatten(0, 1)  # [b*s, V]
    check("flatten moves the shard dim", flat.placements == (Shard(1),) and flat.shape == torch.Size([6, 5 * t]))
    check("view", lt.view(6, -1).placements == (Shard(1),) and lt.reshape(-1, 5 * t).shape == torch.Size([6, 5 * t]))
    check("float/to/double", lt.float().dtype == torch.float32 and lt.to(torch.float32).dtype == torch.float32
          and lt.float().double().dtype == torch.float64)
    check("detach", not lt.detach().requires_grad and lt.requires_grad and lt.detach().placements == lt.placements)
    full = flat.float().redistribute(mesh, [Replicate()]).to_local()  # all-gather
    (full * torch.arange(full.numel(), dtype=torch.float32).view_as(full)).sum().backward()
    want = chunk(torch.arange(6 * 5 * t, dtype=torch.float64).view(2, 3, 5 * t), 2, t, r)
    check("gradient through flatten + float + redistribute", lf.grad is not None and torch.equal(lf.grad, want))
    raises(check.fails, "view splitting the sharded dim", NotImplementedError, lambda: lt.view(-1), "view", "Shard")
    # any other op is refused by name, with the placements and the way out
    raises(check.fails, "torch.matmul", NotImplementedError, lambda: torch.matmul(lt, lt), "matmul", "Shard(dim=2)", ".to_local()")
    raises(check.fails, "operator +", NotImplementedError, lambda: lt + 1, "__add__", ".full_tensor()")
    raises(check.fails, "method sum", NotImplementedError, lambda: lt.sum(), "sum", "Shard(dim=2)")
    raises(check.fails, "F.softmax", NotImplementedError, lambda: torch.nn.functional.softmax(lt, -1), "softmax")
    # readers must agree on the gradient's placement; Partial cannot stand for Shard
    rep = DTensor.from_local(torch.randn(3, requires_grad=True), mesh, [Replicate()])
    rep.to_local(grad_placements=[Partial()])
    raises(check.fails, "conflicting grad placements", RuntimeError, lambda: rep.to_local(), "grad_placements")
    raises(check.fails, "Partial grad of a shard", ValueError, lambda: lt.to_local(grad_placements=[Partial()]), "grad_placements")
    # from_local makes no autograd node while its readers take the default layout; the first reader
    # declaring Partial (f) makes one, shared by the later readers: one all-reduce for all three,
    # attributed to the module that called from_local
    x = torch.randn(3, requires_grad=True)
    check("from_local + to_local(): the same tensor, no node", DTensor.from_local(x, mesh, [Replicate()]).to_local() is x)
    with module_scope("maker"):
        shared = DTensor.from_local(x, mesh, [Replicate()])
    with CommDebugMode() as comm:
        sum((shared.to_local(grad_placements=[Partial()]) * (k + 1)).sum() for k in range(3)).backward()
    check(f"three Partial readers, one all-reduce {comm.get_comm_counts()}",
          comm.get_comm_counts() == ({} if t == 1 else {"all_reduce": 1}) and torch.equal(x.grad, torch.full((3,), 6.0 * t)))
    check("... attributed to from_local's module", all(rec.module == "maker" and rec.phase == "backward"
                                                       for rec in comm.records))
    # a leaf DTensor reports its gradient with the declared placement
    w = distribute_tensor(torch.randn(4, 3, requires_grad=True), mesh, [Replicate()])
    (w.to_local(grad_placements=[Partial()]) * (r + 1)).sum().backward()
    check("leaf DTensor .grad placement", w.grad is not None and w.grad.placements == (Partial(),)
          and torch.equal(w.grad.full_tensor(), torch.full((4, 3), float(t * (t + 1) // 2))))
    return check.result()



def clocked_all_reduce() -> list[tuple[str, float, float]]:
    """One Partial -> Replicate under CommDebugMode: (op, issued, returned) of each record."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if dist.get_rank() == 0:  # rank 0 comes late: the others wait inside the all-reduce
        import time
        time.sleep(0.05)
    with CommDebugMode() as comm:
        DTensor.from_local(torch.ones(4, 2), mesh, [Partial()]).redistribute(placements=[Replicate()])
    return [(r.op, r.issued, r.returned) for r in comm.records]

"""`python -m tensorplay_edu.lab.demo --transitions`: every move of the transition table on
several ranks, checked against single-process math, then a two-layer MLP built from the
table's f and f̄ operators.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..debug import CommDebugMode
from ..dtensor import DTensor
from ..launcher.torchrun import current_device
from ..mesh import init_device_mesh
from ..placement import Partial, Replicate, Shard

MOVES = [  # (source, target) on a [batch, seq, hidden] activation
    (Shard(1), Replicate()), (Partial(), Replicate()), (Partial(), Shard(1)),
    (Replicate(), Shard(2)), (Shard(1), Shard(2)), (Replicate(), Partial()),
]


def _chunk(x, dim, t, r):
    pieces = torch.chunk(x, t, dim)
    return pieces[r] if r < len(pieces) else x.narrow(dim, 0, 0)


def _err(got, want) -> float:
    """Largest error relative to the reference's largest magnitude (at least 1)."""
    got, want = got.detach().cpu(), want.detach().cpu()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1)) if want.numel() else 0.0


def _local(x, p, t, r, addends):
    return _chunk(x, p.dim, t, r) if isinstance(p, Shard) else addends[r] if isinstance(p, Partial) else x


def check_moves(shape, dtype) -> list[dict]:
    """Each move forward and backward; the error is against the single-process tensor."""
    device = current_device()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    rows = []
    for i, (src, dst) in enumerate(MOVES):
        g = torch.Generator().manual_seed(i)
        addends = [torch.randn(shape, generator=g, dtype=dtype) for _ in range(t)]
        x = sum(addends[1:], addends[0].clone()) if isinstance(src, Partial) else addends[0]
        grad = torch.randn(shape, generator=g, dtype=dtype)
        leaf = _local(x, src, t, r, addends).clone().to(device).requires_grad_(True)
        with CommDebugMode() as comm:
            out = DTensor.from_local(leaf, mesh, [src], shape=shape).redistribute(mesh, [dst])
            got = out.to_local()
            (got * _local(grad, dst, t, r, [grad] * t).to(device)).sum().backward()
        total = out.full_tensor().cpu() if not isinstance(dst, Partial) else _sum_over_ranks(got.detach()).cpu()
        rows.append({
            "move": f"{src} -> {dst}",
            "forward": ", ".join(comm.get_comm_counts("forward")) or "-",
            "backward": ", ".join(comm.get_comm_counts("backward")) or "-",
            "bytes/rank": comm.get_total_bytes(),
            "value error": _err(total, x),
            "grad error": _err(leaf.grad, _local(grad, src, t, r, [grad] * t)),
        })
    return rows


def _sum_over_ranks(x):
    return DTensor.from_local(x, init_device_mesh(x.device.type, (dist.get_world_size(),)), [Partial()]).full_tensor()


def megatron_mlp(dtype) -> dict:
    """y = relu(x @ W1) @ W2 with W1 split by columns and W2 by rows: f before, g after."""
    device = current_device()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    g = torch.Generator().manual_seed(42)
    x = torch.randn(4, 16, generator=g, dtype=dtype)  # [tokens, h]
    w1, w2 = torch.randn(16, 4 * t + 1, generator=g, dtype=dtype), torch.randn(4 * t + 1, 16, generator=g, dtype=dtype)
    ref = [v.clone().requires_grad_(True) for v in (x, w1, w2)]
    torch.relu(ref[0] @ ref[1]).matmul(ref[2]).square().sum().backward()

    xl = x.clone().to(device).requires_grad_(True)
    w1l = _chunk(w1, 1, t, r).clone().to(device).requires_grad_(True)  # [h, 4h/t]
    w2l = _chunk(w2, 0, t, r).clone().to(device).requires_grad_(True)  # [4h/t, h]
    with CommDebugMode() as comm:
        # f: identity forward, all-reduce of the partial input gradient in backward
        x_in = DTensor.from_local(xl, mesh, [Replicate()]).to_local(grad_placements=[Partial()])  # [tok, h]
        partial = torch.relu(x_in @ w1l) @ w2l  # [tok, h], this rank's addend
        # f̄: all-reduce forward, identity backward
        y = DTensor.from_local(partial, mesh, [Partial()]).redistribute(mesh, [Replicate()]).to_local()
        y.square().sum().backward()
    errors = {
        "output": _err(y, torch.relu(x @ w1) @ w2),
        "grad x": _err(xl.grad, ref[0].grad),
        "grad W1": _err(w1l.grad, _chunk(ref[1].grad, 1, t, r)),
        "grad W2": _err(w2l.grad, _chunk(ref[2].grad, 0, t, r)),
    }
    return {"errors": errors, "forward": comm.get_comm_counts("forward"), "backward": comm.get_comm_counts("backward"),
            "table": comm.table()}


def rank_main(dtype_name: str) -> dict:
    """Both checks on this rank, with every error replaced by its maximum over all ranks."""
    dtype = getattr(torch, dtype_name)
    mine = {"moves": check_moves((2, 7, 10), dtype), "mlp": megatron_mlp(dtype)}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)  # plain torch.distributed: the report's own bookkeeping
    for i, row in enumerate(mine["moves"]):
        for key in ("value error", "grad error"):
            row[key] = max(other["moves"][i][key] for other in everyone)
    for key in mine["mlp"]["errors"]:
        mine["mlp"]["errors"][key] = max(other["mlp"]["errors"][key] for other in everyone)
    return mine


def report(result: dict, world: int, dtype_name: str) -> bool:
    tol = 1e-5 if dtype_name == "float32" else 1e-12
    print(f"Transition table on {world} rank(s), a [2, 7, 10] {dtype_name} tensor (7 over {world}: uneven shards)")
    head = ["move", "forward", "backward", "bytes/rank", "value error", "grad error"]  # errors: relative
    rows = [[str(row[k]) if "error" not in k else f"{row[k]:.1e}" for k in head] for row in result["moves"]]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for line in [head, ["-" * w for w in widths], *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(line, widths)))
    mlp = result["mlp"]
    print(f"\nMegatron MLP relu(x W1) W2, W1 by columns, W2 by rows: forward {mlp['forward'] or '{}'}, "
          f"backward {mlp['backward'] or '{}'}")
    print("  largest relative error against one process: " + ", ".join(f"{k} {v:.1e}" for k, v in mlp["errors"].items()))
    print("\nCollectives of the MLP step (CommDebugMode):\n" + mlp["table"])
    worst = max([max(r["value error"], r["grad error"]) for r in result["moves"]] + list(mlp["errors"].values()))
    ok = worst <= tol
    print(f"\ncheck against single-process math: {'OK' if ok else 'FAIL'} "
          f"(largest relative error {worst:.1e}, tolerance {tol:.0e})")
    return ok

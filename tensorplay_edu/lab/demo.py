"""`make demo`: train the small Llama with tensor parallelism beside the single-device
model, and show that they stay equal.

    python -m tensorplay_edu.lab.demo                          # 4 gloo ranks, full plan, 30 steps
    python -m tensorplay_edu.lab.demo --world 2 --plan vanilla --steps 10
    python -m tensorplay_edu.lab.demo --world 4 --dp 2         # DP x TP: PyTorch's DDP over 2 TP groups of 2
    python -m tensorplay_edu.lab.demo --transitions            # the transition table, move by move
    torchrun --nproc-per-node 2 -m tensorplay_edu.lab.demo     # the same code under torchrun (NCCL on GPUs)
    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id demo \\
        -m tensorplay_edu.lab.demo --dp 2                      # on each of 2 nodes: DP across them, TP inside

Prints the largest loss difference, the collectives of one training step, each rank's
parameter bytes, and each rank's node with the TP groups (each must lie inside one node);
exits with status 1 if the parallel run leaves the single-device one.
With ``--dp D`` the ranks form a (D, world/D) mesh: the model is parallelized over
``mesh["tp"]`` and wrapped in PyTorch's ``DistributedDataParallel`` over ``mesh["dp"]``;
each DP group trains on its share of the batch and the single device on all of it.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import transitions as demo_transitions
from ..debug import CommDebugMode, ddp_comm_hook
from ..launcher.spawn import launch
from ..launcher.torchrun import current_device, run_from_env
from ..mesh import init_device_mesh, mesh_groups
from ..models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama

ARGS = ModelArgs(dim=64, n_layers=2, n_heads=8, vocab_size=256, max_seq_len=32)
TOLERANCE = {"float64": 1e-9, "float32": 1e-4}
BATCH, SEQ = 4, 32  # the fixed batch of tokens, [b, s]


def train(plan: str, steps: int, dtype_name: str, dp: int = 1) -> dict:
    """One rank: the parallel model trains on its rows of a fixed batch; rank 0 also trains the reference."""
    device, dtype = current_device(), getattr(torch, dtype_name)
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (dp, world // dp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    reference = Transformer(ARGS).to(device, dtype)
    model = parallelize_llama(copy.deepcopy(reference), mesh["tp"], plan)
    runner = model
    if dp > 1:  # PyTorch's own DDP over the replicas; the hook lets CommDebugMode see its all-reduces
        runner = DistributedDataParallel(model, process_group=mesh.get_group("dp"))
        runner.register_comm_hook(mesh.get_group("dp"), ddp_comm_hook)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, ARGS.vocab_size, (BATCH, SEQ), generator=g).to(device)  # [b, s]
    labels = tokens.roll(-1, dims=1)  # next token
    rows = slice(mesh.get_local_rank("dp") * BATCH // dp, (mesh.get_local_rank("dp") + 1) * BATCH // dp)  # [b/dp, s]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=3e-3)
    losses, ref_losses, table = [], [], ""
    for step in range(steps):
        with CommDebugMode() as comm:
            with loss_context(plan):
                loss = llama_loss(runner(tokens[rows]), labels[rows])
            loss.backward()  # (DDP: then averages the gradients over mesh["dp"])
            opt.step()
            opt.zero_grad()
        table = table or comm.table()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=mesh.get_group("dp"))  # the report's bookkeeping: the whole batch's loss
        losses.append(mean.item() / dp)
        if dist.get_rank() == 0:
            ref_loss = llama_loss(reference(tokens), labels)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            ref_losses.append(ref_loss.item())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    node = int(os.environ.get("GROUP_RANK", "0"))  # torchrun's node index (launch: one node, 0)
    everyone = [None] * world
    dist.all_gather_object(everyone, (param_bytes, node))  # plain torch.distributed: the report's bookkeeping
    return {"losses": losses, "ref_losses": ref_losses, "table": table, "param_bytes": [b for b, _ in everyone],
            "nodes": [n for _, n in everyone], "tp_groups": mesh_groups(mesh.mesh, 1),
            "ref_bytes": sum(p.numel() * p.element_size() for p in reference.parameters())}


def report(result: dict, world: int, plan: str, dtype_name: str, dp: int = 1) -> bool:
    losses, ref = result["losses"], result["ref_losses"]
    worst = max(abs(a - b) for a, b in zip(losses, ref))
    layout = f"{dp} DDP replicas x {world // dp} TP ranks" if dp > 1 else f"{world} rank(s)"
    print(f"Llama {ARGS.dim}-dim, {ARGS.n_layers} layers, vocab {ARGS.vocab_size}: {plan} plan on {layout}, "
          f"{len(losses)} AdamW steps, {dtype_name}")
    for step in sorted({0, len(losses) // 2, len(losses) - 1}):
        print(f"  step {step:3d}  loss {losses[step]:.6f}  single device {ref[step]:.6f}")
    print(f"largest loss difference: {worst:.2e}")
    print("\nCollectives of one training step (CommDebugMode, rank 0; ranks = the group it ran on):\n"
          + result["table"])
    print("\nParameter bytes: single device {:,}; per rank {}".format(
        result["ref_bytes"], ", ".join(f"{b:,}" for b in result["param_bytes"])))
    nodes, groups = result["nodes"], result["tp_groups"]
    inside = all(len({nodes[r] for r in group}) == 1 for group in groups)
    print(f"Node of each rank (torchrun's GROUP_RANK): {nodes}; TP groups {groups}: "
          f"{'each inside one node' if inside else 'SOME SPAN NODES'}")
    ok = worst <= TOLERANCE[dtype_name] and losses[-1] < losses[0]
    print(f"\ncheck against the single-device model: {'OK' if ok else 'FAIL'} "
          f"(tolerance {TOLERANCE[dtype_name]:.0e}, and the loss must fall)")
    return ok


def _rank(args) -> dict:
    if args.transitions:
        return demo_transitions.rank_main(args.dtype)
    return train(args.plan, args.steps, args.dtype, args.dp)


def _report(result, world, args) -> bool:
    if args.transitions:
        return demo_transitions.report(result, world, args.dtype)
    return report(result, world, args.plan, args.dtype, args.dp)


def _torchrun_main(args) -> None:
    result = _rank(args)
    if dist.get_rank() == 0 and not _report(result, dist.get_world_size(), args):
        raise SystemExit(1)


def _positive(text: str) -> int:
    """argparse type: a whole number >= 1 (else a one-line usage error, exit code 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=_positive, default=4, help="number of ranks (default 4; torchrun sets its own)")
    parser.add_argument("--plan", choices=["full", "vanilla"], default="full")
    parser.add_argument("--steps", type=_positive, default=30)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    parser.add_argument("--dp", type=_positive, default=1, help="data-parallel degree: DDP over dp groups of "
                        "world/dp TP ranks (default 1: TP only)")
    parser.add_argument("--transitions", action="store_true", help="check the transition table move by move instead")
    args = parser.parse_args(argv)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if torchrun else args.world
    if world % args.dp:
        parser.error(f"--dp {args.dp} must divide --world {world}")
    if not args.transitions and ARGS.n_heads % (world // args.dp):
        parser.error(f"--world {world} --dp {args.dp}: the TP degree world/dp = {world // args.dp} must divide "
                     f"the model's {ARGS.n_heads} heads (each rank holds whole heads): e.g. --world 4 (--dp 2)")
    if not args.transitions and BATCH % args.dp:
        parser.error(f"--dp {args.dp} must divide the batch of {BATCH} sequences (each DDP replica trains on an "
                     "equal share): e.g. --dp 2")
    if torchrun:
        run_from_env(_torchrun_main, args)
    results = launch(_rank, args.world, args)
    return 0 if _report(results[0], args.world, args) else 1


if __name__ == "__main__":
    sys.exit(main())

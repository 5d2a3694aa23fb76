"""Rank code for sharded checkpoints with torch.distributed.checkpoint (DCP): save at one
layout (TP, DDP x TP, FSDP2 x TP), load at another, bit for bit; then keep training and
stay equal to one process trained all along."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from checks import Checker, chunk
from tensorplay_edu import init_device_mesh
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
from tensorplay_edu.parallel import bucket_partial_grads, full_state_dict, param_layout
from tensorplay_edu.parallel.params import as_dtensor

# one model for every TP degree 1-4: 12 heads; vocabulary 50 and FFN hidden 128 uneven at 3 and 4
ARGS = ModelArgs(dim=48, n_layers=2, n_heads=12, vocab_size=50, max_seq_len=16)
TOL = dict(rtol=1e-9, atol=1e-10)


def _tokens(step: int) -> torch.Tensor:
    return torch.randint(0, ARGS.vocab_size, (4, 12), generator=torch.Generator().manual_seed(100 + step))


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def build(plan: str, dp: int = 1, wrap: str | None = None, seed: int = 0, bucket: bool = False):
    """(what is called, the model, the optimizer, dp rank) on a TP or (dp, tp) mesh; ``bucket``: the
    norms' partial gradients in one bucket, made whole by the optimizer's step."""
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "tp")) if dp > 1 else \
        init_device_mesh("cpu", (world,))
    torch.manual_seed(seed)
    model = parallelize_llama(Transformer(ARGS).double(), mesh["tp"] if dp > 1 else mesh, plan)
    runner = model
    if wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        runner = DistributedDataParallel(model, process_group=mesh.get_group("dp"))
    elif wrap == "fsdp2":
        from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh
        from torch.distributed.fsdp import fully_shard
        dp_mesh = TorchDeviceMesh.from_group(mesh.get_group("dp"), "cpu")
        for block in model.layers.values():
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
        # attach_layouts(model) left out on purpose: DCP and full_state_dict read the modules' layouts
    opt = _adamw(runner.parameters())
    if bucket:
        bucket_partial_grads(model, opt)
    return runner, model, opt, (mesh.get_local_rank("dp") if dp > 1 else 0)


def train(runner, opt, plan: str, steps: range, dp: int = 1, dp_rank: int = 0) -> None:
    for step in steps:
        tokens = _tokens(step)
        mine = chunk(tokens, 0, dp, dp_rank) if dp > 1 else tokens
        with loss_context(plan):
            loss = llama_loss(runner(mine), mine.roll(-1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad()


def reference(steps: int) -> Transformer:
    """One process, the whole batch, all along."""
    torch.manual_seed(0)
    ref = Transformer(ARGS).double()
    train(ref, _adamw(ref.parameters()), "vanilla", range(steps))
    return ref


def full_optimizer_state(model, opt) -> dict:
    """Every parameter's AdamW state as single-device tensors (lists), by parameter name."""
    out = {}
    for name, p in model.named_parameters():
        for key, value in opt.state[p].items():
            if hasattr(value, "full_tensor"):  # FSDP2: its shard over dp first
                value = value.full_tensor()
            if value.ndim and param_layout(p) is not None:
                value = as_dtensor(p, value).full_tensor()
            out[f"{name}.{key}"] = value.tolist()
    return out


def snapshot(model, opt) -> dict:
    return {"model": {k: v.tolist() for k, v in full_state_dict(model).items()},
            "optim": full_optimizer_state(model, opt)}


def save(path: str, plan: str, dp: int = 1, wrap: str | None = None, steps: int = 2, bucket: bool = False) -> dict:
    """Train, save model and optimizer with DCP; rank 0 returns the single-device view of both."""
    from tensorplay_edu.parallel.checkpoint import get_state_dict

    runner, model, opt, dp_rank = build(plan, dp, wrap, bucket=bucket)
    train(runner, opt, plan, range(steps), dp, dp_rank)
    model_sd, optim_sd = get_state_dict(runner, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    view = snapshot(model, opt)
    return view if dist.get_rank() == 0 else {}


def resume(path: str, saved: dict, plan: str, dp: int = 1, wrap: str | None = None, steps: int = 2,
           more: int = 2, bucket: bool = False) -> tuple[list[str], int]:
    """A fresh model (another seed) at this layout loads the checkpoint: exactly what was saved;
    ``more`` steps later it still equals one process trained ``steps + more`` steps."""
    from tensorplay_edu.parallel.checkpoint import get_state_dict, set_state_dict

    runner, model, opt, dp_rank = build(plan, dp, wrap, seed=1, bucket=bucket)
    check = Checker()
    model_sd, optim_sd = get_state_dict(runner, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(runner, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    now = snapshot(model, opt)
    for part in ("model", "optim"):
        check(f"{part}: the same keys", now[part].keys() == saved[part].keys())
        for key in now[part].keys() & saved[part].keys():
            check(f"{part} {key} restored bit for bit", now[part][key] == saved[part][key])
    train(runner, opt, plan, range(steps, steps + more), dp, dp_rank)
    ref, got = reference(steps + more), full_state_dict(model)
    for key, want in ref.state_dict().items():
        check(f"{key} {more} steps after resuming", torch.allclose(got[key], want, **TOL))
    return check.result()


def save_plain(path: str, plan: str) -> dict:
    """What a user writes first: dcp.save(model.state_dict())."""
    runner, model, opt, _ = build(plan)
    train(runner, opt, plan, range(1))
    dcp.save(model.state_dict(), checkpoint_id=path)
    full = {k: v.tolist() for k, v in full_state_dict(model).items()}  # a collective: every rank
    return full if dist.get_rank() == 0 else {}


def load_plain(path: str, saved: dict, plan: str) -> tuple[list[str], int]:
    """... and sd = model.state_dict(); dcp.load(sd); model.load_state_dict(sd)."""
    _, model, _, _ = build(plan, seed=1)
    check = Checker()
    sd = model.state_dict()
    dcp.load(sd, checkpoint_id=path)
    model.load_state_dict(sd)
    got = full_state_dict(model)
    check("the same keys", got.keys() == saved.keys())
    for key in saved:
        check(f"{key} restored bit for bit", got[key].tolist() == saved[key])
    # each rank wrote only its own part: t chunks of each split parameter, none whole
    meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    wq = meta["layers.0.attention.wq.weight"]
    check(f"wq written as pieces: {[list(c.sizes) for c in wq.chunks]}",
          len(wq.chunks) > 1 and all(list(c.sizes) != list(wq.size) for c in wq.chunks))
    return check.result()

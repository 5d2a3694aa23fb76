"""Rank code for GPU-readiness checked on the CPU: host synchronisations in a training step,
the meta-device recipe, parameters replaced after parallelization, process-group backends."""

from __future__ import annotations

import copy
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from checks import chunk
from tensorplay_edu import init_device_mesh
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
from tensorplay_edu.parallel import load_full_state_dict, param_layout

# Ops that copy a value from the device to the host: on a GPU each one waits for every queued kernel.
SYNCS = ("aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.equal")
ARGS = ModelArgs(dim=48, n_layers=2, n_heads=12, vocab_size=50, max_seq_len=24)


class CountOps(TorchDispatchMode):
    """Every aten op that runs while it is active, by name."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1  # e.g. "aten._local_scalar_dense"
        return func(*args, **(kwargs or {}))


def host_syncs(plan: str) -> dict[str, int]:
    """The host synchronisations of one training step (forward, loss, backward) under ``plan``."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = parallelize_llama(Transformer(ARGS), mesh, plan)
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    with CountOps() as seen:
        with loss_context(plan):
            loss = llama_loss(model(tokens), tokens.roll(-1, 1))
        loss.backward()
    return {op: n for op, n in seen.ops.items() if op in SYNCS} | {"ops": sum(seen.ops.values())}


def _meta_recipe(ref: nn.Module, mesh, plan: str) -> nn.Module:
    """torchtitan's recipe: build on meta, parallelize, to_empty, init_weights, load the checkpoint."""
    with torch.device("meta"):
        model = Transformer(ARGS).to(ref.norm.weight.dtype)
    parallelize_llama(model, mesh, plan)  # no communication: meta tensors have shapes only
    model.to_empty(device="cpu")  # new Parameter objects: the layouts and hooks must still be there
    model.init_weights()
    load_full_state_dict(model, ref.state_dict())
    return model


def _assign(ref: nn.Module, mesh, plan: str) -> nn.Module:
    """Parallelize, then replace every parameter by load_state_dict(assign=True) of its own values."""
    model = parallelize_llama(copy.deepcopy(ref), mesh, plan)
    model.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()}, assign=True)
    return model


def _float32_then_double(ref: nn.Module, mesh, plan: str) -> nn.Module:
    """Parallelize a float32 copy (its weights are float32 values), then .double(): the layouts stay."""
    model = parallelize_llama(copy.deepcopy(ref).float(), mesh, plan).double()
    model.rope_cos, model.rope_sin = ref.rope_cos.clone(), ref.rope_sin.clone()  # float64 tables, as the reference
    return model


def replaced_parameters(plan: str, how: str) -> tuple[list[str], int]:
    """The model made one of these ways trains like one device (float64)."""
    from rank_parallel import run_llama_with

    make = {"meta": _meta_recipe, "assign": _assign, "to": _float32_then_double}[how]
    return run_llama_with(None, build_parallel=lambda ref, mesh: make(ref, mesh, plan),
                          loss_plan=plan, label=f"{how} {plan}")


def meta_costs_nothing(plan: str) -> dict:
    """Parallelizing a meta model: no collective, meta local pieces of the right shapes."""
    from tensorplay_edu import CommDebugMode

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with torch.device("meta"):
        model = Transformer(ARGS)
    with CommDebugMode() as comm:
        parallelize_llama(model, mesh, plan)
    shapes_ok = all(p.is_meta and (param_layout(p) is None or list(p.shape) == _local(param_layout(p), mesh))
                    for p in model.parameters())
    return {"collectives": comm.get_total_counts(), "meta_and_local": shapes_ok}


def _local(layout, mesh) -> list[int]:
    full = torch.empty(layout.shape, device="meta")
    return list(chunk(full, layout.placements[0].dim, mesh.size(), mesh.get_local_rank()).shape) \
        if layout.placements[0].is_shard() else list(layout.shape)


def backend_facts() -> dict:
    """What the default group and current_device say inside a launched gloo rank."""
    from tensorplay_edu.launcher.torchrun import backends, current_device

    return {"backends": backends(), "device": str(current_device())}

"""Rank code for float8 tensorwise tensor parallelism (tensorplay_edu.float8): against the
single-device model converted the same way, against high precision, and every collective."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from rank_parallel import train_compare
from tensorplay_edu import CommDebugMode, DTensor, init_device_mesh
from tensorplay_edu.float8 import convert_to_float8_training
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama

ARGS = ModelArgs(dim=48, n_layers=2, n_heads=12, vocab_size=50, max_seq_len=24)


def torchtitan_filter(module, fqn: str) -> bool:
    return fqn != "output"  # the output layer stays in high precision, as torchtitan does


def float8_llama(args: ModelArgs = ARGS) -> Transformer:
    return convert_to_float8_training(Transformer(args), module_filter_fn=torchtitan_filter)


def _loss_of(plan, labels):
    def loss_of(logits):
        with loss_context(plan if isinstance(logits, DTensor) else "vanilla"):
            return llama_loss(logits, labels)
    return loss_of


def against_one_device(plan: str, dtype_name: str, apply=None) -> tuple[list[str], int]:
    """The float8 TP model against the same float8 model on one process (the casts are the same).

    SGD and AdamW in float64; SGD only in float32, where TP and one device sum in other orders.  AdamW
    divides each gradient element by its own running size, so a near-zero element that differs by less
    than the gradient check's atol (and float8 casts turn order differences into more than rounding)
    moves its weight by a good part of lr: after 3 steps 2e-5 to 2e-4 on this machine's CPUs, an artefact
    of the optimizer's conditioning, not of the parallelism.  In float64 the orders differ by ~1e-16 and
    AdamW's weights are compared at rtol 1e-9."""
    labels = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(5))
    parallelize = apply or (lambda m, mesh: parallelize_llama(m, mesh, plan, float8=True))
    return train_compare(f"float8 {plan}", float8_llama, parallelize,
                         lambda g, dt: torch.randint(0, 50, (2, 12), generator=g), loss_of=_loss_of(plan, labels),
                         dtype=getattr(torch, dtype_name), input_grad=False,
                         optimizers=("sgd", "adamw") if dtype_name == "float64" else ("sgd",))


def seed_float8(source: str | None) -> tuple[list[str], int]:
    """torchtitan's apply_tp with enable_float8_tensorwise_tp=True (its float8 import pointed here)."""
    from rank_parallelize_module import seed_apply_tp

    return against_one_device("vanilla", "float64", apply=seed_apply_tp(source, float8=True))


def against_high_precision(plan: str, steps: int = 30) -> dict:
    """Losses of the float8 TP model and of the high-precision single-device model, step by step."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    ref = Transformer(ARGS)
    model = parallelize_llama(convert_to_float8_training(copy.deepcopy(ref), module_filter_fn=torchtitan_filter),
                              mesh, plan, float8=True)
    tokens = torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(1))
    labels = tokens.roll(-1, 1)
    losses = {"float8 tp": [], "high precision": []}
    for name, m in (("float8 tp", model), ("high precision", ref)):
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        for _ in range(steps):
            loss = _loss_of(plan, labels)(m(tokens))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[name].append(loss.item())
    return losses


def step_records(plan: str, float8: bool, dtype_name: str = "float32") -> list[tuple]:
    """(phase, op, dtype, shape, bytes) of every collective of one training step."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = float8_llama() if float8 else Transformer(ARGS)
    parallelize_llama(model.to(getattr(torch, dtype_name)), mesh, plan, float8=float8)
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    with CommDebugMode() as comm:
        with loss_context(plan):
            loss = llama_loss(model(tokens), tokens)
        loss.backward()
    return [(r.phase, r.op, r.dtype, r.shape, r.bytes, r.module) for r in comm.records]



def float8_collectives() -> dict:
    """An uneven float8 all-gather is bit-exact; a float8 all-reduce is refused."""
    from tensorplay_edu import Partial, Replicate, Shard
    from tensorplay_edu.float8.scaling import E5M2

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    full = (torch.randn(7, 5, generator=torch.Generator().manual_seed(0)) * 1000).to(E5M2)  # 7 rows over 3: 3, 3, 1
    mine = full.chunk(mesh.size())[mesh.get_local_rank()]
    gathered = DTensor.from_local(mine, mesh, [Shard(0)], shape=full.shape).full_tensor()
    try:
        DTensor.from_local(mine, mesh, [Partial()]).redistribute(mesh, [Replicate()])
        refused = False
    except TypeError as err:
        refused = "never summed" in str(err)
    return {"gathered": torch.equal(gathered.view(torch.uint8), full.view(torch.uint8)), "sum refused": refused}

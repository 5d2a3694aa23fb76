"""Rank code for tests/test_from_scratch.py, training from scratch: initialization equal to one device (the meta-device
recipe, reset_parameters, torch.nn.init on pieces and DTensors) and tied weights."""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from checks import Checker, chunk, init_like_one_process
from tensorplay_edu import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
from tensorplay_edu.models import ModelArgs, Transformer, parallelize_llama
from tensorplay_edu.parallel import ColwiseParallel, RowwiseParallel, full_state_dict, parallelize_module


def _args(t: int) -> ModelArgs:
    """12 heads fit 1-4 ranks; vocabulary 50 and FFN hidden 128 are uneven at 3 and 4 ranks."""
    return ModelArgs(dim=48, n_layers=2, n_heads=12, n_kv_heads=6 if t != 4 else 4, vocab_size=50, max_seq_len=16)


def _meta_llama(args: ModelArgs, dtype, mesh, plan: str) -> Transformer:
    """torchtitan's recipe: build on meta, parallelize (nothing moves), to_empty."""
    with torch.device("meta"):
        model = Transformer(args).to(dtype)
    parallelize_llama(model, mesh, plan)
    return model.to_empty(device="cpu")


def llama_init(plan: str, dtype_name: str) -> tuple[list[str], int]:
    """model.init_weights() under a seed: every rank holds exactly its piece of the single-device
    model initialised with that seed, and the generator ends where the single device's does."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    dtype, args, check = getattr(torch, dtype_name), _args(mesh.size()), Checker()
    model = _meta_llama(args, dtype, mesh, plan)
    init_like_one_process(check, model, lambda: Transformer(args).to(dtype), f"{plan} {dtype_name} init ")
    wq = model.layers["0"].attention.wq.weight.detach()
    pieces = [torch.empty_like(wq) for _ in range(mesh.size())]
    dist.all_gather(pieces, wq)
    check("ranks hold different heads", mesh.size() == 1 or not torch.equal(pieces[0], pieces[1]))
    return check.result()


def fsdp2_llama_init(plan: str) -> tuple[list[str], int]:
    """torchtitan's order with FSDP2 on a (dp 2, tp 2) mesh: meta, TP plan, fully_shard, to_empty,
    init_weights: each rank's FSDP2 shard of its TP piece is the single-device init's."""
    from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("dp", "tp"))
    args, check = _args(mesh.size("tp")), Checker()
    with torch.device("meta"):
        model = Transformer(args)
    parallelize_llama(model, mesh["tp"], plan)
    dp_mesh = TorchDeviceMesh.from_group(mesh.get_group("dp"), "cpu")
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    model.to_empty(device="cpu")
    torch.manual_seed(3)
    model.init_weights()
    got = full_state_dict(model)
    ref = Transformer(args)
    torch.manual_seed(3)
    ref.init_weights()
    for name, want in ref.state_dict().items():
        check.equal(f"FSDP2 x TP {plan} init {name}", got[name], want)
    return check.result()


def torchtitan_style_init(dtype_name: str) -> tuple[list[str], int]:
    """torchtitan's init_weights calls torch.nn.init on the weights directly: trunc_normal_, normal_,
    and fan-based initialisers (the fan-in of a row-split weight is the whole one)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    dtype, args, check = getattr(torch, dtype_name), _args(mesh.size()), Checker()

    def init(m: Transformer):
        nn.init.normal_(m.tok_embeddings.weight)
        for block in m.layers.values():
            for lin in (block.attention.wq, block.attention.wk, block.attention.wv):
                nn.init.trunc_normal_(lin.weight, mean=0.0, std=0.02)
            nn.init.xavier_uniform_(block.attention.wo.weight)
            nn.init.kaiming_normal_(block.feed_forward.w1.weight)
            nn.init.kaiming_uniform_(block.feed_forward.w2.weight, a=math.sqrt(5))  # fan-in of a row-split weight
            nn.init.uniform_(tensor=block.feed_forward.w3.weight, a=-0.1, b=0.1)
            nn.init.ones_(block.attention_norm.weight)
        nn.init.trunc_normal_(m.output.weight, std=0.5, a=-1.0, b=1.0)

    for plan in ("vanilla", "full"):
        model = _meta_llama(args, dtype, mesh, plan)
        torch.manual_seed(99)
        init(model)
        ref = Transformer(args).to(dtype)
        torch.manual_seed(99)
        init(ref)
        got = full_state_dict(model)
        for name in ("tok_embeddings.weight", "output.weight", "layers.0.attention.wq.weight",
                     "layers.1.attention.wo.weight", "layers.0.feed_forward.w1.weight",
                     "layers.1.feed_forward.w2.weight", "layers.0.feed_forward.w3.weight"):
            check.equal(f"{plan} nn.init {name}", got[name], ref.state_dict()[name])
    return check.result()


MODULES = [  # (label, build, style): each module's own reset_parameters, parallelized
    ("Linear colwise", lambda: nn.Linear(10, 7), ColwiseParallel()),
    ("Linear rowwise", lambda: nn.Linear(10, 7), RowwiseParallel()),  # the bias bound uses the whole fan-in
    ("Linear rowwise no bias", lambda: nn.Linear(7, 10, bias=False), RowwiseParallel()),
    ("Embedding rowwise padding_idx", lambda: nn.Embedding(10, 6, padding_idx=7), RowwiseParallel(input_layouts=Replicate())),
    ("Embedding colwise padding_idx", lambda: nn.Embedding(10, 6, padding_idx=2), ColwiseParallel()),
]


def modules_reset(dtype_name: str) -> tuple[list[str], int]:
    """Any module whose reset_parameters uses torch.nn.init: built on meta, parallelized, to_empty,
    reset_parameters under a seed == the single-device module reset under that seed."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    dtype, check = getattr(torch, dtype_name), Checker()
    for label, build, style in MODULES:
        with torch.device("meta"):
            module = build().to(dtype)
        parallelize_module(module, mesh, copy.deepcopy(style)).to_empty(device="cpu")
        torch.manual_seed(5)
        module.reset_parameters()
        ref = build().to(dtype)
        torch.manual_seed(5)
        ref.reset_parameters()
        got = full_state_dict(module)
        for name, want in ref.state_dict().items():
            check.equal(f"{label} {name}", got[name], want)
    return check.result()


def distributed_meta_tensor() -> tuple[list[str], int]:
    """distribute_tensor of a meta tensor: shapes only; torch.empty_like makes it real and
    torch.nn.init fills it as one device would."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checker()
    for placement in (Shard(0), Shard(1), Replicate()):
        d = distribute_tensor(torch.empty(10, 7, device="meta"), mesh, [placement])
        check(f"{placement} stays on meta", d.to_local().is_meta)
        d = torch.empty_like(d, device="cpu")
        check(f"{placement} empty_like is a real DTensor", isinstance(d, DTensor) and not d.to_local().is_meta)
        for fn, kwargs in ((nn.init.normal_, dict(std=0.3)), (nn.init.xavier_uniform_, {}), (nn.init.orthogonal_, {})):
            torch.manual_seed(3)
            fn(d, **kwargs)
            want = torch.empty(10, 7)
            torch.manual_seed(3)
            fn(want, **kwargs)
            check.equal(f"{placement} {fn.__name__}", d.full_tensor(), want)
            if isinstance(placement, Shard):
                check.equal(f"{placement} {fn.__name__} piece", d.to_local(),
                            chunk(want, placement.dim, mesh.size(), mesh.get_local_rank()))
    return check.result()


class _LargestTensor(TorchDispatchMode):
    """The largest tensor any aten op creates inside (the init's peak, one tensor at a time)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def init_memory() -> tuple[list[str], int]:
    """No tensor bigger than the largest parameter is made while the model initialises."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, check = _meta_llama(_args(mesh.size()), torch.float32, mesh, "full"), Checker()
    biggest = max(math.prod(layout.shape) for m in model.modules() for layout in getattr(m, "_tp_layouts", {}).values())
    with _LargestTensor() as seen:
        model.init_weights()
    check(f"largest tensor {seen.largest} elements > largest parameter {biggest}", seen.largest <= biggest)
    check("and the whole parameter was drawn", seen.largest == biggest or mesh.size() == 1)
    return check.result()


def meta_llama_trains(plan: str, bucket: bool) -> tuple[list[str], int]:
    """Built on meta, parallelized, to_empty, init_weights() under a seed (torchtitan's recipe), then
    trained (SGD and AdamW; ``bucket``: the norms' gradients in one bucket per step) against one device
    initialised the same way."""
    from rank_parallel import run_llama_with

    args = _args(dist.get_world_size())

    def build():  # one device: the same recipe without a mesh
        with torch.device("meta"):
            model = Transformer(args)
        model.to_empty(device="cpu")
        torch.manual_seed(1234)
        model.init_weights()
        return model

    def build_parallel(ref, mesh):  # float32 like build(), then float64 like train_compare's reference
        model = _meta_llama(args, torch.float32, mesh, plan)
        torch.manual_seed(1234)
        model.init_weights()
        return model.to(next(ref.parameters()).dtype)

    return run_llama_with(None, build_parallel=build_parallel, loss_plan=plan, build=build, bucket=bucket,
                          label=f"meta recipe {plan} bucket={bucket}")


# ---- tied weights ----------------------------------------------------------------------------

def tied(args: ModelArgs):
    def build():
        model = Transformer(args)
        model.output.weight = model.tok_embeddings.weight  # GPT-2 style: one [vocab, dim] matrix
        return model
    return build


def tied_llama(plan: str, bucket: bool = False) -> tuple[list[str], int]:
    """The tie survives both plans: one Parameter, its gradient the sum of both uses; AdamW steps
    equal one device's (train_compare); ``bucket``: the norms' gradients in one bucket per step."""
    from rank_parallel import run_llama_with

    facts = Checker()

    def build_parallel(ref, mesh):
        model = parallelize_llama(copy.deepcopy(ref), mesh, plan)
        facts("one Parameter object", model.output.weight is model.tok_embeddings.weight)
        facts("as many parameters as one device",
              len(list(model.parameters())) == len(list(ref.parameters())) == 2 + 9 * ref.args.n_layers)
        return model

    fails, n = run_llama_with(None, build_parallel=build_parallel, loss_plan=plan, label=f"tied {plan} bucket={bucket}",
                              build=tied(_args(dist.get_world_size())), bucket=bucket)
    return fails + facts.fails, n + facts.n


def _in_separate_calls(model, mesh, retie: bool):
    """PyTorch's test_transformer_training(weight_tying=True): the embedding and the blocks in one call,
    ``output`` in a second one, then the tie made again by hand."""
    parallelize_module(model, mesh, {"tok_embeddings": RowwiseParallel(input_layouts=Replicate())})
    for block in model.layers.values():
        parallelize_module(block, mesh, {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                                         "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                                         "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                                         "feed_forward.w2": RowwiseParallel()})
    parallelize_module(model.output, mesh, ColwiseParallel(output_layouts=Replicate()))
    if retie:
        model.output.weight = model.tok_embeddings.weight
    return model


def tied_in_separate_calls() -> tuple[list[str], int]:
    """Tied again by hand after separate calls: trains like one device; not tied again: the first
    forward says so (before issue 29 the first call refused the tie with one use left out)."""
    from rank_parallel import run_llama_with

    facts = Checker()
    args = _args(dist.get_world_size())
    fails, n = run_llama_with(None, build_parallel=lambda ref, mesh: _in_separate_calls(copy.deepcopy(ref), mesh, True),
                              label="tied in separate calls", build=tied(args))
    model = _in_separate_calls(tied(args)(), init_device_mesh("cpu", (dist.get_world_size(),)), retie=False)
    try:
        model(torch.zeros(1, 4, dtype=torch.long))
        facts("a tie left undone is an error at the first forward", False)
    except ValueError as e:
        facts(f"the error names both uses and the fix: {e}", all(w in str(e) for w in (
            "'tok_embeddings.weight'", "'output.weight'", "output.weight = tok_embeddings.weight")))
    return fails + facts.fails, n + facts.n


def tied_embedding_and_linear() -> tuple[list[str], int]:
    """PyTorch's test_weight_tying: a colwise Embedding [16, 8] (Shard(1)) and a rowwise Linear(8, 16)
    (weight [16, 8], Shard(1)) share one weight; their gradients add up."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checker()
    torch.manual_seed(0)
    ref = nn.ModuleDict({"emb": nn.Embedding(16, 8), "fc": nn.Linear(8, 16)}).double()
    ref.fc.weight = ref.emb.weight
    model = parallelize_module(copy.deepcopy(ref), mesh, {"emb": ColwiseParallel(), "fc": RowwiseParallel()})
    check("tied after parallelize", model.fc.weight is model.emb.weight)
    ids = torch.randint(0, 16, (5,), generator=torch.Generator().manual_seed(1))
    for m in (ref, model):
        m.fc(m.emb(ids)).pow(2).sum().backward()
    want = chunk(ref.emb.weight.grad, 1, mesh.size(), mesh.get_local_rank())
    check("the gradient is the sum of both uses", torch.allclose(model.emb.weight.grad, want, rtol=1e-12, atol=1e-12))
    return check.result()

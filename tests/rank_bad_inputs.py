"""Rank code for the catalogue of bad inputs (tests/test_bad_inputs.py), run on 2 ranks.

Each case is a function of a fresh context that must raise; ``run_all`` calls every case on
every rank and returns ``{name: (exception type name, message)}`` (``None`` if it did not
raise), so the test can check type and wording case by case."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tensorplay_edu import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, parallelize_llama
from tensorplay_edu.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput, RowwiseParallel,
                                     SequenceParallel, full_state_dict, load_full_state_dict, loss_parallel,
                                     param_layout, parallelize_module)

ARGS = ModelArgs(dim=16, n_layers=1, n_heads=4, vocab_size=20, max_seq_len=16)


def _llama(plan="full"):
    torch.manual_seed(0)
    return parallelize_llama(Transformer(ARGS), _mesh(), plan)


def _mesh():
    return init_device_mesh("cpu", (dist.get_world_size(),))


def _trained_llama():
    model = _llama("vanilla")
    tokens = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(1))
    F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    return model


def _bad_state(key, value):
    model = _llama()
    state = full_state_dict(model)
    state[key] = value(state[key])
    return lambda: load_full_state_dict(model, state)


def _twice(first, second, module=None):
    module = module if module is not None else nn.Linear(4, 4)
    parallelize_module(module, _mesh(), first)
    return lambda: parallelize_module(module, _mesh(), second)


def _pmi():
    return PrepareModuleInput(input_layouts=Shard(0), desired_input_layouts=Replicate())


def _pmo():
    return PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0))


def _dt(placements=(Shard(1),)):
    return DTensor.from_local(torch.randn(3, 4), _mesh(), list(placements))


def _logits():
    return DTensor.from_local(torch.randn(6, 5), _mesh(), [Shard(1)])


def _float8_styles():
    from tensorplay_edu.float8 import float8_tensor_parallel

    return float8_tensor_parallel


def _ring_input():
    from tensorplay_edu.async_tp import RingInput

    return RingInput(torch.ones(1, 2, 4), _mesh(), 1, [2] * dist.get_world_size(), [nn.Linear(4, 4)], "owner")


def _in_loss_parallel(fn):
    def run():
        with loss_parallel():
            fn()
    return run


def _tied(plan, forward: bool = False):
    """A GPT-2 style tie between the embedding and the output layer, parallelized by ``plan``
    (``forward``: then called, where a tie that a plan left in part is checked)."""
    model = Transformer(ARGS)
    model.output.weight = model.tok_embeddings.weight
    if forward:
        return lambda: parallelize_module(model, _mesh(), plan)(torch.zeros(1, 4, dtype=torch.long))
    return lambda: parallelize_module(model, _mesh(), plan)


def _rank_sized(shape_of_rank):
    """A tensor whose shape differs on rank 1 (a rank that built another model)."""
    return torch.ones(shape_of_rank(dist.get_rank()))


def _foreign_piece():
    """A state dict whose wq entry is the other rank's part (from another layout)."""
    from tensorplay_edu.parallel.checkpoint import Piece

    model = _llama("vanilla")
    sd = model.state_dict()
    wq = sd["layers.0.attention.wq.weight"]
    other = 0 if wq.offsets[0] else wq.shape[0] - wq.local.shape[0]
    sd["layers.0.attention.wq.weight"] = Piece(wq.local, wq.shape, (other, 0))
    return lambda: model.load_state_dict(sd)


def _torch_optimizer_state():
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    model = _trained_llama()
    opt = torch.optim.AdamW(model.parameters())
    return lambda: get_optimizer_state_dict(model, opt)


def _fsdp2_without_attach_layouts():
    """FSDP2 over a (1, 2) mesh's dp dimension of a TP model, attach_layouts skipped."""
    from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh
    from torch.distributed.fsdp import fully_shard

    from tensorplay_edu.parallel import clip_grad_norm_

    mesh = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = parallelize_llama(Transformer(ARGS), mesh["tp"], "vanilla")
    fully_shard(model, mesh=TorchDeviceMesh.from_group(mesh.get_group("dp"), "cpu"))
    tokens = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(1))
    F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    return lambda: clip_grad_norm_(model.parameters(), 1.0)


# name: (what builds the failing call, the exception type, fragments its message must hold)
CASES = {
    # training from scratch, saving, resuming (issue 17)
    "distribute_tensor with different shapes on different ranks": (
        lambda: lambda: distribute_tensor(_rank_sized(lambda r: (4, 3 + r)), _mesh(), [Shard(0)]), ValueError,
        ["distribute_tensor", "[4, 3]", "[4, 4]", "global shape"]),
    "distribute_tensor with different dtypes on different ranks": (
        lambda: lambda: distribute_tensor(torch.ones(4, dtype=torch.float64 if dist.get_rank() else torch.float32),
                                          _mesh(), [Replicate()]), ValueError, ["torch.float32", "torch.float64"]),
    "parallelize_module of models that differ between ranks": (
        lambda: lambda: parallelize_module(nn.Sequential(nn.Linear(4, 4 + dist.get_rank())), _mesh(),
                                           {"0": ColwiseParallel()}), ValueError,
        ["parallelize_module", "'0.weight'", "[4, 4]", "[5, 4]", "same model"]),
    "a tie the plan would cut two ways": (
        lambda: _tied({"tok_embeddings": ColwiseParallel(), "output": ColwiseParallel()}), ValueError,
        ["'tok_embeddings.weight'", "'output.weight'", "Shard(dim=1)", "Shard(dim=0)", "RowwiseParallel"]),
    "a tie with one use left out of the plan, not tied again by the first forward": (
        lambda: _tied({"output": ColwiseParallel()}, forward=True), ValueError,
        ["'tok_embeddings.weight' left whole", "'output.weight'", "untie", "output.weight = tok_embeddings.weight"]),
    "load_state_dict of another layout's piece": (
        _foreign_piece, ValueError, ["'layers.0.attention.wq.weight'", "another layout", "torch.distributed.checkpoint"]),
    "torch's get_optimizer_state_dict on a TP model": (
        _torch_optimizer_state, RuntimeError,
        ["get_optimizer_state_dict", "tensorplay_edu.parallel.checkpoint.get_optimizer_state_dict"]),
    "torch get_total_norm of sharded gradients": (
        lambda: (lambda m: lambda: torch.nn.utils.get_total_norm([p.grad for p in m.parameters()]))(_trained_llama()),
        RuntimeError, ["get_total_norm", "sharded over several ranks", "clip_grad_norm_"]),
    "clip_grad_norm_ under FSDP2 without attach_layouts": (
        _fsdp2_without_attach_layouts, RuntimeError, ["attach_layouts(model)", "FSDP2", "fully_shard"]),
    # the edges of float8 and async TP (issue 18): at construction or at the call, not later
    "RowwiseParallel input_layouts a string": (
        lambda: lambda: RowwiseParallel(input_layouts="shard"), TypeError,
        ["RowwiseParallel(input_layouts=...)", "'shard'", "Shard(-1)"]),
    "ColwiseParallel output_layouts a tuple": (
        lambda: lambda: ColwiseParallel(output_layouts=(Shard(0), Shard(1))), TypeError,
        ["ColwiseParallel(output_layouts=...)", "tuple of 2", "one Placement"]),
    "distribute_tensor placements of the wrong type": (
        lambda: lambda: distribute_tensor(torch.ones(4), _mesh(), ["S"]), TypeError, ["'S'", "str", "Shard(dim)"]),
    "distribute_tensor of a list": (
        lambda: lambda: distribute_tensor([1.0, 2.0], _mesh(), [Shard(0)]), TypeError,
        ["distribute_tensor", "list", "torch.tensor"]),
    "cross_entropy of a DTensor outside loss_parallel": (
        lambda: lambda: F.cross_entropy(_logits(), torch.zeros(6, dtype=torch.long)), NotImplementedError,
        ["loss_parallel()", ".to_local()", "wrong loss", ".full_tensor()"]),

    # training loops (issue 8)
    "torch clip_grad_norm_ on sharded parameters": (
        lambda: lambda: torch.nn.utils.clip_grad_norm_(_trained_llama().parameters(), 1.0),
        RuntimeError, ["clip_grad_norm_", "tensorplay_edu.parallel.clip_grad_norm_"]),
    "load_full_state_dict broadcastable wrong shape": (
        lambda: _bad_state("norm.weight", lambda v: v[:1]), ValueError, ["'norm.weight'", "[1]", "[16]"]),
    "load_full_state_dict [V, 1] output weight": (
        lambda: _bad_state("output.weight", lambda v: v[:, :1]), ValueError, ["'output.weight'", "[20, 1]"]),
    "load_full_state_dict non-broadcastable shape": (
        lambda: _bad_state("layers.0.attention.wq.weight", lambda v: v[:3, :5]), ValueError,
        ["'layers.0.attention.wq.weight'", "[3, 5]"]),
    "load_full_state_dict wrong dtype": (
        lambda: _bad_state("tok_embeddings.weight", lambda v: v.double()), ValueError,
        ["'tok_embeddings.weight'", "torch.float64", "torch.float32"]),
    "load_full_state_dict not a tensor": (
        lambda: _bad_state("norm.weight", lambda v: v.tolist()), ValueError, ["'norm.weight'", "list"]),
    "load_full_state_dict missing key": (
        lambda: (lambda m: lambda: load_full_state_dict(m, {}))(_llama()), KeyError, ["missing keys", "norm.weight"]),
    "distribute_tensor Partial src_data_rank out of range": (
        lambda: lambda: distribute_tensor(torch.ones(4), _mesh(), [Partial()], src_data_rank=5), ValueError,
        ["src_data_rank=5"]),
    "distribute_tensor Shard src_data_rank out of range": (
        lambda: lambda: distribute_tensor(torch.ones(4), _mesh(), [Shard(0)], src_data_rank=5), ValueError,
        ["src_data_rank=5", "None"]),
    "distribute_tensor negative src_data_rank": (
        lambda: lambda: distribute_tensor(torch.ones(4), _mesh(), [Replicate()], src_data_rank=-1), ValueError,
        ["src_data_rank=-1"]),
    "PrepareModuleInput applied twice": (
        lambda: _twice(_pmi(), _pmi(), nn.Identity()), RuntimeError, ["PrepareModuleInput", "already"]),
    "PrepareModuleOutput applied twice": (
        lambda: _twice(_pmo(), _pmo(), nn.Identity()), RuntimeError, ["PrepareModuleOutput", "already"]),
    "ColwiseParallel after RowwiseParallel": (
        lambda: _twice(RowwiseParallel(), ColwiseParallel()), RuntimeError, ["only be called once", "RowwiseParallel"]),
    "SequenceParallel applied twice": (
        lambda: _twice(SequenceParallel(), SequenceParallel(), nn.LayerNorm(4)), RuntimeError, ["only be called once"]),
    "two plan keys shard one module": (
        lambda: lambda: parallelize_module(nn.Sequential(nn.Linear(2, 2)), _mesh(),
                                           {"0": ColwiseParallel(), "*": RowwiseParallel()}),
        ValueError, ["'0'", "'*'", "disjoint"]),
    "plan key matching nothing": (
        lambda: lambda: parallelize_module(Transformer(ARGS), _mesh(), {"layers.*.atention.wq": ColwiseParallel()}),
        ValueError, ["layers.*.atention.wq", "layers.0.attention.wq"]),
    "plan value not a style": (
        lambda: lambda: parallelize_module(nn.Sequential(nn.Linear(2, 2)), _mesh(), {"0": "colwise"}),
        TypeError, ["parallelize_plan['0']", "str"]),
    "plan of the wrong type": (
        lambda: lambda: parallelize_module(nn.Linear(2, 2), _mesh(), [ColwiseParallel()]), TypeError,
        ["parallelize_plan", "list"]),
    "style on an unsupported module": (
        lambda: lambda: parallelize_module(nn.Sequential(nn.LayerNorm(4)), _mesh(), {"0": ColwiseParallel()}),
        NotImplementedError, ["ColwiseParallel", "'0'", "LayerNorm"]),
    "2-D mesh given to parallelize_module": (
        lambda: lambda: parallelize_module(nn.Linear(2, 2), init_device_mesh("cpu", (1, dist.get_world_size())),
                                           ColwiseParallel()), ValueError, ['device_mesh["tp"]']),
    "DTensor ==": (lambda: lambda: _dt() == _dt(), NotImplementedError, ["__eq__", ".full_tensor()"]),
    "DTensor !=": (lambda: lambda: _dt() != 0, NotImplementedError, ["__ne__"]),
    "DTensor bool()": (lambda: lambda: bool(_dt()), NotImplementedError, ["__bool__"]),
    "DTensor if": (lambda: lambda: 1 if _dt() else 0, NotImplementedError, ["__bool__"]),
    "DTensor op": (lambda: lambda: torch.matmul(_dt(), _dt()), NotImplementedError, ["matmul", "Shard(dim=1)"]),
    "from_local wrong shape=": (
        lambda: lambda: DTensor.from_local(torch.randn(1, 2), _mesh(), [Shard(0)], shape=(99, 2)), ValueError,
        ["shape=", "[99, 2]"]),
    "from_local placements per mesh dim": (
        lambda: lambda: _dt((Shard(0), Shard(1))), ValueError, ["one placement per mesh dimension"]),
    "Shard dim out of range": (lambda: lambda: _dt((Shard(2),)), ValueError, ["Shard(2)", "2-D"]),
    "Shard dim not an int": (lambda: lambda: Shard("0"), TypeError, ["Shard(dim)", "'0'"]),
    "Partial unknown reduce_op": (lambda: lambda: Partial("prod"), ValueError, ["reduce_op='prod'"]),
    "to_local conflicting grad_placements": (
        lambda: (lambda d: (d.to_local(grad_placements=[Partial()]), lambda: d.to_local())[1])(
            DTensor.from_local(torch.randn(3, requires_grad=True), _mesh(), [Replicate()])),
        RuntimeError, ["grad_placements"]),
    "redistribute to another mesh": (
        lambda: lambda: _dt().redistribute(init_device_mesh("cpu", (1, dist.get_world_size())), [Replicate()] * 2),
        NotImplementedError, ["another mesh"]),
    "token id out of the vocabulary": (
        lambda: lambda: _llama("vanilla")(torch.tensor([[1, 20]])), RuntimeError, ["'tok_embeddings'", "[0, 20)"]),
    "loss_parallel target out of range": (
        lambda: _in_loss_parallel(lambda: F.cross_entropy(_logits(), torch.tensor([0, 1, 2, 3, 4, 99]))),
        RuntimeError, ["out of bounds for 10 classes", "ignore_index=-100"]),  # 2 ranks x 5 classes
    "loss_parallel logits sharded on the batch": (
        lambda: _in_loss_parallel(lambda: F.cross_entropy(DTensor.from_local(torch.randn(3, 5), _mesh(), [Shard(0)]),
                                                          torch.zeros(3 * dist.get_world_size(), dtype=torch.long))),
        ValueError, ["loss_parallel"]),
    "loss_parallel label_smoothing > 1": (
        lambda: _in_loss_parallel(lambda: F.cross_entropy(_logits(), torch.zeros(6, dtype=torch.long),
                                                          label_smoothing=1.5)), ValueError, ["label_smoothing"]),
    "loss_parallel soft targets": (
        lambda: _in_loss_parallel(lambda: F.cross_entropy(_logits(), torch.rand(6, 5 * dist.get_world_size()))),
        NotImplementedError, ["class-index"]),
    "heads not divisible by the TP degree": (
        lambda: lambda: parallelize_llama(Transformer(ModelArgs(dim=15, n_heads=5, vocab_size=20)), _mesh()),
        ValueError, ["n_heads=5", "TP degree"]),
    "1-D tokens, one device": (
        lambda: lambda: Transformer(ARGS)(torch.tensor([1, 2, 3])), ValueError,
        ["tokens", "[batch, seq]", "shape [3]", "tokens[None]"]),
    "1-D tokens (vanilla plan)": (
        lambda: lambda: _llama("vanilla")(torch.tensor([1, 2, 3])), ValueError, ["[batch, seq]", "shape [3]"]),
    "1-D tokens (full plan)": (
        lambda: lambda: _llama("full")(torch.zeros(4, dtype=torch.long)), ValueError, ["[batch, seq]", "shape [4]"]),
    "llama_loss of one sequence": (
        lambda: lambda: llama_loss(torch.randn(3, 20), torch.tensor([1, 2, 3])), ValueError,
        ["llama_loss", "[batch, seq, vocab]", "logits [3, 20]", "labels [3]"]),
    "sequence length not divisible (full plan)": (
        lambda: lambda: _llama("full")(torch.zeros(1, 2 * dist.get_world_size() + 1, dtype=torch.long)),
        ValueError, ["sequence length", "length 5 "]),  # 2 ranks
    "PrepareModuleInput arity": (
        lambda: (lambda m: lambda: m(torch.randn(2, 3)))(parallelize_module(nn.Linear(3, 3), _mesh(), PrepareModuleInput(
            input_layouts=(Replicate(), Replicate()), desired_input_layouts=(Replicate(), Replicate())))),
        ValueError, ["input_layouts", "got 1 inputs"]),
    "PrepareModuleInput without desired layouts": (
        lambda: lambda: PrepareModuleInput(input_layouts=Replicate()), AssertionError, ["desired module inputs"]),
    "Colwise input not a tensor": (
        lambda: (lambda m: lambda: m([1.0, 2.0]))(parallelize_module(nn.Linear(2, 2), _mesh(), ColwiseParallel())),
        ValueError, ["torch.Tensor or DTensor", "list"]),
    "SequenceParallel input not a tensor": (
        lambda: (lambda m: lambda: m("x"))(parallelize_module(nn.LayerNorm(2), _mesh(), SequenceParallel())),
        ValueError, ["torch.Tensor or DTensor"]),
    "float8 style on a plain Linear": (
        lambda: lambda: parallelize_module(nn.Linear(4, 4), _mesh(), _float8_styles().Float8ColwiseParallel()),
        ValueError, ["Expecting module to be Float8Linear", "convert_to_float8_training"]),
    "PrepareFloat8ModuleInput to e5m2": (
        lambda: lambda: _float8_styles().PrepareFloat8ModuleInput(float8_dtype=torch.float8_e5m2), NotImplementedError,
        ["float8_e4m3fn"]),
    "PrepareFloat8ModuleInput without float8 readers": (
        lambda: lambda: parallelize_module(nn.Sequential(nn.Linear(4, 4)), _mesh(), _float8_styles().PrepareFloat8ModuleInput(
            input_layouts=Shard(1), desired_input_layouts=Replicate())), ValueError, ["Float8Linear", "Sequential"]),
    "async TP input read by a non-Colwise module": (
        lambda: lambda: _ring_input().output_for(nn.Linear(4, 4)), RuntimeError, ["async TP", "ColwiseParallel"]),
    "init_device_mesh shape against the world": (
        lambda: lambda: init_device_mesh("cpu", (dist.get_world_size() + 1,)), ValueError, ["mesh_shape"]),
    "mesh dimension name": (
        lambda: lambda: init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))["dp"], KeyError,
        ["'dp'", "('tp',)"]),
}


if not torch.cuda.is_available():  # on a machine with GPUs the call is right
    CASES["init_device_mesh('cuda') without CUDA"] = (
        lambda: lambda: init_device_mesh("cuda", (dist.get_world_size(),)), RuntimeError,
        ["init_device_mesh('cuda'", "no CUDA device", "'cpu'"])


def run_all() -> dict[str, tuple[str, str] | None]:
    torch.manual_seed(0)
    out = {}
    for name, (build, _, _) in CASES.items():
        call = build()
        try:
            call()
        except Exception as err:  # noqa: BLE001  (the test checks the type)
            out[name] = (type(err).__name__, str(err))
        else:
            out[name] = None
    return out


def plan_with_a_bad_key_changes_nothing() -> tuple[list[str], int]:
    """A plan whose last key is wrong shards nothing, and the corrected plan then applies."""
    mesh = _mesh()
    model = Transformer(ARGS)
    plan = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()), "output": ColwiseParallel(),
            "layers.0.attention.wq": ColwiseParallel(), "layers.0.atention.wk": ColwiseParallel()}
    fails = []
    try:
        parallelize_module(model, mesh, plan)
        fails.append("the bad key did not raise")
    except ValueError:
        pass
    touched = [n for n, p in model.named_parameters() if param_layout(p) is not None]
    if touched:
        fails.append(f"a failed plan sharded {touched}")
    plan["layers.0.attention.wk"] = plan.pop("layers.0.atention.wk")
    parallelize_module(model, mesh, plan)
    sharded = sorted(n for n, p in model.named_parameters() if param_layout(p) is not None)
    if sharded != ["layers.0.attention.wk.weight", "layers.0.attention.wq.weight", "output.weight",
                   "tok_embeddings.weight"]:
        fails.append(f"the corrected plan sharded {sharded}")
    copy.deepcopy(model)  # a parallelized model still deep-copies (tests and users copy models)
    return fails, 3

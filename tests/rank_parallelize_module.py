"""Rank code for tests/test_parallelize_module.py, plans: collective counts of a training step, the
seed's apply_tp, parallelize_module's matching and errors, state dicts."""

from __future__ import annotations

import glob
import os
import warnings

import torch
import torch.distributed as dist
from torch import nn

from checks import chunk, raises
from tensorplay_edu import CommDebugMode, Replicate, Shard, init_device_mesh
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
from tensorplay_edu.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                     full_state_dict, load_full_state_dict, param_layout, parallelize_module)


SEEDS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "seeds")


def seed_apply_tp_text() -> str | None:
    """torchtitan's apply_tp, verbatim from the documents the project grew from, when ../shared/seeds is beside
    the clone (CI); None in a user's clone (the tests then check tensorplay_edu.models.apply_tp only)."""
    paths = [p for p in glob.glob(os.path.join(SEEDS, "*.txt")) if "def apply_tp" in open(p).read()]
    if not paths:
        return None
    text = open(paths[0]).read()
    return text[text.index("def apply_tp"):]


def step_counts(plan: str, n_layers: int, apply=None) -> dict:
    """Collectives of one training step (forward, loss, backward, optimizer)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=48, n_layers=n_layers, n_heads=12, vocab_size=40, max_seq_len=16))
    if apply is None:
        parallelize_llama(model, mesh, plan)
    else:
        apply(model, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    with CommDebugMode() as comm:
        with loss_context(plan):
            loss = llama_loss(model(tokens), tokens)
        loss.backward()
    with CommDebugMode() as opt_comm:
        opt.step()
    return {"forward": comm.get_comm_counts("forward"), "backward": comm.get_comm_counts("backward"),
            "optimizer": opt_comm.get_total_counts(), "modules": sorted({r.module for r in comm.records})}


def exec_apply_tp(source: str | None):
    """torchtitan's apply_tp: the seed's text exec'd with only its imports replaced by ours,
    or (``source=None``) the package's own, tensorplay_edu.models.apply_tp."""
    if source is None:
        from tensorplay_edu.models import apply_tp
        return apply_tp
    header = (
        "import logging\nimport torch\nfrom torch import nn\n"
        "from tensorplay_edu import DeviceMesh, Replicate, Shard\n"
        "from tensorplay_edu.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,\n"
        "    SequenceParallel, parallelize_module)\nlogger = logging.getLogger('apply_tp')\n")
    source = source.replace("from torchao.float8.float8_tensor_parallel import",  # its imports inside the function
                            "from tensorplay_edu.float8.float8_tensor_parallel import").replace(
        "from torch.distributed._symmetric_memory import enable_symm_mem_for_group",
        "from tensorplay_edu.async_tp import enable_symm_mem_for_group")
    namespace: dict = {}
    exec(compile(header + source, "seed_apply_tp", "exec"), namespace)
    return namespace["apply_tp"]


def seed_apply_tp(source: str | None, float8: bool = False):
    """apply_tp(model, mesh) as torchtitan calls it for plain TP (float8 as asked)."""
    apply_tp = exec_apply_tp(source)
    return lambda model, mesh: apply_tp(model, mesh, loss_parallel=False, enable_float8_tensorwise_tp=float8,
                                        enable_async_tp=False)


def apply_tp_with_loss_parallel() -> dict:
    """The package's apply_tp with loss_parallel=True: its warnings, and the logits' shape (the whole vocabulary)."""
    from tensorplay_edu.models import apply_tp
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=16, n_layers=1, n_heads=4, vocab_size=20))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_tp(model, mesh, loss_parallel=True, enable_float8_tensorwise_tp=False, enable_async_tp=False)
    logits = model(torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(1)))
    return {"warnings": [str(w.message) for w in caught], "shape": list(logits.shape), "type": type(logits).__name__}


def seed_counts(source: str | None, n_layers: int) -> dict:
    return step_counts("vanilla", n_layers, apply=seed_apply_tp(source))


def seed_training(source: str | None):
    from rank_parallel import run_llama_with
    return run_llama_with(seed_apply_tp(source))


def api_errors() -> tuple[list[str], int]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t = mesh.size()
    fails = []
    ln = nn.Sequential(nn.LayerNorm(4))
    raises(fails, "unsupported module", NotImplementedError,
            lambda: parallelize_module(ln, mesh, {"0": ColwiseParallel()}), "ColwiseParallel", "'0'", "LayerNorm")
    lin = nn.Sequential(nn.Linear(4, 4))
    parallelize_module(lin, mesh, {"0": ColwiseParallel()})
    raises(fails, "applied twice", RuntimeError, lambda: parallelize_module(lin, mesh, {"0": RowwiseParallel()}),
            "only be called once", "'0'")
    raises(fails, "plan type", TypeError, lambda: parallelize_module(nn.Linear(2, 2), mesh, [ColwiseParallel()]),
            "parallelize_plan")
    model = Transformer(ModelArgs(dim=16, n_layers=2, n_heads=4, vocab_size=20))
    raises(fails, "typo in a plan key", ValueError,
            lambda: parallelize_module(model, mesh, {"layers.*.atention.wq": ColwiseParallel()}),
            "layers.*.atention.wq", "layers.0.attention.wq")
    raises(fails, "no mesh", RuntimeError, lambda: parallelize_module(nn.Linear(2, 2), None, ColwiseParallel()),
            "No device mesh")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallelize_module(nn.Linear(2, 2), mesh, None)
    if not any("parallelize_plan" in str(w.message) for w in caught):
        fails.append("no warning for a missing plan")
    # wildcards per dotted level and the "" root key
    m2 = Transformer(ModelArgs(dim=16, n_layers=2, n_heads=4, vocab_size=20))
    parallelize_module(m2, mesh, {"layers.*.attention.w[qk]": ColwiseParallel(),
                                  "": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Replicate())})
    sharded = sorted(n for n, p in m2.named_parameters() if param_layout(p) is not None)
    if sharded != ["layers.0.attention.wk.weight", "layers.0.attention.wq.weight",
                   "layers.1.attention.wk.weight", "layers.1.attention.wq.weight"]:
        fails.append(f"wildcard matched {sharded}")
    lay = param_layout(m2.layers["0"].attention.wq.weight)
    if lay.placements != (Shard(0),) or lay.shape != torch.Size([16, 16]) or lay.mesh != mesh:
        fails.append(f"param_layout {lay}")
    # Prepare* errors
    pmi = nn.Linear(3, 3)
    parallelize_module(pmi, mesh, PrepareModuleInput(input_layouts=(Replicate(), Replicate()),
                                                     desired_input_layouts=(Replicate(), Replicate())))
    raises(fails, "PMI arity", ValueError, lambda: pmi(torch.randn(2, 3)), "input_layouts")
    # heads and sequence length must divide by the TP degree
    if t > 1:
        raises(fails, "heads", ValueError, lambda: parallelize_llama(
            Transformer(ModelArgs(dim=16, n_heads=t + 1 if (t + 1) % t else 2 * t + 1, vocab_size=20)), mesh),
            "n_heads", "TP degree")
        llama = parallelize_llama(Transformer(ModelArgs(dim=16, n_heads=4 * 3, vocab_size=20)), mesh, "full")
        raises(fails, "sequence length", ValueError, lambda: llama(torch.zeros(1, t * 2 + 1, dtype=torch.long)),
                "sequence length", str(t))
    emb = nn.Embedding(10, 4)
    parallelize_module(emb, mesh, RowwiseParallel(input_layouts=Replicate()))
    raises(fails, "token id out of range", RuntimeError, lambda: emb(torch.tensor([[3, 10]])), "out of range")
    return fails, 14


def state_dicts() -> tuple[list[str], int]:
    """full_state_dict / load_full_state_dict round trip, bit-exact, uneven shards included."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    fails = []
    torch.manual_seed(0)
    ref = Transformer(ModelArgs(dim=24, n_layers=2, n_heads=12, vocab_size=37))  # 37 over 4: 10,10,10,7
    model = Transformer(ModelArgs(dim=24, n_layers=2, n_heads=12, vocab_size=37))
    parallelize_llama(model, mesh, "full")
    load_full_state_dict(model, ref.state_dict())
    got, want = full_state_dict(model), ref.state_dict()
    for name in want:
        if not torch.equal(got[name], want[name]):
            fails.append(f"round trip {name}")
    w = model.output.weight
    if w.shape != chunk(ref.output.weight, 0, mesh.size(), mesh.get_local_rank()).shape or not isinstance(w, nn.Parameter):
        fails.append(f"local parameter shape {tuple(w.shape)}")
    if set(model.state_dict()) != set(ref.state_dict()):
        fails.append("state_dict keys changed")
    # src_data_rank=None: parallelizing costs no communication
    with CommDebugMode() as comm:
        parallelize_module(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), mesh,
                           {"0": ColwiseParallel(), "1": RowwiseParallel()}, src_data_rank=None)
    if comm.get_total_counts():
        fails.append(f"src_data_rank=None communicated {comm.get_comm_counts()}")
    with CommDebugMode() as comm:
        parallelize_module(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), mesh,
                           {"0": ColwiseParallel(), "1": RowwiseParallel()})
    want_ops = {} if mesh.size() == 1 else {"all_gather": 1, "scatter": 3, "broadcast": 1}  # 1: the shape check
    if comm.get_comm_counts() != want_ops:
        fails.append(f"src_data_rank=0 issued {comm.get_comm_counts()}, expected {want_ops}")
    return fails, len(want) + 4


def sp_gradient_accumulation() -> tuple[list[str], int]:
    """Two backwards before a step: each reduces only its own contribution."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    torch.manual_seed(0)
    ref, norm = nn.LayerNorm(6).double(), nn.LayerNorm(6).double()
    parallelize_module(norm, mesh, SequenceParallel(use_local_output=True))
    g = torch.Generator().manual_seed(2)
    with CommDebugMode() as comm:
        for _ in range(2):
            x = torch.randn(2, 4 * t, 6, generator=g, dtype=torch.float64)
            w = torch.randn(2, 4 * t, 6, generator=g, dtype=torch.float64)
            (ref(x) * w).sum().backward()
            (norm(chunk(x, 1, t, r)) * chunk(w, 1, t, r)).sum().backward()
    fails = [f"accumulated grad {n}" for n in ("weight", "bias")
             if not torch.allclose(getattr(norm, n).grad, getattr(ref, n).grad, rtol=1e-10, atol=1e-12)]
    if comm.get_comm_counts("backward") != ({} if t == 1 else {"all_reduce": 4}):  # weight and bias, twice
        fails.append(f"one all-reduce per parameter per backward: {comm.get_comm_counts('backward')}")
    return fails, 3

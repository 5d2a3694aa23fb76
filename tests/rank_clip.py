"""Rank code for the gradient-clipping tests: tensorplay_edu.parallel.clip_grad_norm_ on a
parallelized model against torch.nn.utils.clip_grad_norm_ on the same model in one
process: the returned norm, every clipped gradient, the weights after AdamW steps.

Each worker returns (failures, number of checks, the norms it returned and a checksum of
its final weights), so a test can assert no failures, that it really checked (rank 0, which
runs the reference), and that every rank got the same norms and the same weights.
"""

from __future__ import annotations

import copy
import math
import warnings

import torch
import torch.distributed as dist
from torch import nn

from checks import Checker, chunk, raises
from tensorplay_edu import CommDebugMode, DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
from tensorplay_edu.parallel import (ColwiseParallel, RowwiseParallel, clip_grad_norm_, full_state_dict,
                                     param_layout, parallelize_module)
from tensorplay_edu.parallel.layout import ParamLayout
from tensorplay_edu.parallel.params import as_dtensor

TOL = dict(rtol=1e-9, atol=1e-12)
INF = math.inf
BINDING, LOOSE = 1e-3, 1e6  # max_norm below / far above every norm these models reach


class ClipChecker(Checker):
    """checks.Checker, plus the norms this rank returned; close() wants the same dtype too, at TOL."""

    def __init__(self):
        super().__init__()
        self.norms = []

    def close(self, what: str, got, want) -> None:
        ok = got is not None and want is not None and got.shape == want.shape and got.dtype == want.dtype \
            and torch.allclose(got, want, **TOL)
        show = (lambda t: None if t is None else t.flatten()[:4])  # noqa: E731
        self(what if ok else f"{what}: got {show(got)} want {show(want)}", ok)

    def result(self):
        return self.fails, self.n, self.norms


def _full_grads(model: nn.Module) -> dict:
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None or param_layout(p) is None:
            out[name] = p.grad
        else:
            out[name] = as_dtensor(p, p.grad).full_tensor()
    return out


# (foreach, max_norm) of each training step: every pair once, binding and not, in one run
SCHEDULE = [(True, BINDING), (False, LOOSE), (True, LOOSE), (False, BINDING)]
SCHEDULE_NONE = SCHEDULE + [(None, BINDING), (None, LOOSE)]


def clip_and_train(check: ClipChecker, label: str, ref: nn.Module, model: nn.Module, loss_ref, loss_tp, *,
                   norm_type: float, schedule=SCHEDULE, forward: nn.Module | None = None):
    """AdamW steps with clipping, ``ref`` clipped by torch, ``model`` by ours; step i clips
    with ``schedule[i] = (foreach, max_norm)``.

    ``loss_ref(ref, step)`` / ``loss_tp(forward or model, step)`` give each step's loss;
    ``forward`` is what runs the model (a DistributedDataParallel wrapper of ``model``).
    """
    label = f"{label} p={norm_type}"
    has_ref = dist.get_rank() == 0  # the gathered gradients and weights are the same on every rank: one
    # reference is enough (the others check that they got rank 0's norm, bit for bit, in the test)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1)
    opt_tp = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    for step, (foreach, max_norm) in enumerate(schedule):
        at = f"{label} step {step} (foreach={foreach}, max_norm={max_norm:g})"
        opt_tp.zero_grad()
        loss_tp(forward or model, step).backward()
        got = clip_grad_norm_((forward or model).parameters(), max_norm, norm_type, foreach=foreach)
        check.norms.append(got.item())
        grads = _full_grads(model)
        if has_ref:
            opt_ref.zero_grad()
            loss_ref(ref, step).backward()
            want = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm, norm_type, foreach=foreach)
            check.close(f"{at} norm", got, want)
            check(f"{at}: binding as meant (norm {want.item():.3g})", (want.item() > max_norm) == (max_norm == BINDING))
            for name, p in ref.named_parameters():
                check.close(f"{at} clipped grad {name}", grads[name], p.grad)
            opt_ref.step()
        opt_tp.step()
    state = full_state_dict(model)
    check.norms.append(sum(v.double().sum().item() for v in state.values()))  # DDP replicas too: equal, bit for bit
    if has_ref:
        for name, w in ref.state_dict().items():
            check.close(f"{label} weights {name} after {len(schedule)} steps", state[name], w)


# ---- a small MLP with uneven and empty shards ---------------------------------------

def _mlp():
    # 10 output features over 4 ranks: 3, 3, 3, 1; the last layer's 2 over 4: 1, 1, 0, 0 (empty pieces)
    return nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 2))


def _mlp_plan(model, mesh):
    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel(),
                                            "4": ColwiseParallel(output_layouts=Replicate())})


def _mlp_loss(model, step):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(12, 10, generator=g, dtype=torch.float64)
    w = torch.randn(12, 2, generator=g, dtype=torch.float64)
    return (model(x) * w).sum()


def mlp(norm_types=(2.0, 1.0, 3.0, INF)):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = ClipChecker()
    for norm_type in norm_types:
        torch.manual_seed(0)
        ref = _mlp().double()
        model = _mlp_plan(copy.deepcopy(ref), mesh)
        clip_and_train(check, "MLP", ref, model, _mlp_loss, _mlp_loss, norm_type=norm_type, schedule=SCHEDULE_NONE)
    return check.result()


# ---- the small Llama under both plans --------------------------------------------------

def _llama_args(tp: int):
    from tensorplay_edu.models import ModelArgs
    # vocab 50 over 4 ranks: 13, 13, 13, 11; over 3: 17, 17, 16
    return ModelArgs(dim=48, n_layers=2, n_heads=12, n_kv_heads=4 if tp == 4 else 6, vocab_size=50, max_seq_len=24)


def _tokens(step: int, batch: int):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, 50, (batch, 12), generator=g), torch.randint(0, 50, (batch, 12), generator=g)


def _llama_loss(plan: str, rows: slice | None = None, batch: int = 2):
    """The step's loss on all ``batch`` sequences (or on ``rows`` of them)."""
    from tensorplay_edu.models import llama_loss, loss_context

    def loss(model, step):
        tokens, labels = _tokens(step, batch)
        if rows is not None:
            tokens, labels = tokens[rows], labels[rows]
        logits = model(tokens)
        with loss_context(plan if isinstance(logits, DTensor) else "vanilla"):
            return llama_loss(logits, labels)
    return loss


def llama(plan: str, norm_types=(2.0, 1.0, INF)):
    from tensorplay_edu.models import Transformer, parallelize_llama

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = ClipChecker()
    for norm_type in norm_types:
        torch.manual_seed(0)
        ref = Transformer(_llama_args(mesh.size())).double()
        model = parallelize_llama(copy.deepcopy(ref), mesh, plan)
        clip_and_train(check, f"Llama {plan}", ref, model, _llama_loss("vanilla"), _llama_loss(plan),
                       norm_type=norm_type)
    return check.result()


def llama_collectives(plan: str) -> dict:
    """The collectives clip_grad_norm_ issues on a parallelized Llama: one tiny all-reduce."""
    from tensorplay_edu.models import Transformer, parallelize_llama

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = parallelize_llama(Transformer(_llama_args(mesh.size())).double(), mesh, plan)
    _llama_loss(plan)(model, 0).backward()
    out = {}
    for norm_type in (2.0, INF):
        with CommDebugMode() as comm:
            clip_grad_norm_(model.parameters(), 1.0, norm_type)
        out[norm_type] = [(r.op, r.shape, r.group_size, r.module) for r in comm.records]
    return out


# ---- DP x TP: vanilla plan on mesh["tp"], DistributedDataParallel on mesh["dp"] ----------

def dp_tp(plan: str, norm_types=(2.0, 1.0, INF)):
    """4 ranks, mesh (2, 2) ("dp", "tp"); each dp rank trains on half of a batch of 4
    sequences, the reference on all 4 (mean over tokens: DDP's average is the whole mean)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tensorplay_edu.models import Transformer, parallelize_llama

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh.get_local_rank("dp")
    check = ClipChecker()
    for norm_type in norm_types:
        torch.manual_seed(0)
        ref = Transformer(_llama_args(2)).double()
        model = parallelize_llama(copy.deepcopy(ref), mesh["tp"], plan)
        ddp = DDP(model, process_group=mesh.get_group("dp"))
        clip_and_train(check, f"DDP x TP {plan}", ref, model, _llama_loss("vanilla", batch=4),
                       _llama_loss(plan, rows=slice(2 * dp, 2 * dp + 2), batch=4), norm_type=norm_type, forward=ddp)
    return check.result()


# ---- layouts over a 2-D mesh, by hand ---------------------------------------------------

# (global shape, placements on the (dp, tp) mesh, or "tp" for a [Shard(0)] on mesh["tp"], or None: no layout)
LAYOUTS_2D = [
    ((5, 3), [Shard(0), Replicate()]),  # 3, 2 rows over dp; whole on both tp ranks
    ((5, 7), [Shard(0), Shard(1)]),  # uneven both ways
    ((4, 6), [Replicate(), Shard(1)]),
    ((3,), [Replicate(), Replicate()]),
    ((2, 2), None),
    ((7, 2), "tp"),  # a 1-D sub-mesh: the same tp group as [Replicate(), Shard(1)], the same all-reduce
    ((1, 4), [Shard(0), Replicate()]),  # 1 row over 2 dp ranks: 1, 0 (an empty piece)
]


def _params_2d(mesh):
    g = torch.Generator().manual_seed(7)
    fulls = [torch.randn(shape, generator=g, dtype=torch.float64) for shape, _ in LAYOUTS_2D]
    ref, pieces = nn.ParameterList(), nn.ParameterList()
    for full, (shape, placements) in zip(fulls, LAYOUTS_2D):
        ref.append(nn.Parameter(full.clone()))
        if placements is None:
            pieces.append(nn.Parameter(full.clone()))
            continue
        on, places = (mesh["tp"], [Shard(0)]) if placements == "tp" else (mesh, placements)
        dt = distribute_tensor(full.clone(), on, places)
        p = nn.Parameter(dt.to_local().clone())
        p.tp_layout = ParamLayout(on, dt.placements, full.shape)
        pieces.append(p)
    return ref, pieces


def _loss_2d(params, step):
    g = torch.Generator().manual_seed(200 + step)
    loss = 0
    for p in params:
        w = as_dtensor(p).full_tensor() if param_layout(p) is not None else p
        loss = loss + (torch.randn(w.shape, generator=g, dtype=w.dtype) * w + 0.1 * w ** 3).sum()
    return loss


def layouts_2d(norm_types=(2.0, 1.0, 3.0, INF)):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    check = ClipChecker()
    for norm_type in norm_types:
        ref, params = _params_2d(mesh)
        clip_and_train(check, "2-D layouts", ref, params, _loss_2d, _loss_2d, norm_type=norm_type,
                       schedule=SCHEDULE_NONE)
    ref, params = _params_2d(mesh)
    _loss_2d(params, 0).backward()
    with CommDebugMode() as comm:
        clip_grad_norm_(params.parameters(), 1.0)
    # (dp,): 1 all-reduce; (dp, tp): 2 (one per mesh dim); (tp,): 1, shared with the sub-mesh parameter
    check(f"2-D layouts: collectives {comm.get_comm_counts()}", comm.get_comm_counts() == {"all_reduce": 4})
    return check.result()


# ---- non-finite gradients, and the guard on torch's function ------------------------------

def nonfinite():
    """A non-finite value in ONE rank's piece (the first rank's, the last rank's): every rank
    sees the single-device norm (and raises together with error_if_nonfinite)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = ClipChecker()
    for bad in (INF, math.nan):
        for row in (0, 9):  # of the first Linear's 10 output rows: on the first rank, on the last
            for norm_type in (2.0, INF):
                torch.manual_seed(0)
                ref = _mlp().double()
                model = _mlp_plan(copy.deepcopy(ref), mesh)
                _mlp_loss(ref, 0).backward()
                _mlp_loss(model, 0).backward()
                with torch.no_grad():
                    ref[0].weight.grad[row, 3] = bad
                    model[0].weight.grad.copy_(chunk(ref[0].weight.grad, 0, mesh.size(), mesh.get_local_rank()))
                label = f"bad={bad} on row {row} p={norm_type}"
                raises(check.fails, f"error_if_nonfinite {label}", RuntimeError,
                        lambda: clip_grad_norm_(model.parameters(), 1.0, norm_type, error_if_nonfinite=True),
                        "is non-finite, so it cannot be clipped")
                check.n += 1
                want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0, norm_type)
                got = clip_grad_norm_(model.parameters(), 1.0, norm_type)
                check(f"non-finite norm {label}: got {got} want {want}",
                      (got.isnan().item() and want.isnan().item()) or got.item() == want.item())
                check.norms.append(got.item())
    return check.result()


def guard():
    """torch's clip_grad_norm_ / get_total_norm refuse parameters sharded over more than one rank."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    split = mesh.size() > 1
    check = ClipChecker()
    torch.manual_seed(0)
    ref = _mlp().double()
    model = _mlp_plan(copy.deepcopy(ref), mesh)
    _mlp_loss(ref, 0).backward()
    _mlp_loss(model, 0).backward()
    before = [p.grad.clone() for p in model.parameters()]
    utils = torch.nn.utils
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # clip_grad_norm is deprecated
        calls = {
            "clip_grad_norm_(generator)": lambda: utils.clip_grad_norm_(model.parameters(), LOOSE),
            "clip_grad_norm_(list, keywords)": lambda: utils.clip_grad_norm_(parameters=list(model.parameters()),
                                                                             max_norm=LOOSE),
            "clip_grad_norm_(one tensor)": lambda: utils.clip_grad_norm_(model[0].weight, LOOSE),
            "clip_grad.clip_grad_norm_": lambda: utils.clip_grad.clip_grad_norm_(model.parameters(), LOOSE),
            "clip_grad_norm (deprecated)": lambda: utils.clip_grad_norm(model.parameters(), LOOSE),
            "get_total_norm(parameters)": lambda: utils.get_total_norm(model.parameters()),
            "get_total_norm(tensors=)": lambda: utils.get_total_norm(tensors=[model[2].weight]),
        }
        for label, call in calls.items():
            if split:
                raises(check.fails, f"guard {label}", RuntimeError, call, "sharded over several ranks",
                        "tensorplay_edu.parallel.clip_grad_norm_")
                check.n += 1
                check(f"guard {label}: gradients untouched",
                      all(torch.equal(a, p.grad) for a, p in zip(before, model.parameters())))
            else:  # one rank: the pieces are the whole parameters, torch's function is right
                check(f"one rank: {label} passes", call().ndim == 0)
    # the gradients of sharded parameters are pieces too (issue 17: get_total_norm([p.grad ...]) was per rank)
    grads = [p.grad for p in model.parameters()]
    if split:
        raises(check.fails, "guard get_total_norm(gradients)", RuntimeError, lambda: utils.get_total_norm(grads),
                "sharded over several ranks", "tensorplay_edu.parallel.clip_grad_norm_")
        check.n += 1
    else:
        check("one rank: get_total_norm(grads) passes", utils.get_total_norm(grads).ndim == 0)
    # what passes through: replicated parameters and their gradients, torch's function itself
    check("get_total_norm(a replicated gradient) passes", utils.get_total_norm([model[2].bias.grad]).ndim == 0)
    check("clip_grad_norm_(a replicated parameter) passes", utils.clip_grad_norm_([model[2].bias], 1e6).ndim == 0)
    local = utils.clip_grad_norm_.__wrapped__(model.parameters(), 1e6)  # torch's, unchecked: this rank's pieces
    check.norms.append(local.item())
    got = clip_grad_norm_(model.parameters(), 1e6)
    want = utils.clip_grad_norm_(ref.parameters(), 1e6)
    check.close("after the guard, ours == torch on one process", got, want)
    return check.result()

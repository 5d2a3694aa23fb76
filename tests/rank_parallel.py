"""Rank code for the parallel-style tests (tests/test_colwise_rowwise.py, test_sequence_parallel.py, and
the Llama plans in test_parallelize_module.py): train a parallelized copy beside the single-device
model and compare everything (outputs, loss, every parameter gradient, the input gradient, the
weights after each optimizer step). train_compare and run_llama are the harness many other tests reuse."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from checks import Checker, chunk
from tensorplay_edu import DTensor, Partial, Replicate, Shard, init_device_mesh
from tensorplay_edu.parallel import bucket_partial_grads, full_state_dict, param_layout
from tensorplay_edu.parallel.params import as_dtensor

TOL = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=2e-5, atol=2e-5)}


def piece(full: torch.Tensor, layout, mesh) -> torch.Tensor:
    """This rank's piece of ``full`` in ``layout`` (Replicate: all of it)."""
    if isinstance(layout, Shard):
        return chunk(full, layout.dim % full.ndim, mesh.size(), mesh.get_local_rank())
    return full


def full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        layout = param_layout(p)
        if p.grad is None:
            out[name] = None
        elif layout is None:
            out[name] = p.grad
        else:
            out[name] = as_dtensor(p, p.grad).full_tensor()
    return out


def _close(a, b, dtype) -> bool:
    return a is not None and b is not None and a.shape == b.shape and torch.allclose(a, b, **TOL[dtype])


def train_compare(label, build, parallelize, make_input, *, in_layout=Replicate(), out_layout=Replicate(),
                  loss_of=None, steps=3, optimizers=("sgd", "adamw"), dtype=torch.float64, input_grad=True,
                  seed=0, dp=1, wrap=None, build_parallel=None, bucket=False) -> tuple[list[str], int]:
    """Run ``steps`` training steps of the single-device model and of the parallelized
    one; ``in_layout`` says which piece of the input each rank is given, ``out_layout``
    what a plain output holds (a DTensor output is gathered).

    ``dp > 1``: a (dp, tp) mesh; the model is parallelized on ``mesh["tp"]`` and each dp
    rank gets its ``torch.chunk`` of the batch (dim 0), while the single-device model sees
    the whole batch.  ``wrap(model, mesh)`` returns what is called instead of the model
    (DistributedDataParallel, torch.compile, ...): gradients are read from the model.
    ``build_parallel(ref, mesh)`` makes the parallel model another way than
    ``parallelize(deepcopy(ref), mesh)`` (the meta-device recipe, say).  ``bucket``: the partial
    gradients (sequence-parallel norms) in one bucket, made whole by the optimizer's step
    (``bucket_partial_grads(model, opt)``): the gradients are then read after the step.
    """
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "tp")) if dp > 1 else \
        init_device_mesh("cpu", (world,))
    tp_mesh = mesh["tp"] if dp > 1 else mesh
    dp_rank = mesh.get_local_rank("dp") if dp > 1 else 0
    check = Checker(f"{label} [{dtype}]")

    def mine(full):  # this rank's rows of the batch, then its tensor-parallel piece
        return chunk(full, 0, dp, dp_rank) if dp > 1 else full

    for opt_name in optimizers:
        torch.manual_seed(seed)
        ref = build().to(dtype)
        if build_parallel is None:
            model = copy.deepcopy(ref)
            parallelize(model, tp_mesh)
        else:
            model = build_parallel(ref, tp_mesh)
        runner = wrap(model, mesh) if wrap is not None else model
        make_opt = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
                    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1)}[opt_name]
        opt_ref, opt_tp = make_opt(ref.parameters()), make_opt(model.parameters())
        handle = bucket_partial_grads(model, opt_tp) if bucket else None
        for step in range(steps):
            g = torch.Generator().manual_seed(1000 + step)
            x = make_input(g, dtype)
            x_ref = x.clone().requires_grad_(input_grad and x.is_floating_point())
            x_tp = piece(mine(x), in_layout, tp_mesh).clone().requires_grad_(input_grad and x.is_floating_point())
            out_ref = ref(x_ref)
            out = runner(x_tp)
            weights = torch.randn(out_ref.shape, generator=g, dtype=out_ref.dtype)
            if loss_of is None:  # <out, weights>: every element of the output matters
                loss_ref = (out_ref * weights).sum()
                local = out.to_local() if isinstance(out, DTensor) else out
                layout = out.placements[0] if isinstance(out, DTensor) else out_layout
                loss = dp * (local * piece(mine(weights), layout, tp_mesh)).sum()  # DDP averages over dp
            else:  # a mean over the batch: the mean of equal dp slices' means
                loss_ref, loss = loss_of(out_ref), loss_of(out)
                mean = loss.detach().clone()
                if dp > 1:
                    dist.all_reduce(mean, group=mesh.get_group("dp"))  # test bookkeeping, not the model's
                    mean /= dp
                check(f"step {step} loss", _close(mean, loss_ref.detach(), dtype))
            full_out = out.full_tensor() if isinstance(out, DTensor) else out
            want_out = mine(out_ref) if isinstance(out, DTensor) else piece(mine(out_ref), out_layout, tp_mesh)
            check(f"step {step} output", _close(full_out.detach(), want_out.detach(), dtype))
            opt_ref.zero_grad()
            opt_tp.zero_grad()
            loss_ref.backward()
            loss.backward()
            if bucket:  # the norms' gradients were left to the bucket; whole from the step's pre-hook on
                check(f"step {step} norm gradients left to the bucket", handle.pending)
                opt_ref.step()
                opt_tp.step()
            got = full_grads(model)
            for name, p in ref.named_parameters():
                check(f"step {step} grad {name}", _close(got[name], p.grad, dtype))
            if x_ref.requires_grad:  # the local loss weighs this rank's rows dp times more
                want_grad = dp * piece(mine(x_ref.grad), in_layout, tp_mesh)
                check(f"step {step} input grad", _close(x_tp.grad, want_grad, dtype))
            if not bucket:
                opt_ref.step()
                opt_tp.step()
        state, want = full_state_dict(model), ref.state_dict()
        for name in want:
            check(f"{opt_name} weights {name} after {steps} steps", _close(state[name], want[name], dtype))
    return check.result()


# ---- the cases ---------------------------------------------------------------------

def _linear_input(g, dtype):
    return torch.randn(12, 10, generator=g, dtype=dtype)  # [batch 12, in 10]: 10 over 4 ranks is 3,3,3,1


def _ids(g, dtype):
    return torch.randint(0, 10, (12, 5), generator=g)  # vocab 10 (uneven), [12, 5] ids


class ScaledLinear(nn.Linear):
    """A Linear subclass with a forward of its own (linear in the layer's product, bias included)
    and a learnable gain of its own."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gain = nn.Parameter(torch.tensor(2.5))

    def forward(self, x):
        return super().forward(x) * self.gain - 0.5 * F.linear(x, self.weight)


class ScaledEmbedding(nn.Embedding):
    """Gemma's scaled word embedding, plus a learnable per-token shift: a function of a token's row."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.shift = nn.Parameter(torch.tensor(1.0))

    def forward(self, ids):
        return super().forward(ids) * self.embedding_dim ** 0.5 + self.shift


def style_cases():
    """(label, build, plan, make_input, in_layout, out_layout) for each style alone."""
    from tensorplay_edu.parallel import ColwiseParallel as C, RowwiseParallel as R
    from tensorplay_edu.parallel import parallelize_module

    cases = []
    for bias in (True, False):
        lin = lambda bias=bias: nn.Linear(10, 10, bias=bias)  # noqa: E731
        for style, inl, outl in [
            (C(), Replicate(), Shard(-1)), (C(use_local_output=False), Replicate(), None),
            (C(output_layouts=Replicate()), Replicate(), Replicate()), (C(output_layouts=Shard(0)), Replicate(), Shard(0)),
            (C(input_layouts=Shard(0)), Shard(0), Shard(-1)),
            (R(), Shard(-1), Replicate()), (R(input_layouts=Replicate()), Replicate(), Replicate()),
            (R(output_layouts=Shard(0)), Shard(-1), Shard(0)), (R(output_layouts=Shard(-1)), Shard(-1), Shard(-1)),
            (R(output_layouts=Shard(0), use_local_output=False), Shard(-1), None),
            (R(output_layouts=Partial(), use_local_output=False), Shard(-1), None),  # the bias: one addend
        ]:
            cases.append((f"Linear(bias={bias}) {style!r}", lin, lambda m, mesh, s=style: parallelize_module(m, mesh, s),
                          _linear_input, inl, outl or Replicate()))
    for style, outl, kw in [
        (C(), Shard(-1), {}), (C(output_layouts=Replicate()), Replicate(), {}), (C(use_local_output=False), None, {}),
        (R(input_layouts=Replicate()), Replicate(), {}), (R(input_layouts=Replicate(), output_layouts=Shard(1)), Shard(1), {}),
        (R(input_layouts=Replicate(), use_local_output=False), None, {}),
        (R(input_layouts=Replicate()), Replicate(), {"padding_idx": 3}),
    ]:
        emb = lambda kw=kw: nn.Embedding(10, 12, **kw)  # noqa: E731
        cases.append((f"Embedding({kw}) {style!r}", emb, lambda m, mesh, s=style: parallelize_module(m, mesh, s),
                      _ids, Replicate(), outl or Replicate()))
    for style, inl, outl in [(R(), Shard(-1), Replicate()), (R(output_layouts=Shard(0)), Shard(-1), Shard(0)),
                             (C(), Replicate(), Shard(-1))]:
        for bias in (True, False):  # a subclass's own forward runs (the style wraps it, does not replace it)
            cases.append((f"ScaledLinear(bias={bias}) {style!r}", lambda bias=bias: ScaledLinear(10, 10, bias=bias),
                          lambda m, mesh, s=style: parallelize_module(m, mesh, s), _linear_input, inl, outl))
    for style, outl in [(R(input_layouts=Replicate()), Replicate()), (C(), Shard(-1))]:
        cases.append((f"ScaledEmbedding {style!r}", lambda: ScaledEmbedding(10, 12, padding_idx=7),
                      lambda m, mesh, s=style: parallelize_module(m, mesh, s), _ids, Replicate(), outl))
    mlp = lambda: nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 10))  # noqa: E731
    cases.append(("MLP colwise -> rowwise", mlp, lambda m, mesh: parallelize_module(m, mesh, {"0": C(), "2": R()}),
                  _linear_input, Replicate(), Replicate()))
    cases.append(("MLP sequence-parallel edges", mlp,
                  lambda m, mesh: parallelize_module(m, mesh, {"0": C(input_layouts=Shard(0)), "2": R(output_layouts=Shard(0))}),
                  _linear_input, Shard(0), Shard(0)))
    return cases


def run_style_cases(dtype_name: str, first: int, last: int) -> tuple[list[str], int]:
    fails, n = [], 0
    for label, build, plan, make_input, inl, outl in style_cases()[first:last]:
        f, c = train_compare(label, build, plan, make_input, in_layout=inl, out_layout=outl,
                             dtype=getattr(torch, dtype_name), input_grad=make_input is not _ids)
        fails += f
        n += c
    return fails, n


def run_sequence_parallel(dtype_name: str) -> tuple[list[str], int]:
    """SequenceParallel on LayerNorm and RMSNorm, and PrepareModuleInput in front of a plain Linear."""
    from tensorplay_edu.models.llama import RMSNorm
    from tensorplay_edu.parallel import PrepareModuleInput, SequenceParallel, parallelize_module

    dtype = getattr(torch, dtype_name)
    seq_input = lambda g, dt: torch.randn(3, 12, 8, generator=g, dtype=dt)  # noqa: E731  [b, s, h]
    fails, n = [], 0
    for label, build, plan, outl in [
        ("LayerNorm SP", lambda: nn.LayerNorm(8), lambda m, mesh: parallelize_module(m, mesh, SequenceParallel()), None),
        ("RMSNorm SP local out", lambda: RMSNorm(8, 1e-5),
         lambda m, mesh: parallelize_module(m, mesh, SequenceParallel(use_local_output=True)), Shard(1)),
        ("PMI S(1)->R + Linear", lambda: nn.Linear(8, 4), lambda m, mesh: parallelize_module(
            m, mesh, PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate(), use_local_output=True)),
         Replicate()),
    ]:
        f, c = train_compare(label, build, plan, seq_input, in_layout=Shard(1), out_layout=outl or Replicate(), dtype=dtype)
        fails += f
        n += c
    return fails, n


def run_llama(plan: str, dtype_name: str, n_layers: int = 2, *, dp: int = 1, wrap: str | None = None,
              steps: int = 3, optimizers=("sgd", "adamw"), bucket: bool = False) -> tuple[list[str], int]:
    """The Llama under a plan against one process; ``wrap``: "ddp" (over mesh["dp"]),
    "compile", "compile-ddp", "checkpoint" (each block under torch.utils.checkpoint)."""
    from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama

    tp = dist.get_world_size() // dp
    args = ModelArgs(dim=48, n_layers=n_layers, n_heads=12, n_kv_heads=6 if tp != 4 else 4,
                     vocab_size=50, max_seq_len=24)
    tokens = lambda g, dt: torch.randint(0, 50, (2 * dp, 12), generator=g)  # noqa: E731
    labels = torch.randint(0, 50, (2 * dp, 12), generator=torch.Generator().manual_seed(5))

    def loss_of(logits):
        mine = labels if logits.shape[0] == labels.shape[0] else chunk(labels, 0, dp, dist.get_rank() // tp)
        with loss_context(plan if isinstance(logits, DTensor) else "vanilla"):
            return llama_loss(logits, mine)

    return train_compare(f"Llama {plan} {wrap or ''} dp={dp}", lambda: Transformer(args),
                         lambda m, mesh: parallelize_llama(m, mesh, plan), tokens, loss_of=loss_of,
                         dtype=getattr(torch, dtype_name), input_grad=False, dp=dp, wrap=WRAPS[wrap],
                         steps=steps, optimizers=optimizers, bucket=bucket)


def _ddp(model, mesh):
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(model, process_group=mesh.get_group("dp"))


def _checkpointed(model, mesh):
    """Every block's forward recomputed in backward (non-reentrant torch.utils.checkpoint)."""
    import functools
    from torch.utils.checkpoint import checkpoint
    for block in model.layers.values():
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return model


class _AsyncTP:
    """The model called with async TP on (the decomposed collectives are chosen in forward)."""

    def __init__(self, model, mesh):
        self.model, self.mesh = model, mesh

    def __call__(self, *args):
        from tensorplay_edu.async_tp import enable_async_tp

        with enable_async_tp(self.mesh):
            return self.model(*args)


WRAPS = {
    None: None, "ddp": _ddp, "checkpoint": _checkpointed, "async": _AsyncTP,
    "compile": lambda model, mesh: torch.compile(model),
    "compile-aot": lambda model, mesh: torch.compile(model, backend="aot_eager"),
    "compile-ddp": lambda model, mesh: torch.compile(_ddp(model, mesh), backend="aot_eager"),
}


def run_llama_with(apply, dtype_name: str = "float64", *, build_parallel=None, loss_plan: str = "vanilla",
                   label: str = "apply_tp", build=None, bucket: bool = False) -> tuple[list[str], int]:
    """The Llama (or ``build()``) made parallel by ``apply(model, mesh)`` (torchtitan's apply_tp), or by
    ``build_parallel(ref, mesh)``, trained against one process."""
    from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context

    args = ModelArgs(dim=48, n_layers=2, n_heads=12, vocab_size=50, max_seq_len=24)
    labels = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(5))

    def loss_of(logits):
        with loss_context(loss_plan if isinstance(logits, DTensor) else "vanilla"):
            return llama_loss(logits, labels)

    return train_compare(label, build or (lambda: Transformer(args)), apply,
                         lambda g, dt: torch.randint(0, 50, (2, 12), generator=g),
                         loss_of=loss_of, dtype=getattr(torch, dtype_name), input_grad=False,
                         build_parallel=build_parallel, bucket=bucket)

"""Rank code for async TP (tensorplay_edu.async_tp): the decomposed plan against the
synchronous one, the seed's way of switching it on, the timeline."""

from __future__ import annotations

import contextlib
import functools
import importlib

import torch
import torch.distributed as dist

from tensorplay_edu import CommDebugMode, init_device_mesh
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
from tensorplay_edu.async_tp import enable_async_tp
from tensorplay_edu.parallel.params import as_dtensor, param_layout
from tensorplay_edu.async_tp.timeline import Timeline

ARGS = ModelArgs(dim=48, n_layers=2, n_heads=12, vocab_size=50, max_seq_len=24)


def one_step(plan: str, mode: str, seq: int = 12, float8: bool = False) -> dict:
    """One training step (forward, loss, backward) under ``mode``: "sync", "async" (the context
    manager) or "seed" (torch._inductor.config._micro_pipeline_tp + enable_symm_mem_for_group)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Transformer(ARGS).double()
    if float8:
        from tensorplay_edu.float8 import convert_to_float8_training

        model = convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "output")
    model = parallelize_llama(model, mesh, plan, float8=float8)
    tokens = torch.randint(0, 50, (2, seq), generator=torch.Generator().manual_seed(1))
    switch = enable_async_tp(mesh) if mode == "async" else contextlib.nullcontext()
    inductor = importlib.import_module("torch._inductor.config")
    if mode == "seed":  # torchtitan's two lines
        from tensorplay_edu.async_tp import _GROUPS, enable_symm_mem_for_group

        inductor._micro_pipeline_tp = True
        enable_symm_mem_for_group(mesh.get_group().group_name)
    try:
        with switch, CommDebugMode() as comm, Timeline() as tl:
            with loss_context(plan):
                loss = llama_loss(model(tokens), tokens.roll(-1, 1))
            loss.backward()
    finally:
        if mode == "seed":
            inductor._micro_pipeline_tp = False
            _GROUPS.clear()
    grads = {n: (as_dtensor(p, p.grad).full_tensor() if param_layout(p) else p.grad) for n, p in model.named_parameters()}
    return {"loss": loss.detach(), "grads": grads, "forward": comm.get_comm_counts("forward"),
            "backward": comm.get_comm_counts("backward"), "bytes": comm.get_total_bytes(),
            "kinds": sorted({i.kind for i in tl.intervals}),
            "dtypes": sorted({(r.op, r.dtype) for r in comm.records if "matmul" in r.op})}


def seed_async(source: str | None) -> tuple[list[str], int]:
    """torchtitan's apply_tp with enable_async_tp=True (its import pointed here): the vanilla plan,
    nothing to decompose, trains like one device."""
    from rank_parallel import run_llama_with
    from tensorplay_edu.async_tp import _GROUPS

    from rank_parallelize_module import exec_apply_tp

    apply_tp = exec_apply_tp(source)
    try:
        return run_llama_with(lambda m, mesh: apply_tp(m, mesh, loss_parallel=False, enable_float8_tensorwise_tp=False,
                                                       enable_async_tp=True), label="apply_tp async")
    finally:
        importlib.import_module("torch._inductor.config")._micro_pipeline_tp = False
        _GROUPS.clear()


def uneven_rings() -> tuple[list[str], int]:
    """The two decomposed ops on 10 sequence rows over t ranks (4 ranks: 3, 3, 3, 1) against one
    process: outputs and every gradient."""
    from checks import Checker, chunk
    from tensorplay_edu.async_tp import GatherMatmul, MatmulReduceScatter
    from tensorplay_edu.placement import chunk_sizes

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 10, 8, generator=g, dtype=torch.float64, requires_grad=True)  # [b, s, h]
    w1, w2 = (torch.randn(6 * t, 8, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))  # [o, h]
    mine = [chunk(w.detach(), 0, t, r).clone().requires_grad_(True) for w in (w1, w2)]  # this rank's rows
    shard = chunk(x.detach(), 1, t, r).clone().requires_grad_(True)
    outs = GatherMatmul.apply(shard, mesh, 1, chunk_sizes(10, t), *mine)  # [b, s, o/t] each
    checker = Checker()
    check = functools.partial(checker.close, rtol=1e-12, atol=1e-13)

    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in (x @ w1.t(), x @ w2.t())]
    sum((x @ w.t() * c).sum() for w, c in zip((w1, w2), weights)).backward()
    sum((o * chunk(c, 2, t, r)).sum() for o, c in zip(outs, weights)).backward()
    for j, (o, w, m) in enumerate(zip(outs, (w1, w2), mine)):
        check(f"gather-matmul output {j}", o, chunk((x @ w.t()).detach(), 2, t, r))
        check(f"gather-matmul weight grad {j}", m.grad, chunk(w.grad, 0, t, r))
    check("gather-matmul input grad", shard.grad, chunk(x.grad, 1, t, r))
    # matmul -> reduce-scatter: features split over ranks, output rows scattered
    wf = torch.randn(5, 8 * t, generator=g, dtype=torch.float64, requires_grad=True)  # [out, in]
    xf = torch.randn(2, 10, 8 * t, generator=g, dtype=torch.float64, requires_grad=True)
    x_local = chunk(xf.detach(), 2, t, r).clone().requires_grad_(True)
    w_local = chunk(wf.detach(), 1, t, r).clone().requires_grad_(True)
    y = MatmulReduceScatter.apply(x_local, w_local, mesh, 1)  # [b, s/t, out]
    c = torch.randn(2, 10, 5, generator=g, dtype=torch.float64)
    ((xf @ wf.t()) * c).sum().backward()
    (y * chunk(c, 1, t, r)).sum().backward()
    check("matmul-scatter output", y, chunk((xf @ wf.t()).detach(), 1, t, r))
    check("matmul-scatter input grad", x_local.grad, chunk(xf.grad, 2, t, r))
    check("matmul-scatter weight grad", w_local.grad, chunk(wf.grad, 1, t, r))
    return checker.result()


# ---- where the ring is refused (issue 18) -------------------------------------------------------

class _Attn(torch.nn.Module):
    """wq, wk (colwise readers of one block input) -> wo (rowwise, sequence-sharded output)."""

    def __init__(self, h=8):
        super().__init__()
        self.wq, self.wk = torch.nn.Linear(h, 16, bias=False), torch.nn.Linear(h, 16, bias=False)
        self.wo = torch.nn.Linear(16, h, bias=False)

    def forward(self, x):
        return self.wo(torch.relu(self.wq(x)) * self.wk(x))


class _Block(torch.nn.Module):
    def __init__(self, h=8):
        super().__init__()
        self.norm, self.attn = torch.nn.LayerNorm(h), _Attn(h)

    def forward(self, x):
        return self.attn(self.norm(x))


def _sp_block(float8: bool):
    from tensorplay_edu import Replicate, Shard
    from tensorplay_edu.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    def plan(m, mesh):
        from tensorplay_edu.parallel import parallelize_module
        return parallelize_module(m, mesh, {
            "norm": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})

    def build():
        block = _Block()
        if float8:
            from tensorplay_edu.float8 import convert_to_float8_training
            block = convert_to_float8_training(block)
        return block
    return build, plan


def ring_edges(case: str) -> dict:
    """One forward and backward under async TP and synchronously, against one device: the values,
    whether a ring ran, and why not (the logged reason)."""
    import copy
    import logging

    from tensorplay_edu import DTensor, Shard, distribute_tensor
    from tensorplay_edu.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    torch.manual_seed(0)
    if case in ("row last dim", "col last dim"):  # a Linear on a feature-sharded input / output
        build = lambda: torch.nn.Linear(8, 6, bias=False)  # noqa: E731
        style = RowwiseParallel(output_layouts=Shard(-1)) if case == "row last dim" else \
            ColwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(-1))
        plan = lambda m, mesh: parallelize_module(m, mesh, style)  # noqa: E731
        x_full = torch.randn(2, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        make_input = lambda: x_full.chunk(t, -1)[r].clone().requires_grad_()  # noqa: E731
        local_input = True
    else:
        seq = {"uneven": 7 if t == 2 else 10, "no rows": t - 1, "float8 plain": 4 * t, "even": 4 * t}[case]
        build, plan = _sp_block(float8=case == "float8 plain")
        x_full = torch.randn(2, seq, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        make_input = lambda: distribute_tensor(x_full, mesh, [Shard(1)]).requires_grad_()  # noqa: E731
        local_input = False
    ref = build().double()
    x_ref = x_full.clone().requires_grad_()
    g_full = torch.randn(ref(x_ref).shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (ref(x_ref) * g_full).sum().backward()
    out = {}
    for mode in ("sync", "async"):
        model = plan(copy.deepcopy(ref), mesh)
        x = make_input()
        seen = []
        handler = logging.Handler()
        handler.emit = lambda record: seen.append(record.getMessage())
        logger = logging.getLogger("tensorplay_edu.async_tp")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            with (enable_async_tp(mesh) if mode == "async" else contextlib.nullcontext()), CommDebugMode() as comm:
                y = model(x)
                y_full = y.full_tensor() if isinstance(y, DTensor) else torch.cat(
                    [torch.empty_like(y) for _ in range(t)], -1)
                if not isinstance(y, DTensor):
                    pieces = [torch.empty_like(y) for _ in range(t)]
                    dist.all_gather(pieces, y.detach().contiguous())
                    y_full = torch.cat(pieces, -1)
                g = g_full.chunk(t, -1)[r] if not isinstance(y, DTensor) else \
                    g_full.narrow(1, *_rows_of(g_full.shape[1], t, r))
                (y.to_local() if isinstance(y, DTensor) else y).backward(g)
        finally:
            logger.removeHandler(handler)
        grad_x = x.grad if local_input else x.grad.full_tensor() if isinstance(x.grad, DTensor) else x._local.grad
        out[mode] = {"y": float((y_full - ref(x_full)).abs().max()),
                     "rings": sorted({rec.op for rec in comm.records if "matmul" in rec.op}),
                     "why": seen, "grads": {n: _full_grad(p) for n, p in model.named_parameters()},
                     "grad x": grad_x.detach().clone()}
    out["ref grads"] = {n: p.grad for n, p in ref.named_parameters()}
    out["ref grad x"] = x_ref.grad if not local_input else x_ref.grad.chunk(t, -1)[r]
    return out


def _rows_of(n, t, r):
    from tensorplay_edu.placement import chunk_offset, chunk_sizes
    return chunk_offset(n, t, r), chunk_sizes(n, t)[r]


def _full_grad(p):
    return as_dtensor(p, p.grad).full_tensor() if param_layout(p) is not None else p.grad

"""Rank code for tests/test_training_loops.py, ordinary training-loop habits: inference mode,
dropout masks per rank or shared, activation checkpointing of a region with dropout, FSDP2 over
mesh["dp"].  (DDP, torch.compile and checkpointing of whole plans go through rank_parallel.train_compare.)"""

from __future__ import annotations

import copy
import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from checks import Checker, chunk, gather_all
from tensorplay_edu import DTensor, init_device_mesh
from tensorplay_edu.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module


def inference(plan: str) -> tuple[list[str], int]:
    """Forward only, under inference_mode and no_grad: equal to one process."""
    from tensorplay_edu.models import ModelArgs, Transformer, parallelize_llama

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checker()
    torch.manual_seed(0)
    ref = Transformer(ModelArgs(dim=48, n_layers=2, n_heads=12, vocab_size=50, max_seq_len=24)).double()
    model = parallelize_llama(copy.deepcopy(ref), mesh, plan)
    mlp_ref = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 10)).double()
    mlp = parallelize_module(copy.deepcopy(mlp_ref), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    for label, mode in (("inference_mode", torch.inference_mode), ("no_grad", torch.no_grad)):
        with mode():  # the input made inside, as a serving loop does (an inference tensor)
            x = torch.randn(5, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
            logits = model(tokens)
            logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
            want = ref(tokens)
            y, y_ref = mlp(x), mlp_ref(x)
        for what, got, exp in ((f"{plan} logits", logits, want), ("MLP", y, y_ref)):
            check(f"{label} {what}: differs by {(got - exp).abs().max():.2e}",
                  torch.allclose(got, exp, rtol=1e-10, atol=1e-12))
    return check.result()


def dropout_masks() -> tuple[list[str], int]:
    """Sequence-parallel dropout: a mask of its own on each rank; replicated dropout: one mask."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t = mesh.size()
    check = Checker()
    torch.manual_seed(11)  # the same default stream on every rank
    sp = parallelize_module(nn.Dropout(0.5), mesh, SequenceParallel(use_local_output=True))
    ones = torch.ones(2, 8, 64, dtype=torch.float64)  # [b, s/t, h]: this rank's tokens
    masks = gather_all(sp(ones) != 0)
    kept = float(masks[0].double().mean())
    check(f"SP dropout keeps about half: {kept:.3f}", 0.4 < kept < 0.6)
    for r in range(1, t):
        check(f"SP dropout: rank {r}'s mask equals rank 0's", not torch.equal(masks[r], masks[0]))
    states = gather_all(torch.get_rng_state())
    check("the default generator stays in step on every rank", all(torch.equal(s, states[0]) for s in states))
    # replicated region: activations after an all-reduce, a plain Dropout: the same mask everywhere
    torch.manual_seed(12)
    net = parallelize_module(nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16), nn.Dropout(0.5)).double(), mesh,
                             {"0": ColwiseParallel(), "1": RowwiseParallel()})
    out = gather_all(net(torch.randn(4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))))
    check("replicated dropout: the same output on every rank", all(torch.equal(o, out[0]) for o in out))
    # eval mode, or no dropout inside: the default generator is not touched at all
    before = torch.get_rng_state()
    sp.eval()
    check("eval: the output is the input", torch.equal(sp(ones), ones))
    norm = parallelize_module(nn.LayerNorm(64).double(), mesh, SequenceParallel(use_local_output=True)).eval()
    norm(ones)  # (in training mode every sharded region reseeds the generator: rng.py)
    check("eval SP dropout and SP LayerNorm draw no random numbers", torch.equal(torch.get_rng_state(), before))
    return check.result()


def checkpointed_dropout() -> tuple[list[str], int]:
    """A sequence-parallel region with dropout under torch.utils.checkpoint recomputes the same
    masks: outputs and gradients equal the run without checkpointing."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), mesh.get_local_rank()
    torch.manual_seed(0)
    block = nn.Sequential(nn.LayerNorm(16), nn.Dropout(0.3)).double()
    block = parallelize_module(block, mesh, SequenceParallel(use_local_output=True))
    x_full = torch.randn(2, 4 * t, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    w = chunk(torch.randn(x_full.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5)), 1, t, r)
    runs = []
    for use_checkpoint in (False, True):
        block.zero_grad()
        x = chunk(x_full, 1, t, r).clone().requires_grad_(True)
        torch.manual_seed(21)
        y = checkpoint(block, x, use_reentrant=False) if use_checkpoint else block(x)
        (y * w).sum().backward()
        runs.append((y.detach(), x.grad, block[0].weight.grad.clone(), block[0].bias.grad.clone()))
    fails = [f"checkpointed {what} differs" for what, a, b in zip(("output", "input grad", "weight grad", "bias grad"),
                                                                   *runs) if not torch.equal(a, b)]
    return fails, 4



def fsdp2_over_dp(plan: str, steps: int = 3, bucket: bool = False, micro: int = 1, keep_unsharded: bool = False
                  ) -> tuple[list[str], int]:
    """PyTorch's FSDP2 (fully_shard) over mesh["dp"] of a (dp, tp) mesh, on the model parallelized
    over mesh["tp"]: losses, gradient norms, every clipped gradient, weights after AdamW steps, and
    the state-dict round trip against one process on the whole batch.  ``bucket``: the norms'
    partial gradients in one bucket (bucket_partial_grads), made whole by clip_grad_norm_.
    ``micro > 1``: FSDP2's gradient accumulation, ``micro`` backwards a step; all but the last with
    ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)`` (no reduce-scatter,
    no new all-gather between micro-batches).  ``keep_unsharded``: ``set_reshard_after_backward(False)``
    throughout, so the modules hold the unsharded parameters while clip_grad_norm_ (the bucket's
    finalize()) runs; they are resharded after each optimizer step (else the next forward would reuse
    the stale unsharded weights)."""
    from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh
    from torch.distributed.fsdp import fully_shard

    from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
    from tensorplay_edu.parallel import attach_layouts, clip_grad_norm_, full_state_dict, load_full_state_dict
    from tensorplay_edu.parallel.params import as_dtensor, param_layout

    world = dist.get_world_size()
    dp = 2
    mesh = init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "tp"))
    torch_dp = TorchDeviceMesh.from_group(mesh.get_group("dp"), "cpu")  # FSDP2 takes PyTorch's mesh
    torch.manual_seed(0)
    ref = Transformer(ModelArgs(dim=32, n_layers=2, n_heads=4, vocab_size=40, max_seq_len=16)).double()
    model = parallelize_llama(copy.deepcopy(ref), mesh["tp"], plan)
    for block in model.layers.values():
        fully_shard(block, mesh=torch_dp)
    fully_shard(model, mesh=torch_dp)
    fsdp_modules = (*model.layers.values(), model)
    for module in fsdp_modules if keep_unsharded else ():
        module.set_reshard_after_backward(False)
    attach_layouts(model)  # fully_shard made new parameters: give them their tensor-parallel layouts again
    # the sharded parameters, where FSDP2 leaves the gradients (after a backward without resharding the
    # module holds the unsharded ones, whose .grad is None: clip and read these, as the optimizer does)
    named = list(model.named_parameters())
    opt, opt_ref = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, ref))
    if bucket:
        from tensorplay_edu.parallel import bucket_partial_grads
        bucket_partial_grads(model, opt)
    tokens = torch.randint(0, 40, (2 * dp, 8), generator=torch.Generator().manual_seed(1))
    mine = chunk(tokens, 0, dp, mesh.get_local_rank("dp"))
    check = Checker(f"FSDP2 {plan} bucket={bucket} micro={micro} keep_unsharded={keep_unsharded}")
    close = functools.partial(check.close, rtol=1e-9, atol=1e-11)

    for step in range(steps):
        for i in range(micro):
            if micro > 1:  # a new batch each micro-batch; the last one reduce-scatters what accumulated
                tokens = torch.randint(0, 40, (2 * dp, 8), generator=torch.Generator().manual_seed(10 * step + i))
                mine = chunk(tokens, 0, dp, mesh.get_local_rank("dp"))
                for module in fsdp_modules:
                    module.set_requires_gradient_sync(i == micro - 1)
                    module.set_reshard_after_backward(i == micro - 1)
            with loss_context(plan):
                loss = llama_loss(model(mine), mine) / micro
            loss.backward()
            ref_loss = llama_loss(ref(tokens), tokens) / micro
            ref_loss.backward()
            mean = loss.detach().clone()
            dist.all_reduce(mean, group=mesh.get_group("dp"))  # test bookkeeping
            close(f"step {step} micro {i} loss", mean / dp, ref_loss.detach())
        if keep_unsharded:  # the case exercised: the module holds the unsharded parameter now
            check("the module holds its sharded parameter after backward",
                  model.norm._parameters["weight"] is not dict(named)["norm.weight"])
        close(f"step {step} gradient norm", clip_grad_norm_([p for _, p in named], 0.5),
              torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5))
        for (name, p), q in zip(named, ref.parameters()):
            grad = p.grad.full_tensor()  # FSDP2's gather over dp ...
            if param_layout(p) is not None:
                grad = as_dtensor(p, grad).full_tensor()  # ... then ours over tp
            close(f"step {step} grad {name}", grad, q.grad)
        for o in (opt, opt_ref):
            o.step()
            o.zero_grad()
        for module in fsdp_modules if keep_unsharded else ():
            module.reshard()  # the next forward gathers the stepped weights
    state = full_state_dict(model)
    for name, value in ref.state_dict().items():
        close(f"weights {name} after {steps} steps", state[name], value)
    load_full_state_dict(model, {k: torch.zeros_like(v) for k, v in state.items()})
    load_full_state_dict(model, state)
    again = full_state_dict(model)
    check("full_state_dict -> load_full_state_dict round trip", all(torch.equal(again[k], state[k]) for k in state))
    return check.result()

"""Bugs 5 and 6 of notebook 08b (label smoothing over the local vocabulary; a plan-key typo, under PyTorch's own
TP and with the entry skipped), as workers that notebook 08c runs again side by side.

Each worker runs on every rank under ``launch`` and returns plain values: the run with the bug and the run with
its fix, so that the notebook can measure both against one process.  08b teaches each bug step by step.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..dtensor import DTensor
from ..mesh import init_device_mesh
from ..models import ModelArgs, Transformer, llama_loss
from ..parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, loss_parallel,
                        parallelize_module)
from ..parallel.params import as_dtensor, param_layout
from ..placement import Replicate, Shard
from .bug_zoo_tp import f64, mine

EPS, V = 0.1, 12  # bug 5: label smoothing, vocabulary size


def logits_data():
    """Bug 5: logits [N, V] and labels [N]."""
    gen = torch.Generator().manual_seed(4)
    return torch.randn(6, V, generator=gen, dtype=f64), torch.randint(0, V, (6,), generator=gen)


def megatron_smoothing(nll, log_probs, eps):
    """Megatron-LM's smoothing, with its V read from the log-probs it is given (on a rank: its V/t classes)."""
    V_r = log_probs.shape[-1]  # Megatron: vocab_size = exp_logits.size(-1), the classes this rank holds
    s = eps * V_r / (V_r - 1)
    return ((1 - s) * nll - s * log_probs.mean(-1)).mean()


def smoothed_loss(fixed):
    """Bug 5: the smoothed loss on vocabulary-sharded logits, Megatron's formula on the local slice (the bug) or
    F.cross_entropy's label_smoothing under loss_parallel (the fix); the loss and this rank's logits gradient."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    logits, labels = logits_data()
    local = mine(logits, 1).clone().requires_grad_()  # [N, V/t]
    x = DTensor.from_local(local, mesh, [Shard(1)])  # vocabulary-sharded logits, global [N, V]
    with loss_parallel():
        if fixed:  # the global V, and the mean over all V classes, inside loss_parallel
            loss = F.cross_entropy(x, labels, label_smoothing=EPS * x.shape[1] / (x.shape[1] - 1))
        else:
            log_probs = F.log_softmax(x, dim=1)  # DTensor: true log-probs, this rank's classes
            nll = F.nll_loss(log_probs, labels, reduction="none")  # [N], exact (3 all-reduces)
            loss = megatron_smoothing(nll, log_probs.to_local(), EPS)  # V_r = V/t: the local slice
        loss.backward()  # inside loss_parallel, as PyTorch needs
    return {"loss": loss.item(), "grad": local.grad}


ARGS = ModelArgs(dim=32, n_layers=2, n_heads=4, vocab_size=64, max_seq_len=16)  # bug 6's small Llama


def error_or_none(fn):
    """The message of the RuntimeError ``fn()`` raises, or None."""
    try:
        fn()
    except RuntimeError as err:
        return str(err)
    return None


def error_of(fn):
    """The message of the RuntimeError ``fn()`` raises (an AssertionError if it raises none)."""
    message = error_or_none(fn)
    if message is None:
        raise AssertionError("no error")
    return message


def pytorch_typo_whole_plan(norm_key="attention_nrom"):
    """Bug 6 under PyTorch's TP on torchtitan's whole block plan (TP + SP) written with PyTorch's styles, with
    ``norm_key`` for "attention_norm": a forward, a backward, PyTorch's clipping and AdamW's foreach step.
    Returns the warnings, the names of the parameters left plain, and the two errors (None where none)."""
    import torch.distributed.tensor.parallel as tp  # PyTorch's styles (this also loads dist.device_mesh)
    model = Transformer(ARGS)
    block, t = model.layers["0"], dist.get_world_size()
    plan = block_plan(norm_key, pytorch=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tp.parallelize_module(block, dist.device_mesh.init_device_mesh("cpu", (t,)), plan)  # no exception
    block(torch.randn(2, 8 // t, ARGS.dim), (model.rope_cos, model.rope_sin)).sum().backward()  # this rank's tokens
    plain = [n for n, p in block.named_parameters() if type(p) is torch.nn.Parameter]
    clipped = error_or_none(lambda: torch.nn.utils.clip_grad_norm_(block.parameters(), 1.0))
    adamw = error_or_none(lambda: torch.optim.AdamW(block.parameters(), foreach=True).step())  # a GPU's default
    return [str(c.message) for c in caught], plain, clipped, adamw


def top_plan():
    """The model's plan outside the blocks (torchtitan's, TP + SP)."""
    return {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)}


def block_plan(norm_key, pytorch=False):
    """Each block's plan, torchtitan's (TP + SP), with ``norm_key`` for "attention_norm" (None: the entry left out);
    ``pytorch=True``: the same plan with PyTorch's classes (same names and arguments as ours)."""
    if pytorch:
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                       SequenceParallel)
    else:
        from ..parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel
        from ..placement import Replicate, Shard
    plan = {
        norm_key: SequenceParallel(), "ffn_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    plan.pop(None, None)  # norm_key=None: the entry PyTorch skipped
    return plan


def batch():
    """Bug 6's tokens [b, s] and labels (the tokens shifted by one)."""
    tokens = torch.randint(0, ARGS.vocab_size, (4, 16), generator=torch.Generator().manual_seed(1))
    return tokens, tokens.roll(-1, dims=1)


def one_step(norm_key):
    """Bug 6: one step of the small Llama under the plan with ``norm_key``; the loss and every whole gradient, or
    the error parallelize_module raised."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Transformer(ARGS).double()
    parallelize_module(model, mesh, top_plan())
    try:
        for block in model.layers.values():
            parallelize_module(block, mesh, block_plan(norm_key))
    except ValueError as err:
        return {"error": str(err)}
    tokens, labels = batch()
    with loss_parallel():
        loss = llama_loss(model(tokens), labels)  # logits: [b, s, vocab/t] on each rank
        loss.backward()
    grads = {n: p.grad if param_layout(p) is None else as_dtensor(p, p.grad).full_tensor()  # whole gradients
             for n, p in model.named_parameters()}
    return {"loss": loss.item(), "grads": grads}

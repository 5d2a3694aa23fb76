"""Qwen3 under plan_from_hf: its per-head q_norm / k_norm ("replicated_with_grad_allreduce" in its HF plan) stay
whole on every rank while each rank normalises its own heads, so their gradients are summed over the TP group
(parallel/replicated.py).  Two micro-batches accumulate per step, clip_grad_norm_ clips: the loss, every gradient,
the norm and every weight after 2 AdamW steps must equal one process (float64), at 2 and 3 ranks (the vocabulary
uneven), with and without loss_parallel.

Before, plan_from_hf refused the string; a hook that all-reduced .grad after accumulation (transformers' own
style) would have counted the first micro-batch's gradient t times."""

from __future__ import annotations

import contextlib

import transformers  # noqa: F401  (first, as most scripts do)

import pytest
import torch
import torch.distributed as dist

from checks import clean
from tensorplay_edu import CommDebugMode, init_device_mesh, launch
from tensorplay_edu.parallel import ReplicatedWithGradAllReduce, clip_grad_norm_, loss_parallel, parallelize_module
from tensorplay_edu.parallel.hf import plan_from_hf
import test_hf_models as hf_models
from test_hf_training import TIMEOUT, Checks, adamw, compare_grads_and_step, next_token_loss

VOCAB = hf_models.VOCAB  # 61: uneven over 2 and 3 ranks
N_PARAMS = 3 + 11 * 2  # embed_tokens, final norm, lm_head; per layer q, k, v, o, q_norm, k_norm, gate, up, down, 2 norms


def build(heads: int, seed: int = 0):
    """test_hf_models' small config as a Qwen3, its q_norm / k_norm weights moved off all ones so a wrong sum shows."""
    model = hf_models.build("Qwen3", heads, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.copy_(1 + 0.1 * torch.randn(p.shape, dtype=p.dtype))
    return model


def train(lp: bool, steps: int = 2, micro: int = 2) -> tuple[list[str], int]:
    """Rank code: ``steps`` steps of ``micro`` accumulated micro-batches, clipped, against one process."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    heads = 2 * mesh.size()
    check = Checks(f"Qwen3 TP {mesh.size()} lp={lp}")
    model, ref = build(heads), build(heads)
    plan = plan_from_hf(model, mesh=mesh, loss_parallel=lp)
    check("q_norm / k_norm under ReplicatedWithGradAllReduce",
          all(isinstance(plan[f"model.layers.{i}.self_attn.{n}"], ReplicatedWithGradAllReduce)
              for i in range(2) for n in ("q_norm", "k_norm")))
    parallelize_module(model, mesh, plan)
    opt, ref_opt = adamw(model.parameters()), adamw(ref.parameters())
    for s in range(steps):
        for m in range(micro):
            ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(100 + 10 * s + m))
            with CommDebugMode() as comm:
                with loss_parallel() if lp else contextlib.nullcontext():
                    loss = next_token_loss(model(ids).logits, ids) / micro
                    loss.backward()
            ref_loss = next_token_loss(ref(ids).logits, ids) / micro
            ref_loss.backward()
            check.close(f"step {s}.{m} loss", loss.detach(), ref_loss.detach())
            norms = [r for r in comm.records if r.phase == "backward" and r.module.endswith(("q_norm.weight", "k_norm.weight"))]
            check(f"step {s}.{m}: one backward all-reduce per q_norm / k_norm weight",
                  len(norms) == 4 and all(r.op == "all_reduce" for r in norms))
        check.close(f"step {s} gradient norm", clip_grad_norm_(model.parameters(), 1.0),
                    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0))
        compare_grads_and_step(check, f"step {s}", model, ref, opt, ref_opt)
    check.weights(f"after {steps} AdamW steps", model, ref)
    return check.result()


@pytest.mark.parametrize("world_size,lp", [(2, False), (3, True)], ids=["tp2", "tp3-loss_parallel"])
def test_qwen3_with_per_head_norms_trains_like_one_process(world_size, lp):
    clean(launch(train, world_size, lp, timeout=TIMEOUT), at_least=1 + 2 * (2 * 2 + 1 + N_PARAMS) + 1 + N_PARAMS)


def accumulate_under(style_name: str) -> list[float]:
    """Rank code: a weight [4] scaling this rank's own rows, two micro-batches accumulated, under our style or
    transformers' of the same name; the gradient error against the whole sum."""
    from transformers.distributed.tensor_parallel import ReplicatedWithGradAllReduce as HFStyle
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, r = mesh.size(), dist.get_rank()
    module = torch.nn.Module()
    module.weight = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    module.forward = lambda x: x * module.weight
    if style_name == "ours":
        parallelize_module(module, mesh, ReplicatedWithGradAllReduce())
    else:
        HFStyle().install_forward(module, mesh)
    whole = torch.zeros(4, dtype=torch.float64)
    for m in range(2):  # micro-batch m: rank r's rows of a [t, 4] batch
        x = torch.arange(4 * t, dtype=torch.float64).reshape(t, 4) + 10 * m
        module(x[r:r + 1]).sum().backward()
        whole += x.sum(0)
    return [(module.weight.grad - whole).abs().max().item()]


def test_gradient_accumulation_sums_each_micro_batch_once():
    """Ours: the whole gradient after two micro-batches. transformers' 5.25 hook all-reduces .grad after
    autograd added the second addend, so the first micro-batch's whole gradient is summed t times."""
    assert launch(accumulate_under, 2, "ours")[0] == [0.0]
    assert launch(accumulate_under, 2, "transformers")[0][0] > 1.0

"""Hugging Face models whose own code touches what the styles hand it, trained under plan_from_hf
against one process: Gemma and Gemma2 scale their (vocabulary-parallel) embedding by sqrt(h) in a
subclass's forward (GemmaTextScaledWordEmbedding); with loss_parallel, Gemma2 soft-caps the
class-sharded logits (tanh(x / c) * c), Granite divides them by a scale and Cohere multiplies them.

On main before issue 29 RowwiseParallel replaced the embedding's forward by a plain lookup (Gemma's
logits off by 0.3, Gemma2's by 0.24, no error), and the three logit ops raised a DTensor-op error.
Loss, every gradient and every weight after 2 AdamW steps must equal one process (float64)."""

from __future__ import annotations

import contextlib

import transformers  # noqa: F401  (first, as most scripts do)

import pytest
import torch
import torch.distributed as dist

from checks import clean
from tensorplay_edu import DTensor, init_device_mesh, launch
from tensorplay_edu.parallel import loss_parallel, parallelize_module
from tensorplay_edu.parallel.hf import plan_from_hf
from test_hf_training import TIMEOUT, Checks, adamw, compare_grads_and_step, next_token_loss

ARCHS = ("Gemma", "Gemma2", "Granite", "Cohere")
VOCAB = 61  # uneven over 2 and 3 ranks


def build(arch: str, heads: int, seed: int = 0):
    config = getattr(transformers, f"{arch}Config")(
        hidden_size=48, intermediate_size=98, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=heads // 2, head_dim=48 // heads, vocab_size=VOCAB, max_position_embeddings=32,
        use_cache=False, tie_word_embeddings=False, pad_token_id=1, bos_token_id=2, eos_token_id=3)
    torch.manual_seed(seed)
    return getattr(transformers, f"{arch}ForCausalLM")(config).double()


def train(arch: str, lp: bool, steps: int = 2) -> tuple[list[str], int]:
    """Rank code: ``steps`` AdamW steps of the parallel model and of one process, compared throughout."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    heads = 2 * mesh.size()
    check = Checks(f"{arch} TP {mesh.size()} lp={lp}")
    model, ref = build(arch, heads), build(arch, heads)
    parallelize_module(model, mesh, plan_from_hf(model, mesh=mesh, loss_parallel=lp))
    opt, ref_opt = adamw(model.parameters()), adamw(ref.parameters())
    for s in range(steps):
        ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(100 + s))
        with loss_parallel() if lp else contextlib.nullcontext():
            logits = model(ids).logits
            check(f"step {s}: the logits are a DTensor exactly when lp", isinstance(logits, DTensor) == lp)
            loss = next_token_loss(logits, ids)
        ref_logits = ref(ids).logits
        if not lp:
            check.close(f"step {s} logits", logits.detach(), ref_logits.detach())
        ref_loss = next_token_loss(ref_logits, ids)
        check.close(f"step {s} loss", loss.detach(), ref_loss.detach())
        loss.backward()
        ref_loss.backward()
        compare_grads_and_step(check, f"step {s}", model, ref, opt, ref_opt)
    check.weights(f"after {steps} AdamW steps", model, ref)
    return check.result()


def train_all(lp: bool) -> tuple[list[str], int]:
    fails, n = [], 0
    for arch in ARCHS:
        f, c = train(arch, lp)
        fails, n = fails + f, n + c
    return fails, n


@pytest.mark.parametrize("world_size,lp", [(2, False), (3, True)], ids=["tp2", "tp3-loss_parallel"])
def test_models_that_scale_their_embedding_or_logits_train_like_one_process(world_size, lp):
    clean(launch(train_all, world_size, lp, timeout=TIMEOUT), at_least=len(ARCHS) * 2 * 25)

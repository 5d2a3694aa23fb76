"""Hugging Face transformers' own Llama and Qwen2 under our styles, with HF's plan strings
mapped by tensorplay_edu.parallel.hf.plan_from_hf, against the same model on one process.

Models are built from small configs with a fixed seed (no weights are downloaded), in float64:
rtol/atol 1e-10 (the sums are split differently across ranks, nothing else changes); with HF's
own loss, which casts the logits to float32, rtol 1e-6 / atol 1e-7. Each check compares the
logits, the loss, every parameter's gradient (the pieces gathered) and the weights after 2 AdamW
steps (HF's own loss: one forward and backward, since AdamW's first step moves a weight by about
lr * sign(grad), and float32 rounding decides that sign where a gradient is near zero).
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers  # a requirement (requirements.txt): never skipped
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from checks import Checker, clean
from tensorplay_edu import CommDebugMode, DTensor, init_device_mesh, launch
from tensorplay_edu.parallel import (ColwiseParallel, RowwiseParallel, full_state_dict, loss_parallel,
                                     parallelize_module, param_layout)
from tensorplay_edu.parallel.hf import HF_STYLES, SP_REASON, hf_plan_strings, plan_from_hf
from tensorplay_edu.parallel.params import as_dtensor

TOL = {"float64": dict(rtol=1e-10, atol=1e-10), "hf_loss": dict(rtol=1e-6, atol=1e-7)}
VOCAB, BATCH, SEQ = 60, 2, 10


def build(kind: str = "llama", dtype: str = "float64", layers: int = 2, tie: bool = False):
    """A small HF model from a config, the same on every rank (seed 0). 12 query heads, 6 K/V heads:
    whole heads on 1, 2 and 3 ranks (and grouped-query attention)."""
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[kind]
    config = config_cls(hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=12,
                        num_key_value_heads=6, vocab_size=VOCAB, max_position_embeddings=32, use_cache=False,
                        tie_word_embeddings=tie)
    torch.manual_seed(0)
    return model_cls(config).to(getattr(torch, dtype))


def batch():
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return ids


def next_token_loss(logits, ids):
    """Cross-entropy of each token predicting the next (HF's shift: the last position ignored). Works on
    a vocabulary-sharded DTensor under loss_parallel(): the labels move, the logits are not sliced."""
    labels = F.pad(ids[:, 1:], (0, 1), value=-100)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def step_loss(model, ids, lp: bool, hf_loss: bool):
    """(logits, loss) of one forward; ``hf_loss``: the model's own loss (``labels=``)."""
    with loss_parallel() if lp else contextlib.nullcontext():
        if hf_loss:
            out = model(ids, labels=ids)
            return out.logits, out.loss
        logits = model(ids).logits
        return logits, next_token_loss(logits, ids)


def whole(param, value):
    """The single-device tensor of a parameter-shaped ``value`` (this rank's piece of a split one)."""
    return value if param_layout(param) is None else as_dtensor(param, value).full_tensor()


def compare(kind: str, dtype: str, lp: bool, hf_loss: bool = False, tie: bool = False):
    """Rank code: the parallelized model against one process. Returns (failures, number of checks)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    tol = TOL["hf_loss" if hf_loss else dtype]
    ref, model = build(kind, dtype, tie=tie), build(kind, dtype, tie=tie)
    parallelize_module(model, mesh, plan_from_hf(model, mesh=mesh, loss_parallel=lp))
    check = Checker(f"{kind} {dtype} lp={lp} hf_loss={hf_loss} tie={tie}")
    close = functools.partial(check.close, **tol)

    ids = batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(2):
        logits, loss = step_loss(model, ids, lp, hf_loss)
        ref_logits, ref_loss = step_loss(ref, ids, False, hf_loss)
        if lp != isinstance(logits, DTensor):  # not counted as a check
            check.fails.append(f"loss_parallel={lp} but the logits are a {type(logits).__name__}")
        close(f"step {step} logits", logits.full_tensor() if isinstance(logits, DTensor) else logits, ref_logits)
        close(f"step {step} loss", loss.detach(), ref_loss.detach())
        opt.zero_grad()
        ref_opt.zero_grad()
        loss.backward()
        ref_loss.backward()
        ref_params = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            close(f"step {step} grad {name}", whole(p, p.grad), ref_params[name].grad)
        if hf_loss:  # float32 rounding of the loss, not TP, would then decide AdamW's step on near-zero gradients
            return check.result()
        opt.step()
        ref_opt.step()
    ref_state = ref.state_dict()
    for name, value in full_state_dict(model).items():
        close(f"weight after 2 AdamW steps: {name}", value, ref_state[name])
    if tie:
        check("tied lm_head / embed_tokens stayed one parameter", model.lm_head.weight is model.model.embed_tokens.weight)
    return check.result()


def forward_counts(layers: int, lp: bool) -> dict:
    """Rank code: the collectives of one forward + loss + backward (Llama, float32)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = build("llama", "float32", layers=layers)
    parallelize_module(model, mesh, plan_from_hf(model, loss_parallel=lp))
    with CommDebugMode() as comm:
        _, loss = step_loss(model, batch(), lp, hf_loss=False)
        loss.backward()
    return {"forward": comm.get_comm_counts("forward"), "backward": comm.get_comm_counts("backward")}


# 2 layers: 2 x 9 + 3 parameters; 2 steps x (2 + 21) checks + 21 weights
CHECKS = 2 * (2 + 21) + 21


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("lp", [False, True], ids=["vanilla", "loss_parallel"])
def test_llama_equals_one_process_float64(world_size, lp):
    clean(launch(compare, world_size, "llama", "float64", lp), at_least=CHECKS)


@pytest.mark.parametrize("world_size", [2, 3])
def test_qwen2_equals_one_process_float64(world_size):
    """Qwen2: q/k/v have biases (colwise: split with the rows), o_proj none."""
    for lp in (False, True):
        clean(launch(compare, world_size, "qwen2", "float64", lp), at_least=2 * (2 + 27) + 27)


@pytest.mark.parametrize("lp", [False, True], ids=["vanilla", "loss_parallel"])
def test_llama_with_hf_own_loss(lp):
    """The model's own loss (model(ids, labels=ids): HF's cross-entropy on the shifted labels, in
    float32) runs on the vocabulary-sharded logits under loss_parallel() too."""
    clean(launch(compare, 2, "llama", "float64", lp, True), at_least=2 + 21)


def test_tied_embeddings_stay_tied():
    """tie_word_embeddings=True: embed_tokens (embedding_rowwise) and lm_head (colwise) both hold
    [V/t, h] rows on Shard(0): one parameter, whose gradient sums both uses, as on one device."""
    clean(launch(compare, 2, "llama", "float64", True, False, True), at_least=2 * (2 + 20) + 20)


def test_collectives_of_one_step():
    """Forward: embed_tokens + o_proj and down_proj of each layer all-reduce (2L + 1), lm_head
    all-gathers the logits. Backward: each colwise Linear reads a plain tensor, so each pays
    its own input-gradient all-reduce: q, k, v, gate, up per layer and lm_head (5L + 1)."""
    L = 3
    vanilla = launch(forward_counts, 2, L, False)[0]
    assert vanilla["forward"] == {"all_reduce": 2 * L + 1, "all_gather": 1}
    assert vanilla["backward"] == {"all_reduce": 5 * L + 1}
    lp = launch(forward_counts, 2, L, True)[0]
    assert lp["forward"].get("all_gather", 0) == 0  # the logits are never gathered
    assert lp["backward"] == {"all_reduce": 5 * L + 1}


def test_plan_strings_and_styles():
    model = build("llama", "float32")
    strings = hf_plan_strings(model)
    assert strings["model.layers.*.self_attn.q_proj"] == "colwise"
    assert strings["model.layers.*.self_attn.o_proj"] == "rowwise"
    assert strings["lm_head"] in ("colwise_rep", "colwise_gather_output")
    plan = plan_from_hf(model)
    assert sorted(plan) == sorted(
        ["lm_head"] + (["model.embed_tokens"] if "model.embed_tokens" in strings else [])
        + [f"model.layers.{i}.{m}" for i in range(2) for m in
           ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")])
    assert type(plan["model.layers.1.mlp.down_proj"]) is RowwiseParallel
    assert type(plan["model.layers.0.self_attn.k_proj"]) is ColwiseParallel
    lp = plan_from_hf(model, loss_parallel=True)["lm_head"]
    assert lp.use_local_output is False and repr(lp.output_layouts) == "(Shard(dim=-1),)"
    assert set(HF_STYLES) >= {"colwise", "rowwise", "colwise_rep", "rowwise_rep", "embedding_rowwise"}


def test_unknown_string_is_an_error_naming_module_and_string():
    model = build("llama", "float32")
    model.config.base_model_tp_plan = {**model.config.base_model_tp_plan, "layers.*.mlp.up_proj": "packed_colwise"}
    with pytest.raises(ValueError) as err:
        plan_from_hf(model)
    msg = str(err.value)
    assert "'packed_colwise'" in msg and "model.layers.*.mlp.up_proj" in msg and "'colwise'" in msg, msg


def test_sequence_parallel_is_refused_with_the_reason():
    model = build("llama", "float32")
    for call in (lambda: plan_from_hf(model, sequence_parallel=True),
                 lambda: (setattr(model.config, "base_model_tp_plan",
                                  {**model.config.base_model_tp_plan, "norm": "sequence_parallel"}),
                          plan_from_hf(model))):
        with pytest.raises(ValueError) as err:
            call()
        assert SP_REASON in str(err.value)
    assert "position_ids" in SP_REASON and "causal mask" in SP_REASON
    assert "model.layers.0" in SP_REASON  # the split notebook 12b runs, with nothing passed by the caller
    assert "only the caller can check" in SP_REASON  # why the package does not emit that split itself


def test_heads_that_do_not_divide_are_an_error():
    model = build("llama", "float32")

    class Mesh:  # only its size is read
        def size(self):
            return 4

    with pytest.raises(ValueError, match=r"num_key_value_heads = 6 does not divide by the TP degree 4 \(the mesh"):
        plan_from_hf(model, mesh=Mesh())


def test_transformers_version_is_the_pinned_one():
    major = int(transformers.__version__.split(".")[0])
    assert major == 5, transformers.__version__

"""Each HF tp_plan string that plan_from_hf maps means what transformers 5 means by it
(transformers/distributed/tensor_parallel.py, ALL_PARALLEL_STYLES), and gives the single-device
answer: the strings that HF's Llama does not use (colwise_rep, colwise_gather_output, rowwise_rep,
rowwise_split_input, embedding_colwise) on a small embed -> Linear -> ReLU -> Linear model, at 2 and
3 ranks (uneven shards at 3). Plus the head counts checked when the plan is applied without mesh=."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES

import rank_hf_strings
from tensorplay_edu import Replicate, launch
from tensorplay_edu.parallel.hf import HF_STYLES

V, H, F = rank_hf_strings.V, rank_hf_strings.H, rank_hf_strings.F


def _placement(p) -> tuple:
    """A placement of ours or of torch (HF's): its kind and dim, comparable across the two."""
    return type(p).__name__, getattr(p, "dim", None)


def _hf_meaning(s: str) -> dict:
    """What HF's registered style for ``s`` does: the weight's sharded dim, its input and output layouts."""
    hf = ALL_PARALLEL_STYLES[s]
    kind = type(hf).__name__
    if kind == "EmbeddingParallel":  # ids replicated in, the lookup summed or gathered to Replicate out
        return {"weight dim": hf.shard_dim, "in": ("Replicate", None), "out": ("Replicate", None)}
    assert kind in ("ColwiseParallel", "RowwiseParallel"), kind
    return {"weight dim": 0 if kind == "ColwiseParallel" else 1, "in": _placement(hf.input_layouts),
            "out": _placement(hf.output_layouts)}


@pytest.mark.parametrize("s", [s for s, make in HF_STYLES.items() if make is not None])
def test_each_string_means_what_transformers_means(s):
    ours = HF_STYLES[s]()
    if s == "replicated_with_grad_allreduce":  # no layouts: the weight whole, its gradient summed (test_hf_qwen3.py)
        assert type(ALL_PARALLEL_STYLES[s]).__name__ == type(ours).__name__
        norm = nn.RMSNorm(H)
        assert set(ours.param_placements(norm).values()) == {Replicate()}, ours
        return
    want = _hf_meaning(s)
    module = nn.Embedding(V, H) if s.startswith("embedding") else nn.Linear(H, F)
    (dim_of,) = [p for (_, name), p in ours.param_placements(module).items() if name == "weight"]
    assert dim_of.dim % 2 == want["weight dim"], (s, dim_of)
    assert _placement(ours.input_layouts[0]) == want["in"], (s, ours)
    assert _placement(ours.output_layouts[0]) == want["out"], (s, ours)
    assert ours.use_local_output


@pytest.mark.parametrize("world_size", [2, 3])
def test_each_string_gives_the_single_device_answer(world_size):
    for rank, sets in enumerate(launch(rank_hf_strings.every_set, world_size)):
        for strings, got in sets.items():
            y, y_ref = got["y"]
            torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12, msg=lambda m: f"{strings} rank {rank}: {m}")
            for name, (g, g_ref) in got["grads"].items():
                torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12,
                                           msg=lambda m: f"{strings} rank {rank}, grad of {name}: {m}")
            want = {module: _hf_meaning(s)["weight dim"] for module, s in zip(("embed", "fc", "proj"), strings)}
            assert got["weight dims"] == want, (strings, got["weight dims"])
    assert {s for strings in rank_hf_strings.STRING_SETS for s in strings} >= \
        {"colwise_rep", "colwise_gather_output", "rowwise_rep", "rowwise_split_input", "embedding_colwise"}


def test_heads_that_do_not_divide_fail_when_the_plan_is_applied():
    """Without mesh=, plan_from_hf cannot know the TP degree: its styles check the head counts when
    parallelize_module applies them, before the first one shards anything (not HF's shape error later)."""
    for message in launch(rank_hf_strings.heads, 3):
        assert message.startswith("LlamaForCausalLM: config.num_key_value_heads = 4 does not divide by the TP "
                                  "degree 3"), message
        assert "Use a TP mesh whose size divides 4 (1, 2, 4)" in message and "SHARDED" not in message, message

"""Rank code for tests/test_hf_strings.py: HF's rarer tp_plan strings on a small model against one
process, and a plan made without mesh= applied to heads the TP degree does not divide. Kept apart from
the test module so that the ranks import transformers only where a case needs it."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

from tensorplay_edu import init_device_mesh
from tensorplay_edu.parallel import parallelize_module, param_layout
from tensorplay_edu.parallel.hf import plan_from_hf
from tensorplay_edu.parallel.params import as_dtensor

V, H, F = 11, 8, 10  # vocabulary, hidden, inner width: uneven on 3 ranks
STRING_SETS = [("embedding_colwise", "colwise_rep", "rowwise_rep"),  # (embed, fc, proj)
               ("embedding_rowwise", "colwise_gather_output", "rowwise_split_input")]


class Toy(nn.Module):
    """embed -> fc -> ReLU -> proj, float64, the same on every rank; ``config`` carries HF's strings."""

    def __init__(self, strings):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.fc, self.proj = nn.Embedding(V, H), nn.Linear(H, F), nn.Linear(F, H)
        self.config = SimpleNamespace(base_model_tp_plan=dict(zip(("embed", "fc", "proj"), strings)))
        self.double()

    def forward(self, ids):
        return self.proj(torch.relu(self.fc(self.embed(ids))))


def one_set(strings) -> dict:
    """The Toy under plan_from_hf against the Toy on one process: output, gradients, weights' sharded dims."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    ref, model = Toy(strings), Toy(strings)
    parallelize_module(model, mesh, plan_from_hf(model))
    ids = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(1))
    y, y_ref = model(ids), ref(ids)
    w = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (y * w).sum().backward()
    (y_ref * w).sum().backward()
    ref_params = dict(ref.named_parameters())
    layouts = {n: param_layout(p) for n, p in model.named_parameters()}
    return {"y": (y, y_ref),
            "grads": {n: (p.grad if layouts[n] is None else as_dtensor(p, p.grad).full_tensor(), ref_params[n].grad)
                      for n, p in model.named_parameters()},
            "weight dims": {n.split(".")[0]: layouts[n].placements[0].dim % 2 for n in layouts if n.endswith("weight")}}


def every_set() -> dict:
    return {strings: one_set(strings) for strings in STRING_SETS}


def heads() -> str:
    """A plan made without mesh=, applied on 3 ranks to 12 query and 4 K/V heads: the error (and whether
    anything was sharded before it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=12,
                         num_key_value_heads=4, vocab_size=60, max_position_embeddings=32, use_cache=False)
    model = LlamaForCausalLM(config)
    try:
        parallelize_module(model, init_device_mesh("cpu", (dist.get_world_size(),)), plan_from_hf(model))
    except ValueError as err:
        untouched = all(param_layout(p) is None for p in model.parameters())
        return str(err) + ("" if untouched else " [BUT PARAMETERS WERE SHARDED]")
    return "no error"

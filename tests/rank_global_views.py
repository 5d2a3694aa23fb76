"""Rank code for the global views of a tensor-parallel piece (docs/global_views.md): a plain
opt.state_dict() through DCP, state_dict(keep_vars=True) and prefixes, torch.save / torch.load
across ranks, torch.nn.init on indexed views of a piece (and HF's padding row), HF's
save_pretrained, copy.deepcopy; each against one process."""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from checks import Checker
from rank_dcp import ARGS, TOL, build, reference, snapshot, train
from tensorplay_edu import Replicate, init_device_mesh
from tensorplay_edu.models import Transformer
from tensorplay_edu.parallel import ColwiseParallel, RowwiseParallel, full_state_dict, parallelize_module
from tensorplay_edu.parallel.piece import Piece


def _same(check: Checker, now: dict, saved: dict, what: str) -> None:
    for part in ("model", "optim"):
        check(f"{what}: {part} keys", now[part].keys() == saved[part].keys())
        for key in now[part].keys() & saved[part].keys():
            if now[part][key] != saved[part][key]:
                diff = (torch.tensor(now[part][key]) - torch.tensor(saved[part][key])).abs().max().item()
                check(f"{what}: {part} {key} restored (max diff {diff:.3g})", False)
            else:
                check(f"{what}: {part} {key}", True)


def _plain_load(model, opt, path: str) -> None:
    """What a user writes: sd = {model, optim state dicts}; dcp.load(sd); load both."""
    sd = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(sd, checkpoint_id=path)
    model.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])


def _trained_on(check: Checker, model, opt, plan: str, steps: int, more: int, what: str) -> None:
    train(model, opt, plan, range(steps, steps + more))
    ref, got = reference(steps + more), full_state_dict(model)
    worst = max((got[k] - v).abs().max().item() for k, v in ref.state_dict().items())
    check(f"{what}: {more} steps after resuming == one process (max diff {worst:.3g})",
          all(torch.allclose(got[k], v, **TOL) for k, v in ref.state_dict().items()))


def plain_optimizer_save(path: str, plan: str) -> tuple[dict, list[str], int]:
    """dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}) after 2 steps; train on 1
    step, load the checkpoint into the same model and optimizer, train 2 steps: one process's 4."""
    model, _, opt, _ = build(plan)
    train(model, opt, plan, range(2))
    dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=path)
    saved = snapshot(model, opt)
    check = Checker()
    train(model, opt, plan, range(2, 3))
    _plain_load(model, opt, path)
    _same(check, snapshot(model, opt), saved, "rolled back")
    _trained_on(check, model, opt, plan, 2, 2, "rolled back")
    return (saved if dist.get_rank() == 0 else {}), *check.result()


def plain_optimizer_resume(path: str, saved: dict, plan: str) -> tuple[list[str], int]:
    """Another TP degree: a model of another seed, one step taken (DCP loads into existing state)."""
    model, _, opt, _ = build(plan, seed=1)
    train(model, opt, plan, range(1))
    check = Checker()
    _plain_load(model, opt, path)
    _same(check, snapshot(model, opt), saved, f"at TP {dist.get_world_size()}")
    _trained_on(check, model, opt, plan, 2, 2, f"at TP {dist.get_world_size()}")
    return check.result()


class Outer(nn.Module):
    """A parallelized model inside a bigger one: its keys start with 'inner.'."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.head = inner, nn.Linear(2, 2)


def keep_vars_save(path: str) -> dict:
    """dcp.save(outer.state_dict(keep_vars=True, prefix="m.")); rank 0 returns the whole tensors."""
    model, _, opt, _ = build("full")
    train(model, opt, "full", range(1))
    torch.manual_seed(5)
    outer = Outer(model)
    sd = outer.state_dict(keep_vars=True, prefix="m.")
    dcp.save(sd, checkpoint_id=path)
    whole = {f"m.inner.{k}": v.tolist() for k, v in full_state_dict(model).items()}
    whole.update({f"m.head.{k}": v.tolist() for k, v in outer.head.state_dict().items()})
    return whole if dist.get_rank() == 0 else {}


def keep_vars_load(path: str, saved: dict) -> tuple[list[str], int]:
    """dcp.load into state_dict(keep_vars=True, prefix="m.") writes the live parameters; DDP's
    "module." prefix hands out the same pieces; full_state_dict still reads the model."""
    model, _, opt, _ = build("full", seed=1)
    torch.manual_seed(6)
    outer, check = Outer(model), Checker()
    sd = outer.state_dict(keep_vars=True, prefix="m.")
    wq = sd["m.inner.layers.0.attention.wq.weight"]
    check("keep_vars: a split parameter's entry is a Piece of the live parameter",
          isinstance(wq, Piece) and wq.param is model.layers["0"].attention.wq.weight)
    dcp.load(sd, checkpoint_id=path)
    got = {f"m.inner.{k}": v for k, v in full_state_dict(model).items()}
    got.update({f"m.head.{k}": v for k, v in outer.head.state_dict().items()})
    check("keep_vars: the same keys", got.keys() == saved.keys())
    for key in saved.keys() & got.keys():
        check.equal(f"keep_vars: {key} loaded in place", got[key], torch.tensor(saved[key], dtype=got[key].dtype))
    groups = [dist.new_group([r]) for r in range(dist.get_world_size())]  # DDP over one rank: its prefix only
    ddp = nn.parallel.DistributedDataParallel(model, process_group=groups[dist.get_rank()])
    ddp_sd, own = ddp.state_dict(), model.state_dict()
    check("DDP's module. prefix: the same pieces", ddp_sd.keys() == {f"module.{k}" for k in own} and all(
        type(ddp_sd[f"module.{k}"]) is type(v) and getattr(v, "offsets", None) ==
        getattr(ddp_sd[f"module.{k}"], "offsets", None) for k, v in own.items()))
    return check.result()


def torch_save_load(path: str) -> tuple[list[str], int]:
    """Each rank torch.saves its model and optimizer state dicts; each rank torch.loads (default
    weights_only) its own (loads) and rank 0's (refused unless it is rank 0)."""
    model, _, opt, _ = build("full")
    train(model, opt, "full", range(1))
    rank, check = dist.get_rank(), Checker()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f"{path}.{rank}")
    before = snapshot(model, opt)
    dist.barrier()
    own = torch.load(f"{path}.{rank}")
    wq = own["model"]["layers.0.attention.wq.weight"]
    check("torch.load gives the Piece back", isinstance(wq, Piece) and wq.offsets[0] == rank * wq.local.shape[0])
    train(model, opt, "full", range(1, 2))
    model.load_state_dict(own["model"])
    opt.load_state_dict(own["optim"])
    check("its own file restores model and optimizer", snapshot(model, opt) == before)
    first = torch.load(f"{path}.0")
    for what, load in (("model", lambda: model.load_state_dict(first["model"])),
                       ("optimizer", lambda: opt.load_state_dict(first["optim"]))):
        try:
            load()
            check(f"rank 0's {what} file loads on rank {rank}", rank == 0)
        except ValueError as e:
            check(f"rank 0's {what} file refused on rank {rank}: {e}",
                  rank != 0 and "offsets" in str(e) and "torch.distributed.checkpoint" in str(e))
    check("after the refusals: unchanged", snapshot(model, opt) == before)
    return check.result()


# ---- torch.nn.init on indexed views of a piece ------------------------------------------------------

def _layers():
    torch.manual_seed(0)
    return nn.ModuleDict({"emb": nn.Embedding(11, 6), "col": nn.Linear(6, 10), "row": nn.Linear(10, 7)})


INDEXED = [  # (module, the view one process writes, init function, its arguments)
    ("emb", lambda w: w[2], "zeros_", ()),
    ("emb", lambda w: w[1], "normal_", ()),
    ("emb", lambda w: w[:, 2], "normal_", ()),
    ("emb", lambda w: w[:, 1:5:2], "constant_", (7.0,)),
    ("col", lambda w: w[:, 2], "uniform_", ()),
    ("col", lambda w: w[1], "ones_", ()),
    ("row", lambda w: w[:, 1], "zeros_", ()),
    ("row", lambda w: w[1:3], "kaiming_uniform_", ()),
    ("col", lambda w: w[:, 0:2], "xavier_normal_", ()),
]


def indexed_init() -> tuple[list[str], int]:
    """Every INDEXED write after a whole normal_ init: bit for bit one process, generator included."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checker()
    ref, layers = _layers(), _layers()
    parallelize_module(layers, mesh, {"emb": RowwiseParallel(input_layouts=Replicate()), "col": ColwiseParallel(),
                                      "row": RowwiseParallel()})
    for model in (ref, layers):
        torch.manual_seed(3)
        for name in ("emb", "col", "row"):
            nn.init.normal_(model[name].weight)
        for name, view, fn, args in INDEXED:
            with torch.no_grad():
                getattr(nn.init, fn)(view(model[name].weight), *args)
        model.rng = torch.get_rng_state()
    check("the generator stands where one process's does", torch.equal(ref.rng, layers.rng))
    got = full_state_dict(layers)
    for key, want in ref.state_dict().items():
        check.equal(f"indexed init {key}", got[key], want)
    return check.result()


# ---- Hugging Face: a padding row, save_pretrained ---------------------------------------------------

PAD_LAST = 60  # the last row of 61: past every rank's own rows (31 + 30 at 2 ranks, 21 + 20 + 20 at 3)


def hf_model(kind: str, mesh=None, meta: bool = False):
    """A small HF model with a padding row: Llama with pad_token_id 5 or 60, OLMo2 with its default (1).
    Vocabulary 61 (uneven at 2 and 3 ranks); ``mesh``: parallelized with HF's own plan."""
    from transformers import LlamaConfig, LlamaForCausalLM, Olmo2Config, Olmo2ForCausalLM

    from tensorplay_edu.parallel.hf import plan_from_hf

    config_cls, model_cls, extra = {"llama": (LlamaConfig, LlamaForCausalLM, dict(pad_token_id=5)),
                                    "llama-last": (LlamaConfig, LlamaForCausalLM, dict(pad_token_id=PAD_LAST)),
                                    "olmo2": (Olmo2Config, Olmo2ForCausalLM, {})}[kind]
    config = config_cls(hidden_size=48, intermediate_size=98, num_hidden_layers=1, num_attention_heads=12,
                        num_key_value_heads=6, vocab_size=61, max_position_embeddings=32, use_cache=False,
                        tie_word_embeddings=False, **extra)
    torch.manual_seed(0)
    with torch.device("meta" if meta else "cpu"):
        model = model_cls(config)
    if mesh is not None:
        parallelize_module(model, mesh, plan_from_hf(model, mesh=mesh))
    return model


def hf_pad_init(kind: str) -> tuple[list[str], int]:
    """Built on meta, plan_from_hf, to_empty, init_weights under a seed (HF's _init_weights zeroes
    weight[padding_idx] of the vocabulary-split embedding): one process's model bit for bit."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checker()
    states = []
    for model in (hf_model(kind, mesh, meta=True), hf_model(kind, None, meta=True)):
        model.to_empty(device="cpu")
        torch.manual_seed(1234)
        model.init_weights()
        states.append((full_state_dict(model), torch.get_rng_state()))
    (got, rng), (ref, ref_rng) = states
    check("the generator stands where one process's does", torch.equal(rng, ref_rng))
    pad = ref["model.embed_tokens.weight"][{"olmo2": 1, "llama": 5, "llama-last": PAD_LAST}[kind]]
    check("one process's padding row is zero", not pad.any())
    for key, want in ref.items():
        check.equal(f"{kind} init {key}", got[key], want)
    return check.result()


def hf_save_pretrained(path: str) -> None:
    """Every rank calls model.save_pretrained(path) (HF's convention; rank 0 writes)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = hf_model("llama", mesh)
    model.save_pretrained(path)
    dist.barrier()
    return sorted(os.listdir(path)) if dist.get_rank() == 0 else None


def deep_copied(plan: str) -> tuple[list[str], int]:
    """copy.deepcopy of a parallelized model: its own pieces and layouts, trains like one process,
    and the original is untouched."""
    model, _, _, _ = build(plan)
    before = full_state_dict(model)
    twin = copy.deepcopy(model)
    check = Checker()
    wq, twin_wq = model.layers["0"].attention.wq.weight, twin.layers["0"].attention.wq.weight
    check("the copy has its own pieces", twin_wq is not wq and twin_wq.data_ptr() != wq.data_ptr())
    check("the copy's pieces know their layout", getattr(twin_wq, "tp_layout", None) is not None)
    sd = twin.state_dict()
    check("the copy's state_dict hands out pieces", isinstance(sd["layers.0.attention.wq.weight"], Piece))
    opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.1)
    train(twin, opt, plan, range(2))
    ref, got = reference(2), full_state_dict(twin)
    check("the copy trains like one process",
          all(torch.allclose(got[k], v, **TOL) for k, v in ref.state_dict().items()))
    check("the original is untouched", all(torch.equal(v, full_state_dict(model)[k]) for k, v in before.items()))
    third = copy.deepcopy(model)  # nn.init right after the copy, before any forward
    torch.manual_seed(9)
    nn.init.normal_(third.layers["0"].attention.wq.weight)
    want = torch.empty(before["layers.0.attention.wq.weight"].shape, dtype=torch.float64)
    torch.manual_seed(9)
    nn.init.normal_(want)
    check.equal("nn.init on a fresh copy", full_state_dict(third)["layers.0.attention.wq.weight"], want)
    return check.result()


def one_process_model():
    """The single-device Transformer of rank_dcp, float64."""
    torch.manual_seed(0)
    return Transformer(ARGS).double()


def indexed_init_refused() -> str:
    """A part of the split dimension (rows 2-4 of a vocabulary-split embedding): refused on every rank."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    layers = _layers()
    parallelize_module(layers, mesh, {"emb": RowwiseParallel(input_layouts=Replicate())})
    try:
        with torch.no_grad():
            nn.init.zeros_(layers["emb"].weight[2:4])
    except ValueError as e:
        return str(e)
    return "not refused"

"""Hugging Face's own LlamaForCausalLM under plan_from_hf in an ordinary training loop, against
the same model trained on one process: AdamW steps with gradient clipping, a DCP checkpoint
resumed at another TP degree, meta-device construction with HF's own init_weights, attention
dropout on this rank's heads, DDP and FSDP2 over a (dp 2, tp 2) mesh, and torch.compile.

The config makes shards uneven where plan_from_hf allows it: the vocabulary (61: embed_tokens
and lm_head, 31 + 30 rows at 2 ranks, 21 + 20 + 20 at 3) and the MLP width (98: 33 + 33 + 32 at
3 ranks). The heads cannot be uneven: plan_from_hf refuses head counts that do not divide by the
mesh size (each rank holds whole heads), so 12 query and 6 K/V heads, whole on 1, 2 and 3 ranks.

Everything runs in float64, so the only difference from one process is the order of the sums:
rtol 1e-9 / atol 1e-10 after several AdamW steps (as test_dcp.py), 1e-10 for one forward and
backward (as test_hf.py). The losses are this file's own next-token cross-entropy (HF's
``labels=`` loss casts the logits to float32, test_hf.py covers it).

transformers is imported before tensorplay_edu.parallel here on purpose, as most scripts do: its
init_weights then calls the torch.nn.init functions it copied at import, and before parallel/init.py
pointed those at the wrapped ones (guard_transformers_init) every split parameter of a
meta-built model came out wrong (test_meta_device_init_weights_is_the_single_device_init).
"""

from __future__ import annotations

import contextlib

import transformers  # noqa: F401  (first: see the docstring)
from transformers import LlamaConfig, LlamaForCausalLM

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

from tensorplay_edu import DTensor, init_device_mesh, launch
from tensorplay_edu.parallel import (attach_layouts, clip_grad_norm_, full_state_dict, loss_parallel,
                                     parallelize_module, param_layout)
from tensorplay_edu.parallel.checkpoint import get_state_dict, set_state_dict
from tensorplay_edu.parallel.hf import plan_from_hf
from tensorplay_edu.parallel.params import as_dtensor
from checks import Checker, clean, gather_all, init_like_one_process

VOCAB, BATCH, SEQ = 61, 4, 10
STEPS_TOL = dict(rtol=1e-9, atol=1e-10)  # several AdamW steps (test_dcp.py)
STEP_TOL = dict(rtol=1e-10, atol=1e-10)  # one forward and backward (test_hf.py)
MAX_NORM = 0.5  # below the gradient norms of this model: every step clips
TIMEOUT = 120  # seconds: a collective's wait, and how long ranks may outlive another (2 shared cores)
COMPILE_TIMEOUT = 300  # as test_training_loops.py's compile tests


# ---- the model, the data, one step ----------------------------------------------------------------

def config(**extra) -> LlamaConfig:
    return LlamaConfig(**{**dict(hidden_size=48, intermediate_size=98, num_hidden_layers=2, num_attention_heads=12,
                                 num_key_value_heads=6, vocab_size=VOCAB, max_position_embeddings=32, use_cache=False,
                                 tie_word_embeddings=False), **extra})


def build(seed: int = 0, **extra) -> LlamaForCausalLM:
    """The same model on every rank and on one process under the same seed (no weights downloaded)."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(config(**extra)).double()


def parallel(model, mesh, lp: bool = False):
    return parallelize_module(model, mesh, plan_from_hf(model, mesh=mesh, loss_parallel=lp))


def tokens(step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(100 + step))


def next_token_loss(logits, ids):
    """Each token predicts the next (the last position ignored): the same number of targets in every
    row, so the mean over data-parallel ranks of their rows' means is the mean over the whole batch."""
    labels = F.pad(ids[:, 1:], (0, 1), value=-100)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def step(runner, opt, ids, lp: bool = False, clip=clip_grad_norm_):
    """One ordinary training step: forward, loss, backward, clip, AdamW. Returns (loss, norm)."""
    with loss_parallel() if lp else contextlib.nullcontext():
        loss = next_token_loss(runner(ids).logits, ids)
    loss.backward()
    norm = clip(runner.parameters(), MAX_NORM)
    opt.step()
    opt.zero_grad()
    return loss.detach(), norm


def reference(steps: int, **extra):
    """One process, the whole batch, torch.nn.utils.clip_grad_norm_ and AdamW all along: (model, [(loss, norm)])."""
    ref = build(**extra)
    opt = adamw(ref.parameters())
    return ref, [step(ref, opt, tokens(s), clip=torch.nn.utils.clip_grad_norm_) for s in range(steps)]


def whole(param, value):
    """The single-device tensor of a parameter-shaped ``value`` (gathered over FSDP2's dp, then over tp)."""
    if hasattr(value, "full_tensor") and not isinstance(value, DTensor):
        value = value.full_tensor()  # PyTorch's DTensor: FSDP2's shard of this rank's TP piece
    return value if param_layout(param) is None else as_dtensor(param, value).full_tensor()


class Checks(Checker):
    """checks.Checker (failures collected on the rank, returned by result(), after a label) with this
    file's tolerance and whole-model comparisons."""

    def close(self, what: str, got: torch.Tensor, want: torch.Tensor, tol=STEPS_TOL):
        super().close(what, got, want, **tol)

    def weights(self, what: str, model, ref, tol=STEPS_TOL):
        got, want = full_state_dict(model), ref.state_dict()
        self(f"{what}: the same keys", got.keys() == want.keys())
        for name in got.keys() & want.keys():
            self.close(f"{what}: {name}", got[name], want[name], tol)


def clip_compare_and_step(check: Checks, s: int, runner, model, ref, opt, ref_opt) -> float:
    """After both backwards: clip both (ours on ``runner``'s parameters, PyTorch's on one process's),
    compare the norms and every clipped gradient, step both optimizers. Returns one process's norm."""
    norm = clip_grad_norm_(runner.parameters(), MAX_NORM)
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM)
    check.close(f"step {s} gradient norm", norm, ref_norm)
    compare_grads_and_step(check, f"step {s} clipped", model, ref, opt, ref_opt)
    return ref_norm.item()


def compare_grads_and_step(check: Checks, what: str, model, ref, opt, ref_opt) -> None:
    """Every gradient of ``model`` (whole) against ``ref``'s, then a step of both optimizers."""
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        check.close(f"{what} grad {name}", whole(p, p.grad), ref_params[name].grad)
    for o in (opt, ref_opt):
        o.step()
        o.zero_grad()


N_PARAMS = 3 + 9 * 2  # embed_tokens, final norm, lm_head; per layer q, k, v, o, gate, up, down and two norms


# ---- 1. AdamW with gradient clipping ---------------------------------------------------------------

def clipped_training(lp: bool, steps: int = 3) -> tuple[list[str], int]:
    """Rank code: each step's loss, gradient norm (the clipping factor), every clipped gradient, and
    every weight after the steps, against one process."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checks(f"TP {mesh.size()} lp={lp}")
    model = parallel(build(), mesh, lp)
    ref = build()
    opt, ref_opt = adamw(model.parameters()), adamw(ref.parameters())
    if mesh.size() > 1:  # PyTorch's function would clip each rank by its own pieces' norm: refused
        with contextlib.suppress(RuntimeError):
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            check("torch.nn.utils.clip_grad_norm_ refuses the sharded HF parameters", False)
    for s in range(steps):
        ids = tokens(s)
        with loss_parallel() if lp else contextlib.nullcontext():
            logits = model(ids).logits
            check(f"step {s}: the logits are vocabulary-sharded exactly when lp", isinstance(logits, DTensor) == lp)
            loss = next_token_loss(logits, ids)
        ref_loss = next_token_loss(ref(ids).logits, ids)
        check.close(f"step {s} loss", loss.detach(), ref_loss.detach())
        loss.backward()
        ref_loss.backward()
        ref_norm = clip_compare_and_step(check, s, model, model, ref, opt, ref_opt)
        check(f"step {s} clips (norm {ref_norm:.3f} > {MAX_NORM})", ref_norm > MAX_NORM)
    check.weights(f"after {steps} AdamW steps", model, ref)
    return check.result()


@pytest.mark.parametrize("world_size,lp", [(2, False), (3, True)], ids=["tp2-vanilla", "tp3-loss_parallel"])
def test_adamw_with_clipping_trains_like_one_process(world_size, lp):
    """tensorplay_edu.parallel.clip_grad_norm_ on the parallel model, torch.nn.utils.clip_grad_norm_ on
    the single-device one: the same norm, the same clipped gradients, the same weights after 3 steps."""
    clean(launch(clipped_training, world_size, lp, timeout=TIMEOUT), at_least=3 * (4 + N_PARAMS) + N_PARAMS)


# ---- 2. a DCP checkpoint, resumed at the same and at another TP degree -----------------------------

def save_and_resume(path: str, steps: int = 2, more: int = 2) -> tuple[list[str], int]:
    """Rank code: train ``steps`` steps, save model and AdamW state with DCP (the package's get_state_dict),
    then a fresh model (another seed) at this TP degree loads it and trains ``more`` steps."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallel(build(), mesh)
    opt = adamw(model.parameters())
    for s in range(steps):
        step(model, opt, tokens(s))
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    dist.barrier()
    return resume(path, steps, more)


def resume(path: str, steps: int = 2, more: int = 2) -> tuple[list[str], int]:
    """Rank code: a fresh parallel model loads the checkpoint, equals one process after ``steps`` steps,
    and ``more`` steps later still equals one process trained ``steps + more`` steps without a pause."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checks(f"resumed at TP {mesh.size()}")
    model = parallel(build(seed=1), mesh)
    opt = adamw(model.parameters())
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    ref, ref_steps = reference(steps + more)
    at_save, _ = reference(steps)
    check.weights(f"loaded weights = one process after {steps} steps", model, at_save)
    for s in range(steps, steps + more):
        loss, norm = step(model, opt, tokens(s))
        check.close(f"step {s} loss after resuming", loss, ref_steps[s][0])
        check.close(f"step {s} gradient norm after resuming", norm, ref_steps[s][1])
    check.weights(f"{more} steps after resuming", model, ref)
    return check.result()


def test_dcp_checkpoint_resumes_at_tp3_and_tp2_like_an_uninterrupted_run(tmp_path):
    """Saved at TP 3 (uneven vocabulary and MLP shards) after 2 steps; a fresh model at TP 3 and one at
    TP 2 load model and optimizer and train 2 more steps: one process's 4 uninterrupted steps."""
    path = str(tmp_path / "ckpt")
    at_least = 2 * N_PARAMS + 2 * 2
    clean(launch(save_and_resume, 3, path, timeout=TIMEOUT), at_least=at_least)
    clean(launch(resume, 2, path, timeout=TIMEOUT), at_least=at_least)


# ---- 3. meta-device construction and HF's own init_weights ------------------------------------------

def meta_init() -> tuple[list[str], int]:
    """Rank code: build on meta, parallelize, to_empty, model.init_weights() under a seed (HF's
    _init_weights: normal_ on the Linears and the embedding, ones_ on the norms, the rotary tables
    recomputed) == one process doing the same, bit for bit; then one training step equal too."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checks(f"meta init TP {mesh.size()}")
    with torch.device("meta"):
        model = LlamaForCausalLM(config()).double()
    parallel(model, mesh)
    model.to_empty(device="cpu")
    ref = init_like_one_process(check, model, lambda: LlamaForCausalLM(config()).double(), "init ")
    buffers = dict(model.named_buffers())
    for name, want in ref.named_buffers():  # the rotary inv_freq tables (to_empty left them garbage)
        check.equal(f"buffer {name}", buffers[name], want)
    q = model.model.layers[0].self_attn.q_proj.weight.detach()
    pieces = [torch.empty_like(q) for _ in range(mesh.size())]
    dist.all_gather(pieces, q)
    check("ranks hold different heads", not torch.equal(pieces[0], pieces[1]))
    ids = tokens(0)
    loss, ref_loss = (next_token_loss(m(ids).logits, ids) for m in (model, ref))
    check.close("first loss", loss.detach(), ref_loss.detach(), STEP_TOL)
    loss.backward()
    ref_loss.backward()
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        check.close(f"first grad {name}", whole(p, p.grad), ref_params[name].grad, STEP_TOL)
    return check.result()


def test_transformers_init_table_holds_the_wrapped_init_functions():
    """What HF's init_weights calls (transformers.initialization.TORCH_INIT_FUNCTIONS, copied when
    transformers was imported, here before tensorplay_edu.parallel) is the package's wrapped
    torch.nn.init, which draws a split parameter whole and keeps this rank's piece."""
    from transformers import initialization

    wrapped = {name: fn for name, fn in vars(torch.nn.init).items() if getattr(fn, "__tensorplay_guard__", False)}
    assert {"normal_", "ones_", "zeros_", "uniform_"} <= wrapped.keys()
    for name, fn in initialization.TORCH_INIT_FUNCTIONS.items():
        assert name not in wrapped or fn is wrapped[name], name


@pytest.mark.parametrize("world_size", [2, 3])
def test_meta_device_init_weights_is_the_single_device_init(world_size):
    """Fails without parallel/init.py's guard_transformers_init (transformers imported first): every
    split weight differed and each rank's heads were copies of the others'."""
    clean(launch(meta_init, world_size, timeout=TIMEOUT), at_least=2 + 2 * N_PARAMS + 2)


# ---- 4. attention dropout on this rank's heads ------------------------------------------------------

P = 0.3  # config.attention_dropout


@contextlib.contextmanager
def dropout_masks(record: list | None = None, replay: list | None = None):
    """torch.nn.functional.dropout as HF's eager attention calls it, either recording each call's
    mask (the real op runs) or applying given masks in order (the single-device model)."""
    real = F.dropout
    masks = iter(replay or [])

    def dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return real(x, p, training, inplace)
        if replay is not None:
            return x * next(masks).to(x.dtype) / (1 - p)
        out = real(x, p, training, inplace)
        record.append(out.detach() != 0)  # attention probabilities are > 0: a zero is a dropped element
        return out

    F.dropout = dropout  # HF's eager_attention_forward reads nn.functional.dropout when it runs
    try:
        yield
    finally:
        F.dropout = real


def attention_dropout(steps: int = 2) -> tuple[list[str], int]:
    """Rank code: config.attention_dropout in train mode. The package's rule: after the colwise
    q/k/v projections the activations are this rank's heads, so each rank draws its own mask; the
    default generator stays in step on every rank. The masks of the ranks together, applied to the
    single-device model, give its loss, gradients and weights after AdamW steps; eval draws nothing."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t, check = mesh.size(), Checks(f"attention dropout TP {mesh.size()}")
    extra = dict(attention_dropout=P, attn_implementation="eager")
    model, ref = parallel(build(**extra), mesh), build(**extra)
    opt, ref_opt = adamw(model.parameters()), adamw(ref.parameters())
    ref_params = dict(ref.named_parameters())
    torch.manual_seed(7)  # every rank alike
    previous = None
    for s in range(steps):
        ids = tokens(s)
        mine = []
        with dropout_masks(record=mine):
            loss = next_token_loss(model(ids).logits, ids)
        check(f"step {s}: one mask per layer", len(mine) == 2)
        full = []
        for layer, mask in enumerate(mine):  # [b, heads/t, s, s] -> the single device's [b, heads, s, s]
            ranks = gather_all(mask.to(torch.uint8))
            check(f"step {s} layer {layer}: each rank draws its own mask",
                  all(not torch.equal(ranks[0], r) for r in ranks[1:]))
            full.append(torch.cat(ranks, dim=1).bool())
        causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()  # above the diagonal the probabilities are 0
        kept = torch.cat([m[..., causal] for m in full]).double().mean().item()
        check(f"step {s}: about {1 - P:.0%} kept ({kept:.2f})", abs(kept - (1 - P)) < 0.05)
        check(f"step {s}: new masks", previous is None or not torch.equal(previous, full[0]))
        previous = full[0]
        states = gather_all(torch.get_rng_state())
        check(f"step {s}: the default generator in step on every rank", all(torch.equal(states[0], x) for x in states))
        with dropout_masks(replay=full):
            ref_loss = next_token_loss(ref(ids).logits, ids)
        check.close(f"step {s} loss with the ranks' masks", loss.detach(), ref_loss.detach())
        loss.backward()
        ref_loss.backward()
        for name, p in model.named_parameters():
            check.close(f"step {s} grad {name}", whole(p, p.grad), ref_params[name].grad)
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
    check.weights(f"after {steps} AdamW steps with dropout", model, ref)
    model.eval()
    ref.eval()
    before = torch.get_rng_state()
    ids = tokens(steps)
    with torch.no_grad():
        check.close("eval logits (no dropout)", model(ids).logits, ref(ids).logits, STEP_TOL)
    check("eval draws nothing", torch.equal(before, torch.get_rng_state()))
    return check.result()


def test_attention_dropout_draws_per_rank_masks_that_make_a_single_device_mask():
    clean(launch(attention_dropout, 2, timeout=TIMEOUT), at_least=2 * (7 + N_PARAMS) + N_PARAMS + 2)


# ---- 5. DDP and FSDP2 over dp x our TP, a (2, 2) mesh -----------------------------------------------

def dp_x_tp(wrap: str, steps: int = 2) -> tuple[list[str], int]:
    """Rank code: plan_from_hf over mesh["tp"], PyTorch's DDP or FSDP2 (fully_shard per decoder layer
    and the root) over mesh["dp"], each dp rank fed its rows: the mean loss, the norm, every clipped
    gradient and the weights after AdamW steps equal one process on the whole batch."""
    from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("dp", "tp"))
    dp, dp_rank = mesh.size("dp"), mesh.get_local_rank("dp")
    check = Checks(f"{wrap} x TP")
    model, ref = parallel(build(), mesh["tp"]), build()
    if wrap == "ddp":
        runner = DistributedDataParallel(model, process_group=mesh.get_group("dp"))
    else:
        dp_mesh = TorchDeviceMesh.from_group(mesh.get_group("dp"), "cpu")
        for layer in model.model.layers:
            fully_shard(layer, mesh=dp_mesh)
        runner = fully_shard(model, mesh=dp_mesh)
        attach_layouts(model)  # fully_shard made new parameters: their TP layouts again
    opt, ref_opt = adamw(runner.parameters()), adamw(ref.parameters())
    for s in range(steps):
        ids = tokens(s)
        mine = ids.chunk(dp)[dp_rank]
        loss = next_token_loss(runner(mine).logits, mine)
        ref_loss = next_token_loss(ref(ids).logits, ids)
        loss.backward()
        ref_loss.backward()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=mesh.get_group("dp"))  # test bookkeeping
        check.close(f"step {s} loss (mean over dp)", mean / dp, ref_loss.detach())
        clip_compare_and_step(check, s, runner, model, ref, opt, ref_opt)
    check.weights(f"after {steps} AdamW steps", model, ref)
    return check.result()


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_dp_x_tp_on_a_2x2_mesh_trains_like_one_process(wrap):
    clean(launch(dp_x_tp, 4, wrap, timeout=TIMEOUT), at_least=2 * (2 + N_PARAMS) + N_PARAMS)


# ---- 6. torch.compile ------------------------------------------------------------------------------

def compiled(lp: bool) -> tuple[list[str], int]:
    """Rank code: torch.compile (dynamo + AOTAutograd, the aot_eager backend, as test_training_loops.py)
    of the parallel HF model: one forward and backward, logits, loss and every gradient against one
    process in eager mode."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    check = Checks(f"torch.compile TP {mesh.size()} lp={lp}")
    model, ref = parallel(build(), mesh, lp), build()
    runner = torch.compile(model, backend="aot_eager")
    ids = tokens(0)
    with loss_parallel() if lp else contextlib.nullcontext():
        logits = runner(ids).logits
        loss = next_token_loss(logits, ids)
        loss.backward()
    ref_logits = ref(ids).logits
    ref_loss = next_token_loss(ref_logits, ids)
    ref_loss.backward()
    check.close("logits", logits.full_tensor() if isinstance(logits, DTensor) else logits.detach(),
                ref_logits.detach(), STEP_TOL)
    check.close("loss", loss.detach(), ref_loss.detach(), STEP_TOL)
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        check.close(f"grad {name}", whole(p, p.grad), ref_params[name].grad, STEP_TOL)
    return check.result()


def test_torch_compile_forward_backward_equals_one_process():
    clean(launch(compiled, 2, False, timeout=COMPILE_TIMEOUT), at_least=2 + N_PARAMS)

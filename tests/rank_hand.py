"""Rank code for tensorplay_edu/models/by_hand.py: the hand-written Megatron Llama against one process, and the raw
collectives of its training step against tensorplay_edu's for the same plan."""

from __future__ import annotations

import collections
import contextlib
import copy
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from checks import chunk
from tensorplay_edu import collectives, init_device_mesh
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama

from tensorplay_edu.models import by_hand as hand


def cases(t: int) -> list[dict]:
    """Tiny models whose heads divide by t (GQA and an uneven vocabulary among them)."""
    if t == 3:  # dim 24: 6 heads of 4, 3 kv heads; SwiGLU hidden 64 (22, 22, 20 over 3)
        return [dict(dim=24, n_heads=6, n_kv_heads=3, vocab_size=50), dict(dim=24, n_heads=6, vocab_size=64)]
    gqa = dict(dim=32, n_heads=4, n_kv_heads=2) if t == 2 else dict(dim=32, n_heads=8, n_kv_heads=4)
    return [dict(**gqa, vocab_size=64), dict(dim=32, n_heads=4, vocab_size=50)]


@contextlib.contextmanager
def raw_counts():
    """Count the raw torch.distributed calls, wherever they are issued (models/by_hand.py and tensorplay_edu.collectives)."""
    counts = collections.Counter()

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    patches = [(dist, "all_reduce", "all_reduce"), (hand, "_all_gather_flat", "all_gather"),
               (hand, "_reduce_scatter_flat", "reduce_scatter"), (collectives, "_all_gather_flat", "all_gather"),
               (collectives, "_reduce_scatter_flat", "reduce_scatter"), (dist, "all_to_all_single", "all_to_all"),
               (dist, "broadcast", "broadcast"), (dist, "batch_isend_irecv", "p2p")]
    saved = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in patches]
    for mod, attr, name in patches:
        setattr(mod, attr, counting(name, getattr(mod, attr)))
    try:
        yield counts
    finally:
        for mod, attr, fn in saved:
            setattr(mod, attr, fn)


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float) -> bool:
    return a.shape == b.shape and bool(((a - b).abs().max() <= rtol * b.abs().max().clamp_min(1e-30)).item()
                                       if a.numel() else True)


def against_one_process(plan: str, kwargs: dict, steps: int = 2) -> list[str]:
    """Loss, every gradient (this rank's shard against the same slice of one process's) and the weights after
    ``steps`` SGD steps, float64."""
    t, r = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    ref = Transformer(ModelArgs(n_layers=2, max_seq_len=16, **kwargs)).double()
    model = hand.HandLlama(ref, plan)
    g = torch.Generator().manual_seed(1)
    fails, tag = [], f"{plan} {kwargs}"
    ref_opt, opt = torch.optim.SGD(ref.parameters(), lr=0.5), torch.optim.SGD(model.parameters(), lr=0.5)
    ref_params = dict(ref.named_parameters())
    if sorted(ref_params) != sorted(n for n, _ in model.named_parameters()):
        fails.append(f"{tag}: parameter names differ")
    for step in range(steps):
        tokens = torch.randint(0, kwargs["vocab_size"], (2, 12), generator=g)
        labels = torch.randint(0, kwargs["vocab_size"], (2, 12), generator=g)
        want = llama_loss(ref(tokens), labels)
        want.backward()
        got = hand.hand_step(model, tokens, labels)
        if not _close(got, want.detach(), 1e-10):
            fails.append(f"{tag} step {step}: loss {got.item()!r} against {want.item()!r}")
        for name, p in model.named_parameters():
            dim = hand.shard_dim(name)
            expect = ref_params[name].grad if dim is None else chunk(ref_params[name].grad, dim, t, r)
            if p.grad is None or not _close(p.grad, expect, 1e-9):
                fails.append(f"{tag} step {step}: gradient of {name}")
        ref_opt.step(), opt.step()
        ref_opt.zero_grad(), opt.zero_grad()
        for name, p in model.named_parameters():
            dim = hand.shard_dim(name)
            expect = ref_params[name] if dim is None else chunk(ref_params[name], dim, t, r)
            if not _close(p.detach(), expect.detach(), 1e-9):
                fails.append(f"{tag} after step {step}: weight {name}")
    return fails


def extreme_logits() -> list[str]:
    """VocabParallelCrossEntropy on logits with large offsets and scales (float32 and float64), against
    F.cross_entropy on the whole logits: finite and equal, loss and gradient.  A sum in place of the max
    all-reduce passes the model checks above (the max cancels out) and fails here."""
    t, r = dist.get_world_size(), dist.get_rank()
    fails, g = [], torch.Generator().manual_seed(3)
    for dtype, rtol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
        for vocab in (50, 64):
            for offset, scale in ((0.0, 1.0), (30.0, 1.0), (1e3, 1.0), (-1e3, 1.0), (0.0, 50.0), (1e3, 50.0)):
                full = (torch.randn(24, vocab, generator=g, dtype=torch.float64) * scale + offset).to(dtype)
                target = torch.randint(0, vocab, (24,), generator=g)
                whole = full.clone().requires_grad_()
                want = F.cross_entropy(whole, target)
                want.backward()
                mine = chunk(full, 1, t, r).clone().requires_grad_()
                got = hand.VocabParallelCrossEntropy.apply(mine, target, r * -(-vocab // t), None)
                got.backward()
                tag = f"cross-entropy {dtype} V={vocab} offset {offset} scale {scale}"
                if not torch.isfinite(got) or not _close(got.detach(), want.detach(), rtol):
                    fails.append(f"{tag}: loss {got.item()!r} against {want.item()!r}")
                if not _close(mine.grad, chunk(whole.grad, 1, t, r), rtol * 10):
                    fails.append(f"{tag}: gradient")
    return fails


def step_counts(plan: str, kwargs: dict) -> dict:
    """Raw collectives of one training step (forward + loss; backward and, for hand, finish_grads), hand and ours."""
    torch.manual_seed(0)
    ref = Transformer(ModelArgs(n_layers=2, max_seq_len=16, **kwargs))
    tokens = torch.randint(0, kwargs["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    out = {}
    model = hand.HandLlama(ref, plan)
    with raw_counts() as fwd:
        loss = model.loss(model(tokens), tokens)
    with raw_counts() as bwd:
        loss.backward()
        model.finish_grads()
    out["hand"] = {"forward": dict(fwd), "backward": dict(bwd)}
    ours = parallelize_llama(copy.deepcopy(ref), init_device_mesh("cpu", (dist.get_world_size(),)), plan)
    with raw_counts() as fwd:
        with loss_context(plan):
            loss = llama_loss(ours(tokens), tokens)
    with raw_counts() as bwd:
        loss.backward()
    out["ours"] = {"forward": dict(fwd), "backward": dict(bwd)}
    return out


def run_all() -> tuple[list[str], dict, list[str]]:
    """Every case of this world size, both plans; the step counts of the first case; any warning raised."""
    t = dist.get_world_size()
    fails, counts = [], {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for kwargs in cases(t):
            for plan in ("vanilla", "full"):
                fails += against_one_process(plan, kwargs)
        fails += extreme_logits()
        for plan in ("vanilla", "full"):
            counts[plan] = step_counts(plan, cases(t)[0])
    return fails, counts, [f"{w.filename}:{w.lineno}: {w.message}" for w in caught]

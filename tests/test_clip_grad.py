"""tensorplay_edu.parallel.clip_grad_norm_ against torch.nn.utils.clip_grad_norm_ on one process,
and the guard on torch's function (rank code in tests/rank_clip.py)."""

import inspect
import math
import warnings

import pytest
import torch

import rank_clip
from tensorplay_edu import launch
from tensorplay_edu.parallel import clip_grad_norm_
from tensorplay_edu.parallel import clip_grad as ours


# 3 norm types x (4 steps x (norm, binding, 21 grads) + 21 weights)
LLAMA_CHECKS = 3 * (4 * 23 + 21)


def _clean_and_same_norms(results, at_least):
    """checks.clean for ranks that return (fails, checks, norms): only rank 0 (which runs the reference)
    needs ``at_least`` checks, and every rank must return the same norms."""
    fails = sorted({f for rank_fails, _, _ in results for f in rank_fails})
    assert not fails, "\n".join(fails[:30])
    assert results[0][1] >= at_least, [n for _, n, _ in results]  # rank 0 compares with the reference
    norms = [[repr(x) for x in rank_norms] for _, _, rank_norms in results]  # nan == nan here
    assert all(n == norms[0] for n in norms), f"the ranks returned different norms: {norms}"  # bit for bit


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_mlp_uneven_and_empty_shards(world_size):
    # 4 norm types x (6 steps x (norm, binding, 6 grads) + 6 weights)
    _clean_and_same_norms(launch(rank_clip.mlp, world_size), at_least=4 * (6 * 8 + 6))


@pytest.mark.parametrize("plan", ["vanilla", "full"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_llama_clips_like_one_process(plan, world_size):
    _clean_and_same_norms(launch(rank_clip.llama, world_size, plan), at_least=LLAMA_CHECKS)


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_one_all_reduce_for_the_whole_model(plan):
    got = launch(rank_clip.llama_collectives, 4, plan)[0]
    assert got[2.0] == [("all_reduce", (), 4, "clip_grad_norm_")], got  # the sum of |g|^2 over the pieces
    assert got[math.inf] == [("all_reduce", (2,), 4, "clip_grad_norm_")], got  # max |g|, and "saw a nan" beside it


def test_dp_x_tp_vanilla():
    _clean_and_same_norms(launch(rank_clip.dp_tp, 4, "vanilla"), at_least=LLAMA_CHECKS)


def test_dp_x_tp_full():
    """The full plan under DDP (sequence-parallel norm weights: their gradients must be whole before DDP reads them)."""
    _clean_and_same_norms(launch(rank_clip.dp_tp, 4, "full"), at_least=LLAMA_CHECKS)


def test_layouts_on_a_2d_mesh():
    _clean_and_same_norms(launch(rank_clip.layouts_2d, 4), at_least=4 * (6 * 9 + 7) + 1)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_nonfinite_on_one_rank(world_size):
    _clean_and_same_norms(launch(rank_clip.nonfinite, world_size), at_least=16)


@pytest.mark.parametrize("world_size", [1, 2])
def test_guard_on_torch_clip_grad_norm(world_size):
    results = launch(rank_clip.guard, world_size)
    _clean_and_same_norms([(f, n, norms[1:]) for f, n, norms in results], at_least=7 * (2 if world_size > 1 else 1) + 3)
    if world_size > 1:  # what the guard prevents: torch's function gives each rank another norm
        assert results[0][2][0] != results[1][2][0]


# ---- one process, no launch: torch's edge cases, the wrapper's form -------------------

def _pair(seed=0, n=3):
    g = torch.Generator().manual_seed(seed)
    a = [torch.nn.Parameter(torch.randn(4, 3, generator=g, dtype=torch.float64)) for _ in range(n)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        p.grad = torch.randn(4, 3, generator=g, dtype=torch.float64)
        q.grad = p.grad.clone()
    return a, b


@pytest.mark.parametrize("foreach", [None, True, False])
@pytest.mark.parametrize("norm_type", [2.0, 1, 3.0, math.inf, "inf"])
def test_plain_parameters_exactly_like_torch(norm_type, foreach):
    for max_norm in (0.5, 100.0):
        a, b = _pair()
        a[1].grad = None
        b[1].grad = None
        want = torch.nn.utils.clip_grad_norm_(a, max_norm, float(norm_type), foreach=foreach)
        got = clip_grad_norm_(iter(b), max_norm, float(norm_type), foreach=foreach)
        assert got.dtype == want.dtype and torch.allclose(got, want, rtol=1e-12, atol=0)
        for p, q in zip(a, b):
            assert (p.grad is None and q.grad is None) or torch.allclose(p.grad, q.grad, rtol=1e-12, atol=0)


def test_torch_edge_cases():
    # an empty list: tensor(0.) (float32, as torch); an empty generator also warns
    assert torch.equal(clip_grad_norm_([], 1.0), torch.nn.utils.clip_grad_norm_([], 1.0))
    with pytest.warns(UserWarning, match="empty generator") as record:
        clip_grad_norm_((p for p in []), 1.0)
    assert record[0].filename == __file__  # pointed at the caller, as torch's
    # a single tensor; the clip coefficient max_norm / (norm + 1e-6), clamped to 1
    a, b = _pair(n=1)
    want = torch.nn.utils.clip_grad_norm_(a[0], 1.0)
    got = clip_grad_norm_(b[0], 1.0)
    assert torch.equal(got, want) and torch.equal(a[0].grad, b[0].grad)
    a, b = _pair(n=1)
    norm = torch.linalg.vector_norm(b[0].grad)
    clip_grad_norm_(b, norm.item())  # max_norm == norm: scaled by norm / (norm + 1e-6), just below 1
    assert torch.allclose(b[0].grad, a[0].grad * (norm / (norm + 1e-6)), rtol=1e-14, atol=0)
    # non-finite: torch's error with error_if_nonfinite, else the nan/inf norm
    for bad in (math.inf, math.nan):
        a, b = _pair()
        a[2].grad[1, 1] = bad
        b[2].grad[1, 1] = bad
        with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
            clip_grad_norm_(b, 1.0, error_if_nonfinite=True)
        want, got = torch.nn.utils.clip_grad_norm_(a, 1.0), clip_grad_norm_(b, 1.0)
        assert torch.equal(got, want) or (got.isnan() and want.isnan())
    for p in (0.0, -1.0, math.nan):
        with pytest.raises(NotImplementedError, match="norm_type"):
            clip_grad_norm_(_pair()[1], 1.0, p)


def test_signature_and_wrapper_form():
    def form(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert form(clip_grad_norm_) == form(torch.nn.utils.clip_grad.clip_grad_norm_.__wrapped__)
    utils = torch.nn.utils
    for name, original in [("clip_grad_norm_", utils.clip_grad_norm_.__wrapped__),
                           ("get_total_norm", utils.get_total_norm.__wrapped__)]:
        wrapper = getattr(utils, name)
        assert wrapper.__tensorplay_guard__ and wrapper.__name__ == original.__name__
        assert wrapper.__doc__ == original.__doc__ and inspect.signature(wrapper) == inspect.signature(original)
    assert utils.clip_grad.clip_grad_norm_ is utils.clip_grad_norm_  # one wrapper, both names
    assert utils.get_total_norm.__wrapped__ is utils.clip_grad._get_total_norm  # torch's private name untouched
    assert utils.clip_grads_with_norm_ is utils.clip_grad._clip_grads_with_norm_  # needs no guard
    guarded = utils.clip_grad_norm_
    ours.install_guards()  # idempotent: never a wrapper around a wrapper
    assert utils.clip_grad_norm_ is guarded and not hasattr(guarded.__wrapped__, "__tensorplay_guard__")


def test_guard_passes_plain_calls_through():
    a, b = _pair()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want = torch.nn.utils.clip_grad.clip_grad_norm_.__wrapped__(a, 0.5, 3.0)
        got = torch.nn.utils.clip_grad_norm_(parameters=(p for p in b), max_norm=0.5, norm_type=3.0)
    assert torch.equal(got, want) and all(torch.equal(p.grad, q.grad) for p, q in zip(a, b))
    assert torch.equal(torch.nn.utils.get_total_norm(tensors=[p.grad for p in a]),
                       torch.nn.utils.clip_grad._get_total_norm([p.grad for p in a]))
    with pytest.warns(UserWarning, match="empty generator"):  # torch's own warning still comes
        torch.nn.utils.clip_grad_norm_((p for p in []), 1.0)

"""lab.peak: a loss's peak memory counted op by op (notebook 05b), against counts made by hand."""

import torch
import torch.nn.functional as F

from tensorplay_edu import launch
from tensorplay_edu.lab.peak import LiveBytes, loss_peaks, measure

TOKENS, H, V = 8, 4, 30
GEN = torch.Generator().manual_seed(0)
H_IN, Y = torch.randn(TOKENS, H, generator=GEN), torch.randint(0, V, (TOKENS,), generator=GEN)


def test_live_bytes_follows_storages():
    with LiveBytes(min_numel=1000) as mem:
        x = torch.ones(1000)                   # 4,000 bytes
        y = x.exp()                            # 8,000
        del x                                  # 4,000: its storage is gone
        z = y[:10]                             # a view of a known storage: nothing new
    assert (mem.peak, mem.now, z.numel()) == (8000, 4000, 10)


def test_exp_sum_by_hand():
    got = measure(lambda: torch.ones(1000).requires_grad_(), lambda z: z.exp().sum(), True, 1000)
    # held x, saved exp(x), backward: the gradient through exp (4,000) and sum's one-float gradient (4)
    assert (got["phase"], got["held"], got["saved"], got["temporaries"]) == ("backward", 4000, 4000, 4004)
    assert got["peak"] == 12004 and got["after_forward"] == 8000


def test_cross_entropy_saved_is_what_autograd_keeps():
    logits_fn = lambda: torch.randn(32, 500, generator=torch.Generator().manual_seed(1)).requires_grad_()
    got = measure(logits_fn, lambda z: F.cross_entropy(z, torch.arange(32)), True, 32 * 500)
    kept = {}                                  # an independent count: the big storages autograd saves
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: kept.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) and t, lambda t: t):
        F.cross_entropy(logits_fn(), torch.arange(32)).backward()
    n = 32 * 500
    assert got["saved"] == sum(b for b in kept.values() if b >= 4 * n) == 4 * n      # the log-softmax
    assert (got["phase"], got["held"], got["temporaries"]) == ("backward", 4 * n, 8 * n)  # a leaf: held; gradient in and out


def test_loss_peaks_on_two_ranks():
    res = launch(loss_peaks, 2, H_IN, Y, V)
    for r, (out, second) in enumerate(res):
        n = TOKENS * V // 2                     # 15 classes a rank
        got = out[("loss_parallel", "float32", False)]
        assert (got["phase"], got["held"], got["saved"], got["temporaries"]) == ("forward", 4 * n, 4 * n, 0)
        gathered = out[("gather", "float32", False)]
        assert (gathered["phase"], gathered["saved"], gathered["temporaries"]) == ("backward", 4 * 2 * n, 8 * 2 * n)
        assert "runs once" in second


def test_pytorch_loss_parallel_peak_through_measure():
    """PyTorch's own loss_parallel, counted by the same measure (LocalBytes): one process's loss, and at the
    backward peak 0 held + 4 saved + 12 temporaries bytes per local logit; 3 ranks on 30 classes."""
    weight = torch.randn(V, H, generator=torch.Generator().manual_seed(2))
    ref = F.cross_entropy(H_IN @ weight.T, Y)
    from tensorplay_edu.lab.peak import pytorch_loss_peaks
    from tensorplay_edu.placement import chunk_sizes
    for r, res in enumerate(launch(pytorch_loss_peaks, 3, H_IN, Y, weight)):
        n = TOKENS * chunk_sizes(V, 3)[r]
        for dtype, got in res.items():
            torch.testing.assert_close(got["loss"], ref, rtol=2e-2, atol=2e-2)
            roles = (got["phase"], got["held"], got["saved"], got["temporaries"])
            assert roles == ("backward", 0, 4 * n, 12 * n), dtype
            assert got["after_forward"] == 4 * n

"""The bug zoo's workers (tensorplay_edu.lab.bug_zoo_*, run again side by side by notebook 08c): each bug's run
differs from one process, and its fix equals it."""

import pytest
import torch

from tensorplay_edu import launch
from tensorplay_edu.lab import bug_zoo_plans as plans
from tensorplay_edu.lab import bug_zoo_ranks as ranks
from tensorplay_edu.lab import bug_zoo_tp as tp

ROUNDING = 1e-12


def test_bug_1_clipping_on_pieces():
    ref = tp.clipped_step(torch.nn.utils.clip_grad_norm_)  # one process
    runs = launch(tp.clip_workers, 2)
    assert tp.clip_gap([r["bug"] for r in runs], ref) > 1e-3
    assert tp.clip_gap([r["fixed"] for r in runs], ref) < ROUNDING
    assert len({round(r["bug"]["norm"], 9) for r in runs}) == 2 and all(r["bug"]["norm"] < ref["norm"] for r in runs)
    assert all(abs(r["fixed"]["norm"] - ref["norm"]) < ROUNDING for r in runs)  # each rank logs the true norm
    formula, worst, best = tp.toy_clip_factors(2)
    assert worst > formula > 1 and worst >= best


def test_bug_2_global_head_count():
    one = tp.attention_out("-1")
    runs = launch(tp.view_workers, 2)
    assert all(tp.gap(r["bug"], one) > 1e-3 for r in runs)
    assert all(tp.gap(r["fixed"], one) < ROUNDING for r in runs)


def test_bug_3_sp_norm_gradient_not_summed():
    norm, x, dy = tp.make_norm()
    (norm(x) * dy).sum().backward()
    bug, fixed = launch(tp.sp_norm, 2, False), launch(tp.sp_norm, 2, True)
    assert max(tp.gap(r["w_grad"], norm.weight.grad) for r in bug) > 1e-3
    assert max(tp.gap(r["w_grad"], norm.weight.grad) for r in fixed) < ROUNDING


def test_bug_4_raw_all_reduce():
    x, w, dy = tp.proj_data()
    w.requires_grad_()
    ((x @ w.T) * dy).sum().backward()
    for fixed, wrong in ((False, True), (True, False)):
        grad = torch.cat([r["grad"] for r in launch(tp.sum_then_split, 2, fixed)], dim=1)  # [out, in]
        assert (tp.gap(grad, w.grad) > 1e-3) is wrong, fixed


def test_bug_5_smoothing_over_the_local_vocabulary():
    logits, labels = plans.logits_data()
    one = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=plans.EPS * plans.V / (plans.V - 1))
    assert all(abs(r["loss"] - one.item()) > 1e-3 for r in launch(plans.smoothed_loss, 2, False))
    assert all(abs(r["loss"] - one.item()) < ROUNDING for r in launch(plans.smoothed_loss, 2, True))


def test_bug_6_plan_key_typo():
    torch.manual_seed(0)
    model = plans.Transformer(plans.ARGS).double()
    tokens, labels = plans.batch()
    plans.llama_loss(model(tokens), labels).backward()
    norm = "layers.0.attention_norm.weight"
    skipped = launch(plans.one_step, 2, None)[0]
    assert tp.gap(skipped["grads"][norm], dict(model.named_parameters())[norm].grad) > 1e-6
    assert "'attention_nrom' matches no submodule" in launch(plans.one_step, 2, "attention_nrom")[0]["error"]
    right = launch(plans.one_step, 2, "attention_norm")[0]
    assert all(tp.gap(right["grads"][n], p.grad) < 1e-10 for n, p in model.named_parameters())


def test_bug_6_under_pytorch_whole_plan():
    """PyTorch's TP on torchtitan's whole block plan: the typo leaves only the norm plain and clipping fails;
    spelt right, every parameter is a DTensor and clipping and AdamW's foreach step run."""
    warned, plain, clipped, adamw = launch(plans.pytorch_typo_whole_plan, 2, "attention_nrom")[0]
    assert len(warned) == 1 and plain == ["attention_norm.weight"]
    assert clipped.startswith("aten._foreach_norm.Scalar got mixed torch.Tensor and DTensor")
    assert adamw.startswith("aten._foreach_mul_.Scalar got mixed torch.Tensor and DTensor")
    assert launch(plans.pytorch_typo_whole_plan, 2, "attention_norm")[0][1:] == ([], None, None)


def test_bug_7_collective_behind_a_rank_test():
    runs = launch(ranks.both, 2)
    assert runs[0]["bug"]["report"].startswith("NCCL rules, collective #")
    assert all(r["fixed"]["report"] == "" for r in runs)


@pytest.mark.parametrize("how, masks_equal, replicas_apart", [("PyTorch, one seed", True, False),
                                                              ("PyTorch, seed + rank", False, True),
                                                              ("tensorplay_edu, one seed", False, False)])
def test_bug_8_dropout_streams(how, masks_equal, replicas_apart):
    got = ranks.compare_ranks(launch(ranks.dropout_streams, 2, how))
    assert got["sharded masks all equal"] is masks_equal and (got["replicas apart"] > 0.1) is replicas_apart, got


def test_bug_9_ranks_fed_different_data():
    apart, together = launch(ranks.fed, 2, "global rank"), launch(ranks.fed, 2, "DP rank")
    assert tp.gap(apart[1]["y"], tp.make_mlp()(apart[1]["x"]).detach()) > 1e-3  # not rank 1's own batch
    assert all(tp.gap(r["y"], tp.make_mlp()(r["x"]).detach()) < ROUNDING for r in together)

"""NCCLRulesMode (tensorplay_edu.gpu_rules.nccl): the package keeps NCCL's and CUDA's rules (the demo, both
plans, float8, async TP and DP x TP under the checker, with the single-device answer), and each rule,
broken on purpose, is reported (the first diverging collective, the rank) instead of hanging."""

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch import nn

import rank_nccl_rules
from tensorplay_edu import launch
from tensorplay_edu.float8 import convert_to_float8_training
from tensorplay_edu.launcher import RankError
from tensorplay_edu.gpu_rules.fingerprint import local_rules as _local_rules
from tensorplay_edu.gpu_rules.nccl import ENV, NCCLRuleError, NCCLRulesMode
from tensorplay_edu.gpu_rules.scaled_mm import problems

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_plans_float8_async_and_dp_by_tp_keep_the_rules_and_the_answer():
    results = launch(rank_nccl_rules.clean_cases, 4, timeout=120)
    for rank, cases in enumerate(results):
        for name, case in cases.items():
            rel = 1e-5 if "float8" in name else 1e-9  # float8: float32 model, the same casts on both sides
            assert all(math.isclose(a, b, rel_tol=rel) for a, b in zip(case["losses"], case["ref_losses"])), \
                (rank, name, case)
            assert case["collectives"] > 0, (rank, name)
    ops = {name: {op for op, _ in case["ops"]} for name, case in results[0].items()}
    assert results[0]["full float8"]["scaled_mm"] > 0  # every float8 matmul checked too
    assert "ring_shift" in ops["full async"] and "ring_shift" not in ops["full dp2"]
    assert ("all_reduce", (0, 2)) in results[0]["full dp2"]["ops"]  # DDP's buckets on rank 0's dp group, checked
    assert ("all_gather", (0, 1)) in results[0]["full dp2"]["ops"]  # and the TP collectives on its tp group


def test_the_demo_runs_under_the_env_switch_unchanged():
    env = dict(os.environ, **{ENV: "1"})
    run = subprocess.run([sys.executable, "-m", "tensorplay_edu.lab.demo", "--world", "4", "--dp", "2", "--steps", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "check against the single-device model: OK" in run.stdout
    checked = [line for line in run.stdout.splitlines() if "NCCL rules (TENSORPLAY_CHECK_NCCL)" in line]
    assert len(checked) == 4 and all("no violation" in line for line in checked), run.stdout


def test_each_planted_bug_is_reported_on_every_rank():
    results = launch(rank_nccl_rules.planted_bugs, 4)
    for name, report in results[0].items():
        assert report.startswith("NCCL rules, collective #"), (name, report)
        assert all(r[name] == report for r in results), name  # the same report on every rank
    bugs = results[0]
    assert "#1 on ranks (0, 1, 2, 3): rank 2 issued all_gather [4, 8] float32 chunks [4, 4, 4, 4] in " \
           "layers.0.attention.wq (forward); ranks 0, 1, 3 issued all_reduce [4, 8] float32 sum" in bugs["other_op"]
    assert "rank 1 issued all_reduce [4, 9] float32 sum" in bugs["other_size"]
    assert "ranks 0, 2, 3 issued all_reduce [4, 8]" in bugs["other_size"]
    assert "rank 3 issued all_gather [4, 8] float32 chunks [4, 4, 4, 3]" in bugs["uneven_chunks"]
    assert "NCCL turns a bool SUM into MAX" in bugs["bool_sum"]
    assert "NCCL cannot move uint16" in bugs["bad_dtype"]
    assert "rank 1 expects [3, 8] float32 from rank 0, which sends [4, 8] float32" in bugs["ring"]
    assert "rank 1 issued scatter [4, 8] float32 src 1 chunks [1, 1, 1, 1]" in bugs["other_source"]
    assert "rank 3 issued all_to_all [1, 8] float32 chunks [1, 1, 1, 1] -> [3, 3, 1, 1]" in bugs["other_split"]
    assert "rank 1 issued all_reduce [8, 4] float32 sum" in bugs["other_layout"]
    assert "the same op, dtype and element count: NCCL compares counts only and would run it" in bugs["other_layout"]
    assert "element count" not in bugs["other_size"]
    assert "rank 1 issued all_reduce [4, 8] int32 sum" in bugs["other_dtype"]  # the dtype is in the fingerprint
    assert "ranks 0, 2, 3 issued all_reduce [4, 8] float32 sum" in bugs["other_dtype"]
    assert "rank 3 issued all_gather [4, 8] float64 chunks [4, 4, 4, 4]" in bugs["other_dtype_gather"]
    assert "element count" not in bugs["other_dtype"]  # not only the shapes differ


def test_old_fingerprints_leave_the_store():
    """Over many collectives the store's key count stays the same (each rank deletes its key of
    collective n - 1 once collective n is complete), on the world group and on a subgroup."""
    for before, after in launch(rank_nccl_rules.store_keys, 3, timeout=120):
        assert before == after, (before, after)


@pytest.mark.parametrize("op, x, out, words", [
    ("all_gather", torch.ones(4, 8), torch.empty(12, 8), "the out to be exactly 4 x the input"),
    ("reduce_scatter", torch.ones(16, 8), torch.empty(2, 8), "the input to be exactly 4 x the out"),
    ("all_reduce", torch.zeros(4, dtype=torch.float8_e4m3fnuz), None, "NCCL reduces no float8"),
    ("all_reduce", torch.zeros(4, dtype=torch.float8_e5m2fnuz), None, "NCCL reduces no float8"),
])
def test_local_rules_of_one_rank(op, x, out, words):
    assert words in _local_rules(op, x, out, dist.ReduceOp.SUM, 4)
    assert _local_rules("broadcast", x, None, None, 4) == ""  # moving any float8 is fine


def test_a_skipped_collective_names_the_rank_instead_of_hanging():
    with pytest.raises(RankError) as err:
        launch(rank_nccl_rules.skipped, 4, 3.0)
    assert "collective #1 on ranks (0, 1, 2, 3): rank 1 did not issue it within 3 s" in str(err.value)
    assert "rank 1 last issued (and may be waiting in): #0 on ranks (0, 1, 2, 3): all_reduce [4]" in str(err.value)


def test_collectives_on_two_groups_in_crossed_orders_are_named():
    with pytest.raises(RankError) as err:
        launch(rank_nccl_rules.crossed_groups, 4, 3.0)
    text = str(err.value)
    # whichever rank reports first: the peer it waits for, and the other group that peer waits in
    assert "did not issue it within 3 s" in text and "last issued (and may be waiting in): #0 on ranks" in text, text
    waits = {0: ("(0, 1)", "(1, 3)"), 1: ("(1, 3)", "(2, 3)"), 2: ("(0, 2)", "(0, 1)"), 3: ("(2, 3)", "(0, 2)")}
    mine, theirs = waits[err.value.rank]
    assert f"collective #0 on ranks {mine}" in text and f"waiting in): #0 on ranks {theirs}" in text, text


def _float8_operands(m=16, k=32, n=16):
    a = torch.randn(m, k).to(torch.float8_e4m3fn)  # row-major
    b = torch.randn(n, k).to(torch.float8_e4m3fn).t()  # [k, n] column-major
    return a, b, torch.tensor(1.0), torch.tensor(1.0)


@pytest.mark.parametrize("bug, words", [
    ("row-major mat2", "mat2 must be column-major"),
    ("column-major mat1", "mat1 must be row-major"),
    ("e5m2 x e5m2", "both operands are float8_e5m2"),
    ("K of 24", "K and N must be multiples of 16"),
    ("float64 scale", "scale_a must be float32"),
    ("bfloat16 operand", "operands must be float8"),
    ("e4m3fnuz operand", "the fnuz float8 types are ROCm's"),
    ("rowwise float32 out", "rowwise scaling writes bfloat16, not float32"),
    ("rowwise scale_a only", "are no recipe"),
    ("per-row scale_b", "are no recipe"),
])
def test_scaled_mm_is_checked_against_the_cuda_kernels_rules(bug, words):
    a, b, sa, sb = _float8_operands(k=24 if bug == "K of 24" else 32)
    if bug == "row-major mat2":
        b = b.contiguous()
    elif bug == "column-major mat1":
        a = a.t().contiguous().t()
    elif bug == "e5m2 x e5m2":
        a, b = a.to(torch.float32).to(torch.float8_e5m2), b.to(torch.float32).to(torch.float8_e5m2)
    elif bug == "float64 scale":
        sa = sa.double()
    elif bug == "bfloat16 operand":
        a = a.to(torch.bfloat16)
    elif bug == "e4m3fnuz operand":
        a = a.to(torch.float32).to(torch.float8_e4m3fnuz)
    elif bug == "rowwise float32 out":
        sa, sb = torch.ones(16, 1), torch.ones(1, 16)
    elif bug == "rowwise scale_a only":
        sa = torch.ones(16, 1)  # with a tensorwise scale_b
    elif bug == "per-row scale_b":
        sa, sb = torch.ones(16, 1), torch.ones(16, 1)  # scale_b must be [1, N]
    original = torch._scaled_mm
    with NCCLRulesMode(), pytest.raises(NCCLRuleError, match=words):
        torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    assert torch._scaled_mm is original  # restored


def test_rowwise_scales_with_a_bfloat16_output_are_a_recipe():
    a, b, _, _ = _float8_operands()
    assert problems(a, b, torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.bfloat16) == []
    assert problems(a, b, torch.ones(()), torch.ones(()), out_dtype=torch.float32) == []  # tensorwise


def test_a_valid_scaled_mm_passes_unchanged_and_is_counted():
    a, b, sa, sb = _float8_operands()
    expected = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    with NCCLRulesMode() as rules:
        got = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    assert torch.equal(got, expected) and rules.scaled_mm_calls == 1 and not rules.records


def test_float8_linear_takes_cudas_padded_path_under_the_mode():
    """Under the mode float8_mm pads K and N to 16 on the CPU too (CUDA's path), so a [16, 48] -> 40 Linear,
    whose unpadded K = 48 and N = 40 CUDA would refuse, passes the checks and gives the unpadded answer."""
    model = convert_to_float8_training(nn.Sequential(nn.Linear(48, 40)))
    x = torch.randn(16, 48, requires_grad=True)
    model(x).sum().backward()
    plain = (model(x).detach(), x.grad.clone(), model[0].weight.grad.clone())
    x.grad, model[0].weight.grad, model[0].bias.grad = None, None, None
    with NCCLRulesMode() as rules:
        out = model(x)
        out.sum().backward()
    assert rules.scaled_mm_calls == 3  # forward, input gradient, weight gradient: all checked, none refused
    assert torch.equal(out.detach(), plain[0]) and torch.equal(x.grad, plain[1])
    assert torch.equal(model[0].weight.grad, plain[2])
    a, b = torch.zeros(16, 48).to(torch.float8_e4m3fn), torch.zeros(40, 48).to(torch.float8_e4m3fn).t()
    one = torch.ones((), dtype=torch.float32)
    with NCCLRulesMode(), pytest.raises(NCCLRuleError, match="K and N must be multiples of 16"):
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)  # the same shapes, unpadded


def test_timeout_must_be_positive():
    with pytest.raises(ValueError, match="NCCLRulesMode: timeout must be a positive number"):
        NCCLRulesMode(timeout=0)

"""The planner: plan() ranks what fits and says why the rest does not; the command line, bad inputs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tensorplay_edu.cluster.search import RESERVE, main, plan
from tensorplay_edu.cluster import GPUS, MODELS, memory, step_time

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tensorplay_edu.cluster.search", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_plan_ranks_feasible_and_explains_refusals():
    feasible, refused = plan("llama3-70b", 64, "h100", seq=8192, batch=1)
    assert feasible and refused
    hbm = GPUS["h100"].hbm_bytes * (1 - RESERVE)  # a plan keeps 10% of HBM free
    speeds = [r["time"]["tokens_per_s"] for r in feasible]
    assert speeds == sorted(speeds, reverse=True)  # best first
    for r in feasible:
        s = r["setup"]
        assert s.gpus == 64 and r["total"] <= hbm and r["total"] == pytest.approx(sum(r["memory"].values()))
        assert r["memory"] == memory(MODELS["llama3-70b"], s) and r["time"] == step_time(MODELS["llama3-70b"], s,
                                                                                          GPUS["h100"])
        assert MODELS["llama3-70b"].kv_heads % s.tp == 0 and s.tp <= 8 and (s.sp or not s.async_tp)
    reasons = [r["reason"] for r in refused]
    assert any("out of memory" in x for x in reasons) and any("KV heads=8 do not divide" in x for x in reasons)
    assert any("larger than a node" in x for x in reasons)
    for r in refused:
        if "out of memory" in r["reason"]:
            assert r["over"] == pytest.approx(sum(memory(MODELS["llama3-70b"], r["setup"]).values()) - hbm)
            assert f"{r['over'] / 1e9:.1f} GB over" in r["reason"]
    # without SP, TP 8 alone keeps too many activations on a 70B at 8192 tokens
    assert not any(r["setup"].tp == 8 and not r["setup"].sp and not r["setup"].checkpoint for r in feasible)
    # more memory per GPU (H200) fits at least as much; a larger reserve refuses what needs more
    assert len(plan("llama3-70b", 64, "h200")[0]) >= len(feasible)
    tight = plan("llama3-70b", 64, "h100", reserve=0.15)[0]
    limit = 0.85 * GPUS["h100"].hbm_bytes
    assert len(tight) < len(feasible) and max(r["total"] for r in tight) <= limit < max(r["total"] for r in feasible)


def test_plan_bad_inputs():
    with pytest.raises(ValueError, match="unknown model 'gpt5'.*llama3-8b"):
        plan("gpt5", 8)
    with pytest.raises(ValueError, match="unknown gpu"):
        plan("llama3-8b", 8, "a100")
    with pytest.raises(ValueError, match="whole number of 8-GPU nodes"):
        plan("llama3-8b", 12)
    with pytest.raises(ValueError, match="seq must be a positive integer"):
        plan("llama3-8b", 8, seq=0)
    with pytest.raises(ValueError, match=r"reserve must be a fraction of HBM in \[0, 1\)"):
        plan("llama3-8b", 8, reserve=1.5)


def test_sp_needs_a_tp_degree_that_divides_the_sequence():
    """seq 8190 = 2 x 4095 splits into equal pieces over 2 GPUs, not over 4 or 8: SP is refused there
    (though 8190 > t), while TP without SP runs at every degree."""
    feasible, refused = plan("llama3-8b", 8, "h100", seq=8190, batch=1)
    with_sp = {r["setup"].tp for r in feasible if r["setup"].sp}
    assert with_sp == {2}, with_sp
    assert {r["setup"].tp for r in feasible if not r["setup"].sp} == {1, 2, 4, 8}
    reasons = {r["reason"] for r in refused if r["over"] == 0}
    assert reasons == {f"tp={t}: SP cannot split seq=8190 into {t} equal pieces" for t in (4, 8)}, reasons
    assert all(r["setup"].sp for r in refused if r["over"] == 0)


def test_cli_prints_best_first_and_refusals():
    out = _cli("--model", "llama3-70b", "--gpus", "64", "--gpu", "h100", "--seq", "8192", "--top", "5")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("llama3-70b (70.6B) on 64 x H100 SXM (80 GB, 90% usable), seq 8192")
    rows = [line for line in text.splitlines() if re.match(r"\s+\d+ tp=", line)]
    assert len(rows) == 5
    tok = [float(line.split()[-1].replace(",", "")) for line in rows]
    assert tok == sorted(tok, reverse=True)
    best = plan("llama3-70b", 64, "h100")[0][0]
    assert f"{best['time']['tokens_per_s_per_gpu']:,.0f}" in rows[0]
    assert "refused:" in text and "out of memory" in text and "KV heads=8 do not divide" in text


@pytest.mark.parametrize("args, message", [
    (["--model", "llama3-9b"], "argument --model: unknown model 'llama3-9b'; known models: llama3-8b"),
    (["--gpus", "12"], "argument --gpus: 12 is not a whole number of 8-GPU nodes"),
    (["--seq", "0"], "argument --seq: must be a positive integer"),
    (["--gpu", "a100"], "argument --gpu: unknown gpu 'a100'"),
    (["--reserve", "1"], "argument --reserve: a fraction of HBM in [0, 1), got 1.0"),
])
def test_cli_bad_inputs(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_cli_bad_input_through_a_subprocess():
    out = _cli("--model", "llama3-9b")
    assert out.returncode == 2 and "known models: llama3-8b, llama3-70b, llama3-405b" in out.stderr


def test_readme_example_is_the_planner_output():
    """docs/cluster_planner.md ("Plan a run") shows the planner's real output (regenerate it when cluster/ changes)."""
    from tensorplay_edu.cluster.search import format_plan
    readme = (ROOT / "docs" / "cluster_planner.md").read_text()
    section = readme[readme.index("# Plan a run"):]
    assert "python -m tensorplay_edu.cluster.search --model llama3-70b --gpus 64 --gpu h100 --seq 8192" in section
    shown = section[section.index("```text\n") + 8:]
    shown = shown[:shown.index("\n```")]
    assert shown == format_plan("llama3-70b", 64, "h100", seq=8192, batch=1, top=3)

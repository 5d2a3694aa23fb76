"""The planner: layouts at one global batch, ties and risky ones marked, what practice runs among the best,
the job that needs more than TP named; the command line (text and --json), bad inputs."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tensorplay_edu.cluster import GPUS, MODELS, error_bands, memory, step_time
from tensorplay_edu.cluster.search import RESERVE, format_plan, main, needs, plan, plan_json

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tensorplay_edu.cluster.search", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_every_layout_runs_the_same_global_batch_and_is_ordered():
    feasible, refused = plan("llama3-70b", 64, "h100", seq=8192, global_batch=128)
    assert feasible and refused
    usable = GPUS["h100"].hbm_bytes * (1 - RESERVE)
    under = error_bands()["memory"][0]
    for r in feasible:
        s = r["setup"]
        assert s.global_batch == 128 and s.gpus == 64 and s.seq == 8192
        assert r["total"] == pytest.approx(sum(memory(MODELS["llama3-70b"], s).values())) and r["total"] <= usable
        assert r["time"] == step_time(MODELS["llama3-70b"], s, GPUS["h100"])
        assert r["risky"] == (r["total"] / under > usable)
        assert not (r["risky"] and r["tie_with_best"])
    # the order: the safe layouts fastest first (the ties among them at the top), then the risky ones
    key = [(r["risky"], not r["tie_with_best"]) for r in feasible]
    assert key == sorted(key)
    best = min(r["time"]["total"] for r in feasible if not r["risky"])
    assert feasible[0]["time"]["total"] == best
    lo, hi = error_bands()["time"]
    for r in feasible:
        if not r["risky"]:
            assert r["tie_with_best"] == (r["time"]["total"] <= best * (1 + max(hi - 1, 1 - lo)))
    for group in (False, True):
        steps = [r["time"]["total"] for r in feasible if r["risky"] == group]
        assert steps == sorted(steps)
    # each layout runs the largest micro-batch that fits and is safe: one sequence more would not be
    for r in feasible[:20]:
        s = r["setup"]
        per_replica = 128 // s.dp
        bigger = [b for b in range(s.batch + 1, per_replica + 1) if per_replica % b == 0]
        if bigger and not r["risky"]:
            b = bigger[0]
            wider = s.__class__(**{**s.__dict__, "batch": b, "micro_batches": per_replica // b})
            total = sum(memory(MODELS["llama3-70b"], wider).values())
            assert total / under > usable or step_time(MODELS["llama3-70b"], wider, GPUS["h100"])["total"] >= \
                r["time"]["total"]
    reasons = [r["reason"] for r in refused]
    assert any("KV heads=8 do not divide" in x for x in reasons)
    assert any("out of memory even at one sequence per micro-batch" in x and "GiB" in x for x in reasons)


@pytest.mark.parametrize("model, gpus, global_batch, practice", [
    # torchtitan Table 1: 8B on 8 GPUs, global batch 16: FSDP 8, TP 1, selective AC
    ("llama3-8b", 8, 16, lambda s: s.tp == 1 and s.fsdp and s.dp == 8),
    # torchtitan's 70B preset on 64 GPUs (FSDP 8 x local batch 8): TP 8 with activation checkpointing
    ("llama3-70b", 64, 64, lambda s: s.tp == 8 and s.fsdp and s.ac != "none"),
    # torchtitan Table 5: 405B on 512 GPUs, global batch 256: TP 8 (with FSDP and PP there)
    ("llama3-405b", 512, 256, lambda s: s.tp == 8 and s.fsdp),
])
def test_the_best_or_a_tie_is_what_practice_runs(model, gpus, global_batch, practice):
    feasible, _ = plan(model, gpus, "h100", seq=8192, global_batch=global_batch)
    best = feasible[0]
    assert best["tie_with_best"] and not best["risky"]
    assert practice(best["setup"]) or any(practice(r["setup"]) for r in feasible if r["tie_with_best"])


def test_what_the_old_planner_got_wrong_is_gone():
    # 8B on 8 GPUs: FSDP 8 fits once selective AC is offered, and ties with the best; the report names it
    feasible, _ = plan("llama3-8b", 8, "h100", global_batch=16)
    fsdp8 = [r for r in feasible if r["setup"].tp == 1]
    assert fsdp8[0]["tie_with_best"] and fsdp8[0]["setup"].ac == "selective" and fsdp8[0]["setup"].fsdp
    named = [line for line in format_plan("llama3-8b", 8, global_batch=16).splitlines()
             if "tie with the best; the one with the smallest TP degree" in line]
    assert len(named) == 1 and named[0].endswith(": tp=1 float8=tensorwise ac=selective fsdp=8")
    # 405B at TP 1 cannot fit: FSDP's gathered layer, prefetch and fp32 reduce buffer are counted
    _, refused = plan("llama3-405b", 512, "h100", global_batch=512)
    tp1 = [r for r in refused if r["setup"].tp == 1 and r["setup"].fsdp and r["setup"].ac == "full"]
    assert tp1 and all(r["over"] > 0 for r in tp1)
    assert memory(MODELS["llama3-405b"], tp1[0]["setup"])["working"] > 30e9
    # TP 1 cannot give 512 replicas a sequence each from a global batch of 256
    _, refused = plan("llama3-405b", 512, "h100", global_batch=256)
    assert any(r["setup"].tp == 1 and "fewer sequences than replicas" in r["reason"] for r in refused)


@pytest.mark.parametrize("model, gpus, seq, global_batch, name", [
    ("llama3-405b", 8, 8192, None, "pipeline parallelism: at tp="),  # the state alone is too big
    ("llama3-405b", 512, 8192, 32, "pipeline parallelism: a global batch of 32 sequences"),
    ("llama3-8b", 8, 262144, None, "context parallelism"),  # one sequence's activations are too big
])
def test_a_job_beyond_tp_and_dp_is_named(model, gpus, seq, global_batch, name):
    assert plan(model, gpus, "h100", seq=seq, global_batch=global_batch)[0] == []
    why = needs(model, gpus, "h100", seq=seq, global_batch=global_batch)
    assert why.startswith(name) and why.endswith("Outside this model")
    assert f"nothing fits: this job needs {why}" in format_plan(model, gpus, "h100", seq=seq, global_batch=global_batch)
    assert needs("llama3-8b", 8, "h100") is None


def test_json_output_fields():
    out = _cli("--model", "llama3-8b", "--gpus", "8", "--global-batch", "16", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data == json.loads(json.dumps(plan_json("llama3-8b", 8, "h100", global_batch=16)))
    assert data["layouts"] and data["refused"] and data["needs"] is None and data["global_batch"] == 16
    for layout in data["layouts"]:
        assert {"tp", "dp", "fsdp", "ac", "sp", "loss_parallel", "async_tp", "float8", "micro_batches", "memory_gib",
                "step_s", "tokens_per_s_per_gpu", "tie_with_best", "risky"} <= set(layout)
        assert layout["ac"] in ("none", "selective", "full") and layout["float8"] in (
            None, "tensorwise", "rowwise", "rowwise_with_gw_hp")
        assert layout["tp"] * layout["dp"] == 8 and layout["dp"] * layout["micro_batch"] * layout["micro_batches"] == 16
        assert isinstance(layout["fsdp"], bool) and isinstance(layout["tie_with_best"], bool)
    first = data["layouts"][0]
    assert first["tie_with_best"] and not first["risky"]
    for refusal in data["refused"]:
        assert set(refusal) == {"layout", "reason"} and refusal["reason"] and "tp" in refusal["layout"]
    nothing = json.loads(_cli("--model", "llama3-405b", "--gpus", "8", "--json").stdout)
    assert nothing["layouts"] == [] and nothing["needs"].startswith("pipeline parallelism")


def test_cli_prints_ties_first_and_refusals():
    out = _cli("--model", "llama3-70b", "--gpus", "64", "--gpu", "h100", "--seq", "8192", "--top", "5")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("llama3-70b on 64 x H100 SXM 80 GB (700 W), 75.7 GiB usable per GPU, global batch 64 x 8192")
    assert "model error on published runs" in text
    rows = [line for line in text.splitlines() if re.match(r"\s+\d+ tp=", line)]
    assert len(rows) == 5
    best = plan("llama3-70b", 64, "h100")[0][0]
    assert f"{best['time']['tokens_per_s_per_gpu']:,.0f}" in rows[0] and rows[0].rstrip().endswith("tie")
    assert "refused, out of memory" in text and "refused, cannot run:" in text and "KV heads=8 do not divide" in text


def test_plan_bad_inputs():
    with pytest.raises(ValueError, match="unknown model"):
        plan("gpt5", 8)
    with pytest.raises(ValueError, match="unknown gpu"):
        plan("llama3-8b", 8, "a100")
    with pytest.raises(ValueError, match="whole number of 8-GPU nodes"):
        plan("llama3-8b", 12)
    with pytest.raises(ValueError, match="seq"):
        plan("llama3-8b", 8, seq=0)
    with pytest.raises(ValueError, match="global_batch"):
        plan("llama3-8b", 8, global_batch=0)
    with pytest.raises(ValueError, match="reserve"):
        plan("llama3-8b", 8, reserve=1.5)


def test_sp_needs_an_even_sequence():
    """seq 8190 = 2 x 4095 splits into equal pieces over 2 GPUs, not over 4 or 8: SP is refused there
    with the reason, and the layouts without SP still fit."""
    feasible, refused = plan("llama3-8b", 8, "h100", seq=8190, global_batch=8)
    assert {r["setup"].tp for r in feasible if r["setup"].sp} == {2}
    assert {r["setup"].tp for r in feasible if not r["setup"].sp} == {1, 2, 4, 8}
    sp_reasons = {r["reason"] for r in refused if "SP cannot" in r["reason"]}
    assert sp_reasons == {f"tp={t}: SP cannot split seq=8190 into {t} equal pieces" for t in (4, 8)}


def test_a_tighter_reserve_or_a_larger_gpu_changes_what_fits():
    feasible = plan("llama3-70b", 64, "h100")[0]
    assert len(plan("llama3-70b", 64, "h200")[0]) >= len(feasible)
    tight = plan("llama3-70b", 64, "h100", reserve=0.25)[0]
    limit = 0.75 * GPUS["h100"].hbm_bytes
    assert max(r["total"] for r in tight) <= limit < max(r["total"] for r in feasible)


@pytest.mark.parametrize("args, message", [
    (["--model", "llama3-9b"], "argument --model: unknown model 'llama3-9b'; known models: llama3-8b"),
    (["--gpus", "12"], "argument --gpus: 12 is not a whole number of 8-GPU nodes"),
    (["--seq", "0"], "argument --seq: must be a positive integer"),
    (["--global-batch", "0"], "argument --global-batch: must be a positive integer"),
    (["--gpu", "a100"], "argument --gpu: unknown gpu 'a100'"),
    (["--reserve", "1"], "argument --reserve: a fraction of HBM in [0, 1), got 1.0"),
    (["--batch", "2"], "unrecognized arguments: --batch 2"),
])
def test_cli_bad_inputs(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_cli_bad_input_through_a_subprocess():
    out = _cli("--model", "llama3-9b")
    assert out.returncode == 2 and "known models: llama3-8b, llama3-70b, llama3-405b" in out.stderr


def test_docs_example_is_the_planner_output():
    """docs/cluster_planner.md ("Plan a run") shows the planner's real output (regenerate it when cluster/ changes)."""
    doc = (ROOT / "docs" / "cluster_planner.md").read_text()
    section = doc[doc.index("# Plan a run"):]
    assert "python -m tensorplay_edu.cluster.search --model llama3-70b --gpus 64 --gpu h100 --seq 8192" in section
    shown = section[section.index("```text\n") + 8:]
    shown = shown[:shown.index("\n```")]
    assert shown == format_plan("llama3-70b", 64, "h100", seq=8192, top=3)


def test_the_float8_recipes_tried_are_a_choice():
    """``float8=`` narrows the recipes the planner tries: ``()`` keeps bf16 layouts only, ``("rowwise",)`` what
    torchtitan still offers; the layouts left are exactly the default plan's layouts with those recipes (or none),
    and a name that is no recipe is refused by ``Setup`` with the recipes listed."""
    everything, _ = plan("llama3-8b", 8, "h100", seq=8192, global_batch=16)
    for recipes in ((), ("rowwise",), "rowwise"):
        feasible, _ = plan("llama3-8b", 8, "h100", seq=8192, global_batch=16, float8=recipes)
        allowed = {None, *((recipes,) if isinstance(recipes, str) else recipes)}
        assert feasible and {r["setup"].float8 for r in feasible} <= allowed
        assert [r["setup"] for r in feasible] == [r["setup"] for r in everything if r["setup"].float8 in allowed]
    with pytest.raises(ValueError, match="rowwise_with_gw_hp"):
        plan("llama3-8b", 8, "h100", global_batch=16, float8=("bf8",))


def test_the_cli_narrows_float8_and_prices_pytorchs_loss(capsys):
    """``--float8 none`` is ``float8=()``; ``--loss pytorch`` prices PyTorch's loss_parallel peak (16 bytes a logit
    against this package's 10, bf16): the logits part of every loss_parallel layout grows by 16 / 10, no other part."""
    def layouts(*args):
        main(["--model", "llama3-8b", "--gpus", "8", "--global-batch", "16", "--json", *args])
        return json.loads(capsys.readouterr().out)["layouts"]
    ours, bf16, pytorch = layouts(), layouts("--float8", "none"), layouts("--loss", "pytorch")
    assert {r["float8"] for r in ours} > {None} == {r["float8"] for r in bf16}
    key = lambda r: tuple(r[k] for k in ("tp", "sp", "loss_parallel", "float8", "async_tp", "fsdp", "ac"))  # noqa: E731
    same = {key(r): r for r in ours}
    pairs = [(same[key(r)], r) for r in pytorch if key(r) in same and r["micro_batch"] == same[key(r)]["micro_batch"]]
    assert any(o["loss_parallel"] for o, _ in pairs) and any(not o["loss_parallel"] for o, _ in pairs)
    for o, p in pairs:
        ratio = 16 / 10 if o["loss_parallel"] else 1
        assert p["memory_parts_gib"]["logits"] == pytest.approx(o["memory_parts_gib"]["logits"] * ratio)
        assert p["memory_parts_gib"]["weights"] == o["memory_parts_gib"]["weights"]
    assert all(r["loss"] == "pytorch" for r in pytorch) and all(r["loss"] == "tensorplay_edu" for r in ours)

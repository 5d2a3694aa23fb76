"""`make demo`'s DP x TP form: python -m tensorplay_edu.lab.demo --world 4 --dp 2."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("plan", ["full", "vanilla"])
def test_demo_dp_by_tp_trains_like_one_device(plan):
    run = subprocess.run([sys.executable, "-m", "tensorplay_edu.lab.demo", "--world", "4", "--dp", "2", "--plan", plan,
                          "--steps", "6"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "on 2 DDP replicas x 2 TP ranks" in run.stdout and "check against the single-device model: OK" in run.stdout
    ddp = [line.split() for line in run.stdout.splitlines() if line.startswith("backward  DDP")]
    assert ddp and all(row[3] == "0,2" for row in ddp), run.stdout  # rank 0's DDP group: its dp column


def test_demo_rejects_a_dp_that_does_not_divide_the_world():
    run = subprocess.run([sys.executable, "-m", "tensorplay_edu.lab.demo", "--world", "3", "--dp", "2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--dp 2 must divide --world 3" in run.stderr


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "argument --steps: must be a positive integer, got '0'"),
    (["--steps", "-3"], "argument --steps: must be a positive integer, got '-3'"),
    (["--world", "0"], "argument --world: must be a positive integer, got '0'"),
    (["--world", "two"], "argument --world: must be a positive integer, got 'two'"),
    (["--dp", "0"], "argument --dp: must be a positive integer, got '0'"),
    (["--world", "3"], "the TP degree world/dp = 3 must divide the model's 8 heads"),
    (["--world", "8", "--dp", "8"], "--dp 8 must divide the batch of 4 sequences"),
])
def test_bad_arguments_are_one_line_usage_errors(argv, message, capsys, monkeypatch):
    """Checked by argparse before any rank starts: exit code 2, the message, no traceback."""
    from tensorplay_edu.lab import demo

    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(demo, "launch", lambda *a, **k: pytest.fail("a bad argument reached launch"))
    with pytest.raises(SystemExit) as done:
        demo.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and message in err and "Traceback" not in err, err


def test_steps_zero_from_the_command_line():
    run = subprocess.run([sys.executable, "-m", "tensorplay_edu.lab.demo", "--steps", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.splitlines()[-1].endswith("error: argument --steps: must be a positive integer, got '0'")

"""`make demo`'s DP x TP form: python -m tensorplay_edu.demo --world 4 --dp 2."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("plan", ["full", "vanilla"])
def test_demo_dp_by_tp_trains_like_one_device(plan):
    run = subprocess.run([sys.executable, "-m", "tensorplay_edu.demo", "--world", "4", "--dp", "2", "--plan", plan,
                          "--steps", "6"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "on 2 DDP replicas x 2 TP ranks" in run.stdout and "check against the single-device model: OK" in run.stdout
    ddp = [line.split() for line in run.stdout.splitlines() if line.startswith("backward  DDP")]
    assert ddp and all(row[3] == "0,2" for row in ddp), run.stdout  # rank 0's DDP group: its dp column


def test_demo_rejects_a_dp_that_does_not_divide_the_world():
    run = subprocess.run([sys.executable, "-m", "tensorplay_edu.demo", "--world", "3", "--dp", "2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--dp 2 must divide --world 3" in run.stderr

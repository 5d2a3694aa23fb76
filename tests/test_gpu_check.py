"""`make gpu-check` (benchmarks/gpu_check.sh) where no GPU is, and its host-sync check on CPU ranks.

On a machine with GPUs the script itself is the test; here it must say SKIP for every check
and exit 0, and benchmarks/gpu_sync_check.py must run on CPU ranks under torchrun.
"""

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = ("a1.", "a2.", "a3.", "b.", "c.", "d.", "d2.", "d3.")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: run make gpu-check itself")


def _gpu_check(path_prefix: str = ""):
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "GPU_CHECK_RANKS")}
    if path_prefix:
        env["PATH"] = path_prefix + os.pathsep + env.get("PATH", "")
    return subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


@no_gpu
def test_gpu_check_skips_every_check_without_a_gpu():
    run = _gpu_check()
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout + run.stderr
    assert [line.split()[1] for line in lines] == list(CHECKS), run.stdout  # one verdict line per check
    assert all(line.startswith("SKIP ") and line.endswith(" (no CUDA device visible)") for line in lines), run.stdout


@no_gpu
def test_gpu_check_fails_when_nvidia_smi_sees_gpus_that_torch_does_not(tmp_path):
    """A CPU build of torch on a GPU machine is a FAIL, not a quiet row of SKIPs."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    run = _gpu_check(str(tmp_path))
    lines = run.stdout.splitlines()
    assert run.returncode == 1, run.stdout + run.stderr
    assert lines[0].startswith("FAIL setup: nvidia-smi lists 1 GPU(s) but torch") and "sees none" in lines[0]
    assert all(line.startswith("SKIP ") for line in lines[1:]) and len(lines) == 1 + len(CHECKS), run.stdout


def test_gpu_sync_check_on_two_cpu_ranks_under_torchrun():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    run = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "benchmarks/gpu_sync_check.py"],
                         cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    verdict = lines[-1]
    assert verdict.startswith("PASS host syncs: none of _local_scalar_dense, item, is_nonzero, equal"), run.stdout
    assert "vanilla and full plans on 2" in verdict
    if not torch.cuda.is_available():  # the CUDA part says it was skipped, and why
        assert "on 2 cpu rank(s); CUDA sync-debug mode skipped (no CUDA device)" in verdict
        assert any(line.startswith("SKIP CUDA sync-debug mode") for line in lines), run.stdout

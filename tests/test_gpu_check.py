"""`make gpu-check` (benchmarks/gpu_check.sh) where no GPU is: every line SKIPs; a dry run on two
gloo ranks runs every line's code (the measurements, the loss comparisons, the host-sync check,
the launch wrapper's backend and device report); a launch that fails gives a FAIL per line that
names the log and the flight recorder's dumps. Plus the small GPU fixes' CPU halves: float8
padding through bytes, the measuring helpers.
"""

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
CHECKS = ("a1.", "a2.", "a3.", "b.", "c.", "d1.", "d2.", "d3.", "d4.", "d5.", "e1.", "e2.", "e3.")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: run make gpu-check itself")


def _gpu_check(path_prefix: str = "", timeout: float = 60, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_") and k != "CUDA_VISIBLE_DEVICES"}
    if path_prefix:
        env["PATH"] = path_prefix + os.pathsep + env.get("PATH", "")
    env.update(env_extra)
    return subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _verdicts(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.split(" ", 1)[0] in ("PASS", "FAIL", "SKIP", "MEASURED")]


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


def _fake_venv(tmp_path, torchrun_body: str) -> str:
    """A VENV whose python is this one and whose torchrun runs ``torchrun_body`` (sh)."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this venv's, with torch
    (venv / "python").chmod(0o755)
    (venv / "torchrun").write_text("#!/bin/sh\n" + torchrun_body)
    (venv / "torchrun").chmod(0o755)
    return str(venv.parent)


@no_gpu
def test_a_failed_launch_is_a_fail_line_per_check_naming_its_log_and_the_flight_recorder_dump(tmp_path):
    """Every launch dies (after "dumping" a flight-recorder file, as NCCL's watchdog does on a timeout):
    each line is a FAIL with the reason, the log and the dump; a3 still SKIPs on 2 ranks."""
    dump = "${TORCH_FR_DUMP_TEMP_FILE:-$TORCH_NCCL_DEBUG_INFO_TEMP_FILE}0"  # the name torch reads, by version
    venv = _fake_venv(tmp_path, f'echo "rank 0 hung in all_gather"\ntouch "{dump}"\nexit 1\n')
    logs = tmp_path / "logs"
    run = _gpu_check(VENV=venv, GPU_CHECK_RANKS="2", GPU_CHECK_LOGS=str(logs))
    assert run.returncode == 1, run.stdout + run.stderr
    lines = _verdicts(run.stdout)
    assert [line.split()[1] for line in lines] == list(CHECKS), run.stdout
    for line in lines:
        if line.split()[1] == "a3.":
            assert line.startswith("SKIP ") and "needs 4 ranks" in line
            continue
        check = line.split()[1].rstrip(".")
        group = check if check in ("a1", "a2", "b", "c") else check[0]  # d1..d5 share one launch, e1..e3 too
        assert line.startswith("FAIL ") and "exit status 1" in line, line
        assert f"(log: {logs}/{group}.log; NCCL flight recorder dumps: {logs}/fr-{group}-0" in line, line
        assert (f"(read them with: {venv}/bin/python -m torch.distributed.flight_recorder.fr_trace {logs} "
                f"--prefix fr-{group}-)") in line, line  # a command that runs as printed
    assert "    | rank 0 hung in all_gather" in run.stdout  # the log's last lines follow the FAIL line


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


@no_gpu
def test_a_launch_past_the_per_check_kill_is_a_timeout_fail_that_leaves_no_rank_behind(tmp_path):
    """The fake torchrun starts a "rank" in a new session (as torchrun does; a process-group kill misses
    it) and hangs: the line is a timeout FAIL and the rank is killed with the launch. A tiny
    GPU_CHECK_TIMEOUT still leaves a positive collective timeout."""
    rank_pid = tmp_path / "rank.pid"
    venv = _fake_venv(tmp_path, f'setsid sleep 300 &\necho $! >"{rank_pid}"\nexec sleep 30\n')
    run = _gpu_check(VENV=venv, GPU_CHECK_RANKS="2", GPU_CHECK_ONLY="c", GPU_CHECK_TIMEOUT="0",
                     GPU_CHECK_LOGS=str(tmp_path / "logs"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "collective timeout 1 s, each check killed after 2 s" in run.stdout  # NCCL's timeout below the kill
    fails = [line for line in _verdicts(run.stdout) if line.startswith("FAIL ")]
    assert len(fails) == 1 and fails[0].startswith("FAIL c. ") and "timed out after 2 s" in fails[0], run.stdout
    pid = int(rank_pid.read_text())
    try:
        assert not _alive(pid), f"the launch's rank (pid {pid}) outlived its kill"
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def _rank_object_collectives_are_not_counted():
    """On one gloo rank of two: gpu_run's counter and report under GPU_CHECK_DEVICE=cuda's rule."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from collections import Counter

    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from gpu_run import CollectiveDevices, collectives_line

    plain = dist.all_gather_object
    mode = CollectiveDevices()
    everyone = [None] * dist.get_world_size()
    with mode:
        dist.all_gather_object(everyone, dist.get_rank())  # PyTorch's rule: on the CPU, not counted
    after_object = (dict(mode.devices), dict(mode.objects), dist.all_gather_object is plain)
    with mode:
        dist.all_reduce(torch.ones(2))  # a plain collective on the CPU: counted
        funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD).wait()  # PyTorch TP's path: counted, wait not
    line, ok = collectives_line(mode.devices, "cuda", mode.objects)
    gpu_line, gpu_ok = collectives_line(Counter(cuda=3), "cuda", Counter(cpu=1))  # a correct GPU run's counts
    return after_object, line, ok, gpu_line, gpu_ok


def test_gpu_run_counts_collectives_but_not_object_collectives_under_the_cuda_rule():
    """The GPU_CHECK_DEVICE=cuda logic on the CPU: an object collective (the CPU by PyTorch's rule on a
    cpu:gloo,cuda:nccl group) is reported apart and cannot fail a run; a CPU all_reduce, plain or functional
    (PyTorch's TP), is counted and fails it."""
    from tensorplay_edu import launch

    for after_object, line, ok, gpu_line, gpu_ok in launch(_rank_object_collectives_are_not_counted, 2,
                                                           timeout=60):
        assert after_object == ({}, {"cpu": 1}, True)  # not counted; wrappers gone after the mode
        assert not ok and line == ("gpu_run: collectives over all ranks (torch.distributed, seen as c10d and "
                                   "_c10d_functional ops): 4 on cpu; required: all on cuda: NO; not counted: "
                                   "2 object collectives on cpu (PyTorch's rule)")
        assert gpu_ok and "6 on cuda; required: all on cuda: yes; not counted: 2 object collectives on cpu" in gpu_line


@no_gpu
def test_gpu_run_ends_every_rank_when_only_rank_0_fails(tmp_path):
    """Rank 0 exits 1, rank 1 exits 0 (the demo on a FAIL): the ranks exchange their codes and end at once,
    well before the collective timeout (rank 1 does not wait in the report's collective)."""
    script = tmp_path / "fails_on_rank0.py"
    script.write_text("import sys\nimport torch.distributed as dist\n"
                      "sys.stdout.write(f'rank {dist.get_rank()} ends\\n')  # one write: no interleaving\n"
                      "sys.stdout.flush()\n"
                      "sys.exit(1 if dist.get_rank() == 0 else 0)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", GPU_CHECK_NCCL_TIMEOUT="300")
    env.pop("GPU_CHECK_DEVICE", None)
    run = subprocess.run([os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone",
                          "--nproc-per-node", "2", "benchmarks/gpu_run.py", str(script)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "rank 0 ends" in out and "rank 1 ends" in out, out[-3000:]
    assert "exchanging exit codes failed" not in out and "gpu_run: collectives" not in out, out[-3000:]


@no_gpu
def test_gpu_check_dry_run_on_two_gloo_ranks_runs_every_lines_code(tmp_path):
    """GPU_CHECK_RANKS=2: a1, a2 and b (run_check, with their own demo arguments), c, and the d and e
    launches with the tiny model. Each line says where it ran; the d lines are MEASURED (no threshold), the
    e lines PASS within a tolerance. a3 SKIPs on 2 ranks (it needs 4): its line is run_check, a1's path, with
    the demo's --dp 2, which tests/test_demo.py runs on 4 ranks; 4 more torchrun ranks here would cost about
    a minute of this test on 2 cores."""
    logs = tmp_path / "logs"
    run = _gpu_check(timeout=900, GPU_CHECK_RANKS="2", GPU_CHECK_ONLY="a1 a2 b c d e", GPU_CHECK_LOGS=str(logs),
                     OMP_NUM_THREADS="1")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    lines = {line.split()[1].rstrip("."): line for line in _verdicts(run.stdout)}
    assert list(lines) == [c.rstrip(".") for c in CHECKS], run.stdout
    where = "on gloo on 2 cpu rank(s)"
    assert lines["a1"].startswith("PASS a1.") and where in lines["a1"] and "single-device model: OK" in lines["a1"]
    assert lines["a2"].startswith("PASS a2.") and where in lines["a2"] and "single-device model: OK" in lines["a2"]
    assert lines["b"].startswith("PASS b.") and where in lines["b"] and "single-process math: OK" in lines["b"]
    assert lines["a3"].startswith("SKIP a3.") and "needs 4 ranks" in lines["a3"]
    assert lines["c"].startswith("PASS c.") and where in lines["c"]
    assert ("none of _local_scalar_dense, item, is_nonzero, equal in a training step (forward, loss, backward, AdamW) "
            "of vanilla bf16, full bf16, full float8, full async on 2 cpu rank(s)") in lines["c"]
    assert "CUDA sync-debug mode skipped (no CUDA device)" in lines["c"]
    for check in ("d1", "d2", "d3", "d4", "d5"):
        line = lines[check]
        assert line.startswith(f"MEASURED {check}. ") and "on 2 cpu rank(s) (cpu:gloo" in line, line
        assert " tokens/s, " in line and "MFU n/a (peak unknown: cpu; " in line and "peak memory n/a (cpu)" in line
    for check in ("e1", "e2", "e3"):
        line = lines[check]
        assert line.startswith(f"PASS {check}. ") and "5 AdamW steps on 2 cpu rank(s) (cpu:gloo" in line, line
        assert "within the tolerance" in line
    assert "against ours in bf16 (e1's)" in lines["e2"] and "the loss falls" in lines["e2"]
    for check in ("d1", "d2", "d3"):
        assert "norm gradients in one bucket as make bench" in lines[check]
    for group in ("a1", "a2", "b", "c", "d", "e"):  # gpu_run.py's report: where, and (d aside) the collectives
        log = (logs / f"{group}.log").read_text()
        assert "gpu_run: ran on: gloo on 2 cpu rank(s) (backend cpu:gloo,cuda:gloo; cpu, cpu); collective" in log
        watched = "gpu_run: collectives over all ranks (torch.distributed, seen as c10d and _c10d_functional ops): "
        assert (watched in log) == (group != "d"), log[-2000:]


def test_float8_padding_through_bytes_is_bit_identical():
    """_pad of a float8 tensor (torch.cat on float8 is CUDA-only from torch 2.6): the bits of the input,
    then zero bytes (+0.0); as torch.cat on float8 gives where it exists, also for a transposed view."""
    from tensorplay_edu.float8.float8_linear import _pad

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        x = (torch.randn(5, 7, generator=g) * 100).to(dtype)
        for src, dim in ((x, 1), (x, 0), (x.t(), 0), (x.t(), 1)):
            padded = _pad(src, dim, 16)
            assert padded.dtype == dtype and padded.shape[dim] == 16
            raw = padded.view(torch.uint8)
            assert torch.equal(raw.narrow(dim, 0, src.shape[dim]), src.contiguous().view(torch.uint8))
            assert not raw.narrow(dim, src.shape[dim], 16 - src.shape[dim]).any()  # zero bytes: +0.0
            zeros = torch.zeros([16 - src.shape[dim] if d == dim else n for d, n in enumerate(src.shape)], dtype=dtype)
            assert torch.equal(raw, torch.cat([src, zeros], dim=dim).view(torch.uint8))  # CPU has float8 cat
        assert _pad(x, 1, 7) is x  # already a multiple: untouched
    wide = torch.randn(3, 5)
    assert torch.equal(_pad(wide, 1, 4), torch.cat([wide, torch.zeros(3, 3)], dim=1))


def test_gpu_measure_counts_flops_as_scale_does_and_finds_the_peak_by_name():
    from gpu_model import CONFIGS, model_flops, peak_flops
    from tensorplay_edu.cluster import GPUS, Model, Setup, reported_flops

    c = CONFIGS["gpu"]
    assert (c["dim"], c["n_heads"], c["n_kv_heads"], c["ffn_hidden"], c["seq"]) == (4096, 32, 8, 14336, 8192)
    model = Model("m", c["n_layers"], c["dim"], c["n_heads"], c["n_kv_heads"], c["ffn_hidden"], c["vocab_size"])
    per_gpu = reported_flops(model, Setup(tp=8, batch=c["batch"], seq=c["seq"]))
    assert model_flops(c) / 8 == pytest.approx(per_gpu, rel=1e-12)  # per GPU, t = 8
    assert peak_flops("NVIDIA H100 80GB HBM3") == (989e12, "of H100 SXM 80 GB (700 W)'s bf16 989 TFLOP/s")
    assert peak_flops("NVIDIA H200")[0] == 989e12
    for name in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA A100-SXM4-80GB"):
        assert peak_flops(name) == (None, f"peak unknown: {name} is not in tensorplay_edu.cluster.GPUS")


def test_gpu_measure_fails_a_non_finite_loss_and_a_float8_loss_far_from_bf16(monkeypatch):
    """max() ignores NaN, so every loss must be finite (the FAIL names the step); e2 also holds float8 TP to
    e1's bf16 losses and wants its loss to fall. One "rank" (stubbed group), canned losses."""
    import gpu_measure
    from gpu_model import CONFIGS

    monkeypatch.setattr(gpu_measure.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(gpu_measure.dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(gpu_measure.dist, "get_backend_config", lambda: "cpu:gloo")
    monkeypatch.setattr(gpu_measure.dist, "barrier", lambda: None)
    monkeypatch.setattr(gpu_measure.dist, "broadcast_object_list", lambda box, src: None)
    canned = {}
    monkeypatch.setattr(gpu_measure, "losses", lambda kind, c, device, steps: canned[kind])
    cpu, c = torch.device("cpu"), CONFIGS["tiny"]

    canned.update(ours=[6.0, 5.9, float("nan")], torch=[6.0, 5.9, 5.8])
    line = gpu_measure.match_line("e1", c, cpu, 3, {})
    assert line.startswith("FAIL e1. ") and "ours's loss at step 2 is nan (every loss must be finite)" in line, line
    canned.update({"ours": [6.0, 5.9, 5.8], "ours float8": [6.3, 6.2, 6.1], "single float8": [6.3, 6.2, 6.1]})
    line = gpu_measure.match_line("e2", c, cpu, 3, {})  # float8 agrees with itself, not with bf16
    assert line.startswith("FAIL e2. ") and "within the tolerance" in line and "3.0e-01 ABOVE 0.1" in line, line
    canned.update({"ours float8": [6.0, 6.0, 6.01], "single float8": [6.0, 6.0, 6.01]})
    line = gpu_measure.match_line("e2", c, cpu, 3, {})
    assert line.startswith("FAIL e2. ") and "the loss does NOT fall" in line, line
    canned.update({"ours float8": [6.01, 5.92, 5.8], "single float8": [6.0, 5.9, 5.81]})
    assert gpu_measure.match_line("e2", c, cpu, 3, {}).startswith("PASS e2. ")


def test_gpu_measure_estimates_e2s_one_gpu_reference():
    """e2 SKIPs below this estimate (on a GPU; never on the CPU): the GPU config's reference fits 80 GB."""
    from gpu_model import CONFIGS, reference_bytes, too_small

    assert 25 * 2**30 < reference_bytes(CONFIGS["gpu"]) < 70 * 2**30
    assert too_small(CONFIGS["gpu"], torch.device("cpu")) == ""

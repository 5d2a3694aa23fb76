"""The launcher: results, failures, timeouts, re-launch, concurrency, prints, threads."""

import contextlib
import inspect
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

import tensorplay_edu
from tensorplay_edu import RankError, launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # the process may end between the two calls: reading its stat then fails
        with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _pids(path):
    with open(path) as f:
        return [int(line) for line in f.read().split()]


def _note_pid(path):
    """Write this rank's pid, and wait until every rank has written its own."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    dist.barrier()


def test_results_come_back_in_rank_order_with_args_and_tensors():
    def work(scale, offset):  # a closure: travels by value, like a notebook cell's function
        x = torch.full((2,), float(dist.get_rank()))
        dist.all_reduce(x)
        return {"rank": dist.get_rank(), "world": dist.get_world_size(), "x": x * scale + offset}

    out = launch(work, 3, 2.0, 1.0)
    assert [o["rank"] for o in out] == [0, 1, 2] and {o["world"] for o in out} == {3}
    for o in out:  # tensors are plain copies that outlive the ranks
        assert torch.equal(o["x"], torch.full((2,), 7.0))


def test_lambda_and_single_rank():
    assert launch(lambda: dist.get_world_size() * 10, 1) == [10]


def test_a_rank_that_raises_is_named_fast_and_nobody_is_left(tmp_path):
    pidfile = str(tmp_path / "pids")

    def work():
        _note_pid(pidfile)
        if dist.get_rank() == 1:
            raise ValueError("boom on purpose")
        dist.all_reduce(torch.ones(1))  # the others wait here for rank 1, forever
        return "unreachable"

    start = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(work, 3)
    assert time.monotonic() - start < 10
    assert info.value.rank == 1 and "rank 1 of 3 raised" in str(info.value)
    assert "ValueError: boom on purpose" in info.value.remote_traceback
    pids = _pids(pidfile)
    assert len(pids) == 3 and all(_gone(p) for p in pids)


def test_a_rank_that_exits_without_a_word(tmp_path):
    pidfile = str(tmp_path / "pids")

    def work():
        _note_pid(pidfile)
        if dist.get_rank() == 0:
            sys.stdout.flush()
            os._exit(7)
        dist.barrier()

    with pytest.raises(RankError, match="rank 0 of 2 exited with code 7"):
        launch(work, 2)
    pids = _pids(pidfile)
    assert len(pids) == 2 and all(_gone(p) for p in pids)


def test_mismatched_collectives_end_in_a_timeout_error_not_a_hang(tmp_path):
    pidfile = str(tmp_path / "pids")

    def work():
        _note_pid(pidfile)
        x = torch.ones(4)
        if dist.get_rank() == 0:
            dist.all_reduce(x)
        else:
            dist.all_gather_single(torch.empty(8), x) if hasattr(dist, "all_gather_single") else \
                dist.all_gather_into_tensor(torch.empty(8), x)
        return "done"

    start = time.monotonic()
    with pytest.raises((RankError, TimeoutError)) as info:
        launch(work, 2, timeout=3)
    assert time.monotonic() - start < 20
    message = str(info.value).lower()
    assert "collective" in message and ("timed out" in message or "still running" in message or "mismatch" in message)
    pids = _pids(pidfile)
    assert len(pids) == 2 and all(_gone(p) for p in pids)


def test_a_skipped_collective_times_out_in_the_parent():
    def work():
        if dist.get_rank() == 0:
            time.sleep(30)  # never joins rank 1's final barrier in time
        return dist.get_rank()

    start = time.monotonic()
    with pytest.raises((TimeoutError, RankError), match="still running|timed out"):
        launch(work, 2, timeout=2)
    assert time.monotonic() - start < 15


def test_a_size_mismatch_abort_gets_the_hint_and_names_from_local():
    def work():  # uneven pieces without shape=: rank 3 infers 4 rows, the others 12; gloo aborts rank 3 in C++
        mesh = tensorplay_edu.init_device_mesh("cpu", (dist.get_world_size(),))
        x = torch.randn(3 if dist.get_rank() < 3 else 1, 4)
        return tensorplay_edu.DTensor.from_local(x, mesh, [tensorplay_edu.Shard(0)]).full_tensor()

    start = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(work, 4, timeout=10)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert info.value.rank == 3 and "rank 3 of 4 exited with code -6" in message
    assert "collective mismatch" in message and "different collectives" in message
    assert "pass shape= to DTensor.from_local, or run_check=True" in message


def test_a_rank_that_only_lost_its_peer_waits_for_the_root_cause(tmp_path):
    pidfile = str(tmp_path / "pids")

    def work():
        _note_pid(pidfile)
        if dist.get_rank() == 1:
            dist.destroy_process_group()  # its connections close: rank 0 reads "Connection closed by peer" at once
            time.sleep(0.5)
            raise ValueError("the root cause, reported late")
        dist.all_reduce(torch.ones(4))

    with pytest.raises(RankError) as info:
        launch(work, 2, timeout=10)
    assert info.value.rank == 1 and "ValueError: the root cause" in info.value.remote_traceback
    assert "rank 1 failed first; then rank(s) [0] lost their connection to it" in str(info.value)
    assert all(_gone(p) for p in _pids(pidfile))


def test_a_rank_that_lost_its_peer_gets_the_mismatch_hint(tmp_path):
    pidfile = str(tmp_path / "pids")

    def work():
        _note_pid(pidfile)
        if dist.get_rank() == 1:
            dist.destroy_process_group()  # gone from the group without a word, as after a skipped collective
            time.sleep(30)
        dist.all_reduce(torch.ones(4))

    start = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(work, 2, timeout=10)
    assert time.monotonic() - start < 10  # the 2 s grace, not the 10 s timeout nor rank 1's 30 s
    message = str(info.value)
    assert info.value.rank == 0 and ("closed by peer" in message or "reset by peer" in message)
    assert "rank 0 lost its peer in a collective: the ranks probably issued different collectives" in message
    assert all(_gone(p) for p in _pids(pidfile))


_CTRL_C_SCRIPT = """
import os, signal, sys, time
# As from a terminal, whatever the test runner had: a shell's background job (`make test &`, nohup) starts
# with SIGINT ignored, which every child inherits, and then no KeyboardInterrupt would ever come.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
import torch.distributed as dist
from tensorplay_edu import launch

def work():
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(60)

if sys.argv[2] == "while ranks run":
    launch(dist.get_rank, 2)  # the forkserver is up: the next launch starts at once
print("launching", flush=True)
launch(work, 2)
"""


def _press_ctrl_c(script, case):
    """Run ``script``, press Ctrl-C while it launches: its exit code, its stderr, and what it left running."""
    pidfile = script.parent / case.replace(" ", "_").replace(",", "")
    proc = subprocess.Popen([sys.executable, str(script), str(pidfile), case], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    watchdog = threading.Timer(300, os.killpg, (proc.pid, signal.SIGKILL))  # never hang, whatever the script does
    watchdog.start()
    try:
        assert proc.stdout.readline() == "launching\n"
        if case == "while ranks run":
            while len(pidfile.read_text().split() if pidfile.exists() else []) < 2 and proc.poll() is None:
                time.sleep(0.05)
        else:
            time.sleep(0.5)  # the forkserver is still importing torch, for seconds: no rank has started yet
        # a terminal's Ctrl-C signals the whole foreground group; a notebook's interrupt only the kernel
        (os.kill if case == "kernel only, first launch" else os.killpg)(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=240)  # a loaded machine: the forkserver may import torch for a minute
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for _ in range(100):  # the forkserver and the resource tracker end once they see the script gone
        left = [int(p) for p in os.listdir("/proc") if p.isdigit() and _in_group(int(p), proc.pid)]
        if not left:
            break
        time.sleep(0.1)
    return proc.returncode, err, left + [p for p in (_pids(pidfile) if pidfile.exists() else []) if not _gone(p)]


def _in_group(pid, group):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return int(fields[2]) == group and fields[0] != "Z"


@pytest.mark.parametrize("case", ["group, first launch", "kernel only, first launch", "while ranks run"])
def test_ctrl_c_ends_the_launch_with_a_plain_keyboard_interrupt_and_no_rank_left(tmp_path, case):
    script = tmp_path / "ctrl_c.py"
    script.write_text(_CTRL_C_SCRIPT)
    code, err, left = _press_ctrl_c(script, case)
    assert err.count("Traceback") == 1 and err.rstrip().endswith("\nKeyboardInterrupt"), err
    assert "FileNotFoundError" not in err and code == -signal.SIGINT and left == []


def test_relaunch_and_two_launches_at_once():
    def work(tag):
        x = torch.ones(3) * (dist.get_rank() + 1)
        dist.all_reduce(x)
        return (tag, x.tolist())

    first = launch(work, 2, "a")
    assert launch(work, 2, "a") == first  # re-running "the cell"
    out = {}
    threads = [threading.Thread(target=lambda k=k: out.__setitem__(k, launch(work, 2, k))) for k in ("x", "y")]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert out == {"x": [("x", [3.0] * 3)] * 2, "y": [("y", [3.0] * 3)] * 2}


def test_prints_arrive_whole_in_rank_order(capfd):
    def work():
        for i in range(3):
            print(f"python line {i} from {dist.get_rank()}")
            time.sleep(0.01 * (2 - dist.get_rank()))
        os.write(1, f"C-level write from {dist.get_rank()}\n".encode())
        return None

    launch(work, 2)
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("[rank")]
    assert lines == [
        "[rank 0] python line 0 from 0", "[rank 0] python line 1 from 0", "[rank 0] python line 2 from 0",
        "[rank 0] C-level write from 0",
        "[rank 1] python line 0 from 1", "[rank 1] python line 1 from 1", "[rank 1] python line 2 from 1",
        "[rank 1] C-level write from 1",
    ]


def test_one_thread_per_rank_by_default():
    assert launch(torch.get_num_threads, 2) == [1, 1]
    assert launch(torch.get_num_threads, 1, threads=2) == [2]


def test_defaults_and_argument_errors():
    params = inspect.signature(launch).parameters
    assert params["timeout"].default <= 60 and params["backend"].default == "gloo"
    with pytest.raises(ValueError, match="world_size"):
        launch(print, 0)
    with pytest.raises(ValueError, match="backend"):
        launch(print, 1, backend="mpi")
    # launch(None), launch(timeout=-1), launch(threads=0): the bad-input catalogue (test_bad_inputs.py)
    if torch.cuda.device_count() < 2:
        with pytest.raises(RuntimeError, match="CUDA"):
            launch(print, 2, backend="nccl")


def test_a_result_that_cannot_travel_is_explained():
    def work():
        return dist.group.WORLD

    with pytest.raises(RankError, match="cannot be sent back"):
        launch(work, 1)


def test_notebook_defined_function_runs_without_stderr():
    import nbformat  # both come with nbval
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import torch\ntorch.ones(64, 64) @ torch.ones(64, 64)  # warm the OpenMP pool"),
        nbformat.v4.new_code_cell(
            "import torch.distributed as dist\nfrom tensorplay_edu import launch\n"
            "def work(n):\n    x = torch.ones(64, 64) @ torch.ones(64, 64)\n    print('hi', dist.get_rank())\n"
            "    return dist.get_rank() * n + int(x[0, 0])\n"
            "print(launch(work, 2, 10))\nprint(launch(work, 2, 10))"),
    ]
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": ROOT}}).execute()
    outputs = nb.cells[1].outputs
    assert all(o.get("name") != "stderr" for o in outputs), outputs
    text = "".join(o.get("text", "") for o in outputs)
    assert text == "[rank 0] hi 0\n[rank 1] hi 1\n[64, 74]\n" * 2


def test_demo_under_torchrun_and_launch():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    run = subprocess.run([torchrun, "--nproc-per-node", "2", "-m", "tensorplay_edu.lab.demo", "--steps", "4"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "check against the single-device model: OK" in run.stdout and "on 2 rank(s)" in run.stdout
    for flags, ok in [(["--world", "3", "--transitions"], "check against single-process math: OK"),
                      (["--world", "2", "--plan", "vanilla", "--steps", "3", "--dtype", "float32"],
                       "check against the single-device model: OK")]:
        run = subprocess.run([sys.executable, "-m", "tensorplay_edu.lab.demo", *flags], cwd=ROOT, capture_output=True,
                             text=True, timeout=240)
        assert run.returncode == 0 and ok in run.stdout, run.stdout + run.stderr


def _cpu_and_cuda_meshes():
    import tensorplay_edu as tp
    from tensorplay_edu.launcher.torchrun import current_device

    out = {"device": current_device().type}
    for device in ("cpu", "cuda"):
        mesh = tp.init_device_mesh(device, (dist.get_world_size(),))
        x = torch.arange(4.0, device=device).view(2, 2)
        out[device] = tp.distribute_tensor(x, mesh, [tp.Shard(0)]).full_tensor().cpu().tolist()
    return out


def test_nccl_launch_serves_cpu_and_cuda_meshes():
    """On a machine with 2 GPUs: one group with gloo for CPU tensors and NCCL for CUDA ones.
    Elsewhere (CI, laptops): the clear error, naming how many CUDA devices were found."""
    if torch.cuda.device_count() >= 2:
        for result in launch(_cpu_and_cuda_meshes, 2, backend="nccl"):
            assert result == {"device": "cuda", "cpu": [[0.0, 1.0], [2.0, 3.0]], "cuda": [[0.0, 1.0], [2.0, 3.0]]}
    else:
        with pytest.raises(RuntimeError, match=f"needs 2 CUDA devices, found {torch.cuda.device_count()}"):
            launch(_cpu_and_cuda_meshes, 2, backend="nccl")


def test_float8_results_come_back():
    def work():
        return {"x": torch.tensor([1.0, -2.0, 448.0]).to(torch.float8_e4m3fn), "y": [torch.ones(1).to(torch.float8_e5m2)]}

    out = launch(work, 1)[0]
    assert out["x"].dtype == torch.float8_e4m3fn and out["x"].float().tolist() == [1.0, -2.0, 448.0]
    assert out["y"][0].dtype == torch.float8_e5m2


# ---- faults outside any collective, and the parent's death (issue 18) --------------------------------

_HANG_SCRIPT = """
import os, sys, time
from tensorplay_edu import launch

def hang(note):
    with open(note, "w") as f:  # this launch's folder: its log is this rank's stdout
        f.write(os.path.dirname(os.readlink("/proc/self/fd/1")))
    time.sleep(3600)  # outside any collective: no collective timeout will ever fire

try:
    launch(hang, 2, sys.argv[1], timeout=3)
except TimeoutError as err:
    print("TimeoutError:", err)
print("its folder is left:", os.path.exists(open(sys.argv[1]).read()))
"""


def test_ranks_that_all_hang_outside_a_collective_end_in_a_timeout_error(tmp_path):
    """Before issue 18 such a launch never returned; the script runs under subprocess's own timeout."""
    script = tmp_path / "hang.py"
    script.write_text(_HANG_SCRIPT)
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "folder")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert "TimeoutError: ranks [0, 1] used no CPU" in run.stdout, run.stdout + run.stderr
    assert "launch(timeout=...)" in run.stdout
    assert "its folder is left: False" in run.stdout


_ORPHAN_SCRIPT = """
import os, sys, time
from tensorplay_edu import launch

def hang(path):
    folder = os.path.dirname(os.readlink("/proc/self/fd/1"))  # this launch's folder: its log is our stdout
    with open(path, "a") as f:
        f.write(f"{os.getpid()} {folder}\\n")
    time.sleep(3600)

launch(hang, 2, sys.argv[1], timeout=600)
"""


def test_ranks_and_forkserver_die_with_their_parent_and_leave_no_folder(tmp_path):
    """SIGKILL of the launching process: nothing of it may run on, and its temporary folder goes."""
    script, note = tmp_path / "orphan.py", tmp_path / "ranks"
    script.write_text(_ORPHAN_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(note)], cwd=ROOT, start_new_session=True)
    try:
        for _ in range(600):  # the ranks write their pid and folder (the first launch starts a forkserver)
            if note.exists() and len(note.read_text().split("\n")) > 2:
                break
            time.sleep(0.1)
        ranks = [line.split() for line in note.read_text().splitlines()]
        family = [int(p) for p in os.listdir("/proc") if p.isdigit() and _in_group(int(p), proc.pid)]
        assert len(ranks) == 2 and len(family) >= 4  # the script, its forkserver (and tracker), two ranks
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        pids = [int(pid) for pid, _ in ranks] + [p for p in family if p != proc.pid]
        for _ in range(300):
            if all(_gone(p) for p in pids) and not os.path.exists(ranks[0][1]):
                break
            time.sleep(0.1)
        assert [p for p in pids if not _gone(p)] == []
        assert not os.path.exists(ranks[0][1]), ranks[0][1]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_function_that_sets_torchs_inductor_config_travels():
    """torchtitan's async-TP line in a launched function (torch._inductor.config is a module of its own
    class, which plain cloudpickle refused: "cannot pickle 'ConfigModuleInstance' object")."""
    import torch._inductor.config as inductor_config

    def work():
        inductor_config._micro_pipeline_tp = True
        return torch._inductor.config._micro_pipeline_tp

    assert launch(work, 2) == [True, True]
    assert inductor_config._micro_pipeline_tp is False  # the parent's is untouched

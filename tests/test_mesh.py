"""DeviceMesh: inside launched ranks, and with no process group at all."""

import signal
import subprocess
import sys

import pytest

import rank_api
from tensorplay_edu import launch


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_mesh_api_inside_ranks(world_size):
    results = launch(rank_api.mesh_api, world_size)
    fails = sorted({f for rank_fails, _ in results for f in rank_fails})
    assert not fails, "\n".join(fails)
    assert min(n for _, n in results) >= 15


def _python(code: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin"}  # no RANK / WORLD_SIZE from anywhere
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_one_rank_mesh_needs_no_launcher():
    run = _python(
        "import torch\nfrom tensorplay_edu import init_device_mesh, distribute_tensor, Shard\n"
        "mesh = init_device_mesh('cpu', (1,))\nx = torch.arange(6.).view(2, 3)\n"
        "d = distribute_tensor(x, mesh, [Shard(1)])\nassert torch.equal(d.full_tensor(), x)\nprint('ok', mesh.size())\n")
    assert run.returncode == 0 and run.stdout.strip() == "ok 1", run.stderr


def test_many_rank_mesh_without_ranks_says_how_to_start_them():
    run = _python("from tensorplay_edu import init_device_mesh\ninit_device_mesh('cpu', (4,))\n")
    assert run.returncode != 0 and "tensorplay_edu.launch" in run.stderr and "torchrun" in run.stderr


def _mismatched_on_dp():
    import torch
    import torch.distributed as dist
    from tensorplay_edu import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    x = torch.ones(4 if mesh.get_local_rank("dp") == 0 else 3)  # the dp pair disagrees on the size
    dist.all_reduce(x, group=mesh.get_group("dp"))
    return "unreachable"


def test_a_mismatched_collective_on_a_sub_mesh_times_out_like_the_world_group():
    """mesh["dp"]'s groups take launch's timeout (dist.new_group alone gives gloo's 30 minutes)."""
    import time

    from tensorplay_edu import RankError

    def hung(signum, frame):
        raise AssertionError("the mismatched collective hung past launch's timeout (a sub-group of 30 minutes?)")

    start, previous = time.monotonic(), signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)  # a regression hangs: fail instead (launch's finally then kills the ranks)
    try:
        with pytest.raises((RankError, TimeoutError)) as info:
            launch(_mismatched_on_dp, 4, timeout=3)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - start < 30
    assert "different sizes" in str(info.value) or "mismatch" in str(info.value), str(info.value)

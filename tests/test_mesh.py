"""DeviceMesh: inside launched ranks, and with no process group at all."""

import signal
import subprocess
import sys

import pytest

import rank_mesh
from checks import clean
from tensorplay_edu import launch


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_mesh_api_inside_ranks(world_size):
    clean(launch(rank_mesh.mesh_api, world_size), at_least=15)


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


# ---- init_device_mesh("cuda") without CUDA ----------------------------------------------------------------

@pytest.mark.parametrize("available, count", [(False, 0), (True, 0)])  # (True, 0): a device count of 0 divided by
def test_a_cuda_mesh_without_cuda_names_the_fix(monkeypatch, available, count):
    import torch
    import torch.distributed as dist

    from tensorplay_edu import DeviceMesh, init_device_mesh

    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    for build in (lambda: init_device_mesh("cuda", (2,)), lambda: DeviceMesh("cuda", [0, 1])):
        with pytest.raises(RuntimeError) as info:
            build()
        message = str(info.value)
        assert "no CUDA device" in message and "'cpu'" in message and "GPU machine" in message, message
        assert "CUDA build of PyTorch" in message, message
    assert not dist.is_initialized()  # refused before any process group started


# ---- TP groups and nodes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, names, per_node, spans", [
    ((2, 2), ("dp", "tp"), 2, None),          # rows [0, 1], [2, 3]: one node each
    ((2, 4), ("dp", "tp"), 4, None),          # 2 nodes x 4 GPUs
    ((4, 2), ("dp", "tp"), 4, None),          # TP of 2 inside a node of 4: still fine
    ((2, 2), ("tp", "dp"), 2, [0, 2]),        # tp named first: columns, across the nodes
    ((4,), None, 2, [0, 1, 2, 3]),            # 1-D, unnamed: the whole world as TP
    ((2, 3), ("dp", "tp"), 2, [0, 1, 2]),     # TP of 3 does not divide 2 ranks per node
    ((4,), ("dp",), 2, None),                 # named without "tp": no TP dimension to check
    ((2, 2), ("dp", "tp"), 4, None),          # one node holds everything
])
def test_tp_across_nodes(shape, names, per_node, spans):
    import math

    import torch

    from tensorplay_edu.mesh import tp_across_nodes

    reason = tp_across_nodes(torch.arange(math.prod(shape)).view(shape), names, per_node)
    if spans is None:
        assert reason is None
    else:
        assert f"ranks {spans} in one TP group" in reason and f"LOCAL_WORLD_SIZE={per_node}" in reason, reason


def test_no_local_world_size_means_nothing_to_check(monkeypatch):
    import torch

    from tensorplay_edu.mesh import tp_across_nodes

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert tp_across_nodes(torch.arange(4).view(2, 2), ("tp", "dp")) is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert "ranks [0, 2]" in tp_across_nodes(torch.arange(4).view(2, 2), ("tp", "dp"))


def _meshes_as_on_two_nodes():
    """4 ranks told they sit on 2 nodes of 2 (launch says 1 node of 4): which meshes warn, and how often."""
    import os
    import warnings

    import torch.distributed as dist

    from tensorplay_edu import init_device_mesh

    os.environ["LOCAL_WORLD_SIZE"] = "2"
    out = {}
    for shape, names in [((2, 2), ("dp", "tp")), ((2, 2), ("tp", "dp")), ((2, 2), ("tp", "dp")), ((4,), None)]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            init_device_mesh("cpu", shape, mesh_dim_names=names)
        out.setdefault(f"{shape} {names}", []).extend(
            (w.category.__name__, str(w.message)) for w in caught if "TP group" in str(w.message))
    dist.barrier()
    return out


def test_init_device_mesh_warns_once_when_a_tp_group_spans_nodes():
    """Rank 0 warns, once per layout, with the reason and the fix; the other ranks stay quiet."""
    results = launch(_meshes_as_on_two_nodes, 4)
    good, turned, flat = (results[0][key] for key in ("(2, 2) ('dp', 'tp')", "(2, 2) ('tp', 'dp')", "(4,) None"))
    assert good == [] and len(turned) == 1 and len(flat) == 1, results[0]  # the turned mesh built twice, warned once
    for category, message in turned + flat:
        assert category == "UserWarning"
        assert "NVLink" in message and "~9x slower" in message and "mesh_dim_names=('dp', 'tp')" in message
        assert "init_device_mesh(..., (2, 2)" in message and message.endswith("."), message
    assert "ranks [0, 2] in one TP group" in turned[0][1] and "ranks [0, 1, 2, 3]" in flat[0][1]
    assert all(messages == [] for result in results[1:] for messages in result.values()), results


def test_node_picture_shows_tp_inside_nodes_and_dp_across():
    """viz.draw_nodes: what it draws is what node_groups says, and node_groups agrees with the mesh's check."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.colors as mcolors
    import matplotlib.pyplot as plt
    import torch

    from tensorplay_edu.mesh import tp_across_nodes
    from tensorplay_edu.viz import COMM_COLOR, RANK_COLORS, draw_nodes, node_groups

    good = node_groups((2, 4), 4)
    assert good["nodes"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert good["groups"]["tp"] == [([0, 1, 2, 3], [0]), ([4, 5, 6, 7], [1])]
    assert good["groups"]["dp"] == [([r, r + 4], [0, 1]) for r in range(4)]
    bad = node_groups((4, 2), 4, ("tp", "dp"))
    assert bad["groups"]["tp"] == [([0, 2, 4, 6], [0, 1]), ([1, 3, 5, 7], [0, 1])]
    for shape, names, layout in [((2, 4), None, good), ((4, 2), ("tp", "dp"), bad)]:
        spans = tp_across_nodes(torch.arange(8).view(shape), names, 4) is not None
        assert spans == any(len(nodes) > 1 for _, nodes in layout["groups"]["tp"])

    texts = lambda fig: [t.get_text() for t in fig.axes[0].texts]  # noqa: E731
    fig = draw_nodes((2, 4), 4)
    assert [f"rank {r}" for r in range(8)] == [t for t in texts(fig) if t.startswith("rank")]
    assert {"node 0 (NVLink inside)", "node 1 (NVLink inside)", "tp [0, 1, 2, 3]", "dp [3, 7]"} <= set(texts(fig))
    assert not any("crosses" in t for t in texts(fig))
    assert [mcolors.to_hex(p.get_facecolor()) for p in fig.axes[0].patches[2:]] == [c.lower() for c in RANK_COLORS]
    fig = draw_nodes((4, 2), 4, ("tp", "dp"))
    crossing = [t for t in fig.axes[0].texts if t.get_text().endswith("crosses nodes")]
    assert [t.get_text() for t in crossing] == ["tp [0, 2, 4, 6] crosses nodes", "tp [1, 3, 5, 7] crosses nodes"]
    assert all(mcolors.to_hex(t.get_color()) == COMM_COLOR.lower() for t in crossing)
    plt.close("all")
    with pytest.raises(ValueError, match="gpus_per_node=3 must divide"):
        node_groups((2, 4), 3)
    with pytest.raises(ValueError, match="one colour per rank"):
        draw_nodes((2, 8), 8)


def _groups_of_both_meshes():
    """Each rank's tp and dp groups from tensorplay_edu's init_device_mesh and from PyTorch's, both dim orders."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh

    from tensorplay_edu import init_device_mesh

    out = []
    for names in (("dp", "tp"), ("tp", "dp")):
        for build in (init_device_mesh, torch_mesh):
            mesh = build("cpu", (2, 2), mesh_dim_names=names)
            out.append([dist.get_process_group_ranks(mesh[n].get_group()) for n in ("tp", "dp")])
    return out


def test_init_device_mesh_builds_the_groups_pytorchs_does():
    """00c says PyTorch's init_device_mesh builds notebook 00's meshes with the same groups: rank by rank, both orders."""
    for rank, (ours_dp_tp, torchs_dp_tp, ours_tp_dp, torchs_tp_dp) in enumerate(launch(_groups_of_both_meshes, 4)):
        assert ours_dp_tp == torchs_dp_tp and ours_tp_dp == torchs_tp_dp, rank
        assert ours_dp_tp[0] != ours_tp_dp[0], rank   # the order of the names changes the groups

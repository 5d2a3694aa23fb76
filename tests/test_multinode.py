"""Two nodes on one machine: two torchrun launches meet at a c10d rendezvous on 127.0.0.1.

Each launch is one "node" of 2 ranks (``--nnodes 2 --nproc-per-node 2``), exactly the command a
cluster runs once per host. The demo trains DP x TP on the 4 ranks, ``--dp 2``: a (2, 2) mesh whose
TP rows must each lie on one node, and whose DDP columns cross them. The test checks the single-device
answer and where the groups landed.
"""

import ast
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
TIMEOUT = 240  # both nodes together, on a busy 2-core machine; a run here takes ~20 s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its ranks in new sessions, so a process
    group kill would miss them)."""
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError, IndexError):
            continue
    found, todo = [], [pid]
    while todo:
        pid = todo.pop()
        kids = [p for p, parent in parents.items() if parent == pid]
        found += kids
        todo += kids
    return found


def _kill(procs) -> None:
    for proc in procs:
        for pid in [*_descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


def run_two_nodes(*demo_args: str) -> list[tuple[int, str, str]]:
    """(return code, stdout, stderr) of each node; both killed, ranks included, past TIMEOUT."""
    port, env = _free_port(), dict(os.environ, OMP_NUM_THREADS="1")
    command = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"two-nodes-{port}",
               "--local-addr", "127.0.0.1",  # each "node" says 127.0.0.1, not a hostname that may not resolve
               "-m", "tensorplay_edu.lab.demo", *demo_args]
    procs = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # no --node-rank: c10d gives each node its rank as it joins
    deadline, outputs = time.monotonic() + TIMEOUT, []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append((proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        _kill(procs)
        pytest.fail(f"two torchrun nodes still running after {TIMEOUT} s: killed both, with their ranks")
    finally:
        _kill([p for p in procs if p.poll() is None])
    return outputs


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kills stray ranks through /proc")
def test_two_torchrun_nodes_train_dp_by_tp_like_one_device():
    nodes = run_two_nodes("--dp", "2", "--world", "4", "--steps", "4")
    for code, out, err in nodes:
        assert code == 0, out + err
        assert "TP group" not in err, err  # (2, 2) on 2 ranks per node: no warning of a TP group across nodes
    reports = [out for _, out, _ in nodes if "check against the single-device model" in out]
    assert len(reports) == 1, nodes  # rank 0's node prints the report, the other node nothing
    report = reports[0]
    # (a) the single-device answer
    assert "on 2 DDP replicas x 2 TP ranks" in report and "check against the single-device model: OK" in report
    worst = float(re.search(r"largest loss difference: (\S+)", report).group(1))
    assert worst < 1e-9, report  # float64: the same numbers up to rounding
    # (b) each TP group on one node, and each node one TP group (DDP crosses the nodes)
    line = re.search(r"Node of each rank \(torchrun's GROUP_RANK\): (\[.*?\]); TP groups (\[.*\]): (.*)", report)
    node_of, tp_groups = ast.literal_eval(line.group(1)), ast.literal_eval(line.group(2))
    assert tp_groups == [[0, 1], [2, 3]] and line.group(3) == "each inside one node", report
    assert sorted(node_of) == [0, 0, 1, 1], report  # two nodes of two ranks
    assert all(len({node_of[r] for r in group}) == 1 for group in tp_groups), report
    ddp = [row.split() for row in report.splitlines() if row.startswith("backward  DDP")]
    assert ddp and all(row[3] == "0,2" for row in ddp), report  # rank 0's DDP group: ranks 0 and 2, both nodes
    assert node_of[0] != node_of[2]

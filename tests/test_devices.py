"""GPU-readiness, checked on the CPU: backends of the default group, the meta-device recipe,
parameters replaced after parallelization, no host synchronisation in a training step."""

import functools
import os
import subprocess
import sys
import warnings

import pytest

import rank_device
from checks import clean
from tensorplay_edu import launch
from tensorplay_edu.launcher.torchrun import choose_backend, exit_code


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_a_training_step_makes_no_host_synchronisation(plan):
    for counts in launch(rank_device.host_syncs, 2, plan):
        ops = counts.pop("ops")
        assert ops > 100 and counts == {}, counts  # the step ran ops, and none of them read a value back


@pytest.mark.parametrize("plan", ["vanilla", "full"])
@pytest.mark.parametrize("how", ["meta", "assign", "to"])
def test_models_whose_parameters_were_replaced_train_like_one_device(plan, how):
    """to_empty after a meta build, load_state_dict(assign=True), .double(): layouts and gradient hooks survive."""
    clean(launch(functools.partial(rank_device.replaced_parameters, plan, how), 2), at_least=180)


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_parallelizing_a_meta_model_communicates_nothing(plan):
    for facts in launch(rank_device.meta_costs_nothing, 2, plan):
        assert facts == {"collectives": 0, "meta_and_local": True}


def test_backend_choice():
    assert choose_backend(gpus=8, local_ranks=8) == "cpu:gloo,cuda:nccl"
    assert choose_backend(gpus=0, local_ranks=2) == "gloo"
    assert choose_backend(gpus=2, local_ranks=2, requested="gloo") == "gloo"
    with pytest.warns(UserWarning, match="2 local ranks but 1 GPU"):
        assert choose_backend(gpus=1, local_ranks=2) == "gloo"
    with pytest.raises(RuntimeError, match="one GPU per local rank: 2 local ranks, 1 GPU"):
        choose_backend(gpus=1, local_ranks=2, requested="nccl")
    with pytest.raises(ValueError, match="backend must be"):
        choose_backend(gpus=1, local_ranks=1, requested="mpi")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choose_backend(gpus=0, local_ranks=4) == "gloo"  # no GPU at all: no warning


def test_exit_codes_pass_through():
    assert [exit_code(SystemExit(c)) for c in (None, 0, 3)] == [0, 0, 3]
    assert exit_code(SystemExit("a message")) == 1


def test_current_device_follows_the_group_backends():
    for facts in launch(rank_device.backend_facts, 2):
        assert facts == {"backends": {"cpu": "gloo", "cuda": "gloo"}, "device": "cpu"}


def test_a_cpu_mesh_on_a_group_without_a_cpu_backend_is_a_clear_error(tmp_path):
    code = ("import torch.distributed as dist\nfrom tensorplay_edu import init_device_mesh\n"
            f"dist.init_process_group('cuda:gloo', store=dist.FileStore({str(tmp_path / 'store')!r}, 1), rank=0, "
            "world_size=1)\ninit_device_mesh('cpu', (1,))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode != 0
    assert "DeviceMesh('cpu'): the default process group has no backend for cpu tensors" in run.stderr, run.stderr
    assert "cpu:gloo,cuda:nccl" in run.stderr

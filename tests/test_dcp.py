"""Sharded checkpoints with torch.distributed.checkpoint (DCP), against one process: what a
user writes first (dcp.save(model.state_dict())), resharding from TP 4 to TP 3 (uneven), 2
and 1, and to one process without any process group; model and AdamW state together through
tensorplay_edu.parallel.checkpoint.get_state_dict / set_state_dict, from TP, DDP x TP and
FSDP2 x TP, training on after the load exactly as one process trained all along.

On main before issue 17 dcp.save(model.state_dict()) kept rank 0's pieces only (DCP took the
plain local tensors, one name on every rank, for replicas): the loads below restored wrong
values (max diff 4.38) and the resharded ones failed on shapes."""

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

import rank_dcp
from checks import clean
from tensorplay_edu import launch
from tensorplay_edu.models import Transformer


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_dcp_save_of_model_state_dict_loads_at_any_tp_degree(tmp_path, plan):
    path = str(tmp_path / "ckpt")
    saved = launch(rank_dcp.save_plain, 4, path, plan)[0]
    for world in (4, 3, 2, 1):
        clean(launch(rank_dcp.load_plain, world, path, saved, plan), at_least=len(saved) + 2)
    # one process, no process group, no tensorplay_edu: the single-device model reads the whole tensors
    ref = Transformer(rank_dcp.ARGS).double()
    state = ref.state_dict()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is")  # DCP says it loads in one process: it does
        dcp.load(state, checkpoint_id=path, no_dist=True)
        whole = _load_state_dict_from_keys(checkpoint_id=path)
    assert {k: v.tolist() for k, v in state.items()} == saved
    assert {k: torch.as_tensor(v).tolist() for k, v in whole.items()} == saved


@pytest.mark.parametrize("plan,bucket", [("vanilla", False), ("full", False), ("full", True)])
def test_model_and_optimizer_reshard_from_tp4_and_train_on_like_one_process(tmp_path, plan, bucket):
    """bucket: trained before and after with the norms' partial gradients in one bucket per step."""
    path = str(tmp_path / "ckpt")
    saved = launch(rank_dcp.save, 4, path, plan, 1, None, 2, bucket)[0]
    for world in (4, 3, 2, 1):
        clean(launch(rank_dcp.resume, world, path, saved, plan, 1, None, 2, 2, bucket),
               at_least=len(saved["model"]) * 2)


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_dp_x_tp_checkpoints_reshard(tmp_path, wrap):
    """Saved on a (dp 2, tp 2) mesh under DDP or FSDP2; loaded there again, at TP 4 and at TP 1."""
    path = str(tmp_path / "ckpt")
    saved = launch(rank_dcp.save, 4, path, "full", 2, wrap)[0]
    clean(launch(rank_dcp.resume, 4, path, saved, "full", 2, wrap), at_least=len(saved["model"]) * 2)
    for world in (4, 1):
        clean(launch(rank_dcp.resume, world, path, saved, "full"), at_least=len(saved["model"]) * 2)

"""Every global view of a tensor-parallel piece gives the one-process answer or refuses
(docs/global_views.md): a plain opt.state_dict() through DCP, resharded; state_dict(keep_vars=True)
with prefixes; torch.save / torch.load across ranks; torch.nn.init on indexed views of a piece and
HF's padding row; HF's save_pretrained; copy.deepcopy.

On main before issue 29: dcp.save({"optim": opt.state_dict()}) kept rank 0's AdamW moments (the
resumed moments off, the weights after resuming off; uneven shards: DCP's "Size mismatch");
keep_vars=True entries went to DCP as rank 0's pieces; torch.load of rank 0's file loaded on
rank 1 silently; HF's init zeroed local row padding_idx on every rank; save_pretrained failed with
"invalid python storage"."""

from __future__ import annotations

import pytest
import torch

import rank_global_views as rv
from checks import clean
from tensorplay_edu import launch
from tensorplay_edu.parallel.piece import Piece

TIMEOUT = 120  # seconds: a collective's wait, and how long ranks may outlive another (2 shared cores)


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_plain_optimizer_state_dict_through_dcp_resumes_like_one_process(tmp_path, plan):
    """Saved at TP 4, rolled back there, loaded at TP 3 (uneven) and 2: model and AdamW moments bit
    for bit, and two steps later one process's weights."""
    path = str(tmp_path / "ckpt")
    results = launch(rv.plain_optimizer_save, 4, path, plan, timeout=TIMEOUT)
    saved = results[0][0]
    clean([r[1:] for r in results], at_least=len(saved["model"]) + len(saved["optim"]) + 3)
    for world in (3, 2):
        clean(launch(rv.plain_optimizer_resume, world, path, saved, plan, timeout=TIMEOUT),
               at_least=len(saved["model"]) + len(saved["optim"]) + 3)


def test_keep_vars_state_dict_with_prefixes_saves_and_loads_through_dcp(tmp_path):
    path = str(tmp_path / "ckpt")
    saved = launch(rv.keep_vars_save, 3, path, timeout=TIMEOUT)[0]
    clean(launch(rv.keep_vars_load, 2, path, saved, timeout=TIMEOUT), at_least=len(saved) + 3)


def test_torch_save_records_the_place_and_load_refuses_another_ranks_piece(tmp_path):
    path = str(tmp_path / "sd.pt")
    clean(launch(rv.torch_save_load, 2, path, timeout=TIMEOUT), at_least=5)
    # one process, no tensorplay process group: the file's pieces are refused loudly, not copied
    sd = torch.load(f"{path}.0")
    assert isinstance(sd["model"]["layers.0.attention.wq.weight"], Piece)
    model = rv.one_process_model()
    with pytest.raises(RuntimeError, match="Piece"):
        model.load_state_dict(sd["model"])


@pytest.mark.parametrize("world_size", [2, 3])
def test_init_on_indexed_views_of_a_piece_is_the_single_device_init(world_size):
    clean(launch(rv.indexed_init, world_size, timeout=TIMEOUT), at_least=4)


def test_init_on_part_of_a_split_dimension_is_refused():
    results = launch(rv.indexed_init_refused, 2, timeout=TIMEOUT)
    for message in results:
        assert "split over ranks" in message and "full_size" in message, message


@pytest.mark.parametrize("kind,world_size", [("llama", 3), ("olmo2", 2), ("llama-last", 2), ("llama-last", 3)])
def test_hf_meta_init_with_a_padding_row_is_the_single_device_init(kind, world_size):
    clean(launch(rv.hf_pad_init, world_size, kind, timeout=TIMEOUT), at_least=5)


def test_hf_save_pretrained_writes_the_single_device_model(tmp_path):
    from transformers import LlamaForCausalLM

    path = str(tmp_path / "hf")
    files = launch(rv.hf_save_pretrained, 2, path, timeout=TIMEOUT)[0]
    assert "model.safetensors" in files, files
    loaded, ref = LlamaForCausalLM.from_pretrained(path), rv.hf_model("llama")
    want = ref.state_dict()
    assert loaded.state_dict().keys() == want.keys()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, want[key]), key


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_deepcopy_of_a_parallelized_model_trains_like_one_process(plan):
    clean(launch(rv.deep_copied, 2, plan, timeout=TIMEOUT), at_least=6)

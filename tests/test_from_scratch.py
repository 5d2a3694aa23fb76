"""Training from scratch, against one process: the meta-device recipe's init_weights(), any
module's reset_parameters(), torch.nn.init on pieces and on DTensors (bit for bit the
single-device values under the same seed, at 1-4 ranks, uneven shards included), its peak
memory, and tied weights that stay tied (one parameter, equal to one device over AdamW steps).

Each failed on main before issue 17: identical pieces on every rank (wq's heads copies of
each other), row-split fan-ins, an Embedding's padding row on the wrong rank, empty_like of a
DTensor refused, a tie silently undone (21 parameters instead of 20)."""

import pytest

import rank_from_scratch
from checks import clean
from tensorplay_edu import launch


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("plan", ["vanilla", "full"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_init_weights_after_the_meta_recipe_is_the_single_device_init(world_size, plan, dtype):
    clean(launch(rank_from_scratch.llama_init, world_size, plan, dtype), at_least=23)


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_init_weights_under_fsdp2_x_tp(plan):
    clean(launch(rank_from_scratch.fsdp2_llama_init, 4, plan), at_least=21)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_torch_nn_init_on_the_pieces_as_torchtitan_writes_it(world_size):
    clean(launch(rank_from_scratch.torchtitan_style_init, world_size, "float32"), at_least=14)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_reset_parameters_of_parallelized_linear_and_embedding(world_size, dtype):
    clean(launch(rank_from_scratch.modules_reset, world_size, dtype), at_least=7)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_distribute_tensor_of_a_meta_tensor_then_init(world_size):
    clean(launch(rank_from_scratch.distributed_meta_tensor, world_size), at_least=20)


@pytest.mark.parametrize("world_size", [2, 4])
def test_init_holds_at_most_one_whole_parameter_at_a_time(world_size):
    clean(launch(rank_from_scratch.init_memory, world_size), at_least=2)


@pytest.mark.parametrize("plan,bucket", [("vanilla", False), ("full", False), ("full", True)])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_tied_embedding_and_output_stay_tied_and_train_like_one_device(world_size, plan, bucket):
    """bucket: the norms' partial gradients in one bucket per step (grad_sync.bucket_partial_grads)."""
    clean(launch(rank_from_scratch.tied_llama, world_size, plan, bucket), at_least=100)


@pytest.mark.parametrize("plan,bucket", [("vanilla", False), ("full", False), ("full", True)])
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_meta_recipe_trains_like_one_device(world_size, plan, bucket):
    """From scratch to trained: meta, parallelize, to_empty, init_weights, then SGD and AdamW steps."""
    clean(launch(rank_from_scratch.meta_llama_trains, world_size, plan, bucket), at_least=100)


@pytest.mark.parametrize("world_size", [2, 4])
def test_pytorchs_weight_tying_case(world_size):
    clean(launch(rank_from_scratch.tied_embedding_and_linear, world_size), at_least=2)


@pytest.mark.parametrize("world_size", [2, 3])
def test_pytorchs_separate_calls_then_tie_again(world_size):
    clean(launch(rank_from_scratch.tied_in_separate_calls, world_size, timeout=120), at_least=100)

"""loss_parallel on a 1-D mesh against F.cross_entropy on the whole logits: every option of
cross_entropy, the log_softmax / nll_loss paths, large logit offsets and scales, one saved buffer
(rank code: tests/rank_loss_parallel.py). On 2-D meshes: tests/test_loss_parallel_2d.py.
"""

import pytest

import rank_loss_parallel
from checks import clean
from tensorplay_edu import launch


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_loss_parallel_matches_cross_entropy(world_size):
    clean(launch(rank_loss_parallel.cross_entropy_options, world_size), at_least=216)
    clean(launch(rank_loss_parallel.log_softmax_paths, world_size), at_least=14)


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_loss_parallel_with_large_logit_offsets_and_scales(world_size, dtype):
    clean(launch(rank_loss_parallel.extreme_logits, world_size, dtype), at_least=40)


@pytest.mark.parametrize("world_size", [1, 3])
def test_loss_parallel_keeps_one_buffer_and_backs_through_it_once(world_size):
    clean(launch(rank_loss_parallel.one_buffer, world_size), at_least=3)

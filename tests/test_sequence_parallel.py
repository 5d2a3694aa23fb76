"""SequenceParallel on LayerNorm and RMSNorm, and PrepareModuleInput in front of a plain Linear
(sequence-sharded input made whole), against one process (rank code: tests/rank_parallel.py).

In the Llama's full plan: tests/test_parallelize_module.py; dropout inside its regions:
tests/test_random_streams.py; its norms' partial gradients in one bucket: tests/test_grad_bucket.py.
"""

import pytest

import rank_parallel
from checks import clean
from tensorplay_edu import launch


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sequence_parallel_and_prepare_input(world_size):
    clean(launch(rank_parallel.run_sequence_parallel, world_size, "float64"), at_least=76)

"""ColwiseParallel and RowwiseParallel, each style alone against one process: on a Linear (with and
without bias; every input and output layout), an Embedding (padding_idx too), a Linear or Embedding
subclass with a forward and a parameter of its own, a colwise -> rowwise MLP: outputs, every gradient,
the weights after SGD and AdamW steps (rank code: tests/rank_parallel.py).

Their signatures and defaults: tests/test_prepare_module.py; in whole plans: tests/test_parallelize_module.py.
"""

import pytest

import rank_parallel
from checks import clean
from tensorplay_edu import launch


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_each_style_alone_float64(world_size):
    n = len(rank_parallel.style_cases())
    assert n == 39  # 22 Linear (with/without bias), 7 Embedding, 6 Linear and 2 Embedding subclasses, 2 MLP
    clean(launch(rank_parallel.run_style_cases, world_size, "float64", 0, n), at_least=666)


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_style_alone_float32(world_size):
    clean(launch(rank_parallel.run_style_cases, world_size, "float32", 0, 39), at_least=666)

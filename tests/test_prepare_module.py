"""PrepareModuleInput, PrepareModuleOutput and PrepareModuleInputOutput: the styles' signatures,
defaults and construction errors (ColwiseParallel's, RowwiseParallel's and SequenceParallel's too).

PrepareModuleInput at work: tests/test_sequence_parallel.py (in front of a Linear) and the Llama's full
plan in tests/test_parallelize_module.py.
"""

import pytest

from tensorplay_edu import Replicate, Shard
from tensorplay_edu.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                     PrepareModuleOutput, RowwiseParallel, SequenceParallel)


def test_style_signatures_defaults_and_construction_errors():
    c = ColwiseParallel()
    assert c.input_layouts == (Replicate(),) and c.output_layouts == (Shard(-1),) and c.use_local_output
    r = RowwiseParallel()
    assert r.input_layouts == (Shard(-1),) and r.output_layouts == (Replicate(),) and r.use_local_output
    s = SequenceParallel()
    assert s.sequence_sharding == (Shard(1),) and not s.use_local_output
    assert not PrepareModuleInput().use_local_output and PrepareModuleOutput(
        output_layouts=Replicate(), desired_output_layouts=Shard(0)).use_local_output
    with pytest.raises(TypeError):
        ColwiseParallel(Replicate())  # keyword-only, as in PyTorch
    with pytest.raises(AssertionError, match="desired module inputs should not be None"):
        PrepareModuleInput(input_layouts=Replicate())
    with pytest.raises(AssertionError, match="same length"):
        PrepareModuleInput(input_layouts=(Replicate(), Shard(0)), desired_input_layouts=(Replicate(),))
    with pytest.raises(AssertionError, match="same length"):
        PrepareModuleOutput(output_layouts=(Replicate(), Shard(0)), desired_output_layouts=(Replicate(),))
    with pytest.raises(AssertionError, match="same length"):
        PrepareModuleInput(input_kwarg_layouts={"a": Shard(0)}, desired_input_kwarg_layouts={})
    with pytest.raises(TypeError):
        PrepareModuleInputOutput(input_layouts=Replicate(), desired_input_layouts=Replicate())  # outputs required

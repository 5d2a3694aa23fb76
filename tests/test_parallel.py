"""Parallel styles, parallelize_module, loss_parallel and the Llama plans against one process."""

import os
import warnings

import pytest

import rank_loss
import rank_parallel
import rank_plans
from tensorplay_edu import Replicate, Shard, launch
from tensorplay_edu.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                     PrepareModuleOutput, RowwiseParallel, SequenceParallel)

SEEDS = rank_plans.SEEDS


def _clean(results, at_least):
    fails = sorted({f for rank_fails, _ in results for f in rank_fails})
    assert not fails, "\n".join(fails[:30])
    assert min(n for _, n in results) >= at_least, [n for _, n in results]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_each_style_alone_float64(world_size):
    n = len(rank_parallel.style_cases())
    assert n == 37  # 20 Linear (with/without bias), 7 Embedding, 6 Linear and 2 Embedding subclasses, 2 MLP
    _clean(launch(rank_parallel.run_style_cases, world_size, "float64", 0, n), at_least=666)


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_style_alone_float32(world_size):
    _clean(launch(rank_parallel.run_style_cases, world_size, "float32", 0, 37), at_least=666)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sequence_parallel_and_prepare_input(world_size):
    _clean(launch(rank_parallel.run_sequence_parallel, world_size, "float64"), at_least=76)


@pytest.mark.parametrize("plan", ["vanilla", "full"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_llama_trains_like_one_process(plan, world_size):
    _clean(launch(rank_parallel.run_llama, world_size, plan, "float64"), at_least=180)


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_llama_float32(plan):
    _clean(launch(rank_parallel.run_llama, 4, plan, "float32"), at_least=180)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_loss_parallel_matches_cross_entropy(world_size):
    _clean(launch(rank_loss.cross_entropy_options, world_size), at_least=216)
    _clean(launch(rank_loss.log_softmax_paths, world_size), at_least=14)


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_loss_parallel_with_large_logit_offsets_and_scales(world_size, dtype):
    _clean(launch(rank_loss.extreme_logits, world_size, dtype), at_least=40)


@pytest.mark.parametrize("world_size", [1, 3])
def test_loss_parallel_keeps_one_buffer_and_backs_through_it_once(world_size):
    _clean(launch(rank_loss.one_buffer, world_size), at_least=3)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_collectives_of_one_training_step(world_size):
    L = 3
    full = launch(rank_plans.step_counts, world_size, "full", L)[0]
    assert full["forward"] == {"all_gather": 2 * L + 1, "reduce_scatter": 2 * L + 1, "all_reduce": 3}
    # backward: the transposes, plus one all-reduce per sequence-parallel norm weight (its gradient is partial)
    assert full["backward"] == {"all_gather": 2 * L + 1, "reduce_scatter": 2 * L + 1, "all_reduce": 2 * L + 1}
    assert full["optimizer"] == 0  # every .grad was whole when backward returned
    assert {"tok_embeddings", "output", "loss_parallel", "layers.2.attention", "layers.2.ffn_norm.weight",
            "norm.weight"} <= set(full["modules"])
    vanilla = launch(rank_plans.step_counts, world_size, "vanilla", L)[0]
    assert vanilla["forward"] == {"all_reduce": 2 * L + 1, "all_gather": 1}
    assert vanilla["backward"] == {"all_reduce": 1 + 2 * L}  # the minimum: one f per block input, not per linear
    assert vanilla["optimizer"] == 0




@pytest.mark.parametrize("world_size", [2, 4])
def test_apply_tp_runs_with_only_its_imports_changed(world_size):
    """tensorplay_edu.models.apply_tp always; the seed's verbatim text too when ../shared/seeds is there."""
    sources = {"tensorplay_edu.models.apply_tp": None}
    seed = rank_plans.seed_apply_tp_text()
    if seed is None:
        warnings.warn(f"{os.path.normpath(SEEDS)} is not beside this clone: checked tensorplay_edu.models.apply_tp "
                      "only, not the seed's verbatim text")
    else:
        assert "parallelize_module(" in seed and "RowwiseParallel(" in seed
        sources["the seed's verbatim apply_tp (../shared/seeds)"] = seed
    for label, source in sources.items():
        fails, n = launch(rank_plans.seed_training, world_size, source)[0]
        assert not fails and n >= 180, (label, fails[:10])
        counts = launch(rank_plans.seed_counts, world_size, source, 2)[0]
        # one f per Colwise Linear (5 per block) backward, as in PyTorch: the plan wraps each input alone
        assert counts["forward"] == {"all_reduce": 5, "all_gather": 1} and counts["backward"] == {"all_reduce": 11}, \
            (label, counts)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_api_errors_state_dicts_and_gradient_accumulation(world_size):
    _clean(launch(rank_plans.api_errors, world_size), at_least=14)
    _clean(launch(rank_plans.state_dicts, world_size), at_least=20)
    _clean(launch(rank_plans.sp_gradient_accumulation, world_size), at_least=3)


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

"""parallelize_module with a plan: the Llama's vanilla and full plans against one process, the
collectives of one training step, torchtitan's apply_tp (the seed's text) run with only its imports
changed, the errors, state dicts and gradient accumulation (rank code: tests/rank_parallelize_module.py,
the training comparison in tests/rank_parallel.py).
"""

import os
import warnings

import pytest

import rank_parallel
import rank_parallelize_module
from checks import clean
from tensorplay_edu import launch

SEEDS = rank_parallelize_module.SEEDS


@pytest.mark.parametrize("plan", ["vanilla", "full"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_llama_trains_like_one_process(plan, world_size):
    clean(launch(rank_parallel.run_llama, world_size, plan, "float64"), at_least=180)


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_llama_float32(plan):
    clean(launch(rank_parallel.run_llama, 4, plan, "float32"), at_least=180)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_collectives_of_one_training_step(world_size):
    L = 3
    full = launch(rank_parallelize_module.step_counts, world_size, "full", L)[0]
    assert full["forward"] == {"all_gather": 2 * L + 1, "reduce_scatter": 2 * L + 1, "all_reduce": 3}
    # backward: the transposes, plus one all-reduce per sequence-parallel norm weight (its gradient is partial)
    assert full["backward"] == {"all_gather": 2 * L + 1, "reduce_scatter": 2 * L + 1, "all_reduce": 2 * L + 1}
    assert full["optimizer"] == 0  # every .grad was whole when backward returned
    assert {"tok_embeddings", "output", "loss_parallel", "layers.2.attention", "layers.2.ffn_norm.weight",
            "norm.weight"} <= set(full["modules"])
    vanilla = launch(rank_parallelize_module.step_counts, world_size, "vanilla", L)[0]
    assert vanilla["forward"] == {"all_reduce": 2 * L + 1, "all_gather": 1}
    assert vanilla["backward"] == {"all_reduce": 1 + 2 * L}  # the minimum: one f per block input, not per linear
    assert vanilla["optimizer"] == 0


@pytest.mark.parametrize("world_size", [2, 4])
def test_apply_tp_runs_with_only_its_imports_changed(world_size):
    """tensorplay_edu.models.apply_tp always; the seed's verbatim text too when ../shared/seeds is there."""
    sources = {"tensorplay_edu.models.apply_tp": None}
    seed = rank_parallelize_module.seed_apply_tp_text()
    if seed is None:
        warnings.warn(f"{os.path.normpath(SEEDS)} is not beside this clone: checked tensorplay_edu.models.apply_tp "
                      "only, not the seed's verbatim text")
    else:
        assert "parallelize_module(" in seed and "RowwiseParallel(" in seed
        sources["the seed's verbatim apply_tp (../shared/seeds)"] = seed
    for label, source in sources.items():
        fails, n = launch(rank_parallelize_module.seed_training, world_size, source)[0]
        assert not fails and n >= 180, (label, fails[:10])
        counts = launch(rank_parallelize_module.seed_counts, world_size, source, 2)[0]
        # one f per Colwise Linear (5 per block) backward, as in PyTorch: the plan wraps each input alone
        assert counts["forward"] == {"all_reduce": 5, "all_gather": 1} and counts["backward"] == {"all_reduce": 11}, \
            (label, counts)


def test_apply_tp_says_that_it_ignores_loss_parallel():
    """The seed's plan gathers the logits whatever loss_parallel says: the package's apply_tp says so, and names the
    plan that shards them."""
    got = launch(rank_parallelize_module.apply_tp_with_loss_parallel, 2)[0]
    assert got["shape"] == [2, 8, 20] and got["type"] == "Tensor", got
    assert len(got["warnings"]) == 1 and "accepted and unused" in got["warnings"][0], got["warnings"]
    assert "parallelize_llama(model, mesh, 'full')" in got["warnings"][0]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_api_errors_state_dicts_and_gradient_accumulation(world_size):
    clean(launch(rank_parallelize_module.api_errors, world_size), at_least=14)
    clean(launch(rank_parallelize_module.state_dicts, world_size), at_least=20)
    clean(launch(rank_parallelize_module.sp_gradient_accumulation, world_size), at_least=3)

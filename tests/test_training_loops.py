"""The parallel model inside ordinary PyTorch training code, against one process:
DistributedDataParallel over mesh["dp"] (DP x TP), torch.compile, activation
checkpointing, inference mode, dropout masks."""

import functools

import pytest

import rank_parallel
import rank_training_loops
from checks import clean
from tensorplay_edu import launch


@pytest.mark.parametrize("plan", ["vanilla", "full"])
@pytest.mark.parametrize("world_size,dp", [(4, 2), (2, 2), (4, 4)])
def test_ddp_over_dp_wrapping_tp_trains_like_one_device(plan, world_size, dp):
    """DDP on mesh["dp"] of a (dp, tp) mesh, each dp rank fed its rows of the batch; the single
    device sees the whole batch.  Sequence-parallel norm gradients must be whole before DDP reads them."""
    clean(launch(functools.partial(rank_parallel.run_llama, plan, "float64", dp=dp, wrap="ddp"), world_size),
           at_least=180)


# bucket: the sequence-parallel norms' partial gradients in one bucket per step (grad_sync.bucket_partial_grads)
PLANS = [("vanilla", False), ("full", False), ("full", True)]


@pytest.mark.parametrize("plan,bucket", PLANS)
def test_activation_checkpointing_per_block(plan, bucket):
    clean(launch(functools.partial(rank_parallel.run_llama, plan, "float64", wrap="checkpoint", bucket=bucket), 2),
           at_least=180)


@pytest.mark.parametrize("plan,bucket", PLANS)
def test_torch_compile_equals_one_device(plan, bucket):
    """torch.compile (dynamo + AOTAutograd, the aot_eager backend: where graphs are captured and
    state that lives between calls goes stale; inductor's code generation takes minutes on 2 cores)."""
    clean(launch(functools.partial(rank_parallel.run_llama, plan, "float64", wrap="compile-aot",
                                    optimizers=("adamw",), bucket=bucket), 2, timeout=300), at_least=90)


def test_torch_compile_of_ddp_over_dp():
    clean(launch(functools.partial(rank_parallel.run_llama, "full", "float64", dp=2, wrap="compile-ddp",
                                    optimizers=("adamw",)), 4, timeout=300), at_least=90)


@pytest.mark.parametrize("plan", ["vanilla", "full"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_inference_mode_and_no_grad(plan, world_size):
    clean(launch(rank_training_loops.inference, world_size, plan), at_least=4)


@pytest.mark.parametrize("world_size", [2, 3])
def test_dropout_masks_per_rank_in_sequence_parallel_regions_shared_elsewhere(world_size):
    clean(launch(rank_training_loops.dropout_masks, world_size), at_least=4 + world_size)


@pytest.mark.parametrize("world_size", [1, 2])
def test_checkpointing_recomputes_the_same_sequence_parallel_dropout_masks(world_size):
    clean(launch(rank_training_loops.checkpointed_dropout, world_size), at_least=4)


@pytest.mark.parametrize("plan,bucket,micro", [("vanilla", False, 1), ("full", False, 1), ("full", True, 1),
                                               ("full", False, 2), ("full", True, 2)])
def test_fsdp2_over_dp_wrapping_tp_trains_like_one_device(plan, bucket, micro):
    """bucket: the norms' partial gradients in one bucket (grad_sync.bucket_partial_grads), made whole by
    clip_grad_norm_ after FSDP2's reduce-scatter over dp (sums commute).  micro=2: FSDP2's gradient
    accumulation, the first backward without reduce-scatter and without resharding
    (set_requires_gradient_sync / set_reshard_after_backward(False)): the unsharded parameters the
    module then holds are the ones the bucket's hooks see."""
    clean(launch(rank_training_loops.fsdp2_over_dp, 4, plan, 3, bucket, micro), at_least=3 * (micro + 12) + 12)

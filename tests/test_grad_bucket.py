"""The partial gradients of sequence-parallel norms in one bucket per step (grad_sync.bucket_partial_grads),
against one process, wherever it is safe; the per-parameter path (the default) is what every other test runs.
FSDP2 with the bucket: tests/test_training_loops.py::test_fsdp2_over_dp_wrapping_tp_trains_like_one_device."""

import functools

import pytest

import rank_grad_bucket
import rank_training_loops
from checks import clean
from tensorplay_edu import launch


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_bucket_made_whole_by_the_optimizer_step(world_size):
    clean(launch(rank_grad_bucket.train, world_size, timeout=300), at_least=3 + 12)


@pytest.mark.parametrize("via", ["clip", "finalize"])
def test_bucket_made_whole_by_clip_grad_norm_or_finalize(via):
    clean(launch(functools.partial(rank_grad_bucket.train, via=via), 4, timeout=300), at_least=3 * (2 + 21) + 12)


def test_bucket_with_gradient_accumulation():
    clean(launch(functools.partial(rank_grad_bucket.train, micro=2, via="finalize"), 2, timeout=300),
           at_least=3 * (2 + 21) + 12)


def test_bucket_with_a_micro_batch_count_that_changes_between_steps():
    """1, then 3, then 2 accumulated backwards: no false "already made whole" error, the single-device answer."""
    clean(launch(functools.partial(rank_grad_bucket.train, micro=(1, 3, 2)), 2, timeout=300), at_least=6 + 12)


def test_a_norm_without_a_new_gradient_is_not_reduced_again():
    clean(launch(rank_grad_bucket.alternating_norms, 2, timeout=120), at_least=4)


@pytest.mark.parametrize("micro", [1, 2])
def test_bucket_under_ddp_over_dp(micro):
    """DDP averages the partial sums over dp, then the bucket sums them over tp: sums commute."""
    clean(launch(functools.partial(rank_grad_bucket.train, dp=2, ddp=True, micro=micro, via="finalize"), 4,
                  timeout=300), at_least=3 * (micro + 21) + 12)


def test_finalize_per_micro_batch_raises_instead_of_summing_twice():
    clean(launch(rank_grad_bucket.finalize_per_micro_batch, 2, timeout=120), at_least=1)


def test_one_bucket_replaces_the_per_norm_all_reduces():
    """2 blocks: 2L + 1 = 5 norm weights, each an all-reduce of its own in backward; with the bucket, one."""
    per_param = launch(functools.partial(rank_grad_bucket.step_collectives, False), 2, timeout=120)[0]
    bucketed = launch(functools.partial(rank_grad_bucket.step_collectives, True), 2, timeout=120)[0]
    assert per_param["per_param"] == 5 and per_param["bucket"] == []
    assert bucketed["per_param"] == 0
    assert bucketed["bucket"] == [("all_reduce", "backward", (5 * 48,))]  # [5 norm weights x h]
    assert bucketed["forward"] == per_param["forward"]
    want = dict(per_param["backward"], all_reduce=per_param["backward"]["all_reduce"] - 5 + 1)
    assert bucketed["backward"] == want
    assert bucketed["total"] == per_param["total"] - 4


def test_bucket_finds_fsdp2s_gradients_while_the_module_holds_unsharded_parameters():
    """set_reshard_after_backward(False): finalize() looks past the unsharded parameter the module holds
    (and the hooks were registered on, every forward) to the sharded one FSDP2 reduced into; FSDP2 over
    dp against one process (rank_training_loops.fsdp2_over_dp)."""
    clean(launch(functools.partial(rank_training_loops.fsdp2_over_dp, "full", 3, bucket=True, keep_unsharded=True), 4,
                  timeout=300), at_least=3 * (1 + 13) + 12)

"""tensorplay_edu/models/by_hand.py, the hand-written Megatron Llama (make bench's floor), against one process, and its
collectives against tensorplay_edu's for the same plan."""

import pytest

import rank_hand
from tensorplay_edu import launch

L = 2  # rank_hand's models have 2 layers


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_hand_written_llama_trains_like_one_process(world_size):
    """Both plans, float64, GQA and an uneven vocabulary: loss (1e-10), every gradient shard and the weights
    after 2 SGD steps (1e-9); the vocab-parallel cross-entropy on extreme logits; no warning."""
    results = launch(rank_hand.run_all, world_size, timeout=120)
    fails = sorted({f for rank_fails, _, _ in results for f in rank_fails})
    assert not fails, "\n".join(fails[:30])
    assert not [w for _, _, caught in results for w in caught], results[0][2]
    counts = results[0][1]
    assert all(c == counts for _, c, _ in results)  # every rank issues the same collectives
    vanilla, full = counts["vanilla"], counts["full"]
    # vanilla: g after the embedding, wo and w2; the logits gathered; one f per block input and before the output
    assert vanilla["hand"] == {"forward": {"all_reduce": 2 * L + 1, "all_gather": 1},
                               "backward": {"all_reduce": 2 * L + 1}}
    assert vanilla["ours"] == vanilla["hand"]
    # full: the sequence-parallel pair around every block input and wo / w2, 3 all-reduces in the loss forward
    sp = {"all_gather": 2 * L + 1, "reduce_scatter": 2 * L + 1}
    assert full["hand"] == {"forward": {**sp, "all_reduce": 3}, "backward": {**sp, "all_reduce": 1}}
    assert full["ours"]["forward"] == full["hand"]["forward"]
    # the norm weights' partial gradients: ONE bucket after backward by hand, one all-reduce per norm weight
    # as each gradient arrives in ours (parallel/grad_sync.py: whole before DDP's hooks read it)
    assert full["ours"]["backward"] == {**sp, "all_reduce": 2 * L + 1}

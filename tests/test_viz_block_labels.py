"""The block drawn with readable labels (notebook 03): the same steps as block_steps, in words, no underscore."""

import matplotlib.pyplot as plt

from tensorplay_edu.viz import block_steps
from tensorplay_edu.viz.block_labels import WORDS, draw_readable_block, readable_steps


def test_steps_are_block_steps_in_words():
    code, words = block_steps(True, 2, 0), readable_steps(True, 2, 0)
    assert len(code) == len(words)
    for a, b in zip(code, words):
        assert (a["placement"], a["shape"], a["kind"]) == (b["placement"], b["shape"], b["kind"])
    names = [st["name"] for st in words]
    assert "attention norm (RMSNorm)" in names and "MLP norm (RMSNorm)" in names
    assert "MLP input" in names and "MLP output" in names
    gather = next(st for st in words if st["name"] == "attention input")
    assert (gather["fwd"], gather["bwd"]) == ("all-gather (dim 1)", "reduce-scatter (dim 1)")
    vanilla = next(st for st in readable_steps(False, 2, 0) if st["name"] == "attention output")
    assert vanilla["fwd"] == "all-reduce"
    assert set(WORDS) >= {"attention_norm", "ffn_norm", "feed_forward"}


def test_no_underscore_is_drawn():
    for sp in (True, False):
        fig = draw_readable_block(sp, 2, 0)
        texts = [t.get_text() for t in fig.axes[0].texts] + [fig.axes[0].get_title()]
        assert not [t for t in texts if "_" in t.replace(r"\bar", "")], texts
        assert "MLP norm (RMSNorm)" in texts and "attention norm (RMSNorm)" in texts
        assert sorted(p.get_gid() for p in fig.axes[0].patches if (p.get_gid() or "").startswith("residual")) == \
            ["residual r", "residual x"]
        plt.close(fig)


def test_the_drawn_labels_are_the_readable_steps():
    fig = draw_readable_block(True, 2, 0)
    texts = [t.get_text() for t in fig.axes[0].texts]
    for st in readable_steps(True, 2, 0):
        assert st["name"] in texts, st["name"]
        if st["kind"] == "comm":
            assert f"forward: {st['fwd']}\nbackward: {st['bwd']}" in texts
    plt.close(fig)

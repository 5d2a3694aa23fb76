"""One transformer block, as :func:`tensorplay_edu.viz.draw_block` draws it, labelled in words.

:func:`~tensorplay_edu.viz.block_steps` names each step by the module it is in torchtitan's Llama
(``attention_norm``, ``ffn_norm``, ``feed_forward``) and each collective by its ``torch.distributed``
function (``all_gather``, ``reduce_scatter``, ``all_reduce``): right for code, hard to read in a picture.
:func:`readable_steps` rewrites those names as words (the norms "attention norm" / "MLP norm", the
feed-forward "MLP", the collectives "all-gather", "reduce-scatter", "all-reduce"), and
:func:`draw_readable_block` draws :func:`~tensorplay_edu.viz.draw_block`'s figure, box for box, arrow
for arrow, the same layouts and local shapes, with those words in its labels.  A name it does not know keeps its underscore,
and ``tests/test_viz_block_labels.py`` fails on any underscore drawn, so a new step gets a word too.

Notation: ``b`` batch, ``s`` sequence, ``h`` model dim, ``t`` the TP degree; every shape drawn is local.
"""

from __future__ import annotations

from .block import block_steps, draw_block

__all__ = ["WORDS", "readable_steps", "draw_readable_block"]

# torchtitan's module names and torch.distributed's function names, as a reader says them
WORDS = {
    "attention_norm": "attention norm (RMSNorm)",
    "ffn_norm": "MLP norm (RMSNorm)",
    "feed_forward": "MLP",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_reduce": "all-reduce",
}
_FIELDS = ("name", "what", "fwd", "bwd")


def _words(text: str) -> str:
    for code, word in WORDS.items():
        text = text.replace(code, word)
    return text


def readable_steps(sp: bool = True, world_size: int = 2, rank: int = 0, **dims) -> list[dict]:
    """:func:`~tensorplay_edu.viz.block_steps` with its names, styles and collectives in words
    (:data:`WORDS`); the placements and shapes are untouched."""
    return [{**st, **{k: _words(st[k]) for k in _FIELDS}} for st in block_steps(sp, world_size, rank, **dims)]


def draw_readable_block(sp: bool = True, world_size: int = 2, rank: int = 0, title=None, **dims):
    """:func:`~tensorplay_edu.viz.draw_block`'s figure (modules blue, work without communication white,
    collectives red with their forward / backward, on each arrow ``placement · local [shape]`` on rank
    ``rank``, the residual skips on the left), every label it draws rewritten with :data:`WORDS`: the
    labels of :func:`readable_steps`.  ``dims``: batch, seq, dim, n_heads, n_kv_heads, ffn_hidden."""
    fig = draw_block(sp, world_size, rank, title=title, **dims)
    for text in fig.axes[0].texts:
        text.set_text(_words(text.get_text()))
    return fig

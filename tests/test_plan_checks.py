"""tensorplay_edu.lab.plan_checks (notebook 06's checks): each passes on what it should and fails on a change."""

from types import SimpleNamespace as Rec

import pytest

from tensorplay_edu.lab.plan_checks import check_backward_mirrors_forward, check_drawn_shapes, check_edges
from tensorplay_edu.viz.block import block_steps


def _full_step(n_layers):
    """One full-plan step's records, as section 6 of notebook 06 prints them."""
    fwd = [("tok_embeddings", "reduce_scatter")]
    for i in range(n_layers):
        fwd += [(f"layers.{i}.attention", "all_gather"), (f"layers.{i}.attention.wo", "reduce_scatter"),
                (f"layers.{i}.feed_forward", "all_gather"), (f"layers.{i}.feed_forward.w2", "reduce_scatter")]
    fwd += [("output", "all_gather")]
    norm_of = {"output": "norm", **{f"layers.{i}.{m}": f"layers.{i}.{n}" for i in range(n_layers)
                                    for n, m in (("attention_norm", "attention"), ("ffn_norm", "feed_forward"))}}
    mirror = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"}
    recs = [Rec(phase="forward", module=m, op=op) for m, op in fwd]
    recs += [Rec(phase="forward", module="loss_parallel", op="all_reduce")] * 3
    for m, op in reversed(fwd):
        recs.append(Rec(phase="backward", module=m, op=mirror[op]))
        if m in norm_of:
            recs.append(Rec(phase="backward", module=norm_of[m] + ".weight", op="all_reduce"))
    return recs


def test_backward_mirrors_forward():
    recs = _full_step(2)
    check_backward_mirrors_forward(recs, 2)
    swapped = recs[:-3] + [recs[-2], recs[-3], recs[-1]]             # a norm's all-reduce out of place
    with pytest.raises(AssertionError):
        check_backward_mirrors_forward(swapped, 2)


def test_drawn_shapes():
    dims = dict(batch=4, seq=16, dim=32, n_heads=4, n_kv_heads=2, ffn_hidden=96)

    def shapes(sp, rank):
        steps = block_steps(sp, 2, rank, **dims)
        out = {st["module"]: st["shape"] for st in steps if st["module"]}
        return {**out, "attention.wk": next(st["also"] for st in steps if st["also"])}

    runs = {plan: [{"shapes": shapes(sp, r)} for r in range(2)]
            for plan, sp in (("apply_tp", False), ("vanilla", False), ("full", True))}
    check_drawn_shapes(runs, dims, 2)
    runs["full"][1]["shapes"]["attention.wk"] = (0,)
    with pytest.raises(AssertionError):
        check_drawn_shapes(runs, dims, 2)


def test_edges():
    b, s, h, v, t = 4, 16, 32, 64, 2
    rep = lambda *names: [(n, "", f"tensor [{b}, {s}, {h}]", "") for n in names]
    per_linear = rep("tok_embeddings", "layers.0", "norm") + [("layers.0.attention", f"tensor [{b}, {s}, {h}]", "", ""),
                                                               ("output", "", f"tensor [{b}, {s}, {v}]", "")]
    vanilla = rep("tok_embeddings", "layers.0", "norm") + [("layers.0.attention", f"DTensor R [{b}, {s}, {h}]", "", ""),
                                                            ("output", "", f"tensor [{b}, {s}, {v}]", "")]
    full = [("tok_embeddings", "", f"tensor [{b}, {s // t}, {h}]", ""),
            ("layers.0.attention", f"DTensor R [{b}, {s}, {h}]", "", ""),
            ("layers.0.attention.wq", "", f"tensor [{b}, {s}, {h // t}]", ""),
            ("layers.0.attention.wo", "", "", "reduce_scatter"), ("output", "", f"DTensor S(2) [{b}, {s}, {v}]", "")]
    check_edges(per_linear, vanilla, full, b, s, h, v, t)
    with pytest.raises(AssertionError):
        check_edges(per_linear, per_linear, full, b, s, h, v, t)     # vanilla's attention input not one DTensor

"""Checks notebook 06 runs on the three Llama plans, kept here so the notebook shows only their names.

Each raises an AssertionError saying what differs; everything it compares is passed in:

* ``check_backward_mirrors_forward``: one full-plan step's records (``CommDebugMode``) run backward as the
  forward mirrored and reversed (each all-gather a reduce-scatter and back), plus one all-reduce per norm
  weight, right after the reduce-scatter of its reader's input gradient;
* ``check_drawn_shapes``: the local shapes ``viz.block_steps`` draws are the ones each module really returned;
* ``check_edges``: what the edges and a block hand on (``viz.trace_flow`` rows), plan by plan.
"""

from ..viz.block import block_steps

__all__ = ["check_backward_mirrors_forward", "check_drawn_shapes", "check_edges"]


def check_backward_mirrors_forward(records, n_layers):
    """Backward = forward reversed, each all-gather a reduce-scatter and back; a norm weight's all-reduce comes
    right after the reduce-scatter of its reader's input gradient."""
    mirror = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"}
    fwd = [(r.module, r.op) for r in records if r.phase == "forward" and r.module != "loss_parallel"]
    bwd_records = [r for r in records if r.phase == "backward"]
    assert [(r.module, r.op) for r in bwd_records if not r.module.endswith("norm.weight")] == [
        (module, mirror[op]) for module, op in reversed(fwd)]
    reader = {"norm": "output"}  # the module whose input each norm's output is
    reader.update({f"layers.{i}.{n}": f"layers.{i}.{m}" for i in range(n_layers)
                   for n, m in (("attention_norm", "attention"), ("ffn_norm", "feed_forward"))})
    for before, r in zip(bwd_records, bwd_records[1:]):
        if r.module.endswith("norm.weight"):
            assert (before.module, before.op) == (reader[r.module.removesuffix(".weight")], "reduce_scatter"), r.module


def check_drawn_shapes(runs, dims, world):
    """block_steps' shapes = the local shapes each module of block 0 returned (``runs[plan][rank]["shapes"]``:
    {module: shape}), on every rank, every plan."""
    for plan, sp in (("apply_tp", False), ("vanilla", False), ("full", True)):
        for rank in range(world):
            steps = block_steps(sp, world, rank, **dims)
            real = runs[plan][rank]["shapes"]
            drawn = {st["module"]: st["shape"] for st in steps if st["module"]}
            assert drawn == {module: real[module] for module in drawn}, (plan, rank)
            assert [st["also"] for st in steps if st["also"]] == [real["attention.wk"]]  # wk and wv beside wq


def _out_of(flow, name):  # the trace_flow row of one module
    return next(row for row in flow if row[0] == name)


def check_edges(per_linear_flow, vanilla_flow, full_flow, b, s, h, v, world):
    """What the edges and a block return, plan by plan; b, s, h, v: the batch's sizes; world: the ranks."""
    assert _out_of(full_flow, "tok_embeddings")[2] == f"tensor [{b}, {s // world}, {h}]"  # [b, s/t, h]
    assert _out_of(full_flow, "layers.0.attention")[1] == f"DTensor R [{b}, {s}, {h}]"  # gathered once for wq, wk, wv
    assert _out_of(full_flow, "layers.0.attention.wq")[2] == f"tensor [{b}, {s}, {h // world}]"  # this rank's heads
    assert _out_of(full_flow, "layers.0.attention.wo")[3] == "reduce_scatter"
    assert _out_of(full_flow, "output")[2] == f"DTensor S(2) [{b}, {s}, {v}]"  # [b, s, V/t] locally, never gathered
    assert _out_of(vanilla_flow, "layers.0.attention")[1] == f"DTensor R [{b}, {s}, {h}]"  # one DTensor: one f
    assert _out_of(per_linear_flow, "layers.0.attention")[1] == f"tensor [{b}, {s}, {h}]"  # wrapped by each Linear
    for flow in (per_linear_flow, vanilla_flow):
        assert all(_out_of(flow, n)[2] == f"tensor [{b}, {s}, {h}]" for n in ("tok_embeddings", "layers.0", "norm"))
        assert _out_of(flow, "output")[2] == f"tensor [{b}, {s}, {v}]"  # the logits replicated

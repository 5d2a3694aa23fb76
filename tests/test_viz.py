"""The pictures: structure, colours and labels of the returned figures (not pixels)."""

import matplotlib
import matplotlib.colors as mcolors
import pytest

from tensorplay_edu import Partial, Replicate, Shard
from tensorplay_edu.debug import CommRecord
from tensorplay_edu.viz import (RANK_COLORS, SHARED_COLOR, draw_collective, draw_collectives, draw_flow, draw_layout, draw_transition,
                                pieces)
from figures import texts as _texts, hex_color as _hex


def _colors(ax):
    return [mcolors.to_hex(p.get_facecolor()) for p in ax.patches]


def test_pieces_follow_torch_chunk():
    got = [p["ranges"][0] for p in pieces((10, 3), [Shard(0)], (4,))]
    assert got == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [p["ranges"][1] for p in pieces((10, 3), [Shard(0)], (4,))] == [(0, 3)] * 4
    assert all(p["partial"] for p in pieces((2, 2), [Partial()], (3,)))


def test_shard_blocks_are_coloured_by_rank_and_labelled():
    fig = draw_layout((10, 7), [Shard(0)], (4,))
    glob, *ranks = fig.axes
    assert _colors(glob) == [c.lower() for c in RANK_COLORS[:4]]
    assert _texts(glob)[0] == "rank 0\nrows 0:3\ncols 0:7" and _texts(glob)[3] == "rank 3  rows 9:10"  # a thin block: one line
    assert [ax.get_title() for ax in ranks] == [f"rank {r}\nlocal [{n}, 7]" for r, n in enumerate([3, 3, 3, 1])]
    assert "S(0)" in glob.get_title()


def test_block_labels_stay_inside_their_blocks():
    # notebook 01's uneven X10 [10, 4] over 4 ranks, and a thin block that spans only some columns (2-D mesh)
    for fig in (draw_layout((10, 4), [Shard(0)], (4,)), draw_layout((10, 4), [Shard(0), Shard(1)], (4, 2))):
        glob = fig.axes[0]
        renderer = fig.canvas.get_renderer()
        glob.apply_aspect()
        for text in glob.texts:
            x, y, w, h = text.block
            (x0, y0), (x1, y1) = glob.transData.transform([(x, y), (x + w, y + h)])
            box = text.get_window_extent(renderer)
            assert box.x0 >= x0 - 1 and box.x1 <= x1 + 1 and box.y0 >= y0 - 1 and box.y1 <= y1 + 1, text.get_text()


def test_replicate_is_one_shared_block_and_every_rank_holds_it_whole():
    fig = draw_layout((4, 6), [Replicate()], (3,))
    glob, *ranks = fig.axes
    assert _colors(glob) == [SHARED_COLOR.lower()] and _texts(glob) == ["ranks 0,1,2\nrows 0:4\ncols 0:6"]
    assert [ax.get_title() for ax in ranks] == [f"rank {r}\nlocal [4, 6]" for r in range(3)]


def test_partial_is_hatched_and_says_pending_sum():
    fig = draw_layout((4, 6), [Partial()], (2,))
    glob, *ranks = fig.axes
    # the global value is t addends: one hatched sheet per rank, in that rank's colour; the label sits on white
    assert [p.get_hatch() for p in glob.patches] == ["//", "//"] and "pending sum of 2" in _texts(glob)[0]
    assert _colors(glob) == [c.lower() for c in RANK_COLORS[:2]]
    assert glob.texts[0].get_bbox_patch().get_facecolor()[:3] == (1.0, 1.0, 1.0)
    assert all(ax.patches[1].get_hatch() == "//" and "addend" in ax.get_title() for ax in ranks)
    assert [_texts(ax) for ax in ranks] == [["addend\n0"], ["addend\n1"]]


def test_each_rank_piece_sits_where_it_is_in_the_global_tensor():
    fig = draw_layout((10, 6), [Shard(0)], (4,))
    for rank, ax in enumerate(fig.axes[1:]):
        frame, piece = ax.patches
        assert (frame.get_width(), frame.get_height()) == (6, 10) and frame.get_linestyle() == ":"
        r0, r1 = [(0, 3), (3, 6), (6, 9), (9, 10)][rank]
        assert piece.get_xy() == (0, 10 - r1) and piece.get_height() == r1 - r0  # rows r0:r1, y up
    fig = draw_layout((4, 8), [Shard(1)], (2,))
    assert [ax.patches[1].get_xy()[0] for ax in fig.axes[1:]] == [0, 4]


def test_two_d_mesh_names_its_axes_and_three_d_tensors_pick_two_dims():
    fig = draw_layout((6, 8), [Shard(0), Shard(1)], (2, 2), mesh_dim_names=("dp", "tp"))
    assert "dp: S(0), tp: S(1)" in fig.axes[0].get_title() and len(fig.axes[0].patches) == 4
    assert fig.axes[4].get_title() == "rank 3 (1, 1)\nlocal [3, 4]"
    fig = draw_layout((2, 12, 5), [Shard(1)], (4,), dims=(1, 2))
    assert fig.axes[0].get_ylabel() == "dim 1 (12)" and fig.axes[0].get_xlabel() == "dim 2 (5)"


def test_frames_follow_the_tensors_aspect_ratio():
    """A [2, 8] tensor is drawn wide and an [8, 2] one tall, global frame and local frames alike; a very flat one
    stays readable (clamped)."""
    from tensorplay_edu.viz.layouts import ASPECT_LIMITS

    def ratio(ax):  # height / width as drawn
        ax.figure.canvas.draw()
        box = ax.get_window_extent()
        return box.height / box.width

    wide, tall = draw_layout((2, 8), [Shard(1)], (2,)), draw_layout((8, 2), [Shard(0)], (2,))
    assert all(ratio(ax) < 0.6 for ax in wide.axes) and all(ratio(ax) > 1.6 for ax in tall.axes)
    assert 0.95 < ratio(draw_layout((6, 6), [Replicate()], (2,)).axes[0]) < 1.05
    assert ratio(draw_layout((1, 1000), [Shard(1)], (2,)).axes[0]) == pytest.approx(ASPECT_LIMITS[0], rel=0.02)
    assert ratio(draw_transition((2, 8), Shard(1), Replicate(), 2).axes[0]) < 0.6


@pytest.mark.parametrize("op,forward", [("all_gather", "all_gather"), ("reduce_scatter", "reduce_scatter"),
                                        ("all_reduce", "all_reduce"), ("all_to_all", "all_to_all")])
def test_collective_pictures(op, forward):
    fig = draw_collective(op)   # a collective alone: its name, no forward / backward
    assert _texts(fig.axes[1]) == [forward] and op in fig._suptitle.get_text()


def test_transition_shows_forward_and_backward_collectives():
    fig = draw_transition((8, 6), Partial(), Shard(0), 4)
    assert _texts(fig.axes[1]) == ["forward: reduce_scatter", "backward: all_gather"]
    fig = draw_transition((8, 6), Shard(1), Replicate(), 4)
    assert _texts(fig.axes[1]) == ["forward: all_gather", "backward: local chunk"]
    fig = draw_transition((8, 6), Replicate(), Replicate(), 4, grad_placement=Partial())  # Megatron's f
    assert _texts(fig.axes[1]) == ["forward: nothing", "backward: all_reduce"]


def test_flow_arrows_and_an_unknown_collective():
    fig = draw_flow([("tok_embeddings", "tensor [2, 8]", "tensor [2, 4, 16]", "reduce_scatter"),
                     ("norm", "tensor [2, 4, 16]", "DTensor S(1) [2, 8, 16]", "")])
    assert {"tok_embeddings", "norm", "reduce_scatter", "DTensor S(1) [2, 8, 16]"} <= set(_texts(fig.axes[0]))
    arrows = [p for p in fig.axes[0].patches if isinstance(p, matplotlib.patches.FancyArrowPatch)]
    assert [a.get_gid() for a in arrows] == ["flow 0->1"]  # one arrow between two consecutive steps, none after
    with pytest.raises(ValueError, match="draw_collective"):
        draw_collective("broadcast")


def test_float8_pieces_are_boxed_and_tagged():
    """A float8 layout or collective in a flow is a gold dashed box, the collective tagged 1 B/elem;
    everything else is drawn as before (no box)."""
    import torch

    from tensorplay_edu.viz import FLOAT8_COLOR, comm_label, float8_tag

    assert [float8_tag(x) for x in (torch.float8_e4m3fn, "float8_e5m2", "all_gather e4m3", torch.float32,
                                    "all_gather")] == ["e4m3", "e5m2", "e4m3", None, None]
    assert comm_label(CommRecord("all_gather", "forward", (2, 12, 48), "float8_e4m3fn", 2, 576, "a")) == \
        "all_gather e4m3"
    assert comm_label(CommRecord("all_reduce", "forward", (), "float32", 2, 8, "a")) == "all_reduce (scalar)"
    assert comm_label(CommRecord("reduce_scatter", "backward", (2, 12, 48), "float32", 2, 2304, "a")) == \
        "reduce_scatter"
    fig = draw_flow([("attention_norm", "tensor [2, 6, 48]", "DTensor S(1) [2, 12, 48]", ""),
                     ("attention", "Float8Input e4m3 [2, 12, 48]", "tensor [2, 6, 48]",
                      "all_reduce (scalar), all_gather e4m3"),
                     ("attention.wo", "tensor [2, 12, 24]", "tensor [2, 6, 48]", "reduce_scatter")])
    ax = fig.axes[0]
    boxed = {t.get_text(): t.get_bbox_patch() for t in ax.texts if t.get_bbox_patch() is not None}
    assert set(boxed) == {"Float8Input e4m3 [2, 12, 48]", "all_gather e4m3  1 B/elem",
                          "float8 (e4m3 forward, e5m2 gradients): 1 byte per element"}
    for patch in boxed.values():
        assert mcolors.to_hex(patch.get_facecolor()) == FLOAT8_COLOR.lower() and patch.get_linestyle() == "--"
    assert {"all_reduce (scalar)", "reduce_scatter", "tensor [2, 12, 24]"} <= set(_texts(ax))  # plain, unboxed
    assert FLOAT8_COLOR.lower() not in [c.lower() for c in RANK_COLORS]  # float8 is not a rank
    fig = draw_flow([("norm", "tensor [2, 6, 48]", "DTensor S(1) [2, 12, 48]", "all_gather, reduce_scatter")])
    assert all(t.get_bbox_patch() is None for t in fig.axes[0].texts)  # no float8: no box, no note
    assert "all_gather\nreduce_scatter" in _texts(fig.axes[0])


def _float8_flow():
    import torch
    import torch.distributed as dist

    from tensorplay_edu import init_device_mesh
    from tensorplay_edu.float8 import convert_to_float8_training
    from tensorplay_edu.models import ModelArgs, Transformer, parallelize_llama
    from tensorplay_edu.viz import trace_flow

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = convert_to_float8_training(Transformer(ModelArgs(dim=16, n_layers=1, n_heads=4, vocab_size=32,
                                                             max_seq_len=8)),
                                       module_filter_fn=lambda mod, fqn: fqn != "output")
    parallelize_llama(model, mesh, "full", float8=True)
    return trace_flow(model, torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0)), depth=4)


def test_trace_flow_names_float8_inputs_and_collectives():
    from tensorplay_edu import launch

    rows = {row[0]: row[1:] for row in launch(_float8_flow, 2)[0]}
    assert rows["layers.0.attention"] == ("Float8Input e4m3 [2, 8, 16]", "tensor [2, 4, 16]",
                                          "all_reduce (scalar), all_gather e4m3")
    assert rows["layers.0.attention.wq"] == ("Float8Input e4m3 [2, 8, 16]", "tensor [2, 8, 8]", "all_reduce (scalar)")
    assert rows["layers.0.attention.wo"][2] == "all_reduce (scalar), all_reduce (scalar), reduce_scatter"
    assert rows["output"][2] == "all_gather"  # high precision: no tag


def test_timeline_lanes_bars_and_labels():
    """Two ranks, a compute and a transfer lane each; bars in ms, coloured by kind (not by rank), the rank
    colour only on the strip marking its lanes; a label where it fits, the chunk number where only that fits."""
    from tensorplay_edu.async_tp.timeline import Interval
    from tensorplay_edu.viz import LANE_COLORS, draw_timeline

    per_rank = [[Interval("compute", "chunk 0", 0.0, 0.004), Interval("transfer", "chunk 1", 0.0, 0.005),
                 Interval("compute", "chunk 1", 0.005, 0.009)],
                [("compute", "chunk 1", 0.0, 0.004), ("transfer", "chunk 0", 0.0, 0.005),  # plain tuples from ranks
                 ("compute", "chunk 0", 0.005, 0.0052), ("compute", "chunk 7", 0.0095, 0.00951)]]
    fig = draw_timeline(per_rank, title="ring")
    ax = fig.axes[0]
    compute, transfer = LANE_COLORS["compute"].lower(), LANE_COLORS["transfer"].lower()
    assert compute != transfer and not {compute, transfer} & {c.lower() for c in RANK_COLORS}
    assert _colors(ax) == [RANK_COLORS[0].lower(), compute, transfer, compute,
                           RANK_COLORS[1].lower(), compute, transfer, compute, compute]
    bars = [p for p in ax.patches if mcolors.to_hex(p.get_facecolor()) in (compute, transfer)]
    assert [(round(b.get_x(), 6), round(b.get_width(), 6)) for b in bars[:3]] == [(0, 4), (0, 5), (5, 4)]  # ms
    lanes = {t.get_text(): y for t, y in zip(ax.get_yticklabels(), ax.get_yticks())}
    assert list(lanes) == ["rank 0 compute", "rank 0 transfer", "rank 1 compute", "rank 1 transfer"]
    assert lanes["rank 0 compute"] > lanes["rank 0 transfer"] > lanes["rank 1 compute"] > lanes["rank 1 transfer"]
    assert [b.get_y() + 0.4 for b in bars[:3]] == [lanes["rank 0 compute"], lanes["rank 0 transfer"],
                                                    lanes["rank 0 compute"]]
    # rank 0 ran one ring of t = 2 steps (2 matmuls, 1 transfer): each bar says its step and what it is; rank 1's
    # bars (3 matmuls) are not whole rings, so no step; 0.2 ms has room for "0" only; 0.01 ms for nothing
    assert _texts(ax) == ["step 1/2: matmul chunk 0", "step 1/2: send chunk 0, get chunk 1", "step 2/2: matmul chunk 1",
                          "matmul chunk 1", "send chunk 1, get chunk 0", "0"]
    assert ax.get_xlabel() == "time (ms)" and ax.get_title(loc="left") == "ring"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["compute", "transfer"]
    assert min(t.get_fontsize() for t in ax.texts + ax.get_yticklabels()) >= 8
    with pytest.raises(ValueError, match="kinds must be"):
        draw_timeline([[("wait", "x", 0.0, 1.0)]])


def test_timeline_names_rings_and_marks_forward_and_backward():
    """With the rings named (CommDebugMode's fused records, in the order they ran), each ring gets a numbered
    bracket over all ranks' bars, a key under the chart per phase, and the forward and the backward a shaded
    background; a reduce-scatter ring's matmuls are parts of sums and its transfers move sums."""
    from tensorplay_edu.viz import LANE_COLORS, draw_timeline
    from tensorplay_edu.viz.timelines import _PHASE_SHADE

    def rank(me):  # a gather ring (0-10 ms), then a reduce-scatter ring (15-26 ms), as async_tp labels them
        return [("transfer", f"chunk {1 - me}", 0.0, 0.006), ("compute", f"chunk {me}", 0.0001, 0.004),
                ("compute", f"chunk {1 - me}", 0.006, 0.010), ("compute", f"chunk {1 - me}", 0.015, 0.019),
                ("transfer", f"sum {me}", 0.020, 0.026), ("compute", f"chunk {me}", 0.0201, 0.024)]

    rings = [CommRecord("all_gather_matmul", "forward", (2, 8), "float32", 2, 64, "layers.0.attention"),
             ("layers.0.attention", "backward", "matmul_reduce_scatter")]  # a record or a plain tuple
    ax = draw_timeline([rank(0), rank(1)], rings=rings).axes[0]
    texts = _texts(ax)
    assert texts[:2] == ["1", "2"]  # the brackets' numbers
    assert [t.get_text() for t in ax.texts[2:4]] == ["forward:\n 1  layers.0.attention: all-gather \u2192 matmul",
                                                     "backward:\n 2  layers.0.attention: matmul \u2192 reduce-scatter"]
    assert {"matmul chunk 0", "part of sum 1", "send sum 1, get sum 0", "send chunk 0, get chunk 1"} <= \
        {t.split(": ", 1)[-1] for t in texts}
    brackets = [line for line in ax.lines if len(line.get_xdata()) == 4]
    assert [(line.get_xdata()[0], line.get_xdata()[-1]) for line in brackets] == [(0.0, 10.0), (15.0, 26.0)]  # ms
    shades = [p for p in ax.patches if _hex(p) in {c.lower() for c in _PHASE_SHADE.values()}]
    assert [(_hex(p), round(p.get_x(), 6), round(p.get_width(), 6)) for p in shades] == [
        (_PHASE_SHADE["forward"].lower(), 0.0, 10.0), (_PHASE_SHADE["backward"].lower(), 15.0, 11.0)]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(LANE_COLORS) + ["forward", "backward"]
    assert not {c.lower() for c in _PHASE_SHADE.values()} & {c.lower() for c in RANK_COLORS + list(LANE_COLORS.values())}


def test_viz_modules_import_in_any_order():
    # A rank unpickles tensorplay_edu.viz.runs.trace_flow before anything imported viz: no import cycle.
    import subprocess
    import sys
    for first in ("tensorplay_edu.viz.runs", "tensorplay_edu.viz.style", "tensorplay_edu.viz.ring", "tensorplay_edu.viz"):
        code = f"import {first}; import tensorplay_edu.viz as v; assert v.draw_flow and v.RANK_COLORS"
        subprocess.run([sys.executable, "-c", code], check=True)


def test_memory_bars_stack_components_in_fixed_colours():
    from tensorplay_edu.viz import draw_memory
    fig = draw_memory({"no TP": {"attention": 10, "norms": 4}, "TP + SP": {"attention": 5, "norms": 1}}, unit="GB")
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert heights == [10, 5, 4, 1]  # component by component, bar by bar
    assert _hex(ax.patches[0]) == _hex(ax.patches[1]) != _hex(ax.patches[2])  # a component keeps its colour
    assert [p.get_y() for p in ax.patches[2:]] == [10, 5]  # norms stacked on attention
    assert _texts(ax) == ["14 GB", "6 GB"]
    assert not {_hex(p) for p in ax.patches} & {c.lower() for c in RANK_COLORS}


def test_every_picture_uses_fonts_of_at_least_8_points():
    from tensorplay_edu.viz import draw_block_pair, draw_memory
    figs = [draw_layout((10, 6), [Shard(0)], (4,)), draw_layout((4, 6), [Partial()], (3,)),
            draw_layout((6, 8), [Shard(0), Partial()], (2, 2)), draw_transition((8, 8), Shard(0), Replicate()),
            draw_block_pair(), draw_block_pair(4, 3), draw_memory({"a": {"x": 1}}),
            draw_flow([("wo", "tensor [2, 8]", "tensor [2, 8]", "all_reduce")])]
    for fig in figs:
        for text in fig.findobj(matplotlib.text.Text):
            if text.get_text():
                assert text.get_fontsize() >= 8, (text.get_text(), text.get_fontsize())


def test_block_diagram_names_f_and_f_bar_and_labels_local_shapes():
    from tensorplay_edu.viz import block_steps, draw_block_pair
    vanilla = block_steps(False, 2, batch=2, seq=8, dim=16, n_heads=4, n_kv_heads=2)
    comms = [(s["what"], s["fwd"], s["bwd"]) for s in vanilla if s["kind"] == "comm"]
    assert comms == [("f: identity / all-reduce", "nothing", "all_reduce"),
                     ("f\u0304: all-reduce / identity", "all_reduce", "nothing")] * 2
    sp = block_steps(True, 4, 3, batch=2, seq=8, dim=16, n_heads=4)
    assert [s["fwd"] for s in sp if s["kind"] == "comm"] == ["all_gather (dim 1)", "reduce_scatter (dim 1)"] * 2
    assert sp[0]["shape"] == [2, 2, 16] and sp[0]["placement"] == "Shard(1)"
    fig = draw_block_pair(4, 3)
    assert "Shard(1) \u00b7 [2, 2, 16]" in [t.get_text() for t in fig.axes[1].texts]  # s/t = 2 at t = 4
    assert "rank 3's local one" in fig.get_suptitle()  # the title says every shape is local
    with pytest.raises(ValueError, match="n_heads=4 .* world_size=3"):
        block_steps(False, 3, n_heads=4)


@pytest.mark.parametrize("sp", [False, True])
def test_block_diagram_draws_the_residuals_the_reshape_and_its_letters(sp):
    """Two residual skip arrows (x around attention, h around the feed-forward); the heads reshaped back to
    [b, s, h/t] before wo; the collectives named with one convention, spelled out under the picture:
    f and f-bar (vanilla), g and g-bar (sequence parallel), Korthikanti's letters."""
    from tensorplay_edu.viz import block_steps, draw_block_pair
    steps = block_steps(sp, 2, batch=2, seq=8, dim=16, n_heads=4)
    names = [s["name"] for s in steps]
    reshape = steps[names.index("reshape")]
    assert names[names.index("reshape") + 1] == "wo" and reshape["shape"] == [2, 8, 8]  # [b, s, h/t]
    assert "[b, s, H/t, hd] \u2192 [b, s, h/t]" in reshape["what"]
    letters = [s["what"].split(":")[0] for s in steps if s["kind"] == "comm"]
    assert letters == (["g", "g\u0304"] if sp else ["f", "f\u0304"]) * 2
    ax = draw_block_pair().axes[int(sp)]  # vanilla left, sequence parallel right
    skips = {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith("residual")}
    assert sorted(skips) == ["residual r", "residual x"]
    # each skip is labelled halfway along it: x from the block input to "+ x", r from "+ x" to "+ r" (y: n-1 at the top)
    mid = {t.get_text(): t.get_position()[1] for t in ax.texts if t.get_text().startswith("residual: ")}
    top, add_x, add_h = len(steps) - 1, len(steps) - 1 - names.index("+ x"), len(steps) - 1 - names.index("+ r")
    assert mid == pytest.approx({"residual: x": (top + add_x) / 2, "residual: r": (add_x + add_h) / 2})
    key = [t for t in _texts(ax) if "backward\n" in t]
    assert key == ([r"g: all-gather forward, reduce-scatter backward" "\n"
                    r"$\bar{g}$: reduce-scatter forward, all-gather backward"] if sp else
                   [r"f: identity forward, all-reduce backward" "\n"
                    r"$\bar{f}$: all-reduce forward, identity backward"])


def _block_shapes(plan: str, n_kv_heads: int):
    """The local shapes the real block returns, module by module, under parallelize_llama (inside a rank)."""
    import torch
    from tensorplay_edu import DTensor, init_device_mesh
    from tensorplay_edu.models import ModelArgs, Transformer, parallelize_llama
    torch.manual_seed(0)
    args = ModelArgs(dim=16, n_layers=1, n_heads=4, n_kv_heads=n_kv_heads, vocab_size=32, max_seq_len=8)
    model = parallelize_llama(Transformer(args), init_device_mesh("cpu", (2,)), plan)
    seen = {}
    for name, mod in model.layers["0"].named_modules():
        if name:
            def hook(m, a, out, name=name):  # returns None: the output stays as it is
                seen.setdefault(name, list((out.to_local() if isinstance(out, DTensor) else out).shape))
            mod.register_forward_hook(hook)
    model(torch.randint(0, 32, (2, 8)))
    return seen


@pytest.mark.parametrize("plan", ["vanilla", "full"])
def test_block_diagram_shapes_are_the_real_blocks(plan):
    from tensorplay_edu import launch
    from tensorplay_edu.viz import block_steps
    for n_kv in (4, 2):
        real = launch(_block_shapes, 2, plan, n_kv)[1]
        steps = block_steps(plan == "full", 2, 1, batch=2, seq=8, dim=16, n_heads=4, n_kv_heads=n_kv)
        drawn = {s["module"]: s["shape"] for s in steps if s["module"]}
        assert drawn == {k: real[k] for k in drawn}, (plan, n_kv)
        assert [s["also"] for s in steps if s["also"]] == [real["attention.wk"]]


def test_the_rank_palette_is_used_only_for_ranks():
    """Pictures without ranks in them (the block, flows, a backward's collectives, memory, a transition's arrows) use
    no rank colour."""
    from tensorplay_edu.viz import draw_block_pair, draw_grad_sync_order, draw_memory
    ranks = {c.lower() for c in RANK_COLORS}
    figs = [draw_block_pair(), draw_memory({"a": {"x": 1, "y": 2}}),
            draw_flow([("wo", "tensor [2, 8]", "tensor [2, 8]", "all_reduce")]),
            draw_grad_sync_order([(0, "tp", "all_reduce", "norm.weight", []), (1, "tp", "reduce_scatter", "wo", []),
                                  (2, "dp", "all_reduce", "", ["norm.weight"])], {"norm.weight"},
                                 {"tp": [0, 1], "dp": [0, 2]})]
    middle = draw_transition((8, 8), Shard(0), Replicate()).axes[1]  # the arrows between the two layouts
    colours = [mcolors.to_hex(c) for fig in figs for p in fig.findobj(matplotlib.patches.Patch)
               for c in (p.get_facecolor(), p.get_edgecolor())]
    colours += [mcolors.to_hex(t.get_color()) for fig in figs for t in fig.findobj(matplotlib.text.Text)]
    colours += [mcolors.to_hex(p.get_edgecolor()) for p in middle.patches] + [mcolors.to_hex(t.get_color())
                                                                               for t in middle.texts]
    assert not set(colours) & ranks


def test_readme_pictures_are_drawn_from_the_code(tmp_path):
    """docs/pictures.py (make pictures) draws the README's pictures with viz; the README shows them."""
    import importlib.util
    from pathlib import Path
    root = Path(__file__).parent.parent
    spec = importlib.util.spec_from_file_location("pictures", root / "docs" / "pictures.py")
    pictures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pictures)
    made = pictures.main(tmp_path)
    assert [p.name for p in made] == ["idea.png", "uneven_shard.png"] and all(p.stat().st_size > 10_000 for p in made)
    readme = (root / "README.md").read_text()
    assert all(f"](docs/{p.name})" in readme for p in made)


def test_draw_checkpoint_who_wrote_what_what_each_keeps_and_reads():
    from tensorplay_edu.viz import draw_checkpoint, reads, wanted_chunks
    from tensorplay_edu.viz.checkpoint import keeps

    saved = wanted_chunks([10, 4], 0, 4)  # TP 4 wrote rows 0-2, 3-5, 6-8, 9
    loaded = wanted_chunks([10, 4], 0, 2)  # TP 2 holds rows 0-4, 5-9
    assert [c["sizes"][0] for c in saved] == [3, 3, 3, 1]
    assert [[s["rank"] for s in reads(c, saved)] for c in loaded] == [[0, 1], [1, 2, 3]]
    # rank 0 keeps rows 3-4 of file 1 but reads its rows 3-5 whole (DCP's FileSystemReader)
    assert [(k["offsets"][0], k["sizes"][0]) for k in keeps(loaded[0], saved)] == [(0, 3), (3, 2)]
    assert [(r["offsets"][0], r["sizes"][0]) for r in reads(loaded[0], saved)] == [(0, 3), (3, 3)]
    fig = draw_checkpoint([10, 4], saved, loaded, name="output.weight")
    left, *right = fig.axes
    assert len(right) == 2  # one panel per rank of TP 2
    assert _texts(left) == ["rank 0 writes\nrows 0-2", "rank 1 writes\nrows 3-5", "rank 2 writes\nrows 6-8",
                            "rank 3 writes\nrow 9"]
    assert _texts(right[1]) == ["rank 1 keeps\nrow 5 of rank 1's file\nrows 6-8 of rank 2's file\nrow 9 of rank 3's file"]
    assert "reads" not in _texts(right[0])[0]
    assert right[0].get_title() == "TP 2, rank 0: keeps 20 numbers,\nreads 24 (hatched: read, thrown away)"
    assert right[1].get_title() == "TP 2, rank 1: keeps 20 numbers,\nreads 28 (hatched: read, thrown away)"
    in_bytes = draw_checkpoint([10, 4], saved, loaded, name="output.weight", itemsize=8).axes[2]  # float64
    assert in_bytes.get_title() == "TP 2, rank 1: keeps 160 bytes,\nreads 224 (hatched: read, thrown away)"
    assert [_hex(p) for p in left.patches] == [mcolors.to_hex(c) for c in RANK_COLORS[:4]]
    for ax in right:
        assert sum(p.get_linestyle() == "--" for p in ax.patches) == 4  # the saved chunks' borders
        assert sum(bool(p.get_hatch()) for p in ax.patches) == len(reads(loaded[right.index(ax)], saved))
    assert left.get_ylim() == (10, 0) and right[0].get_ylim() == (10, 0)
    # one colour meaning in every panel: the file a row comes from. Rank 0 keeps rows 0-2 of file 0 and
    # rows 3-4 of file 1: filled in file 0's and file 1's colours; its hatched rows 5 are file 1's colour too.
    filled = [p for p in right[0].patches if p.get_fill() and not p.get_hatch() and p.get_facecolor()[:3] != (1, 1, 1)]
    assert [(p.get_y(), p.get_height(), _hex(p)) for p in filled] == [
        (0, 3, mcolors.to_hex(RANK_COLORS[0])), (3, 2, mcolors.to_hex(RANK_COLORS[1]))]
    hatched = [p for p in right[1].patches if p.get_hatch()]
    assert [mcolors.to_hex(p.get_edgecolor()) for p in hatched] == [mcolors.to_hex(c) for c in RANK_COLORS[1:4]]


def test_collectives_in_one_figure():
    # notebook 00: all-gather and reduce-scatter as two rows of one figure, each row's middle naming its collective
    fig = draw_collectives(["all_gather", "reduce_scatter"], 4, shape=(8, 4))
    assert len(fig.axes) == 6
    assert _texts(fig.axes[1]) == ["all_gather", "S(0) -> R"] and _texts(fig.axes[4]) == ["reduce_scatter", "P(sum) -> S(0)"]
    with pytest.raises(ValueError, match="draw_collectives"):
        draw_collectives(["broadcast"])

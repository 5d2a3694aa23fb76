"""The pictures added for notebooks 09-11: a flow with side-by-side readers, one timeline per ring with the
waiting marked, the float8 value line, the step grid, the mesh grid and the smaller charts (patches and
texts of the returned figures, not pixels)."""

import matplotlib.colors as mcolors
import torch

from tensorplay_edu import viz
from figures import texts as _texts


def test_flow_fans_out_to_side_by_side_readers_and_back_in():
    """A list of rows is one step of modules side by side: an arrow from the step above to each (a fan-out) and
    from each to the step below (a fan-in); their shared input is written once, a shared output and shared
    collectives with "(each)"; a row with no texts is a dashed box in italics (not a module)."""
    readers = [(m, "Float8Input e4m3 [2, 12, 48]", "tensor [2, 12, 24]", "all_reduce (scalar)")
               for m in ("wq", "wk", "wv")]
    fig = viz.draw_flow([("attention: its input", "DTensor S(1) [2, 12, 48]", "Float8Input e4m3 [2, 12, 48]",
                          "all_reduce (scalar), all_gather e4m3"), readers, ("attention core", "", "", ""),
                         ("wo", "tensor [2, 12, 24]", "tensor [2, 6, 48]", "reduce_scatter")])
    ax = fig.axes[0]
    gids = [p.get_gid() for p in ax.patches if (p.get_gid() or "").startswith("flow")]
    assert gids == ["flow 0.0->1.0", "flow 0.0->1.1", "flow 0.0->1.2",
                    "flow 1.0->2.0", "flow 1.1->2.0", "flow 1.2->2.0", "flow 2->3"]
    texts = _texts(ax)
    assert texts.count("Float8Input e4m3 [2, 12, 48]") == 2  # the hook's output, and the readers' input once
    assert "tensor [2, 12, 24]  (each)" in texts and "all_reduce (scalar) (each)" in texts
    assert {"wq", "wk", "wv", "attention core"} <= set(texts)
    boxes = [p for p in ax.patches if type(p).__name__ == "Rectangle"]
    assert len(boxes) == 6 and [b.get_linestyle() for b in boxes].count("--") == 1
    core = next(t for t in ax.texts if t.get_text() == "attention core")
    assert core.get_style() == "italic"
    xs = sorted(b.get_x() for b in boxes[1:4])
    assert xs[0] < xs[1] < xs[2] and len({round(b.get_y(), 6) for b in boxes[1:4]}) == 1  # one row


def test_ring_timelines_one_panel_per_ring_with_waiting_marked():
    """Each ring its own panel (forward left, backward right); the part of a transfer beside a matmul is drawn
    as a transfer, every stretch of a rank's ring without a matmul hatched and labelled waiting."""
    def rank(me):  # a gather ring (0-10 ms): matmul 0-4 under a transfer 0-6, then 6-10; a scatter ring later
        return [("transfer", f"chunk {1 - me}", 0.0, 0.006), ("compute", f"chunk {me}", 0.0, 0.004),
                ("compute", f"chunk {1 - me}", 0.006, 0.010), ("compute", f"chunk {1 - me}", 0.015, 0.019),
                ("transfer", f"sum {me}", 0.020, 0.026), ("compute", f"chunk {me}", 0.020, 0.024)]

    rings = [("layers.0.attention", "forward", "all_gather_matmul"), ("layers.0.attention", "backward",
                                                                       "matmul_reduce_scatter")]
    fig = viz.draw_ring_timelines([rank(0), rank(1)], rings, title="two rings")
    forward, backward = fig.axes[0], fig.axes[1]
    assert forward.get_title(loc="left") == "ring 1 (forward): layers.0.attention: all-gather \u2192 matmul"
    assert backward.get_title(loc="left") == "ring 2 (backward): layers.0.attention: matmul \u2192 reduce-scatter"
    spans = lambda ax, gid: sorted((round(p.get_x(), 6), round(p.get_width(), 6)) for p in ax.patches  # noqa: E731
                                   if p.get_gid() == gid)
    assert spans(forward, "compute") == [(0, 4), (0, 4), (6, 4), (6, 4)]  # ms from the ring's first bar
    assert spans(forward, "transfer") == [(0, 4), (0, 4)]                 # under the first matmul
    assert spans(forward, "wait") == [(4, 2), (4, 2)]                     # then the rank waited
    # the scatter ring: 15-19 a matmul, 19-20 posting the send (nothing drawn by the ring: waiting), 20-24 beside
    # the second matmul, 24-26 waiting in wait()
    assert spans(backward, "wait") == [(4, 1), (4, 1), (9, 2), (9, 2)]
    assert "waiting" in _texts(forward) and "step 1/2: matmul chunk 0" in _texts(forward)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[1] == "transfer in flight under a matmul (overlap)" and legend[2].startswith("waiting")
    hatched = [p for p in forward.patches if p.get_gid() == "wait"]
    assert all(p.get_hatch() for p in hatched)


def test_float8_values_amax_and_differences():
    values = {"e4m3": torch.tensor([0.002, 0.0156, 1.0, 1.125, 448.0])}
    pos = values["e4m3"]
    gaps = {"e4m3": (pos, (pos[1:] - pos[:-1]) / pos[:-1])}
    props = {"e4m3": {"max": 448.0, "smallest normal": 0.0156, "smallest subnormal": 0.002, "positive values": 5}}
    fig = viz.draw_float8_values(gaps, props, {"e4m3": 3}, {"e4m3": "#1B7F79"})
    top, bottom = fig.axes
    assert "FP8_MAX = 448" in _texts(top) and "e4m3\n5 values" in _texts(top)
    assert "e4m3 rounding bound 2^-4" in _texts(bottom)
    (curve,) = bottom.get_lines()[:1]  # half the gap: the same quantity as the bound line
    assert curve.get_label() == "e4m3: half the gap / value" and any(abs(y - 2 ** -4) < 1e-6 for y in curve.get_ydata())  # 1 -> 1.125

    x = torch.cat([torch.full((4, 4), 0.01), torch.full((4, 4), 5.0)])
    fig = viz.draw_amax_slices(x, torch.ones(8, 4), torch.zeros(8, 4), 2, "#1B7F79")
    left = fig.axes[0]
    assert sorted(t.get_text() for t in left.get_legend().get_texts()) == [
        "global amax", "rank 0's local amax", "rank 0's rows", "rank 1's local amax", "rank 1's rows"]

    ax = viz.draw_relative_differences({"a": ([1e-3, 0.0], "o", "black")}).axes[0]
    assert list(ax.lines[0].get_ydata()) == [1e-3, 1e-17]  # zero drawn at the floor


def test_schedules_step_grid_mesh_grid_and_grad_sync_order():
    sync = [("transfer", "gather", 0, 3), ("compute", "matmul", 3, 7)]
    ring = [("compute", "x0", 0, 1), ("transfer", "x1", 0, 1), ("compute", "x1", 1, 2)]
    ax = viz.draw_schedules({"synchronous": sync, "decomposed": ring}, {"synchronous": 7, "decomposed": 2},
                            "time").axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["synchronous, compute", "synchronous, transfer",
                                                            "decomposed, compute", "decomposed, transfer"]
    assert "synchronous: 7.0" in _texts(ax) and "decomposed: 2.0" in _texts(ax)

    held = [[(r - k) % 3 for r in range(3)] for k in range(3)]
    ax = viz.draw_step_grid(held, lambda k, r, c: f"x{c}", lambda c: c, "grid").axes[0]
    assert [mcolors.to_hex(p.get_facecolor()) for p in ax.patches if p.get_gid() is None][:3] == \
        [viz.RANK_COLORS[c].lower() for c in held[0]]
    assert sum((p.get_gid() or "").startswith("step") for p in ax.patches) == 6  # 2 steps x 3 ranks
    assert _texts(ax).count("to rank 0") == 2

    ax = viz.draw_mesh_grid(2, 2).axes[0]
    assert "TP group [0, 1]\ninside one node, every layer" in _texts(ax)
    assert "DP group [1, 3]\ngradients, per bucket,\nin backward" in _texts(ax)
    assert {p.get_gid() for p in ax.patches} >= {"tp 0", "tp 1", "dp 0", "dp 1"}

    timeline = [(0, "tp", "all_reduce", "norm.weight", []), (1, "tp", "all_gather", "w2", []),
                (2, "dp", "all_reduce", "", ["output.weight", "norm.weight"])]
    ax = viz.draw_grad_sync_order(timeline, {"norm.weight"}, {"tp": [0, 1], "dp": [0, 2]}).axes[0]
    deep = viz.draw_grad_sync_order([(0, "tp", "all_reduce", "layers.1.ffn_norm.weight", [])],
                                    {"layers.1.ffn_norm.weight"}, {"tp": [0, 1], "dp": [0, 2]}).axes[0]
    assert "layers.1\nffn_norm" in _texts(deep)  # the module path as written, not "layers 1"
    dotted = [line for line in ax.lines if line.get_linestyle() == ":"]
    assert len(dotted) == 1 and list(dotted[0].get_xdata()) == [0, 2]  # the norm weight's all-reduce to its bucket
    assert "2 grads" in _texts(ax) and "norm" in _texts(ax)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "norm weight's all-reduce (TP)", "all-gather (TP)", "DDP bucket's all-reduce (DP)",
        "carries that norm weight across"]
    assert [line.get_marker() for line in ax.lines if line.get_linestyle() != ":"] == ["D", "o", "^"]  # bucket != norm
    marked = viz.draw_grad_sync_order(timeline, {"norm.weight"}, {"tp": [0, 1], "dp": [0, 2]}, last_label="last").axes[0]
    arrow = next(t for t in marked.texts if t.get_gid() == "last tp")  # under the TP lane's last record, w2's
    assert arrow.get_text() == "last" and arrow.xy == (1, 1) and not any(t.get_gid() == "last tp" for t in ax.texts)


def test_ring_step_costs_shade_where_the_transfer_hides():
    tokens = [4.0, 64.0, 1024.0]
    ax = viz.draw_ring_step_costs(tokens, [1.0, 2.0, 20.0], {"w1, w3": [0.1, 2.5, 40.0], "wq": [0.05, 1.0, 10.0]},
                                  50.0, title="t").axes[0]
    assert [line.get_linestyle() for line in ax.lines] == ["-", "-", "--"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "transfer of one chunk", "matmul of one chunk: w1, w3", "matmul of one chunk: wq", "the transfer hides (solid line)"]
    (shade,) = ax.patches
    assert round(shade.get_x(), 6) == 50.0


def test_flow_collectives_clear_the_widest_output_label():
    """A long boxed output label (float8) never runs into the collectives' column: the column moves right of it."""
    fig = viz.draw_flow([("attention: its input", "DTensor S(1) global [2, 12, 48]",
                          "Float8Input e4m3 local [2, 12, 48]", "all_reduce (scalar), all_gather e4m3")])
    ax, renderer = fig.axes[0], fig.canvas.get_renderer()
    frame = lambda text: next((t.get_bbox_patch() or t).get_window_extent(renderer)  # noqa: E731
                              for t in ax.texts if t.get_text() == text)
    out = frame("Float8Input e4m3 local [2, 12, 48]")
    assert all(frame(c).x0 > out.x1 for c in ("all_reduce (scalar)", "all_gather e4m3  1 B/elem"))
    assert [line.get_gid() for line in ax.lines].count("margin") == 1  # the frames kept off the figure's edge


def test_flow_heads_its_collectives_column_when_asked():
    """comm_header names the right-hand column above the top row, left-aligned with the collectives under it."""
    rows = [("wq", "Float8Input e4m3 [2, 12, 48]", "tensor [2, 12, 24]", "all_reduce (scalar), all_gather e4m3"),
            ("wo", "tensor [2, 12, 24]", "tensor [2, 6, 48]", "reduce_scatter")]
    ax = viz.draw_flow(rows, comm_header="collectives").axes[0]
    header = next(t for t in ax.texts if t.get_gid() == "comm header")
    below = next(t for t in ax.texts if t.get_text() == "reduce_scatter")
    assert header.get_text() == "collectives" and header.get_position()[1] > 2  # above the top row (rows at 1.5, 0.5)
    assert abs(header.get_position()[0] - below.get_position()[0]) < 1e-9
    assert not any(t.get_gid() == "comm header" for t in viz.draw_flow(rows).axes[0].texts)  # only when asked

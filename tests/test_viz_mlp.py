"""Megatron's MLP picture (notebook 02, section 4): its steps against a real run, and its boxes (not pixels)."""

import matplotlib
import matplotlib.pyplot
import torch
from matplotlib.patches import FancyBboxPatch
from torch import nn

from tensorplay_edu.viz import COMM_COLOR, draw_mlp, mlp_comms, mlp_steps


def _mlp_run(h, ff):
    # One colwise -> rowwise MLP on this rank: what each module returned (local shapes), and the records.
    import torch.distributed as dist
    from tensorplay_edu import CommDebugMode, init_device_mesh
    from tensorplay_edu.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallelize_module(nn.Sequential(nn.Linear(h, ff), nn.ReLU(), nn.Linear(ff, h)), mesh,
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    returned = {}
    def hook(module, args, out):  # returns None: the output stays as it is
        returned.setdefault(module.fqn, list(out.shape))

    for name, module in model.named_children():
        module.fqn = name
        module.register_forward_hook(hook)
    x = torch.randn(2, 3, h, requires_grad=True)
    with CommDebugMode() as comm:
        model(x).sum().backward()
    return returned, [(r.op, r.phase, r.module, tuple(r.shape)) for r in comm.records]


def test_steps_are_the_real_mlps_shapes_and_collectives():
    from tensorplay_edu import launch
    for r, (returned, records) in enumerate(launch(_mlp_run, 2, 8, 12)):
        steps = mlp_steps(2, 3, 8, 12, 2, r)
        assert {st["module"]: st["shape"] for st in steps if st["module"]} == returned
        assert mlp_comms(steps) == records == [("all_reduce", "forward", "2", (2, 3, 8)),
                                               ("all_reduce", "backward", "0", (2, 3, 8))]


def test_uneven_hidden_width_gives_each_rank_its_chunk():
    assert [mlp_steps(2, 3, 8, 10, 4, r)[2]["shape"] for r in range(4)] == [[2, 3, 3]] * 3 + [[2, 3, 1]]


def test_picture_draws_six_boxes_two_red_and_bars_f():
    fig = draw_mlp(2, 3, 8, 16, 4)
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == 6
    assert sum(matplotlib.colors.to_hex(p.get_edgecolor()) == COMM_COLOR.lower() for p in boxes) == 2
    labels = [t.get_text() for t in ax.texts]
    assert r"$\bar{f}$" in labels and "f" in labels
    assert "Shard(-1) \u00b7 local [2, 3, 4]" in labels and "Replicate() \u00b7 local [2, 3, 8]" in labels
    assert "forward: all_reduce\nbackward: nothing" in labels and "t = 4" in ax.get_title()
    matplotlib.pyplot.close(fig)


def test_note_x_moves_the_forward_backward_notes_beside_their_boxes():
    for note_x in (8.0, 4.5):
        fig = draw_mlp(2, 3, 8, 16, 4, note_x=note_x)
        notes = [t for t in fig.axes[0].texts if t.get_text().startswith("forward:")]
        assert len(notes) == 2 and all(t.get_position()[0] == note_x for t in notes)
        matplotlib.pyplot.close(fig)


def test_xmax_crops_the_right_margin_and_narrows_the_figure():
    wide, narrow = draw_mlp(2, 3, 8, 16, 4, note_x=4.5), draw_mlp(2, 3, 8, 16, 4, note_x=4.5, xmax=7.4)
    assert wide.axes[0].get_xlim() == (0, 10) and narrow.axes[0].get_xlim() == (0, 7.4)
    assert narrow.get_figwidth() < wide.get_figwidth()
    matplotlib.pyplot.close(wide), matplotlib.pyplot.close(narrow)


def test_hooks_names_the_hook_each_collective_runs_in_and_changes_nothing_else():
    plain, named = mlp_steps(2, 3, 8, 16, 4), mlp_steps(2, 3, 8, 16, 4, hooks=True)
    assert [st["name"] for st in named if st["kind"] == "comm"] == ["f (layer 0's input hook)",
                                                                    "f\u0304 (layer 2's output hook)"]
    assert [{**st, "name": None} for st in plain] == [{**st, "name": None} for st in named]
    assert [st["under"] for st in named if st["kind"] == "comm"] == ["0", "2"]   # the layers the hooks belong to
    matplotlib.pyplot.close(draw_mlp(2, 3, 8, 16, 4, hooks=True))

"""The bug zoo's picture (notebook 08): the heads each view hands to attention (structure and labels of the
returned figure, not pixels)."""

from tensorplay_edu.viz import draw_view_groups


def _groups(ax):
    """{row: [(rank, k, first, size)]} from the gids of the black boxes."""
    out = {}
    for p in ax.patches:
        gid = p.get_gid() or ""
        if gid.startswith("group "):
            row, rank, k, first, size = map(int, gid.split()[1:])
            out.setdefault(row, []).append((rank, k, first, size))
    return out


def test_head_views_box_whole_heads_for_minus_one_and_cut_heads_for_the_global_count():
    heads, hd, t = 4, 4, 2
    views = {"-1": lambda y: y.view(1, 1, -1, hd), "H": lambda y: y.view(1, 1, heads, -1)}
    ax = draw_view_groups(views, heads, hd, t).axes[0]
    groups = _groups(ax)
    # -1: each rank names H/t heads of hd features, each one whole true head (first feature a multiple of hd)
    assert sorted(groups[0]) == [(r, k, r * 8 + k * hd, hd) for r in range(t) for k in range(heads // t)]
    # H: each rank names H heads of hd/t features, so every true head is cut in t pieces
    assert sorted(groups[1]) == [(r, k, r * 8 + k * 2, 2) for r in range(t) for k in range(heads)]
    labels = [x.get_text() for x in ax.get_yticklabels()]
    assert labels == ["true head\n(one process)", "-1", "H"]
    texts = [x.get_text() for x in ax.texts]
    assert "rank 1: local features 0-7 = global 8-15" in texts
    assert texts.count("head 0") == t  # the whole heads are labelled "head k", once per rank


def test_dropout_masks_show_the_ranks_blocks_side_by_side():
    """One column per seeding: on top the ranks' hidden masks side by side (their concatenation, exactly), below
    each rank's mask of the replicated output; t - 1 rank edges in each panel, the correlation in the title."""
    import torch
    from tensorplay_edu.viz import draw_dropout_masks

    t, n = 2, 3
    same = torch.tensor([[1, 0], [0, 1], [1, 1]], dtype=torch.bool)
    runs = {"one seed": [{"kept": same, "y": torch.tensor([[1.0, 0.0]] * n)} for _ in range(t)],
            "seed + rank": [{"kept": same, "y": torch.tensor([[1.0, 0.0]] * n)},
                            {"kept": ~same, "y": torch.tensor([[0.0, 2.0]] * n)}]}
    fig = draw_dropout_masks(runs, {"one seed": 1.0, "seed + rank": -1.0})
    axes = fig.axes
    assert len(axes) == 4  # 2 rows x 2 seedings
    top = axes[1].get_images()[0].get_array()  # seedings across, rows down: axes[1] is row 0, column 1
    assert (top == torch.cat([same, ~same], dim=1).int().numpy()).all()
    bottom = axes[3].get_images()[0].get_array()
    assert bottom.tolist() == [[1, 0, 0, 1]] * n  # the replicas' masks differ: the bug
    assert all(sum(line.get_gid() == "rank edge" for line in ax.get_lines()) == t - 1 for ax in axes)
    assert "+1.00" in axes[0].get_title() and "-1.00" in axes[1].get_title()

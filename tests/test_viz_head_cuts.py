"""wq cut by torch.chunk at t = 3 (notebook 02b): the dashed lines sit where the ranks' pieces meet."""

import matplotlib.pyplot as plt

from tensorplay_edu.viz.head_cuts import cut_rows, draw_head_cuts


def test_cut_rows_follow_torch_chunk():
    assert cut_rows(4, 8, 3) == [11, 22]          # 32 rows: 11, 11, 10
    assert cut_rows(4, 8, 2) == [16]              # whole heads: the cut falls between heads 1 and 2
    assert cut_rows(4, 8, 1) == []


def test_lines_and_labels_at_the_cuts():
    fig = draw_head_cuts(4, 2, 8, 3)
    ax = fig.axes[0]
    lines = {line.get_gid(): line for line in ax.lines}
    assert set(lines) == {"cut 11", "cut 22"}
    for stop in (11, 22):
        assert list(lines[f"cut {stop}"].get_ydata()) == [-stop, -stop]
    texts = [t.get_text() for t in ax.texts]
    assert "cut at row 11" in texts and "cut at row 22" in texts
    assert ax.get_xlim()[0] < -0.32 * 32                      # the labels fit left of the weight
    assert any(p.get_gid() == "wq q head 1" and p.get_edgecolor()[:3] == (1.0, 0.0, 0.0) for p in ax.patches)
    plt.close(fig)


def test_cut_heads_labelled_beside_the_weight():
    fig = draw_head_cuts(4, 2, 8, 3)
    cut = [t for t in fig.axes[0].texts if "(cut)" in t.get_text()]
    assert [t.get_text().split(chr(10))[0] for t in cut] == ["q head 1 (cut)", "q head 2 (cut)"]
    assert all(t.get_position()[0] > 32 and t.get_ha() == "left" for t in cut)   # right of the [32, 32] weight
    plt.close(fig)

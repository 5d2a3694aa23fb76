"""Notebook 08c's gap picture: per bug, the fixed and the buggy relative error as two dots on one log axis
(structure and labels of the returned figure, not pixels)."""

import pytest

from tensorplay_edu.viz.bug_gaps import draw_bug_gaps


def test_each_row_joins_the_fixed_error_to_the_bug_on_one_log_axis():
    rows = {"a bug": {"quantity": "the loss", "bug": 0.03, "fixed": 0.0},
            "another": {"quantity": "a gradient", "bug": 0.7, "fixed": 3e-16}}
    ax = draw_bug_gaps(rows).axes[0]
    assert ax.get_xscale() == "log"
    lo, hi = ax.get_xlim()
    assert lo < 1e-17 and hi == 10
    dots = {c.get_gid(): c.get_offsets()[0] for c in ax.collections}
    assert set(dots) == {"fixed a bug", "bug a bug", "fixed another", "bug another"}
    assert dots["bug a bug"][0] == pytest.approx(0.03) and dots["bug another"][0] == pytest.approx(0.7)
    assert dots["fixed a bug"][0] == pytest.approx(1e-17)  # an exact 0 sits at the floor
    assert dots["fixed another"][0] == pytest.approx(3e-16)
    assert dots["bug a bug"][1] == dots["fixed a bug"][1] == 0 and dots["bug another"][1] == 1  # one row each
    lines = {line.get_gid(): line.get_xdata() for line in ax.lines if (line.get_gid() or "").startswith("gap ")}
    assert list(lines["gap another"]) == pytest.approx([3e-16, 0.7])  # the gap, end to end
    texts = [x.get_text() for x in ax.texts]
    assert {"3.0%", "70.0%", "0", "3e-16"} <= set(texts)
    assert "the checks' bound, 1e-12" in texts
    labels = [x.get_text() for x in ax.get_yticklabels()]
    assert labels == ["a bug\nspoils the loss", "another\nspoils a gradient"]

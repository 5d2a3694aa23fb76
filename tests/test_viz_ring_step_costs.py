"""draw_ring_step_costs's keywords for notebook 10b: a colour per matmul, red marks, the shade's label."""
import matplotlib

matplotlib.use("Agg")

from tensorplay_edu import viz  # noqa: E402


def test_ring_step_costs_colours_marks_and_shade_label():
    tokens = [4.0, 64.0, 1024.0]
    ax = viz.draw_ring_step_costs(tokens, [1.0, 2.0, 20.0], {"w1, w3": [0.1, 2.5, 40.0], "wq": [0.05, 1.0, 10.0]}, 50.0,
                                  colors=["#1D5C63", "#7B3294"], marks={"one sequence": 512.0, "w2": 200.0},
                                  shade_label="shaded: hides").axes[0]
    curves = [line for line in ax.lines if line.get_label().startswith("matmul")]
    assert [line.get_color() for line in curves] == ["#1D5C63", "#7B3294"]
    red = [line for line in ax.lines if line.get_color() == "#C44E52"]
    assert [(line.get_label(), line.get_xdata()[0], line.get_linestyle()) for line in red] == [
        ("one sequence", 512.0, "-"), ("w2", 200.0, "-.")]
    (shade,) = ax.patches
    assert shade.get_label() == "shaded: hides" and shade.get_alpha() >= 0.4    # visible, not faint
    assert [t.get_text() for t in ax.get_legend().get_texts()][-3:] == ["shaded: hides", "one sequence", "w2"]

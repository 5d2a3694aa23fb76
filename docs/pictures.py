"""The README's pictures, drawn from the code (``make pictures``): re-run after changing ``tensorplay_edu.viz``."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from tensorplay_edu import Partial, Shard, viz  # noqa: E402

HERE = Path(__file__).parent


def main(out: Path = HERE) -> list[Path]:
    pictures = {
        # the idea: a layout, the move of the table that changes it, and the collectives it costs both ways
        "idea.png": viz.draw_transition((8, 8), Partial(), Shard(0), 4, title=(
            "RowwiseParallel's output under sequence parallelism: 4 addends -> each rank's rows of the sum\n"
            "forward: one reduce-scatter; backward: the gradient's all-gather (one row of the transition table)")),
        "uneven_shard.png": viz.draw_layout((10, 6), [Shard(0)], (4,), title=(
            "10 rows over 4 ranks: torch.chunk gives 3, 3, 3, 1, each drawn where it sits in the global tensor")),
    }
    paths = []
    for name, fig in pictures.items():
        fig.savefig(out / name, dpi=110)
        paths.append(out / name)
    return paths


if __name__ == "__main__":
    for path in main():
        print(path)

"""Every "Try it" asks before it tells, read from the notebooks' JSON (tests/test_browser.py checks the
same in JupyterLab itself, where Chromium is installed).

An exercise is three code cells: the experiment (collapsed, source and outputs, its first line, the
one JupyterLab shows, neutral), the learner's (only the prediction and the call, stored saying "not
tried yet"), and the solution (collapsed, its first line the same everywhere, printing only its
verdict: JupyterLab opens a cell's output when it runs, so after Run All any other print would show).
"""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
SOLUTION = "# Solution: open it once you have tried."
CALL = re.compile(r"^(try_\w+)\(PREDICTED\)$")


def _code(nb):
    for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
        if cell["cell_type"] == "code":
            folded = cell["metadata"].get("jupyter", {})
            text = "".join(out.get("text", "") if isinstance(out.get("text", ""), str) else "".join(out["text"])
                           for out in cell.get("outputs", []))
            yield i, "".join(cell["source"]), folded.get("source_hidden") and folded.get("outputs_hidden"), text


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda nb: nb.stem)
def test_every_exercise_asks_before_it_tells(nb):
    experiments, learners, solutions = {}, [], []
    for i, source, folded, printed in _code(nb):
        first, lines = source.split("\n", 1)[0], source.strip().splitlines()
        assert "check(PREDICTED" not in source, f"{nb.name} cell {i}: compares in the learner's sight"
        if re.search(r"^(try_\w+) = TryIt\(", source, re.M):
            assert folded and first.startswith("# The experiment") and "(open it after your try)" in first, \
                f"{nb.name} cell {i}: an experiment, collapsed, with a first line that gives nothing away"
            experiments.update((name, i) for name in re.findall(r"^(try_\w+) = TryIt\(", source, re.M))
        elif first.startswith("# Solution"):
            assert first == SOLUTION and folded, f"{nb.name} cell {i}: a solution, collapsed, first line {SOLUTION!r}"
            assert re.fullmatch(r"[^\n]*: right\n", printed), f"{nb.name} cell {i} prints more than its verdict: {printed!r}"
            solutions.append(i)
        elif CALL.match(lines[-1] if lines else ""):
            assert not folded and lines[0].startswith("PREDICTED = ") and len(lines) <= 4 and "launch(" not in source, \
                f"{nb.name} cell {i}: the learner's cell holds only the prediction and the call"
            assert printed.count("not tried yet") == 1, f"{nb.name} cell {i} is stored tried: {printed!r}"
            learners.append((i, CALL.match(lines[-1]).group(1)))
    assert learners, f"{nb.name}: no exercise"
    for i, name in learners:  # each learner cell: its experiment before it, its solution right after it
        assert experiments.get(name, i) < i, f"{nb.name} cell {i}: {name} is built after it is called"
        assert any(j > i and not any(i < k < j for k, _ in learners) for j in solutions), f"{nb.name} cell {i}: no solution"
    assert len(solutions) == len(learners) == len(experiments), (nb.name, solutions, learners, experiments)

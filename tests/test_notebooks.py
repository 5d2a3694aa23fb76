"""The series' shape, read from the stored notebooks (nbval runs them; this reads them): each opens with
what you will learn, closes with a link to the next, has exercises with a checked answer, and needs nothing
outside the repository."""

import ast
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
NAMES = [nb.name for nb in NOTEBOOKS]


def _cells(path):
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]


def test_the_series_is_there_in_order():
    assert NAMES[:4] == ["00_launching_ranks.ipynb", "01_placements_and_dtensor.ipynb", "02_colwise_rowwise.ipynb",
                         "02b_attention.ipynb"], NAMES
    assert len(NAMES) >= 13


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_opens_with_what_you_will_learn(path):
    kind, first = _cells(path)[0]
    assert kind == "markdown" and first.startswith(f"# {path.name[:path.name.index('_')]} · "), first[:80]
    bullets = first.split("**What you will learn**", 1)
    assert len(bullets) == 2, f"{path.name}: the first cell needs a '**What you will learn**' list"
    assert len(re.findall(r"^\s*[-*] ", bullets[1], flags=re.M)) >= 3, f"{path.name}: at least 3 bullets"
    assert re.search(r"Time: about \d+ minutes", first), f"{path.name}: say how long it takes ('Time: about N minutes')"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_closes_with_a_link_to_the_next(path):
    kind, last = _cells(path)[-1]
    i = NAMES.index(path.name)
    target = NAMES[i + 1] if i + 1 < len(NAMES) else "../README.md"
    assert kind == "markdown" and "**Next:**" in last, f"{path.name}: the last cell links the next notebook"
    assert f"]({target})" in last.split("**Next:**", 1)[1], f"{path.name}: 'Next' should link {target}"
    headings = [line for kind, src in _cells(path) if kind == "markdown" for line in src.splitlines()
                if line.startswith("## ")]
    assert headings and headings[-1] == "## Summary", f"{path.name}: the last section is '## Summary' (one name)"


def _has_ellipsis(src: str) -> bool:
    """A literal ``...`` in the code (not in a comment or a string): the learner's blank."""
    code = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))
    return any(isinstance(n, ast.Constant) and n.value is Ellipsis for n in ast.walk(ast.parse(code)))


def _text_outputs(cell) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("output_type") == "stream")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_exercises_ask_before_they_tell(path):
    """Every '### Try it' is a cell the learner fills (``...`` blanks, ``check()`` says "not tried yet",
    nothing raises) and then a solution cell, collapsed in JupyterLab, that fills the blanks and asserts
    ``check()``: so nbval proves each answer while the learner still commits to a prediction first."""
    raw = json.loads(path.read_text())["cells"]
    tries = [i for i, c in enumerate(raw) if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("### Try it")]
    assert len(tries) >= 2, f"{path.name}: at least two '### Try it' exercises"
    for i in tries:
        title = "".join(raw[i]["source"]).splitlines()[0]
        ask, answer = raw[i + 1], raw[i + 2] if i + 2 < len(raw) else {"cell_type": None}
        ask_src, answer_src = "".join(ask["source"]), "".join(answer.get("source", ""))
        assert ask["cell_type"] == "code" and _has_ellipsis(ask_src) and "check(" in ask_src, \
            f"{path.name}: '{title}' is followed by a cell with ... blanks and a check() call"
        assert "assert check(" not in ask_src, f"{path.name}: '{title}': the learner's cell must not raise"
        assert "not tried yet" in _text_outputs(ask), f"{path.name}: '{title}': run, the blank cell says 'not tried yet'"
        assert answer["cell_type"] == "code" and answer.get("metadata", {}).get("jupyter", {}).get("source_hidden"), \
            f"{path.name}: '{title}': then a solution cell, collapsed (metadata jupyter.source_hidden)"
        assert "assert check(" in answer_src and not _has_ellipsis(answer_src), \
            f"{path.name}: '{title}': the solution fills every blank and asserts check()"
        assert ": right" in _text_outputs(answer), f"{path.name}: '{title}': the stored solution run says right"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_needs_nothing_outside_the_repository(path):
    text = path.read_text()
    assert "../shared" not in text and "shared/seeds" not in text, path.name
    for kind, src in _cells(path):
        if kind == "markdown":  # "seed" in prose is a random seed, never the document the project grew from
            for m in re.finditer(r"\bseed(s|'s)?\b", src, flags=re.I):
                around = src[max(0, m.start() - 30):m.end() + 30].lower()
                assert "random" in around or "manual_seed" in around or "seed=" in around or "seeded" in around, \
                    f"{path.name}: 'seed' in prose should mean a random seed: ...{around}..."


def test_the_readme_lists_every_notebook_with_its_minutes():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    total = 0
    for path in NOTEBOOKS:
        minutes = re.search(r"Time: about (\d+) minutes", _cells(path)[0][1]).group(1)
        assert re.search(rf"\]\(notebooks/{re.escape(path.name)}\) \| {minutes} \|", readme), \
            f"README's notebook table: {path.name} with its {minutes} minutes"
        total += int(minutes)
    assert f"about {round(total / 60)} hours for the series" in readme, total

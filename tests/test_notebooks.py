"""The series' shape, read from the stored notebooks (nbval runs them; this reads them): each opens with
what you will learn, closes with a link to the next, has exercises with a checked answer, and needs nothing
outside the repository."""

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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_has_two_exercises_with_checked_answers(path):
    cells = _cells(path)
    tries = [i for i, (kind, src) in enumerate(cells) if kind == "markdown" and src.startswith("### Try it")]
    assert len(tries) >= 2, f"{path.name}: at least two '### Try it' exercises"
    for i in tries:
        kind, src = cells[i + 1]
        assert kind == "code" and re.search(r"\bassert\b", src), f"{path.name}: '{cells[i][1].splitlines()[0]}' " \
            "is followed by a code cell that checks the answer with assert"


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

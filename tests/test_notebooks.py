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


FIRST = ["00_launching_ranks.ipynb", "00b_why_tp.ipynb", "01_placements_and_dtensor.ipynb", "02_colwise_rowwise.ipynb",
         "02b_attention.ipynb"]


def test_the_series_is_there_in_order():
    """Ranks first, then why TP, placements, the two Linear styles and attention; a companion may sit between."""
    assert NAMES[0] == FIRST[0] and [name for name in NAMES if name in FIRST] == FIRST, NAMES
    assert len(NAMES) >= 13


def test_a_first_pass_can_skip_each_companion():
    """The README marks a companion ("*companion of ..."); the notebook before it links, in its Next cell, the
    companion and the notebook after it, so that a first pass can go straight on."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    companions = re.findall(r"\]\(notebooks/([^)]+\.ipynb)\) \| \d+ \| \*companion of ", readme)
    assert companions, "the README marks no companion"
    listed = re.search(r"notebooks are companions \(([^)]*)\)", readme)
    assert listed and listed.group(1).split(", ") == [name.split("_")[0] for name in companions], \
        "the README's sentence naming the companions and its table's marks differ"
    for name in companions:
        i = NAMES.index(name)
        after = NAMES[i + 1] if i + 1 < len(NAMES) else "../README.md"
        kind, last = _cells(NOTEBOOKS[i - 1])[-1]
        assert f"]({name})" in last and f"]({after})" in last, f"{NAMES[i - 1]}: 'Next' should link {name} and {after}"


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


SOLUTION = "# Solution: open it once you have tried."
CALL = re.compile(r"^(try_\w+)\(PREDICTED\)$")


def _code_cells(path):
    """(index, source, collapsed: source and outputs both, what the stored run printed) of each code cell."""
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            folded = cell["metadata"].get("jupyter", {})
            printed = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("output_type") == "stream")
            yield i, "".join(cell["source"]), bool(folded.get("source_hidden") and folded.get("outputs_hidden")), printed


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_exercises_ask_before_they_tell(path):
    """Every "Try it" is three code cells, and only the middle one is open: the experiment (collapsed,
    source and outputs, its first line, the one JupyterLab shows, neutral), the learner's cell (only the
    prediction and the call, stored saying "not tried yet"), and the solution (collapsed, its first line
    the same everywhere, printing only its verdict: JupyterLab opens a cell's output when it runs it, so
    after Run All any other print would show). nbval runs the solutions, so each answer is proven right.
    tests/test_browser.py checks the same in JupyterLab itself."""
    experiments, learners, solutions = {}, [], []
    for i, source, folded, printed in _code_cells(path):
        first, lines = source.split("\n", 1)[0], source.strip().splitlines()
        assert "check(PREDICTED" not in source, f"{path.name} cell {i}: compares in the learner's sight"
        if re.search(r"^(try_\w+) = TryIt\(", source, re.M):
            assert folded and first.startswith("# The experiment") and "(open it after your try)" in first, \
                f"{path.name} cell {i}: an experiment, collapsed, with a first line that gives nothing away"
            experiments.update((name, i) for name in re.findall(r"^(try_\w+) = TryIt\(", source, re.M))
        elif first.startswith("# Solution"):
            assert first == SOLUTION and folded, f"{path.name} cell {i}: a solution, collapsed, first line {SOLUTION!r}"
            assert re.fullmatch(r"[^\n]*: right\n", printed), f"{path.name} cell {i} prints more than its verdict: {printed!r}"
            solutions.append(i)
        elif CALL.match(lines[-1] if lines else ""):
            assert not folded and lines[0].startswith("PREDICTED = ") and len(lines) <= 4 and "launch(" not in source, \
                f"{path.name} cell {i}: the learner's cell holds only the prediction and the call"
            assert printed.count("not tried yet") == 1, f"{path.name} cell {i} is stored tried: {printed!r}"
            learners.append((i, CALL.match(lines[-1]).group(1)))
    tries = [c for kind, c in _cells(path) if kind == "markdown" and c.startswith("### Try it")]
    assert len(learners) == len(tries) >= 2, f"{path.name}: {len(tries)} '### Try it' headings, {len(learners)} exercises"
    for i, name in learners:  # its experiment before it, its solution after it and before the next exercise
        assert experiments.get(name, i) < i, f"{path.name} cell {i}: {name} is built after it is called"
        assert any(j > i and not any(i < k < j for k, _ in learners) for j in solutions), f"{path.name} cell {i}: no solution"
    assert len(solutions) == len(learners) == len(experiments), (path.name, solutions, learners, experiments)


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


OPTIONAL = re.compile(r"^(#{2,3}) .*(for experts|optional)", re.I | re.M)  # a section a first reading skips
SKIPS = {frozenset({"for experts"}): "for experts", frozenset({"optional"}): "marked optional",
         frozenset({"for experts", "optional"}): "for experts or marked optional"}  # the header's words for them


def skipped_sections(path) -> str:
    """How the header names the sections a first reading skips: by the words their headings use."""
    kinds = {word for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "markdown"
             for m in OPTIONAL.finditer("".join(cell["source"])) for word in ("for experts", "optional")
             if word in m.group(0).lower()}
    return SKIPS.get(frozenset(kinds), "")


def _printed_lines(cell) -> int:
    """The non-blank lines a code cell prints where the reader sees them (its outputs not collapsed): the tables
    and verdicts are read too. Pictures are not counted here (the prose around them is)."""
    if cell["metadata"].get("jupyter", {}).get("outputs_hidden"):
        return 0
    outputs = cell.get("outputs", [])
    texts = ["".join(o["text"]) for o in outputs if o["output_type"] == "stream" and o["name"] == "stdout"]
    texts += ["".join(o["data"].get("text/plain", "")) for o in outputs
              if o["output_type"] in ("execute_result", "display_data") and "image/png" not in o["data"]]
    return sum(1 for text in texts for line in text.splitlines() if line.strip())


def reading_load(path):
    """(words, visible code and printed lines, exercises) of the whole notebook and of a first reading, which
    skips every section whose heading says "For experts" or "optional" (up to the next heading of its level or
    above), and the collapsed cells' code lines."""
    whole, first, hidden, skip_level = [0, 0, 0], [0, 0, 0], 0, None
    for cell in json.loads(path.read_text())["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            heading = re.match(r"(#{1,3}) ", src)
            if heading and skip_level and len(heading.group(1)) <= skip_level:
                skip_level = None
            optional = OPTIONAL.match(src)
            if optional and not skip_level:
                skip_level = len(optional.group(1))
            load = [len(src.split()), 0, int(src.startswith("### Try it"))]
        else:
            if cell["metadata"].get("jupyter", {}).get("source_hidden"):  # a solution's reasoning is comments
                hidden += sum(1 for line in src.splitlines() if line.strip())
                load = [0, _printed_lines(cell), 0]  # its verdict, if its outputs show
            else:
                code = sum(1 for line in src.splitlines() if line.strip() and not line.strip().startswith("#"))
                load = [0, code + _printed_lines(cell), 0]
        whole = [a + b for a, b in zip(whole, load)]
        if not skip_level:
            first = [a + b for a, b in zip(first, load)]
    return whole, first, hidden


def minutes(words, code, exercises):
    return words / 80 + code / 6 + 15 * exercises


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_the_minutes_stated_are_honest(path):
    """At least the time to read its prose at 80 words a minute (dense technical text, checked as you go), its
    visible code and printed output at 6 lines a minute, and 15 minutes per exercise, the basis its header states:
    a notebook that grows must say so. A notebook with sections for experts or marked optional also states a
    first reading's time without them, naming those sections by their headings' words. The collapsed cells
    (checks, experiments, solutions with their reasoning in comments, drawing code) are priced apart, every line
    at 6 a minute, for the reader who opens them all."""
    whole, first, hidden = reading_load(path)
    header = _cells(path)[0][1]
    said = re.search(r"Time: about (\d+) minutes \(reading at 80 words and 6 lines of code or output a minute, "
                     r"15 per exercise\)(?:, about (\d+) on a first reading, which skips the sections ([a-z ]+))?; "
                     r"the collapsed cells, if you open them all, about (\d+) more\.", header)
    assert said, f"{path.name}: the header's Time line, with its basis and the collapsed cells' minutes"
    stated, extra = int(said.group(1)), int(said.group(4))
    assert stated >= minutes(*whole), (path.name, stated, whole)
    assert extra >= hidden / 6, (path.name, extra, hidden)
    if first == whole:
        assert said.group(2) is None, f"{path.name}: no optional section, so no first-reading time"
    else:
        assert said.group(2), f"{path.name}: it has optional sections: state the first reading's minutes too"
        assert minutes(*first) <= int(said.group(2)) < stated, (path.name, said.group(2), first)
        assert said.group(3) == skipped_sections(path), (path.name, said.group(3), skipped_sections(path))
    assert first[2] >= 1, f"{path.name}: a first reading (optional sections skipped) asks at least one Try it"


def test_the_readme_lists_every_notebook_with_its_minutes():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    total = 0
    for path in NOTEBOOKS:
        minutes = re.search(r"Time: about (\d+) minutes", _cells(path)[0][1]).group(1)
        assert re.search(rf"\]\(notebooks/{re.escape(path.name)}\) \| {minutes} \|", readme), \
            f"README's notebook table: {path.name} with its {minutes} minutes"
        total += int(minutes)
    assert f"about {round(total / 60)} hours for the series" in readme, total


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_every_stored_picture_is_shown(path):
    """A cell that stores a picture may collapse its code, never its output: a collapsed output hides the
    picture from the learner (tests/test_browser.py sees the same in JupyterLab, where Chromium is)."""
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        pictures = [out for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
        if pictures and not "".join(cell["source"]).startswith(("# Solution", "# The experiment")):
            assert not cell["metadata"].get("jupyter", {}).get("outputs_hidden"), \
                f"{path.name} cell {i}: its picture is stored but its output is collapsed"


def test_an_answer_drawn_after_the_try_is_not_stored():
    """A picture of an exercise's answer (00c's both-ways rings) is drawn when the learner runs its cell, never
    stored: stored, it shows under the exercise before the try. Re-executing the notebook stores it again, so
    clear that cell's outputs after `nbconvert --execute` (the cell is tagged nbval-ignore-output)."""
    drawn_on_run = 0
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        for above, cell in zip(cells, cells[1:]):
            if cell["cell_type"] == "code" and above["cell_type"] == "markdown" \
                    and "after your try" in "".join(above["source"]).lower():
                drawn_on_run += 1
                assert not cell.get("outputs"), f"{path.name} cell {cell['id']}: the answer's picture is stored"
                assert "nbval-ignore-output" in cell["metadata"].get("tags", []), f"{path.name} {cell['id']}"
    assert drawn_on_run >= 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_every_cell_has_an_id(path):
    """nbformat 4.5 cells carry an id (nbformat warns of a future hard error without one): a cell added by
    editing the JSON gets one too, unique in its notebook."""
    cells = json.loads(path.read_text())["cells"]
    ids = [cell.get("id") for cell in cells]
    assert all(ids) and len(set(ids)) == len(ids), f"{path.name}: cells {[i for i, x in enumerate(ids) if not x]} lack an id"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_no_control_characters_in_the_cells(path):
    """A cell written from a Python string that was not raw turns LaTeX's `\\text` and `\\frac` into a tab and a
    form feed: JupyterLab then renders garbage, and nbval, which compares outputs, never notices."""
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        bad = {ch for ch in "".join(cell["source"]) if ord(ch) < 32 and ch != "\n"}
        assert not bad, f"{path.name} cell {i}: control characters {sorted(map(repr, bad))}; write it from a raw string"

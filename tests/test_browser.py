"""What a learner sees: `make lab` opened in a real headless Chromium.

Every notebook is opened as JupyterLab draws it, and one is run from the Run menu. Before anything
is run, no answer may be visible: an exercise's experiment and its solution are collapsed, source and
outputs, and the only line JupyterLab shows of a collapsed cell, its first, gives nothing away; the
learner's cell says "not tried yet"; every picture is drawn. Needs Debian's Chromium (`apt-get install
-y chromium`, which `.ci/run` does) and the `playwright` package (requirements.txt), which drives it
without a browser download of its own. The notebooks are copies in a temporary folder, so a run
never writes into notebooks/.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SOLUTION = "# Solution: open it once you have tried."
RUN_IN_BROWSER = "02_colwise_rowwise.ipynb"  # a short one: every exercise shape, a picture, 17 s of ranks

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - requirements.txt installs it
    sync_playwright = None

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or sync_playwright is None,
    reason="needs Chromium and playwright: `apt-get install -y chromium` (Debian; .ci/run does it) and "
           "`pip install -r requirements.txt`")

# Everything a cell shows, read from the page: textContent, since JupyterLab skips laying out cells
# outside the window (their innerText is empty).
CELLS_JS = """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')].map(c => ({
    code: c.classList.contains('jp-CodeCell'),
    prompt: (c.querySelector('.jp-InputArea-prompt') || {}).textContent || '',
    input_placeholder: c.querySelector('.jp-InputPlaceholder') ? c.querySelector('.jp-InputPlaceholder').textContent : null,
    output_placeholder: !!c.querySelector('.jp-OutputPlaceholder'),
    outputs: [...c.querySelectorAll('.jp-OutputArea-output')].map(o => o.textContent),
    pictures: [...c.querySelectorAll('.jp-OutputArea-output img')].map(i => i.complete ? i.naturalWidth : -1)}))"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`make lab` on copies of the notebooks; yields (base url, token, folder); shuts the server and its kernels."""
    folder = tmp_path_factory.mktemp("lab")
    for nb in NOTEBOOKS:
        shutil.copy(nb, folder / nb.name)
    port, token = _free_port(), "tensorplay-browser-test"
    flags = f"--no-browser --port={port} --ServerApp.token={token} --ServerApp.ip=127.0.0.1"
    server = subprocess.Popen(["make", "-s", "lab", f"LAB_DIR={folder}", f"LAB_FLAGS={flags}"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5)
                break
            except OSError:
                assert server.poll() is None, "`make lab` exited before JupyterLab answered"
                assert time.monotonic() < deadline, "JupyterLab did not answer within 120 s"
                time.sleep(1)
        yield base, token, folder
    finally:
        try:  # the server shuts its kernels down with it
            urllib.request.urlopen(urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST"), timeout=10)
            server.wait(timeout=30)
        except Exception:
            pass
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield chromium
        chromium.close()


def _open(browser, lab, name):
    """A fresh page on one notebook (a workspace of its own, so no other notebook's tab is restored)."""
    base, token, _ = lab
    page = browser.new_page(viewport={"width": 1300, "height": 1600})
    page.set_default_timeout(60_000)
    page.goto(f"{base}/lab/workspaces/{Path(name).stem}/tree/{name}?token={token}&reset")
    page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")
    cells = json.loads((lab[2] / name).read_text())["cells"]
    page.wait_for_function(f"() => document.querySelectorAll("
                           f"'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell').length == {len(cells)}")
    page.wait_for_function("() => [...document.querySelectorAll('.jp-OutputArea-output img')].every(i => i.complete)")
    return page, cells


def _exercise_cells(cells):
    """Indices of the learner cells (they open with ``PREDICTED = `` and call try_...(PREDICTED); a later cell that
    only reads PREDICTED, as 00c's gated picture does, is not one) and of the collapsed cells around them."""
    learner = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
               and "".join(c["source"]).startswith("PREDICTED =") and "(PREDICTED)" in "".join(c["source"])
               and not c["metadata"].get("jupyter", {}).get("source_hidden")]
    hidden = [i for i, c in enumerate(cells) if c["cell_type"] == "code"
              and "".join(c["source"]).startswith(("# Solution", "# The experiment"))]
    return learner, hidden


def _what_a_learner_sees(shown, cells, name, ran=False):
    """Collapsed cells show only their neutral first line. Before a run, no output of theirs shows; after
    one, JupyterLab opens the output of every cell it ran, so a solution may show only its verdict."""
    learner, hidden = _exercise_cells(cells)
    for i in hidden:
        first = "".join(cells[i]["source"]).split("\n", 1)[0]
        assert first == SOLUTION or first.startswith("# The experiment"), f"{name} cell {i}: first line {first!r}"
        assert shown[i]["input_placeholder"] is not None, f"{name} cell {i}: its source is not collapsed"
        assert shown[i]["input_placeholder"].strip() == first, f"{name} cell {i} shows {shown[i]['input_placeholder']!r}"
        verdict = ran and first == SOLUTION and len(shown[i]["outputs"]) == 1 and shown[i]["outputs"][0].endswith(": right\n")
        assert not shown[i]["outputs"] or (verdict and shown[i]["outputs"][0].count("\n") == 1), \
            f"{name} cell {i}: its output is visible: {shown[i]['outputs']}"
    for i in learner:
        assert any("not tried yet" in out for out in shown[i]["outputs"]), f"{name} cell {i}: {shown[i]['outputs']}"
    stored = sum(1 for i, c in enumerate(cells) if c["cell_type"] == "code" and i not in hidden
                 for out in c.get("outputs", []) if "image/png" in out.get("data", {}))
    drawn = [w for cell in shown for w in cell["pictures"]]
    assert len(drawn) >= stored and all(w > 0 for w in drawn), f"{name}: {stored} pictures stored, drawn {drawn}"
    return learner, hidden


@pytest.mark.parametrize("name", [nb.name for nb in NOTEBOOKS])
def test_no_answer_is_visible_before_it_is_run(browser, lab, name):
    page, cells = _open(browser, lab, name)
    try:
        shown = page.evaluate(CELLS_JS)
        assert len(shown) == len(cells)
        learner, hidden = _what_a_learner_sees(shown, cells, name)
        assert len(learner) * 2 == len(hidden), f"{name}: {len(learner)} exercises but {len(hidden)} collapsed cells"
        assert page.locator("text=get notified about official Jupyter news").count() == 0  # make lab's settings
    finally:
        page.close()


def test_a_learner_runs_a_whole_notebook(browser, lab):
    """Run > Run All Cells, as a learner might on arrival: every cell runs without an error, the blanks
    still say "not tried yet", and each solution, its source still collapsed, shows only "right"."""
    page, cells = _open(browser, lab, RUN_IN_BROWSER)
    try:
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        # Done: every prompt a learner can see shows a number (a collapsed cell shows none), the kernel idle.
        open_code = sum(c["cell_type"] == "code" and not c["metadata"].get("jupyter", {}).get("source_hidden") for c in cells)
        page.wait_for_function(
            "n => { const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');"
            " const p = [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.textContent);"
            " return p.length == n && p.every(t => /\\[\\d+\\]/.test(t))"
            " && !!panel.querySelector('.jp-Notebook-ExecutionIndicator[data-status=idle]'); }",
            arg=open_code, timeout=300_000)
        solutions = [i for i, c in enumerate(cells) if "".join(c["source"]).startswith(SOLUTION)]
        page.wait_for_function(  # a collapsed cell has no prompt to read: wait for each solution's verdict
            "ix => { const c = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell');"
            " return ix.every(i => c[i].querySelector('.jp-OutputArea-output')); }", arg=solutions, timeout=300_000)
        shown = page.evaluate(CELLS_JS)
        assert not [i for i, cell in enumerate(shown) if any("Traceback" in out for out in cell["outputs"])]
        learner, hidden = _what_a_learner_sees(shown, cells, RUN_IN_BROWSER, ran=True)
        assert solutions and set(solutions) < set(hidden)  # each ran, and said only "right" (checked above)
    finally:
        page.close()

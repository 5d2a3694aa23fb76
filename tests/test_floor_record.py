"""The committed benchmarks/results.md's floor table, as notebook 06b section 4 reads it: the parser the notebook
uses (`lab.bench_record.floor_rows`), and what the notebook's text says of the table. No timing is run."""

from pathlib import Path

from tensorplay_edu.lab.bench_record import floor_rows

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results.md"


def _span(text):
    return [float(x) for x in text.split(" (")[0].split(" to ")]  # "(88%)": an interval's coverage


def test_every_floor_ratio_lies_inside_its_own_spans():
    """The small full plan at 2 and 4 ranks is there; each median lies inside its middle half, its 95 % interval,
    and (launched apart) its range."""
    rows, run = floor_rows(RESULTS)
    assert run and {("small", "full", "2"), ("small", "full", "4")} <= {(r["config"], r["plan"], r["ranks"]) for r in rows}
    for r in rows:
        for ratio, span in (("ours/hand", "middle half"), ("ours/hand", "95% interval"),
                            ("ours/hand apart", "ours/hand apart range")):
            low, high = _span(r[span])
            assert low <= float(r[ratio]) <= high, (ratio, r)


def test_what_notebook_06b_reads_off_the_floor_table():
    """Small config (160 turns): every median a few per cent above 1 (under 1.1), every 95 % interval above 1, a
    few ms of extra CPU on steps of over 100 ms, hand's step at 4 ranks over 1.5 times its step at 2 (the cores
    shared); medium (6 turns): every interval reaches across 1."""
    rows, _ = floor_rows(RESULTS)
    small = [r for r in rows if r["config"] == "small"]
    assert all(_span(r["95% interval"])[0] > 1 and 1 < float(r["ours/hand"]) < 1.1 for r in small)
    assert all(float(r["extra CPU ms"]) < 10 and float(r["hand ms"]) > 100 for r in small)
    assert all(_span(r["95% interval"])[0] <= 1 <= _span(r["95% interval"])[1] for r in rows if r["config"] == "medium")
    assert {(r["config"], r["turns"]) for r in rows} == {("small", "160"), ("medium", "6")}
    hand = {(r["config"], r["plan"], r["ranks"]): float(r["hand ms"]) for r in rows}
    assert all(hand["small", plan, "4"] > 1.5 * hand["small", plan, "2"] for plan in ("full", "vanilla"))

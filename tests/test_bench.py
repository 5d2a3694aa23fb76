"""`make bench`'s float8 and async rows (benchmarks/bench.py, runners.py, report*.py): tiny launched variants'
records, the float8 and async tables rendered from made-up ones, the --float8 / --async-tp / --async-only
options' guards. No timing."""

import os
import sys

import pytest
import torch

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import bench  # noqa: E402
import configs  # noqa: E402
import probes  # noqa: E402
import report  # noqa: E402
import report_async  # noqa: E402
import report_float8  # noqa: E402
import report_floor  # noqa: E402
import runners  # noqa: E402
from tensorplay_edu import launch  # noqa: E402


def test_a_float8_variant_records_what_the_table_needs():
    """Full plan, 2 ranks, small config, one step: the float8 all-gathers move 1 byte per element."""
    f8, hp = (launch(runners.rank_bench, 2, "small", "full", "ours", 1, 0, torch.float32, float8, timeout=120)[0]
              for float8 in (True, False))
    assert {"median_s", "counts", "bytes", "float8_bytes", "saved", "rss_mb", "layer_saved"} <= f8.keys()
    assert f8["counts"]["all_gather"] == hp["counts"]["all_gather"]
    assert f8["counts"]["reduce_scatter"] == hp["counts"]["reduce_scatter"]
    assert f8["counts"]["all_reduce"] > hp["counts"]["all_reduce"]  # the amax all-reduces
    c = configs.CONFIGS["small"]
    block_gather = c["batch"] * c["seq"] * c["dim"] // 2  # what one rank sends of one [b, s, h] all-gather, 1 byte each
    gathers = 4 * c["n_layers"]  # attention / feed_forward inputs forward, wo / w2 output gradients backward
    assert f8["float8_bytes"] == gathers * block_gather
    assert hp["bytes"] - f8["bytes"] == gathers * block_gather * 3  # 4 bytes per element became 1
    assert hp["float8_bytes"] == 0 and f8["layer_saved"] == 0  # no formula row for float8


def _row(impl, plan="full", world=2, ms=100.0, nbytes=0, **extra):
    return {"config": "small", "plan": plan, "world": world, "impl": impl, "median_ms": ms,
            "counts": {"all_gather": 10}, "bytes": nbytes, "float8_bytes": extra.pop("float8_bytes", 0),
            "saved_mb": 1.0, "layer_saved": 100, "layer_formula": 100, "rss_mb": 1.0, **extra}


def test_the_report_has_the_float8_table_and_keeps_the_main_one(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_chart", lambda table, path: None)
    table = [_row("ours", ms=200, nbytes=400), _row("torch", ms=250, nbytes=400),
             _row("ours float8", ms=300, nbytes=100, float8_bytes=50),
             _row("ours", "gathered", nbytes=800), _row("single", "-", 1, 100), _row("single float8", "-", 1, 150)]
    text = report.render(table, True, str(tmp_path))
    main = [line for line in text.splitlines() if line.startswith("| small | full | 2 | 100 | 200 | 250 | 0.80 |")]
    assert len(main) == 1 and len(main[0].split("|")) == 15  # the main table: 13 columns
    assert "## Float8 tensorwise tensor parallelism" in text
    assert "| small | full | 2 | 100 / 150 | 300 | 200 | 1.50 |" in text and "| 100 / 400 | 0.25 | 50% |" in text
    prose = " ".join(text.split())  # the notes are wrapped
    assert "costs more time than it saves" in prose and "`make gpu-check` (check d2" in prose and "beside d1" in prose
    old = [r for r in table if "float8" not in r["impl"]]
    assert report_float8.float8_section(old) == []  # an old table: no section
    assert "through `torch._scaled_mm`, on the CPU here" in prose and "emulated" not in prose
    table[2]["float8_emulated"] = True  # a CPU whose float8 matmul is a reference loop: the report says so
    prose = " ".join(report.render(table, True, str(tmp_path)).split())
    assert "its matmuls are emulated: this CPU's `torch._scaled_mm` is oneDNN's reference loop" in prose


def test_float8_models_emulate_the_matmul_where_the_cpu_has_only_a_reference_loop(monkeypatch):
    """configs.float8_emulated() times one 128 x 128 float8 matmul against float32's, here on a clock that only
    the matmuls move (timed for real, a CI run once took a 1000x loop for a kernel). Every clock read adds a
    microsecond, so float32's matmul takes one; a float8 one taking a second turns emulation on, ten
    microseconds (a kernel's pace) does not. The float8 call is the real one, with bench's arguments."""
    real = torch._scaled_mm
    for per_call, expected in ((1.0, True), (1e-5, False)):
        now = [0.0]

        def clock():  # every read is a microsecond on, a float32 matmul included
            now[0] += 1e-6
            return now[0]

        def scaled_mm(a, b, **kw):  # the real call (its arguments checked), then a reference loop's time
            out = real(a, b, **kw)
            now[0] += per_call
            return out

        monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
        assert configs.float8_emulated(clock) is expected
        model = configs.build("small", float8=True, emulate=expected)[0]
        assert {m.config.emulate for m in model.modules() if hasattr(m, "float8_spec")} == {expected}


@pytest.mark.parametrize("float32_s, float8_s, loop", [(1e-5, 1e-2, True), (1e-5, 1e-3, False),
                                                       (1e-4, 4e-3, False), (1e-4, 7e-3, True),
                                                       (2e-3, 0.05, False), (2e-3, 2.0, True)])
def test_the_reference_loop_is_fifty_times_float32_and_a_millisecond_more(float32_s, float8_s, loop):
    """The rule on its own: over 50x float32's time plus 1 ms is a loop; a kernel a few times float32's is not."""
    assert configs.is_reference_loop(float32_s, float8_s) is loop


@pytest.mark.parametrize("argv, message", [(["--float8"], "--float8 goes with --torchrun"),
                                           (["--torchrun", "--impl", "torch", "--float8"], "needs torchao"),
                                           (["--async-tp"], "--async-tp goes with --torchrun"),
                                           (["--torchrun", "--impl", "torch", "--async-tp"], "--impl ours --plan full"),
                                           (["--torchrun", "--plan", "vanilla", "--async-tp"], "--impl ours --plan full"),
                                           (["--torchrun", "--async-only"], "--async-only is a launched run")])
def test_option_guards(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pins rank 0's main thread to one core and keeps another free for gloo: needs Linux's "
                           "sched_getaffinity and at least 2 usable cores (CI and make test here have both)")
def test_an_async_pinned_variant_records_what_the_table_needs():
    """Full plan, 2 ranks, small config, one step, async TP on and the main threads pinned: the decomposed
    collectives by name, the synchronous step's bytes, one block-input ring's times, the step's ring waits."""
    res = launch(runners.rank_bench, 2, "small", "full", "ours", 1, 0, torch.float32, False, True, True, timeout=120)[0]
    L = configs.CONFIGS["small"]["n_layers"]
    assert res["counts"] == {"all_gather_matmul": 4 * L + 1, "matmul_reduce_scatter": 4 * L + 1, "all_gather": 1,
                             "reduce_scatter": 1, "all_reduce": res["sync_counts"]["all_reduce"]}, res["counts"]
    assert res["sync_counts"]["all_gather"] == res["sync_counts"]["reduce_scatter"] == 4 * L + 2
    assert res["total_bytes"] == res["sync_total_bytes"] > 0  # bench raises otherwise
    assert res["pinned"]["core"] == min(os.sched_getaffinity(0)) and res["pinned"]["free_threads"] >= 1  # gloo's
    assert {"fused", "comm", "comp", "overlap"} <= res["overlap"].keys()
    ring = res["ring"]
    assert ring["transfers"] == 2 * (4 * L + 1) and 0 <= ring["wait_s"] <= ring["transfer_s"] and ring["compute_s"] > 0
    assert res["layer_saved"] == 0  # no formula row for the async variants


def test_ring_waits_counts_transfer_time_under_no_matmul():
    from tensorplay_edu.async_tp.timeline import Interval

    tl = [Interval("transfer", "chunk 1", 0.0, 4.0), Interval("compute", "chunk 0", 0.5, 2.0),
          Interval("transfer", "sum 0", 5.0, 6.0), Interval("compute", "chunk 1", 5.0, 5.25),
          Interval("compute", "chunk 1", 5.2, 5.5)]
    out = probes.ring_waits(tl)
    assert out == {"compute_s": 2.0, "transfer_s": 5.0, "wait_s": 3.0, "transfers": 2}


def _async_table():
    pin = {"core": 0, "cores": 2, "free_threads": 3}
    ring = {"overlap": {"fused": 0.004, "comm": 0.002, "comp": 0.003, "overlap": 0.5},
            "ring": {"wait_s": 0.01, "transfer_s": 0.02, "compute_s": 0.05, "transfers": 18}}
    return [_row("ours", ms=200, nbytes=400, total_bytes=500, pinned={"cores": 2}),
            _row("ours async", ms=210, nbytes=400, total_bytes=500, pinned={"cores": 2}, **ring),
            _row("ours pinned", ms=300, nbytes=400, total_bytes=500, pinned=pin),
            _row("ours async pinned", ms=270, nbytes=400, total_bytes=500, pinned=pin, **ring),
            _row("torch", ms=250, nbytes=400), _row("ours", "gathered", nbytes=800), _row("single", "-", 1, 100)]


def test_the_report_has_the_async_table_and_keeps_the_main_one(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_chart", lambda table, path: None)
    text = report.render(_async_table(), True, str(tmp_path))
    main = [line for line in text.splitlines() if line.startswith("| small | full | 2 | 100 | 200 | 250 | 0.80 |")]
    assert len(main) == 1 and len(main[0].split("|")) == 15  # the main table: 13 columns
    assert "## Async tensor parallelism" in text
    assert "| small | 2 | any of 2 cores | 200 | 210 | 1.05 |" in text
    assert "| small | 2 | core 0 (of 2); 3 other threads free on the rest | 300 | 270 | 0.90 |" in text
    assert "| 500 / 500 | 4.0 / 2.0 / 3.0 | 0.50 | 10 (of 20) |" in text
    prose = " ".join(text.split())
    assert "0.90 times the pinned synchronous step (faster, beyond the repeats' spread)" in prose
    assert "1.05 times the synchronous step (slower" in prose and "check d3" in prose
    assert report_async.async_section([r for r in _async_table() if "async" not in r["impl"]]) == []  # no section


def test_summarize_raises_when_async_moves_other_bytes():
    record = {"median_s": 0.1, "counts": {}, "bytes": 1, "saved": 0, "rss_mb": 1.0}
    rows = {("small", "full", 2, "ours"): [dict(record, total_bytes=100)],
            ("small", "full", 2, "ours async"): [dict(record, total_bytes=100)]}
    assert len(bench.summarize(rows, {})) == 2
    rows[("small", "full", 2, "ours async")] = [dict(record, total_bytes=101)]
    with pytest.raises(RuntimeError, match="must move the same bytes"):
        bench.summarize(rows, {})


def test_a_hand_variant_runs_the_floor_and_moves_the_same_gather_bytes():
    """The hand-written floor in the bench: one launched step per plan, the same model and batch as ours."""
    for plan in ("vanilla", "full"):
        hand, ours = (launch(runners.rank_bench, 2, "small", plan, impl, 1, 0, timeout=120)[0]
                      for impl in ("hand", "ours"))
        assert hand["median_s"] > 0 and hand["saved"] > 0
        if plan == "full":  # the same activations kept for backward, up to the loss's [N] vectors
            assert abs(hand["saved"] - ours["saved"]) <= 0.01 * ours["saved"], (hand["saved"], ours["saved"])


def test_the_floor_section_reads_its_target_from_the_turns_and_shows_the_launches_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_chart", lambda table, path: None)
    paired = {"config": "small", "plan": "full", "world": 2, "impl": "paired", "steps": 40, "ratio": 1.03,
              "quartiles": (1.0, 1.06), "interval": (1.01, 1.045, 0.96), "wall_ms": {"ours": 103.0, "hand": 100.0},
              "cpu_ms": {"ours": [3.0, 1.0, 2.0, 1.5], "hand": [2.0, 1.0, 1.5, 1.0]}}
    table = [_row("ours", ms=105, repeats_ms=[100, 110, 104]), _row("hand", ms=100, repeats_ms=[100, 100, 100]),
             _row("torch", ms=150, repeats_ms=[140, 160, 150]), _row("ours", "gathered"), _row("single", "-", 1, 90),
             paired]
    text = report.render(table, True, str(tmp_path))
    assert "## The floor: the same model written by hand" in text
    # in turns: 1.03 (met), middle half 1.00 to 1.06, the median within 1.01 to 1.045; ours' CPU 7.5 ms a step,
    # the floor's 5.5: +2.0; launched apart, per-round ratios 1.00, 1.10, 1.04: median 1.04, range 1.00 to 1.10;
    # against PyTorch 0.71, 0.69, 0.69
    assert ("| small | full | 2 | 40 | 100 | 103 | 1.030 | 1.000 to 1.060 | 1.010 to 1.045 | <= 1.05 met | +2.0 | 3 "
            "| 1.04 | 1.00 to 1.10 | 0.69 | 0.69 to 0.71 |") in text
    assert "Floor targets met: 1 of 1." in text
    paired["ratio"] = 1.06  # the target reads the turns, whatever the launches apart say (1.04 here)
    paired["interval"] = (0.99, 1.12, 0.875)  # 4 turns: the whole range, which covers the median 88 % of the time
    text = report.render(table, True, str(tmp_path))
    assert "| 1.060 | 1.000 to 1.060 | 0.990 to 1.120 (88%) | <= 1.05 MISSED | +2.0 | 3 | 1.04 |" in text
    assert "Floor targets met: 0 of 1." in text
    for gone in ("hand", "paired"):  # an old table: no section
        assert report_floor.floor_section([r for r in table if r["impl"] != gone]) == []


def test_the_loss_alone_is_timed_against_the_floor(tmp_path, monkeypatch):
    res = launch(runners.rank_loss_bench, 2, "small", 2, timeout=120)[0]
    assert res["ours_ms"] > 0 and res["hand_ms"] > 0 and len(res["ratios"]) == 2
    monkeypatch.setattr(report, "_chart", lambda table, path: None)
    table = [_row("ours", ms=105), _row("torch", ms=150), _row("ours", "gathered"), _row("single", "-", 1, 90),
             {"config": "medium", "plan": "loss", "world": 2, "impl": "loss", "ours_ms": 110.0, "hand_ms": 100.0,
              "ratios": [1.1, 1.3, 1.0]}]
    text = report.render(table, True, str(tmp_path))
    assert "| medium | 2 | 3 | 100.0 | 110.0 | 1.10 | 1.00 to 1.30 | <= 1.2 met |" in text


def test_a_quick_run_leaves_the_committed_record_alone(tmp_path, monkeypatch):
    """--quick writes into a fresh temporary folder (or --out), never over benchmarks/results.md / .png; the
    report's first lines say which run it was and on which commit."""
    monkeypatch.setattr(report, "_chart", lambda table, path: open(path, "w").close())
    record = {name: open(os.path.join(BENCH, name), "rb").read() for name in ("results.md", "results.png")}
    table = [_row("ours", ms=105), _row("torch", ms=150), _row("ours", "gathered"), _row("single", "-", 1, 90)]
    text = bench.write_report(table, True)
    folder = text.rsplit("wrote ", 1)[1].split(" and ")[0].rsplit(os.sep, 1)[0]
    assert os.path.realpath(folder) != os.path.realpath(BENCH) and os.path.exists(os.path.join(folder, "results.md"))
    assert text.splitlines()[2].startswith("Run: `python benchmarks/bench.py --quick` on commit ")
    assert bench.write_report(table, True, str(tmp_path)).count(str(tmp_path)) == 1
    assert (tmp_path / "results.md").read_text().splitlines()[2].startswith("Run: `python benchmarks/bench.py --quick`")
    assert {name: open(os.path.join(BENCH, name), "rb").read() for name in record} == record
    assert bench.report_folder(False, None) == bench.HERE  # a full run writes the record
    full = report.provenance(False)
    assert full.startswith("Run: `make bench` (full run) on commit ") and f"torch {torch.__version__}" in full


def test_the_committed_record_and_the_readme_name_the_same_full_run():
    """docs/benchmark.md's table is copied from results.md: both name the run and its commit."""
    root = os.path.dirname(BENCH)
    run = open(os.path.join(BENCH, "results.md")).read().splitlines()[2]
    assert run.startswith("Run: `make bench` (full run) on commit "), run
    commit = run.split(" on commit ")[1].split(",")[0].split()[0]
    readme = open(os.path.join(root, "docs", "benchmark.md")).read()
    section = readme[readme.index("# Benchmark (`make bench`)"):]
    assert f"the full run on commit {commit}" in " ".join(section.split()), commit


def test_overhead_runs_ours_and_the_floor_in_turns_on_the_same_work():
    """benchmarks/overhead.py: tiny model, 2 ranks, 3 alternating steps of each plan; compare() raises unless
    the first losses agree, and the report has the row with one CPU figure per phase."""
    import overhead

    for plan in ("full", "vanilla"):
        row = overhead.compare("tiny", 2, 3, plan)
        assert (row["config"], row["plan"], row["world"], row["steps"]) == ("tiny", plan, 2, 3)
        assert set(row["wall_ms"]) == {"ours", "hand"} and min(row["wall_ms"].values()) > 0
        low, high = row["quartiles"]
        assert 0 < low <= row["ratio"] <= high
        low, high, coverage = row["interval"]  # 3 turns: their whole range, covering the median 75 % of the time
        assert (low, high, coverage) == (min(row["ratios"]), max(row["ratios"]), 0.75)
        assert all(len(v) == len(overhead.PHASES) and min(v) >= 0 for v in row["cpu_ms"].values())
        table = overhead.render([row])
        assert "| tiny | 2 | 3 |" in table and table.count("\n") == 2


def test_the_median_interval_is_two_order_statistics_with_their_binomial_coverage():
    """The interval that holds a median: [x[j], x[n-1-j]] of the sorted values misses it when j or fewer values
    fall on one side, each side with probability 1/2: coverage 1 - 2 P(Binomial(n, 1/2) <= j), the largest j
    keeping it at 95 %.  Checked against the counts by hand and against draws whose median is known."""
    import random

    import overhead

    assert overhead.median_interval([3.0]) == (3.0, 3.0, 0.0)
    assert overhead.median_interval([2.0, 1.0, 4.0, 3.0]) == (1.0, 4.0, 1 - 2 / 16)  # too few for 95 %: the range
    assert overhead.median_interval(list(range(6))) == (0, 5, 1 - 2 / 64)  # the fewest values giving 95 %
    low, high, coverage = overhead.median_interval(list(range(10)))  # j = 1: 1 - 2 (1 + 10) / 1024
    assert (low, high) == (1, 8) and coverage == pytest.approx(1 - 22 / 1024)
    low, high, coverage = overhead.median_interval(list(range(160)))  # the floor table's small config
    assert (low, high) == (67, 92) and 0.95 <= coverage < 0.96  # j = 68 would cover less than 95 %
    rng, hits = random.Random(0), 0
    for _ in range(2000):  # draws around a median of 0: the interval holds it about 95 % of the time
        low, high, _ = overhead.median_interval([rng.gauss(0, 1) for _ in range(40)])
        hits += low <= 0 <= high
    assert 0.93 <= hits / 2000 <= 0.985, hits
    with pytest.raises(ValueError, match="no values"):
        overhead.median_interval([])


def test_the_turns_refuse_two_models_that_do_not_compute_the_same_loss():
    """compare() checks the first losses of ours and the floor before it reports a ratio."""
    import overhead

    overhead.same_work({"ours": 2.5, "hand": 2.5 + 1e-5}, "small full, 2 ranks")  # float32 rounding: the same
    with pytest.raises(RuntimeError, match="small full, 2 ranks: ours' first loss 2.6 is not the floor's 2.5"):
        overhead.same_work({"ours": 2.6, "hand": 2.5}, "small full, 2 ranks")

"""`make bench`'s float8 rows (benchmarks/bench.py, benchmarks/report.py): one tiny launched variant's
record, the float8 table rendered from a made-up one, and the --float8 option's guards. No timing."""

import os
import sys

import pytest
import torch

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import bench  # noqa: E402
import report  # noqa: E402
from tensorplay_edu import launch  # noqa: E402


def test_a_float8_variant_records_what_the_table_needs():
    """Full plan, 2 ranks, small config, one step: the float8 all-gathers move 1 byte per element."""
    f8, hp = (launch(bench.rank_bench, 2, "small", "full", "ours", 1, 0, torch.float32, float8, timeout=120)[0]
              for float8 in (True, False))
    assert {"median_s", "counts", "bytes", "float8_bytes", "saved", "rss_mb", "layer_saved"} <= f8.keys()
    assert f8["counts"]["all_gather"] == hp["counts"]["all_gather"]
    assert f8["counts"]["reduce_scatter"] == hp["counts"]["reduce_scatter"]
    assert f8["counts"]["all_reduce"] > hp["counts"]["all_reduce"]  # the amax all-reduces
    c = bench.CONFIGS["small"]
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
    assert len(main) == 1 and len(main[0].split("|")) == 15  # the 13 columns the README embeds
    assert "## Float8 tensorwise tensor parallelism" in text
    assert "| small | full | 2 | 100 / 150 | 300 | 200 | 1.50 |" in text and "| 100 / 400 | 0.25 | 50% |" in text
    prose = " ".join(text.split())  # the notes are wrapped
    assert "costs more time than it saves" in prose and "`make gpu-check` (check d2" in prose
    assert report.float8_section([r for r in table if "float8" not in r["impl"]]) == []  # an old table: no section


@pytest.mark.parametrize("argv, message", [(["--float8"], "--float8 goes with --torchrun"),
                                           (["--torchrun", "--impl", "torch", "--float8"], "needs torchao")])
def test_float8_option_guards(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err

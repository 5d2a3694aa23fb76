"""`make bench`'s report: results.md (the main table, loss_parallel against gathered logits, one block's
activation memory against the formula, then the floor, loss, float8 and async sections of report_*.py) and
results.png, in the folder bench.py chose."""

from __future__ import annotations

import os
import subprocess
import time

import torch

from report_async import async_section
from report_cells import _counts, _find
from report_float8 import float8_section
from report_floor import floor_section, loss_section

TARGET_RATIO = {"small": 0.7, "medium": 1.0}  # step time, ours / PyTorch's, per config


def provenance(quick: bool) -> str:
    """Which run made the tables: full or --quick, the commit (and whether the tree had other changes), the date,
    torch, the cores."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "--short=7", "HEAD") or "unknown"
    changed = [line for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
               if not line[3:].startswith("benchmarks/results.")]
    run = "`python benchmarks/bench.py --quick`" if quick else "`make bench` (full run)"
    return (f"Run: {run} on commit {commit}{' with uncommitted changes' if changed else ''}, "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}, torch {torch.__version__}, {os.cpu_count()} cores.")


def render(table: list[dict], quick: bool, folder: str) -> str:
    lines = ["# Benchmark: one training step of the small Llama (AdamW), CPU, gloo", "", provenance(quick), "",
             "Median step time of the slowest rank; collectives of one step (ours from tensorplay_edu's",
             "CommDebugMode, PyTorch's from its CommDebugMode); bytes each rank sends in all-gathers and",
             "reduce-scatters, counted the same ring way for both (PyTorch's all-reduces are not visible",
             "to a dispatch mode, so all-reduces are compared by count); bytes saved for",
             "backward per rank, peak RSS per rank. " + ("`--quick` run: small config only." if quick else ""), "",
             "| config | plan | ranks | single ms | ours ms | PyTorch ms | ours/PyTorch | target | ours collectives |"
             " PyTorch collectives | gather+scatter bytes/rank ours / PyTorch | saved MB ours / PyTorch | RSS MB ours / PyTorch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for row in sorted((r for r in table if r["impl"] == "ours" and r["plan"] != "gathered"),
                      key=lambda r: (r["config"], r["world"], r["plan"])):
        ref = _find(table, config=row["config"], plan=row["plan"], world=row["world"], impl="torch")
        single = _find(table, config=row["config"], impl="single")
        ratio = row["median_ms"] / ref["median_ms"] if ref else float("nan")
        target = TARGET_RATIO[row["config"]]
        verdicts.append(ratio <= target)
        lines.append(f"| {row['config']} | {row['plan']} | {row['world']} | {single['median_ms']:.0f} | "
                     f"{row['median_ms']:.0f} | {ref['median_ms']:.0f} | {ratio:.2f} | <= {target} "
                     f"{'met' if ratio <= target else 'MISSED'} | {_counts(row['counts'])} | {_counts(ref['counts'])} | "
                     f"{row['bytes']:,} / {ref['bytes']:,} | {row['saved_mb']:.1f} / {ref['saved_mb']:.1f} | "
                     f"{row['rss_mb']:.0f} / {ref['rss_mb']:.0f} |")
    lines += ["", "## loss_parallel against gathering the logits (ours, full plan)", "",
              "| config | ranks | gather+scatter bytes/rank, loss_parallel | gathered logits | saved MB loss_parallel / gathered |",
              "|---|---|---|---|---|"]
    for row in sorted((r for r in table if r["plan"] == "gathered"), key=lambda r: (r["config"], r["world"])):
        lp = _find(table, config=row["config"], plan="full", world=row["world"], impl="ours")
        lines.append(f"| {row['config']} | {row['world']} | {lp['bytes']:,} | {row['bytes']:,} | "
                     f"{lp['saved_mb']:.1f} / {row['saved_mb']:.1f} |")
    lines += ["", "## Activation memory of one block against the formula (ours; bytes saved for backward per rank)", "",
              "| config | plan | ranks | measured | formula | difference | within 10% |", "|---|---|---|---|---|---|---|"]
    memory_ok = []
    for row in sorted((r for r in table if r["impl"] == "ours" and r["plan"] in ("vanilla", "full")),
                      key=lambda r: (r["config"], r["world"], r["plan"])):
        diff = row["layer_saved"] / row["layer_formula"] - 1
        memory_ok.append(abs(diff) <= 0.10)
        lines.append(f"| {row['config']} | {row['plan']} | {row['world']} | {row['layer_saved']:,} | "
                     f"{row['layer_formula']:,} | {100 * diff:+.1f}% | {'yes' if abs(diff) <= 0.10 else 'NO'} |")
    lines += ["", f"Step-time targets met: {sum(verdicts)} of {len(verdicts)}; activation-memory checks within 10%: "
              f"{sum(memory_ok)} of {len(memory_ok)}.", ""]
    lines += floor_section(table)
    lines += loss_section(table)
    lines += float8_section(table)
    lines += async_section(table)
    lines += ["Reproduce: `make bench` (or `python benchmarks/bench.py --quick`).", ""]
    text = "\n".join(lines)
    with open(os.path.join(folder, "results.md"), "w") as f:
        f.write(text)
    _chart(table, os.path.join(folder, "results.png"))
    return text


def _chart(table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted((r for r in table if r["impl"] == "ours" and r["plan"] != "gathered"),
                  key=lambda r: (r["config"], r["world"], r["plan"]))
    labels = [f"{r['config']}\n{r['plan']} x{r['world']}" for r in rows]
    ours = [r["median_ms"] for r in rows]
    theirs = [_find(table, config=r["config"], plan=r["plan"], world=r["world"], impl="torch")["median_ms"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], ours, width=0.4, label="tensorplay_edu", color="#4C72B0")
    ax.bar([x + 0.2 for x in xs], theirs, width=0.4, label="PyTorch TP (DTensor)", color="#DD8452")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("median step time (ms)")
    ax.legend(fontsize=8)
    ax.set_title("training step time, CPU gloo, 1 thread per rank", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)

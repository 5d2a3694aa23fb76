"""The report's floor sections: ours against the hand-written floor (tensorplay_edu/models/by_hand.py), a
whole step taken in turns and launched apart, and the loss alone."""

from __future__ import annotations

import statistics

from report_cells import _find

TARGET_FLOOR = 1.05  # a step, ours / the floor's
TARGET_LOSS = 1.2  # the medium model's loss, ours / the floor's


def _per_round(row, ref) -> list[float]:
    """The ratio row / ref in each interleaved round (the same round for both: a slow spell hits both)."""
    return [a / b for a, b in zip(row["repeats_ms"], ref["repeats_ms"])]


def _interval(interval) -> str:
    """``low to high``, with its coverage when it is under 95 % (too few turns for more)."""
    if interval is None:
        return "-"
    low, high, coverage = interval
    return f"{low:.3f} to {high:.3f}" + ("" if coverage >= 0.95 else f" ({100 * coverage:.0f}%)")


def floor_section(table: list[dict]) -> list[str]:
    """Ours against the hand-written floor: taking turns in the same ranks (the target's ratio, with the middle
    half of the per-step ratios), and launched apart round by round (per-round ratios, their median and range),
    against PyTorch too."""
    rows = sorted((r for r in table if r["impl"] == "ours" and r["plan"] in ("vanilla", "full")),
                  key=lambda r: (r["config"], r["world"], r["plan"]))
    keys = [dict(config=r["config"], plan=r["plan"], world=r["world"]) for r in rows]
    rows = [(r, k) for r, k in zip(rows, keys) if _find(table, **k, impl="hand") and _find(table, **k, impl="paired")]
    if not rows:
        return []
    lines = ["## The floor: the same model written by hand (tensorplay_edu/models/by_hand.py)", "",
             "Taking turns: ours and the floor built in the same ranks, one step of each in turn on the same batch "
             "(`benchmarks/overhead.py`, which first checks that both compute the same loss). ours/hand is the median "
             "of the per-step ratios of the slowest rank, with the middle half of them and the interval that holds "
             "the true median with 95 % confidence (between two order statistics: distribution-free, taking the "
             "steps as independent draws; `overhead.median_interval`). The ms are the median steps; extra CPU is "
             "the main-thread CPU time of ours' step minus the floor's (medians; the most of any rank), which "
             "waiting in a collective does not count. "
             "Launched apart: each variant in launches of its own, round by round as in the tables above, the "
             "median of the per-round ratios and their range. On this 2-core machine the launches drift by more "
             "than the difference asked about, so the target reads the ratio taken in turns.", "",
             "| config | plan | ranks | turns | hand ms | ours ms | ours/hand | middle half | 95% interval | target "
             "| extra CPU ms | rounds apart | ours/hand apart | range | ours/PyTorch apart | range |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    met = []
    for row, key in rows:
        pair, hand, ref = (_find(table, **key, impl=impl) for impl in ("paired", "hand", "torch"))
        apart, vs_torch = _per_round(row, hand), _per_round(row, ref) if ref else []
        met.append(pair["ratio"] <= TARGET_FLOOR)
        torch_mid = f"{statistics.median(vs_torch):.2f}" if vs_torch else "-"
        torch_span = f"{min(vs_torch):.2f} to {max(vs_torch):.2f}" if vs_torch else "-"
        low, high = pair["quartiles"]
        interval = _interval(pair.get("interval"))
        extra = f"{sum(pair['cpu_ms']['ours']) - sum(pair['cpu_ms']['hand']):+.1f}" if "cpu_ms" in pair else "-"
        lines.append(f"| {row['config']} | {row['plan']} | {row['world']} | {pair['steps']} | "
                     f"{pair['wall_ms']['hand']:.0f} | {pair['wall_ms']['ours']:.0f} | {pair['ratio']:.3f} | "
                     f"{low:.3f} to {high:.3f} | {interval} | <= {TARGET_FLOOR} {'met' if met[-1] else 'MISSED'} | "
                     f"{extra} | {len(apart)} | "
                     f"{statistics.median(apart):.2f} | {min(apart):.2f} to {max(apart):.2f} | {torch_mid} | "
                     f"{torch_span} |")
    lines += ["", f"Floor targets met: {sum(met)} of {len(met)}. The hand-written model issues the same collectives "
              "as ours: under the full plan both sum the norm weights' partial gradients in one bucket per step (hand's "
              "`finish_grads`; ours `bucket_partial_grads(model, opt)`, made whole in `opt.step()`), where ours by "
              "default all-reduces each as it arrives (2L + 1 small all-reduces, `.grad` whole at once).", ""]
    return lines


def loss_section(table: list[dict]) -> list[str]:
    """The cross-entropy alone, forward and backward: loss_parallel against the floor's."""
    rows = sorted((r for r in table if r["impl"] == "loss"), key=lambda r: (r["config"], r["world"]))
    if not rows:
        return []
    lines = ["## The loss alone: `loss_parallel` against the floor's cross-entropy", "",
             "`F.cross_entropy` under `loss_parallel()` on this rank's [b * s, V/t] slice of float32 logits, forward "
             "and backward, against tensorplay_edu/models/by_hand.py's `VocabParallelCrossEntropy` on the same slice, interleaved "
             "(slowest rank; median of the per-repeat ratios, and their range).", "",
             "| config | ranks | repeats | hand ms | ours ms | ours/hand | range | target |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        mid = statistics.median(row["ratios"])
        target = f"<= {TARGET_LOSS} {'met' if mid <= TARGET_LOSS else 'MISSED'}" if row["config"] == "medium" else "-"
        lines.append(f"| {row['config']} | {row['world']} | {len(row['ratios'])} | {row['hand_ms']:.1f} | "
                     f"{row['ours_ms']:.1f} | {mid:.2f} | {min(row['ratios']):.2f} to {max(row['ratios']):.2f} | "
                     f"{target} |")
    return lines + [""]

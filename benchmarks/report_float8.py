"""The report's float8 section: ours with the float8 model and styles against ours in float32."""

from __future__ import annotations

import textwrap

from report_cells import _counts, _find, _span


def float8_section(table: list[dict]) -> list[str]:
    """The float8 rows ("ours float8", "single float8") against ours in float32; [] if the run had none."""
    rows = sorted((r for r in table if r["impl"] == "ours float8"),
                  key=lambda r: (r["config"], r["world"], r["plan"]))
    if not rows:
        return []
    lines = ["## Float8 tensorwise tensor parallelism (ours, float32 model converted to float8)", "",
             "| config | plan | ranks | single ms float32 / float8 | ours float8 ms | ours float32 ms | float8/float32 time |"
             " ours float8 collectives | ours float32 collectives | gather+scatter bytes/rank float8 / float32 |"
             " float8/float32 bytes | of them moved in float8 | saved MB float8 / float32 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    times, nbytes, shares, extra, singles = {}, {}, {}, {}, []
    for row in rows:
        ref = _find(table, config=row["config"], plan=row["plan"], world=row["world"], impl="ours")
        single = _find(table, config=row["config"], impl="single")
        single8 = _find(table, config=row["config"], impl="single float8")
        t_ratio = row["median_ms"] / ref["median_ms"]
        b_ratio = row["bytes"] / ref["bytes"] if ref["bytes"] else float("nan")
        share = row.get("float8_bytes", 0) / row["bytes"] if row["bytes"] else 0.0
        times.setdefault(row["plan"], []).append(t_ratio)
        nbytes.setdefault(row["plan"], []).append(b_ratio)
        shares.setdefault(row["plan"], []).append(share)
        amaxes = row["counts"].get("all_reduce", 0) - ref["counts"].get("all_reduce", 0)
        extra.setdefault(row["plan"], []).append(amaxes)
        singles.append(single8["median_ms"] / single["median_ms"])
        lines.append(f"| {row['config']} | {row['plan']} | {row['world']} | {single['median_ms']:.0f} / "
                     f"{single8['median_ms']:.0f} | {row['median_ms']:.0f} | {ref['median_ms']:.0f} | {t_ratio:.2f} | "
                     f"{_counts(row['counts'])} | {_counts(ref['counts'])} | {row['bytes']:,} / {ref['bytes']:,} | "
                     f"{b_ratio:.2f} | {100 * share:.0f}% | {row['saved_mb']:.1f} / {ref['saved_mb']:.1f} |")
    every_time = [t for ts in times.values() for t in ts]
    emulated = any(r.get("float8_emulated") for r in rows)
    matmul = ("emulated: this CPU's `torch._scaled_mm` is oneDNN's reference loop (no float8 kernel for it, about "
              "a thousand times slower than a float32 matmul), so the float8 values are dequantized and multiplied "
              "in float32 (`Float8LinearConfig(emulate=True)`, as torchao's CPU tests; casts, scales, collectives "
              "and bytes unchanged)" if emulated else "run through `torch._scaled_mm`, on the CPU here")
    notes = ["`ours float8`: the benchmark's float32 model converted by `convert_to_float8_training` (every Linear "
             "but the output layer, as torchtitan) and parallelized by `parallelize_llama(..., float8=True)` (the "
             f"float8 styles); its matmuls are {matmul}. It is compared with ours "
             "in float32 (the first table) and with the same float8 model on one process; PyTorch's own float8 "
             "tensor parallelism needs torchao, not a dependency, so it has no column here."]
    if "full" in nbytes:
        notes.append(f"Bytes moved. Full plan: {_span(nbytes['full'])} times float32's gather+scatter bytes per rank. "
                     "The block inputs are cast to e4m3 while still sequence-sharded (one global amax) and "
                     "all-gathered at 1 byte per element, and wo / w2's output gradients are gathered in e5m2: those "
                     "all-gathers move a quarter of float32's bytes. The reduce-scatters stay in float32 (they sum "
                     "partial results, which float8 cannot do without rounding every addend), and so does the output "
                     f"layer's all-gather: {_span(shares['full'], '{:.0%}')} of the bytes move in float8.")
    if "vanilla" in nbytes:
        notes.append(f"Vanilla plan: {_span(nbytes['vanilla'])} times float32's bytes: nothing is gathered in float8 "
                     "(replicated inputs are cast locally, the all-reduces of partial sums stay in float32).")
    notes.append("The extra all-reduces (" + ", ".join(f"{_span(v, '{:.0f}')} per step under the {plan} plan"
                                                       for plan, v in sorted(extra.items())) +
                 ") are the amax all-reduces, a max of one float32 number each, of every tensor cast while sharded: "
                 "weight shards, the inputs of wo / w2, sharded output gradients, and under the full plan the "
                 "sequence-sharded block inputs.")
    if all(t > 1 for t in every_time):
        time_note = (f"Time. On this CPU float8 costs more time than it saves: ours float8 takes {_span(every_time)} "
                     f"times ours float32's step time (one process: {_span(singles)} times), while the bytes moved "
                     "fall. The casts (amax, scale, clamp and cast of every operand and output gradient), the amax "
                     "all-reduces (a latency each, however small the number) and the matmul on a CPU without "
                     "float8 units (no faster than a float32 matmul) outweigh the bytes saved over shared-memory gloo.")
    else:
        time_note = (f"Time. Ours float8 takes {_span(every_time)} times ours float32's step time on this CPU (one "
                     f"process: {_span(singles)} times), while the bytes moved fall: the casts, the amax all-reduces "
                     "and the matmul on a CPU cost about what the smaller transfers save.")
    notes.append(time_note + " Whether float8 pays is a GPU question (float8 tensor cores, NCCL): the GPU figures "
                 "come from `make gpu-check` (check d2: the bf16 model with the float8 styles, beside d1, ours in bf16).")
    lines.append("")
    for note in notes:
        lines += [textwrap.fill(note, 110, break_long_words=False, break_on_hyphens=False), ""]
    return lines

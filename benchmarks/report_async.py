"""The report's async section: ours with async TP (ring-decomposed collectives) against ours synchronous,
with every core computing and with each rank's compute thread pinned to one core."""

from __future__ import annotations

import textwrap

from report_cells import _counts, _find, _span


ASYNC_ROWS = {"ours async": "ours", "ours async pinned": "ours pinned"}  # async label -> its synchronous row


def _threads(row) -> str:
    pinned = row.get("pinned") or {}
    if "core" in pinned:
        return (f"core {pinned['core']} (of {pinned['cores']}); {pinned['free_threads']} other threads free on the "
                f"rest")
    return f"any of {pinned['cores']} cores" if "cores" in pinned else "any core"


def async_section(table: list[dict]) -> list[str]:
    """Ours async against ours synchronous, full plan (the "ours async" rows); [] if the run had none."""
    rows = sorted((r for r in table if r["impl"] in ASYNC_ROWS),
                  key=lambda r: (r["config"], r["world"], r["impl"] != "ours async"))
    if not rows:
        return []
    lines = ["## Async tensor parallelism (ours, full plan): ring-decomposed collectives against the synchronous ones",
             "", "| config | ranks | compute threads on | sync ms | async ms | async/sync | async collectives |"
             " sync collectives | total bytes/rank async / sync | block-input ring fused / comm / comp ms |"
             " ring overlap | ring waits ms/step (of transfer in flight) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = ("ratio", "spread", "overlap", "hide", "wait", "comm", "comp", "fused", "sum", "sync_ms", "free_ms")
    got = {pinned: {k: [] for k in keys} for pinned in (False, True)}  # what the notes quote, unpinned / pinned
    for row in rows:
        sync = _find(table, config=row["config"], plan=row["plan"], world=row["world"], impl=ASYNC_ROWS[row["impl"]])
        g = got[row["impl"].endswith("pinned")]
        ratio = row["median_ms"] / sync["median_ms"]
        g["ratio"].append(ratio)
        g["sync_ms"].append(sync["median_ms"])
        unpinned = _find(table, config=row["config"], plan=row["plan"], world=row["world"], impl="ours")
        g["free_ms"].append(unpinned["median_ms"] if unpinned else float("nan"))
        g["spread"] += [row.get("spread", 0.0), sync.get("spread", 0.0)]
        o, ring = row.get("overlap"), row.get("ring")
        if o:
            for k in ("overlap", "comm", "comp", "fused"):
                g[k].append(o[k] if k == "overlap" else 1e3 * o[k])
            g["sum"].append(1e3 * (o["comm"] + o["comp"]))
        if ring:
            g["wait"].append(100 * 1e3 * ring["wait_s"] / row["median_ms"])
        if o and ring and row["world"] > 1:  # every ring moves [b, s/t, h] chunks: rings x one ring's transfers
            g["hide"].append(100 * ring["transfers"] / (row["world"] - 1) * 1e3 * o["comm"] / sync["median_ms"])
        ring_ms = f"{1e3 * o['fused']:.1f} / {1e3 * o['comm']:.1f} / {1e3 * o['comp']:.1f}" if o else "-"
        overlap = f"{o['overlap']:.2f}" if o else "-"
        waits = f"{1e3 * ring['wait_s']:.0f} (of {1e3 * ring['transfer_s']:.0f})" if ring else "-"
        lines.append(f"| {row['config']} | {row['world']} | {_threads(row)} | {sync['median_ms']:.0f} | "
                     f"{row['median_ms']:.0f} | {ratio:.2f} | {_counts(row['counts'])} | {_counts(sync['counts'])} | "
                     f"{row.get('total_bytes', 0):,} / {sync.get('total_bytes', 0):,} | {ring_ms} | {overlap} | {waits} |")
    notes = ["`ours async`: ours with `with enable_async_tp(mesh):` around the forward (the backward follows what the "
             "forward chose) against ours synchronous (`ours`, run interleaved with it; the unpinned sync rows are the "
             "first table's full-plan rows). Each block-input all-gather (attention's and feed_forward's input, the "
             "output layer's) becomes an all_gather_matmul: t-1 isend / irecv ring steps, each chunk's transfer under "
             "the matmuls of the chunk in hand; wo's and w2's reduce-scatters become matmul_reduce_scatter; the backward "
             "mirrors them. The embedding's reduce-scatter (a lookup, no matmul) and its all-gather in backward stay "
             "collectives. The step moves exactly the synchronous step's bytes per rank (all collectives, all-reduces "
             "included): every async variant runs one synchronous and one async step under CommDebugMode and the "
             "bench raises if the totals differ (and again if the rows' totals do).",
             "Ring columns: `async_tp.time_gather_matmul` on a [b, s/t, h] block input with layer 0's wq / wk / wv "
             "shards (the slowest rank's; medians of 5 runs; the middle repeat): the fused ring, its transfers alone, "
             "its matmuls alone; overlap = (serial - fused) / (serial - ideal) with serial = comm + comp and the ring's "
             "own ideal (t-1) max(comm/(t-1), comp/t) + comp/t (the last chunk's matmuls hide nothing): 1 at the ideal, "
             "0 when they ran one after the other, below 0 when the ring took longer than both one after the other "
             "(when the transfers are much shorter than the matmuls, a jitter of the fused time swings it far). "
             "Ring waits: from a `Timeline` of one async step, the time the rank's transfers were in flight with no "
             "matmul of its own running (it had finished the chunk's matmuls and waited for the next chunk, or for a "
             "late neighbour), against their whole time in flight."]

    def verdict(g):
        noise = max(g["spread"] + [0.03])  # at least 3%: a ratio closer to 1 is not read as a difference
        if max(g["ratio"]) < 1 - noise:
            return "faster, beyond the repeats' spread", True
        if min(g["ratio"]) > 1 + noise:
            return "slower, beyond the repeats' spread", False
        most = 100 * max(g["spread"] + [0.0])
        return f"within the repeats' spread, up to {most:.0f}% between repeats of one variant", False

    def ring_facts(g):
        if not g["hide"]:
            return ""
        text = (f" One ring's transfers alone take {_span(g['comm'], '{:.1f}')} ms against {_span(g['comp'], '{:.1f}')} "
                f"ms of matmuls, and the step's rings, each moving as much, come to {_span(g['hide'], '{:.0f}')}% of the "
                "synchronous step: the most a perfect overlap could save. The Timeline has the rings waiting for a chunk "
                f"after their matmuls for {_span(g['wait'], '{:.1f}')}% of the step")
        if len(g["wait"]) == len(g["hide"]) and all(w < h for w, h in zip(g["wait"], g["hide"])):
            text += ", less than the transfers take alone: most of their time passes under the matmuls"
        if max(g["overlap"]) < 0.25:
            return text + (f". Yet a fused ring takes {_span(g['fused'], '{:.1f}')} ms, as long as its transfers and "
                           f"matmuls one after the other or longer ({_span(g['sum'], '{:.1f}')} ms; overlap "
                           f"{_span(g['overlap'])}).")
        return text + (f". A fused ring takes {_span(g['fused'], '{:.1f}')} ms against {_span(g['sum'], '{:.1f}')} ms "
                       f"one after the other (overlap {_span(g['overlap'])}).")

    free, pinned = got[False], got[True]
    if free["ratio"]:
        words, _ = verdict(free)
        notes.append(f"Time, every core computing: async TP takes {_span(free['ratio'])} times the synchronous step "
                     f"({words})." + ring_facts(free) + " On gloo a transfer is CPU work (the kernel copies each chunk "
                     "through a loopback socket, driven by the sending thread and gloo's threads), so with every core "
                     "computing it takes its time from the matmuls, and the decomposition adds costs of its own (t-1 "
                     "isend / irecv pairs and a wait on the neighbour per collective, t smaller matmuls).")
    if pinned["ratio"]:
        words, gains = verdict(pinned)
        little = pinned["hide"] and max(pinned["hide"]) < 10
        shows = ("So a core left to the transfers lets async TP pay here." if gains else
                 "So a core left to the transfers does not make async TP pay here" +
                 (": there is too little to hide." if little else "."))
        notes.append("A core left free for the transfers: 2 ranks whose main threads (their matmuls) were pinned to one "
                     "core with `os.sched_setaffinity(0, {core})` after the process group started; gloo's threads, "
                     "started with the group, keep the other core (the table counts each rank's other threads, free to "
                     "run elsewhere). In the synchronous step the compute core then waits while each collective runs "
                     "on gloo's threads: that wait is what async TP could fill. Both ranks' matmuls share the one core, "
                     f"so the synchronous step takes {_span(pinned['sync_ms'], '{:.0f}')} ms (unpinned "
                     f"{_span(pinned['free_ms'], '{:.0f}')} ms). Async TP takes "
                     f"{_span(pinned['ratio'])} times the pinned synchronous step ({words}). {shows}" +
                     ring_facts(pinned))
    notes.append("On GPUs nothing in the code changes (`bench.py --torchrun --async-tp`): each ring step's isend / irecv "
                 "run as NCCL kernels on NCCL's stream while the chunk's matmuls run on the compute stream, and the "
                 "host only queues both. What the GPU path needs to gain is a matmul per ring step long enough to hide "
                 "one chunk's transfer (b * s/t rows: large batches and sequences), and NCCL's kernels leaving the "
                 "matmuls enough SMs (PyTorch's own async TP moves the chunks with copy engines through symmetric "
                 "memory for that reason): `make gpu-check` check d3 measures ours bf16, full plan, with async TP, "
                 "beside d1 (synchronous), and e3 compares their losses.")
    lines.append("")
    for note in notes:
        lines += [textwrap.fill(note, 110, break_long_words=False, break_on_hyphens=False), ""]
    return lines

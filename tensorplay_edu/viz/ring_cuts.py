"""A rank's measured intervals cut into rings and summed: the numbers behind :func:`~tensorplay_edu.viz.timelines.draw_ring_timelines`'s
picture (which stretch of a ring is a matmul, a transfer beside one, posting, or waiting)."""

from __future__ import annotations

__all__ = ["bar_labels", "uncovered", "idle_stretches", "ring_intervals", "ring_shares"]


def bar_labels(ivs, t):
    """Per interval, its labels longest first: ``"step 2/3: matmul chunk 1"``, ``"matmul chunk 1"``, ``"chunk 1"``,
    ``"1"``.  A rank's rings are t computes and t-1 transfers each, one after the other (async_tp's rings):
    where the counts say so, each bar gets its ring (``ring``) and step; a transfer's step is the matmul it
    runs under.  Returns (labels, ring of each interval or None)."""
    comps = sorted((j for j, iv in enumerate(ivs) if iv[0] == "compute"), key=lambda j: ivs[j][2])
    sends = sorted((j for j, iv in enumerate(ivs) if iv[0] == "transfer"), key=lambda j: ivs[j][2])
    rings = len(comps) // t if t > 1 and len(comps) % t == 0 and len(sends) == (t - 1) * (len(comps) // t) else 0
    ring_of, step_of = [None] * len(ivs), [None] * len(ivs)
    for i, j in enumerate(comps if rings else []):
        ring_of[j], step_of[j] = i // t, i % t
    for i, j in enumerate(sends if rings else []):
        ring_of[j] = i // (t - 1)
        mine = comps[ring_of[j] * t:(ring_of[j] + 1) * t]
        step_of[j] = next((k for k, c in enumerate(mine) if ivs[c][2] >= ivs[j][2]), t - 1)
    scatter = {ring_of[j] for j in sends if ivs[j][1].startswith("sum ")}
    labels = []
    for j, (kind, label, *_) in enumerate(ivs):
        word, _, num = label.rpartition(" ")
        ring, k = ring_of[j], step_of[j]
        if word not in ("chunk", "sum") or not num.isdigit():
            labels.append([label, num] if num else [label])
            continue
        c = int(num)
        if kind == "compute":
            what = f"part of sum {c}" if ring is not None and ring in scatter else f"matmul chunk {c}"
        else:
            what = f"send {word} {(c + 1) % t}, get {word} {c}" if t > 1 else f"get {word} {c}"
        long = [f"step {k + 1}/{t}: {what}"] if k is not None else []
        labels.append(long + [what, label, num])
    return labels, ring_of


def uncovered(start, end, busy):
    """The parts of [start, end] that no interval of ``busy`` covers: (start, end) pairs."""
    out, t = [], start
    for a, b in sorted(busy):
        if b <= t or a >= end:
            continue
        if a > t:
            out.append((t, a))
        t = max(t, b)
    if t < end:
        out.append((t, end))
    return [(a, b) for a, b in out if b - a > 1e-12]


def idle_stretches(ring, busy):
    """The stretches of one rank's ring with no matmul running, ``(start, end, what)``: ``"posting"`` from a
    transfer's start (``ring_shift`` called) to the first matmul that starts under it (the rank was inside
    ``batch_isend_irecv``, or descheduled); every other stretch ``"waiting"`` (mostly in ``wait()`` for the
    bytes, or between ring steps)."""
    posts = [(s, min([a for a, _ in busy if s <= a < e], default=e)) for kind, _, s, e in ring if kind == "transfer"]
    first, last = min(iv[2] for iv in ring), max(iv[3] for iv in ring)
    out = []
    for a, b in uncovered(first, last, busy):
        inside = [(max(a, s), min(b, e)) for s, e in posts if min(b, e) > max(a, s)]
        out += [(s, e, "posting") for s, e in inside] + [(s, e, "waiting") for s, e in uncovered(a, b, inside)]
    return sorted(out)


def _rows(per_rank_intervals, cpu=False):
    """Each rank's intervals as ``(kind, label, start, end)`` tuples, or with ``cpu`` as
    ``(kind, label, start, end, cpu_start, cpu_end)`` (None where the interval carries no CPU times)."""
    def row(i):
        if hasattr(i, "kind"):
            i = (i.kind, i.label, i.start, i.end, getattr(i, "cpu_start", None), getattr(i, "cpu_end", None))
        i = tuple(i) + (None, None)
        return i[:6] if cpu else i[:4]
    return [[row(i) for i in ivs] for ivs in per_rank_intervals]


def _cut(rows, t):
    """Each rank's rows cut into its rings, in start order (see :func:`ring_intervals`)."""
    out = []
    for r, ivs in enumerate(rows):
        _, ring_of = bar_labels(ivs, t)
        if any(ring is None for ring in ring_of):
            raise ValueError(f"rank {r}: its intervals are not whole rings of {t} matmuls and {t - 1} transfers")
        rings = [[] for _ in range(max(ring_of, default=-1) + 1)]
        for iv, ring in zip(ivs, ring_of):
            rings[ring].append(iv)
        out.append([sorted(ring, key=lambda iv: iv[2]) for ring in rings])
    return out


def ring_intervals(per_rank_intervals, t):
    """Each rank's intervals cut into its rings as :func:`draw_ring_timelines` cuts them (``t`` matmuls and
    ``t - 1`` transfers a ring, in order): ``out[r][i]`` lists rank r's ``(kind, label, start, end)`` of
    ring i, in start order. Raises if a rank's counts are not whole rings."""
    return _cut(_rows(per_rank_intervals), t)


def ring_shares(per_rank_intervals, t):
    """Per rank, in seconds, what :func:`draw_ring_timelines` shades: ``"transfer"``, its transfers in flight;
    ``"under a matmul"``, the part of them beside a matmul of the same rank (pale teal); the stretches of its
    rings with no matmul running, ``"posting"`` (inside ``ring_shift``, hatched orange) and ``"waiting"``
    (the rest, hatched grey).  Where the intervals carry the thread's CPU times (``Timeline`` on the CPU:
    ``Interval`` objects, or 6-tuples ending ``cpu_start, cpu_end``), also ``"compute"`` (the matmuls' wall
    time), ``"compute on the CPU"`` and ``"posting on the CPU"``: the CPU time the thread spent in them.
    Wall time the CPU time falls short of is time the thread did not run (descheduled, or blocked)."""
    shares = []
    for rings in _cut(_rows(per_rank_intervals, cpu=True), t):
        total = {"transfer": 0.0, "under a matmul": 0.0, "posting": 0.0, "waiting": 0.0}
        timed = all(iv[4] is not None for ring in rings for iv in ring)
        if timed:
            total.update({"compute": 0.0, "compute on the CPU": 0.0, "posting on the CPU": 0.0})
        for ring in rings:
            busy = [(iv[2], iv[3]) for iv in ring if iv[0] == "compute"]
            for kind, _, s, e, cs, ce in ring:
                if kind == "transfer":
                    total["transfer"] += e - s
                    total["under a matmul"] += sum(b - a for a, b in uncovered(s, e, uncovered(s, e, busy)))
                    if timed:  # posting: from the transfer's start to the first matmul under it
                        first = min((iv for iv in ring if iv[0] == "compute" and s <= iv[2] < e),
                                    key=lambda iv: iv[2], default=None)
                        total["posting on the CPU"] += (first[4] if first else ce) - cs
                elif timed:
                    total["compute"] += e - s
                    total["compute on the CPU"] += ce - cs
            for a, b, what in idle_stretches([iv[:4] for iv in ring], busy):
                total[what] += b - a
        shares.append(total)
    return shares

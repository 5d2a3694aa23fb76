"""Fit this machine's α, β and matmul FLOP/s from measured samples, then predict a step from its FLOPs
and the collectives CommDebugMode recorded (notebook 07b measures, fits, predicts and plots; nothing here
times anything). Importable from :mod:`tensorplay_edu.cluster` as well.
"""

from __future__ import annotations

from .model import bytes_sent, ring_steps

__all__ = ["fit_cpu", "predict_step"]


def _lstsq_line(xs, ys) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys)."""
    n = len(xs)
    if n < 2:
        raise ValueError("fit_cpu needs at least two samples per fit")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("fit_cpu needs samples of at least two different sizes")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def _ring_cost(collectives, world: int) -> tuple[float, float]:
    """(ring steps, bytes sent per rank) of a list of collectives: CommDebugMode's records or
    ``(op, full buffer bytes)`` pairs on ``world`` ranks."""
    steps = sent = 0.0
    for c in collectives:
        if hasattr(c, "op"):
            op, t, nbytes_sent = c.op, c.group_size, c.bytes
        else:
            (op, nbytes), t = c, world
            nbytes_sent = bytes_sent(op, nbytes, t)
        steps += ring_steps(op, t) if op in ("all_reduce", "all_gather", "reduce_scatter") else t - 1
        sent += nbytes_sent
    return steps, sent


def _lstsq_plane(rows) -> tuple[float, float]:
    """(a, b) minimising Σ (a·x + b·y - z)² over rows (x, y, z): no intercept."""
    sxx = sum(x * x for x, _, _ in rows)
    syy = sum(y * y for _, y, _ in rows)
    sxy = sum(x * y for x, y, _ in rows)
    sxz = sum(x * z for x, _, z in rows)
    syz = sum(y * z for _, y, z in rows)
    det = sxx * syy - sxy * sxy
    if len(rows) < 2 or det <= 1e-12 * sxx * syy:
        raise ValueError("fit_cpu needs transitions of at least two different sizes")
    return (sxz * syy - syz * sxy) / det, (syz * sxx - sxz * sxy) / det


def fit_cpu(samples: dict) -> dict[str, float]:
    """Fit this machine's constants from measured samples (pure math: pass what you measured).

    ``samples = {"all_reduce": [(nbytes, seconds), ...], "matmul": [(flops, seconds), ...], "world": 2}``
    (either list may be left out). ``nbytes`` is the all-reduced buffer's size. On t ranks a ring
    all-reduce takes 2(t-1)·α + 2(t-1)/t·nbytes·β, so the least-squares line through
    (2(t-1)/t·nbytes, seconds) has slope β (s/byte) and intercept 2(t-1)·α; a matmul of f FLOPs takes
    overhead + f / FLOP/s. Returns ``{"alpha", "beta"}`` and/or ``{"flops", "matmul_overhead"}``.

    ``samples["transitions"] = [(collectives, seconds), ...]`` instead fits α and β from timed layout
    changes (e.g. ``DTensor.redistribute`` forward and backward): ``collectives`` are what each one
    issued, as :func:`predict_step` takes them, and seconds = Σ ring steps·α + Σ bytes sent·β, least
    squares with no intercept, so α then also holds whatever each collective costs around it."""
    t, fit = samples.get("world", 2), {}
    if samples.get("transitions"):
        rows = [(*_ring_cost(coll, t), sec) for coll, sec in samples["transitions"]]
        fit["alpha"], fit["beta"] = _lstsq_plane(rows)
    elif samples.get("all_reduce"):
        xs, ys = zip(*[(2 * (t - 1) / t * n, sec) for n, sec in samples["all_reduce"]])
        intercept, fit["beta"] = _lstsq_line(xs, ys)
        fit["alpha"] = intercept / (2 * (t - 1))
    if samples.get("matmul"):
        fit["matmul_overhead"], slope = _lstsq_line(*zip(*samples["matmul"]))
        fit["flops"] = 1 / slope
    return fit


def predict_step(flops: float, collectives, fit: dict, world: int = 2) -> dict[str, float]:
    """Predicted seconds of one step on the fitted machine: ``flops / fit["flops"]`` plus the α–β time
    of each collective, nothing overlapped (gloo). ``collectives``: CommDebugMode's records (each has
    ``op``, ``bytes`` sent per rank and ``group_size``) or ``(op, full buffer bytes)`` pairs on
    ``world`` ranks. A ring op costs its (t-1) or 2(t-1) steps of α plus the bytes it sends times β."""
    steps, sent = _ring_cost(collectives, world)
    comm = steps * fit["alpha"] + sent * fit["beta"]
    compute = flops / fit["flops"]
    return {"compute": compute, "comm": comm, "total": compute + comm}

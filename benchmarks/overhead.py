"""What tensorplay_edu costs per training step beyond the hand-written floor, measured in one process.

Timed in launches of their own, a few steps each, two variants drift apart by several percent on a
busy 2-core machine: as large as the difference asked about.  Here ours (norm gradients bucketed
under the full plan) and the floor (tensorplay_edu/models/by_hand.py) live in the same ranks and take turns, step
by step, on the same batch; `make bench`'s floor table comes from :func:`compare`.  Per step: the
wall time of the slowest rank, and the main thread's CPU time (``time.thread_time``: waiting in a
collective is not CPU, so this is the work each rank does, Python included).  A tiny model (every
matmul a few microseconds) shows the fixed cost alone, split by phase.  Both are checked to compute
the same first loss.

    python benchmarks/overhead.py               # small config at 2 and 4 ranks, tiny model at 2
    python benchmarks/overhead.py --steps 6     # fewer steps
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from configs import build  # noqa: E402
from tensorplay_edu.models.by_hand import HandLlama  # noqa: E402
from tensorplay_edu import init_device_mesh, launch  # noqa: E402
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama  # noqa: E402
from tensorplay_edu.parallel import bucket_partial_grads  # noqa: E402

PHASES = ("forward", "loss", "backward", "optimizer")


def _build(config: str):
    if config != "tiny":
        return build(config)
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=32, n_layers=2, n_heads=8, vocab_size=64, max_seq_len=8))
    tokens = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    return model, tokens, tokens.roll(-1, dims=1)


def rank_compare(config: str, steps: int, plan: str = "full") -> dict:
    """On this rank: ours and hand alternately (who goes first alternates too); medians per step."""
    model, tokens, labels = _build(config)
    ours = parallelize_llama(model, init_device_mesh("cpu", (dist.get_world_size(),)), plan)
    hand = HandLlama(_build(config)[0], plan)
    opts = {"ours": torch.optim.AdamW(ours.parameters(), lr=1e-4), "hand": torch.optim.AdamW(hand.parameters(), lr=1e-4)}
    if plan == "full":  # the norms' partial gradients: one bucket, made whole in opt.step() (hand: its own)
        bucket_partial_grads(ours, opts["ours"])
    clock = time.thread_time

    def step(name: str) -> tuple[float, list[float]]:
        marks = [clock()]
        if name == "ours":
            with loss_context(plan):
                out = ours(tokens)
                marks.append(clock())
                loss = llama_loss(out, labels)
                marks.append(clock())
                loss.backward()
        else:
            out = hand(tokens)
            marks.append(clock())
            loss = hand.loss(out, labels)
            marks.append(clock())
            loss.backward()
            hand.finish_grads()  # the floor's norm bucket, full plan (ours: in the optimizer's pre-step hook)
        marks.append(clock())
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)
        marks.append(clock())
        return loss.item(), [b - a for a, b in zip(marks, marks[1:])]

    first = {name: step(name)[0] for name in ("ours", "hand")}
    wall, cpu = {"ours": [], "hand": []}, {"ours": [], "hand": []}
    for i in range(steps):
        for name in (("ours", "hand") if i % 2 else ("hand", "ours")):
            dist.barrier()
            start = time.perf_counter()
            cpu[name].append(step(name)[1])
            wall[name].append(time.perf_counter() - start)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, wall)
    slowest = {k: [max(w[k][i] for w in everyone) for i in range(steps)] for k in wall}
    return {"first_loss": first,
            "wall_ms": {k: 1000 * statistics.median(v) for k, v in slowest.items()},
            "ratios": [a / b for a, b in zip(slowest["ours"], slowest["hand"])],
            "cpu_ms": {k: [1000 * statistics.median(p[j] for p in v) for j in range(len(PHASES))] for k, v in cpu.items()}}


def same_work(first_loss: dict, label: str) -> None:
    """Raises unless ours and the floor computed the same first loss: the turns compare like with like."""
    a, b = first_loss["ours"], first_loss["hand"]
    if abs(a - b) > 1e-4 * max(1.0, abs(b)):
        raise RuntimeError(f"{label}: ours' first loss {a} is not the floor's {b}: not the same work")


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Where the median of the distribution the ``values`` were drawn from lies: the distribution-free interval
    between two order statistics, ``sorted(values)[j]`` and ``sorted(values)[n - 1 - j]``, with the largest ``j``
    whose coverage is at least ``confidence``.  Each value falls below the true median with probability 1/2, so
    the interval misses it when ``j`` or fewer fall below (or above): ``1 - 2 P(Binomial(n, 1/2) <= j)``.
    Returns (low, high, coverage); with too few values for ``confidence`` (n < 6 at 95 %), their whole range
    and the smaller coverage it has."""
    x, n = sorted(values), len(values)
    if n == 0:
        raise ValueError("median_interval: no values")

    def coverage(j: int) -> float:  # of [x[j], x[n - 1 - j]]
        return 1 - 2 * sum(math.comb(n, i) for i in range(j + 1)) / 2**n

    j = 0
    while 2 * (j + 1) <= n - 1 and coverage(j + 1) >= confidence:
        j += 1
    return x[j], x[n - 1 - j], coverage(j)


def compare(config: str, world: int, steps: int, plan: str = "full") -> dict:
    """Ours against the floor in ``world`` launched ranks, ``steps`` turns each: the per-step ratios (slowest
    rank), their median, quartiles and the median's 95 % interval (:func:`median_interval`), the median step
    times, and the CPU a step by phase (the most of any rank).  Raises unless both computed the same first loss."""
    res = launch(rank_compare, world, config, steps, plan, timeout=1200)
    same_work(res[0]["first_loss"], f"{config} {plan}, {world} ranks")
    cpu = {k: [max(r["cpu_ms"][k][j] for r in res) for j in range(len(PHASES))] for k in ("ours", "hand")}
    ratios = res[0]["ratios"]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return {"config": config, "plan": plan, "world": world, "steps": steps, "wall_ms": res[0]["wall_ms"],
            "ratio": statistics.median(ratios), "quartiles": (quartiles[0], quartiles[2]),
            "interval": median_interval(ratios), "ratios": ratios, "cpu_ms": cpu}


def render(rows: list[dict]) -> str:
    lines = ["| config | ranks | steps | hand ms | ours ms | ours/hand (median of steps) | CPU ms a step hand / ours "
             "| ours' extra CPU: " + ", ".join(PHASES) + " |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        hand, ours = r["cpu_ms"]["hand"], r["cpu_ms"]["ours"]
        extra = ", ".join(f"{o - h:+.1f}" for o, h in zip(ours, hand))
        lines.append(f"| {r['config']} | {r['world']} | {r['steps']} | {r['wall_ms']['hand']:.1f} | "
                     f"{r['wall_ms']['ours']:.1f} | {r['ratio']:.3f} | {sum(hand):.1f} / {sum(ours):.1f} | {extra} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="alternating steps of each (default 20)")
    args = parser.parse_args(argv)
    rows = [compare(config, world, args.steps) for config, world in (("tiny", 2), ("small", 2), ("small", 4))]
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

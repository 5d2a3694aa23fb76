"""CommDebugMode: count and weigh every collective this package issues.

    with CommDebugMode() as comm:
        y = x.redistribute(mesh, [Replicate()])
    comm.get_comm_counts()      # {'all_gather': 1}
    print(comm.table())

Each :class:`CommRecord` holds the op, the phase (``forward`` or ``backward``: a
collective issued inside an autograd backward), the logical payload shape and dtype,
the group size ``t`` and its global ranks, the module path it was issued under, when this
rank issued it and when it returned (``time.perf_counter``), and the bytes each rank sends,
counted as a bandwidth-optimal ring / chain would move them:

=================  ==========================================================
op                 bytes each rank sends (F = padded full tensor, c = F / t)
=================  ==========================================================
``all_gather``     (t-1) * c   = (t-1)/t * F
``reduce_scatter`` (t-1) * c   = (t-1)/t * F
``all_reduce``     2 (t-1) * c = 2(t-1)/t * F  (a reduce-scatter + an all-gather)
``all_to_all``     (t-1) * c   (each rank keeps one of its t blocks)
``broadcast``      F           (a pipelined chain: every rank forwards it once)
``scatter``        (t-1) * c   (what the source sends)
=================  ==========================================================

"Padded" because uneven shards are padded to ``ceil(n / t)`` rows inside the
collective (gloo rejects unequal sizes): the bytes are what really moves.

PyTorch's ``DistributedDataParallel`` issues its own all-reduces; :func:`ddp_comm_hook`
(``ddp_model.register_comm_hook(group, ddp_comm_hook)``) records them here too.

Watchers see a collective *before* it is issued: :func:`watch` calls every function in
``WATCHERS`` with what the collective will put on the wire, so a checker can refuse it before it
hangs.  Nothing watches by default; ``NCCLRulesMode`` (:mod:`tensorplay_edu.gpu_rules.nccl`)
joins while it is active and sees the DDP buckets of :func:`ddp_comm_hook` too.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch.distributed as dist

__all__ = ["CommDebugMode", "CommRecord", "module_scope", "current_module", "ddp_comm_hook", "WATCHERS", "watch"]

WATCHERS: list = []  # each called as watch(op, group, x, out, **facts) before a collective is issued
_ACTIVE: list["CommDebugMode"] = []
_MODULE_STACK: list[str] = []
_PHASE: list[str] = ["forward"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "scatter")


@dataclass(frozen=True)
class CommRecord:
    op: str
    phase: str  # "forward" or "backward"
    shape: tuple[int, ...]
    dtype: str
    group_size: int
    bytes: int
    module: str  # "" when issued outside any parallelized module
    ranks: tuple[int, ...] = ()  # the group's global ranks (mesh["tp"] of rank 2 in a (2, 2) mesh: (2, 3))
    # time.perf_counter() when this rank issued it and when it returned (one clock for all processes of a
    # machine; on CUDA the return is the enqueue, not the end). Not part of a record's identity.
    issued: float | None = field(default=None, compare=False)
    returned: float | None = field(default=None, compare=False)


class module_scope:  # noqa: N801 (used as a function: ``with module_scope(path):``)
    """Collectives issued inside are attributed to module ``path`` (used by the styles; a class, not a
    generator, because every hook enters one)."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        _MODULE_STACK.append(self.path)

    def __exit__(self, *exc):
        _MODULE_STACK.pop()


def current_module() -> str:
    return _MODULE_STACK[-1] if _MODULE_STACK else ""


class backward_scope(module_scope):  # noqa: N801
    """Inside an autograd backward: collectives are recorded as ``backward`` of ``module``."""

    def __enter__(self):
        _PHASE.append("backward")
        super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        _PHASE.pop()


def watch(op: str, group, x, out=None, **facts) -> float:
    """Called by :mod:`tensorplay_edu.collectives` just before it issues a collective: ``x`` / ``out``
    as they go on the wire; ``facts``: ``reduce`` (the op), ``detail`` (chunk sizes, source rank),
    ``recv`` (a ring's incoming shape), ``shape`` (this rank's tensor as the caller sees it).
    Returns the moment it is issued, which the collective hands back to :func:`record`."""
    for watcher in WATCHERS:
        watcher(op, group, x, out, **facts)
    return time.perf_counter()


def record(op: str, shape, dtype, group_size: int, nbytes: int, group=None, issued: float | None = None) -> None:
    """Called by :mod:`tensorplay_edu.collectives` for every collective it issues, once it returns."""
    if not _ACTIVE:
        return
    returned = time.perf_counter()
    ranks = tuple(dist.get_process_group_ranks(group)) if group is not None else ()
    rec = CommRecord(op, _PHASE[-1], tuple(shape), str(dtype).replace("torch.", ""), group_size, int(nbytes),
                     current_module(), ranks, issued, returned)
    for mode in _ACTIVE:
        mode.records.append(rec)


def ddp_comm_hook(group, bucket):
    """A DistributedDataParallel communication hook: PyTorch's all-reduce of a gradient
    bucket (averaged over ``group``), recorded as ``backward`` of module ``"DDP"``."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    flat, t = bucket.buffer(), dist.get_world_size(group)
    with backward_scope("DDP"):
        watch("all_reduce", group, flat, reduce=dist.ReduceOp.SUM)  # PyTorch's collective, watched too
        record("all_reduce", flat.shape, flat.dtype, t, 2 * (t - 1) * -(-flat.numel() // t) * flat.element_size(),
               group)
    return allreduce_hook(group, bucket)


class CommDebugMode:
    """Context manager recording every collective issued while it is active (nestable)."""

    def __init__(self):
        self.records: list[CommRecord] = []

    def __enter__(self):
        self.records = []
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        _ACTIVE.remove(self)

    def _select(self, phase: str | None, module: str | None = None):
        if phase not in (None, "forward", "backward"):
            raise ValueError(f"phase must be None, 'forward' or 'backward', got {phase!r}")
        return [r for r in self.records if (phase is None or r.phase == phase) and (module is None or r.module == module)]

    def get_comm_counts(self, phase: str | None = None) -> dict[str, int]:
        """``{op: count}``, over both phases or one (``phase="forward"`` / ``"backward"``)."""
        return dict(Counter(r.op for r in self._select(phase)))

    def get_total_counts(self, phase: str | None = None) -> int:
        return len(self._select(phase))

    def get_comm_bytes(self, phase: str | None = None) -> dict[str, int]:
        """``{op: bytes each rank sent}``."""
        out: Counter = Counter()
        for r in self._select(phase):
            out[r.op] += r.bytes
        return dict(out)

    def get_total_bytes(self, phase: str | None = None) -> int:
        return sum(r.bytes for r in self._select(phase))

    def get_comm_module_counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{module: {"forward": {op: n}, "backward": {op: n}}}``."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for r in self.records:
            phases = out.setdefault(r.module, {"forward": {}, "backward": {}})
            phases[r.phase][r.op] = phases[r.phase].get(r.op, 0) + 1
        return out

    def table(self) -> str:
        """One row per (phase, module, op, group, shape, dtype): count and bytes."""
        rows: Counter = Counter()
        nbytes: Counter = Counter()
        for r in self.records:
            group = ",".join(map(str, r.ranks)) or "-"
            key = (r.phase, r.module or "-", r.op, group, "x".join(map(str, r.shape)) or "scalar", r.dtype)
            rows[key] += 1
            nbytes[key] += r.bytes
        head = ("phase", "module", "op", "ranks", "shape", "dtype", "count", "bytes/rank")
        body = [(*k, str(rows[k]), f"{nbytes[k]:,}") for k in rows]
        body.append(("total", "", "", "", "", "", str(len(self.records)), f"{self.get_total_bytes():,}"))
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        fmt = "  ".join("{:<%d}" % w for w in widths)
        lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
        lines += [fmt.format(*row) for row in body]
        return "\n".join(lines)

    def __str__(self):
        return self.table()

"""NCCLRulesMode: what NCCL and CUDA's float8 matmul would refuse or hang on, checked on the CPU.

    with NCCLRulesMode() as rules:          # on every rank, at the same point
        loss = model(tokens).sum()
        loss.backward()
    print(rules.table())                    # every collective this rank issued, numbered per group

    TENSORPLAY_CHECK_NCCL=1 torchrun --nproc-per-node 4 -m tensorplay_edu.lab.demo    # the same, unchanged code

gloo forgives what NCCL does not.  Two ranks that issue different collectives on gloo often
fail at once ("Connection closed by peer", "Received data size doesn't match"); on NCCL they
may hang until the watchdog kills the job ten minutes later, or, worse, finish with garbled
data (the same byte count, another op).  So, before every collective of
:mod:`tensorplay_edu.collectives` is issued, each rank of its group

1. writes a *fingerprint* (op, group, dtype, wire shape, reduction, chunk sizes, module,
   phase) under the collective's sequence number on that group into the default group's
   store, then waits (``timeout`` seconds) for every other rank's.  Collectives are numbered
   per group for the life of the process (every mode of this rank counts on), so enter and
   leave modes on every rank at the same points.  Once exchange n is complete every rank has
   read exchange n - 1, so the rank deletes its key of n - 1: the store holds at most two
   fingerprints per group and rank, however long the run;
2. raises :class:`NCCLRuleError` on every rank, with the same report, if the group's
   fingerprints differ ("collective #5 on ranks (0, 1, 2, 3): rank 2 issued all_gather ...;
   ranks 0, 1, 3 issued all_reduce ..."), if a rank broke a rule on its own (a dtype NCCL
   cannot move or reduce, unequal chunks, a ring whose send and receive do not pair up),
   or if a rank never arrives (it is named, with the last collective it did issue).

The fingerprints compare shapes, which is stricter than NCCL: NCCL sees element counts only,
so ranks passing [4, 8] and [8, 4] to an all-reduce run on NCCL (each summing the same flat
memory).  That is reported as a mismatch too, and its report says the counts agree: not a
hang, but almost always a bug (two ranks disagree on the layout).

Checking before issuing means the first divergence is the one reported, and nothing hangs.
While the mode is active, ``torch._scaled_mm`` (the float8 matmul of
:mod:`tensorplay_edu.float8`) is checked too, against the CUDA kernel's rules
(:mod:`tensorplay_edu.gpu_rules.scaled_mm`), and ``float8_mm`` takes its CUDA path on the CPU
(K and N zero-padded to multiples of 16), so the code a GPU will run is the code checked.

The references, and what each sees:

* ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` wraps every process group in PyTorch's
  ``ProcessGroupWrapper``: before each collective it exchanges a fingerprint (op, sequence
  number, shapes, dtypes) over a helper gloo group and raises on a mismatch, which is the idea
  here.  On a GPU it also sees collectives we do not issue (DDP's buckets, ``barrier``); it
  knows no module path and no float8 matmul, and NCCL's dtype rules only show when NCCL runs.
  Here the fingerprints travel through the store instead of a helper group, so a rank that
  never arrives is named rather than only timed out.
* NCCL's flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE=2000`` keeps each rank's last
  collectives, ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` dumps them when the watchdog fires, and
  ``python -m torch.distributed.flight_recorder.fr_trace`` (``torchfrtrace``) reads the dumps
  and names the mismatch): it costs nearly nothing, so it stays on in production, and it sees a
  kernel that never finishes, which no CPU check can; but it speaks only after the hang (the
  timeout), and only for NCCL groups.  This mode needs no GPU and speaks before the hang.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from .. import debug
from . import scaled_mm as scaled_mm_rules

__all__ = ["NCCLRulesMode", "NCCLRuleError", "Issued", "ENV", "from_env", "summary", "active"]

ENV, ENV_TIMEOUT = "TENSORPLAY_CHECK_NCCL", "TENSORPLAY_CHECK_NCCL_TIMEOUT"
_ACTIVE: list["NCCLRulesMode"] = []
_SEQ: dict[tuple[int, ...], int] = {}  # group ranks -> collectives checked on it by this process
_PREFIX = "tensorplay_nccl_rules"
# the float8 types (CUDA's, and ROCm's "fnuz" ones): moved as bytes, never reduced
_F8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
# What ProcessGroupNCCL moves (its ncclDataType map; bool and float8 travel as uint8, complex as reals)
MOVABLE = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
           torch.int64, torch.bool, torch.complex64, torch.complex128, *_F8}
_REDUCING = ("all_reduce", "reduce_scatter")


class NCCLRuleError(RuntimeError):
    """A collective (or a float8 matmul) NCCL / CUDA would refuse or hang on."""


@dataclass(frozen=True)
class Issued:
    """One collective, as one rank issued it."""
    seq: int  # its number on this group (0, 1, ...) for the life of the process, as PyTorch's
    op: str
    ranks: tuple[int, ...]  # the group's global ranks
    dtype: str
    shape: tuple[int, ...]  # the tensor the caller passed (a chunk unpadded, or the full tensor)
    wire: tuple[int, ...]  # what this rank puts on the wire (chunks padded to equal sizes)
    detail: str  # what must match besides: reduction, chunk sizes, source rank
    module: str
    phase: str
    recv: tuple[int, ...] = ()  # ring_shift: the shape this rank expects from the previous rank
    broken: str = ""  # a rule this rank broke on its own

    def what(self) -> str:
        extra = f" {self.detail}" if self.detail else ""
        return (f"{self.op} {list(self.shape)} {self.dtype}{extra} in {self.module or '(no module)'} "
                f"({self.phase})")

    def key(self) -> tuple:
        """What NCCL needs equal on every rank (a ring's shapes are paired instead)."""
        return (self.op, self.dtype, self.detail) + (() if self.op == "ring_shift" else (self.wire,))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _reduction(op) -> str:
    return getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]


def _local_rules(op: str, x: torch.Tensor, out, reduce, t: int) -> str:
    """A rule broken by this rank alone, or "" (``t``: the group's size)."""
    if x.dtype not in MOVABLE:
        return f"NCCL cannot move {_name(x.dtype)} (it moves {', '.join(sorted(map(_name, MOVABLE)))})"
    if op in _REDUCING:
        red = _reduction(reduce)
        if x.dtype in _F8:
            return f"{op} of {_name(x.dtype)}: NCCL reduces no float8 (gather it, reduce in high precision)"
        if x.dtype == torch.bool and red in ("SUM", "AVG"):
            return f"{op} {red} of bool: NCCL turns a bool SUM into MAX (a logical or), not a count"
        if x.is_complex() and red not in ("SUM", "AVG"):
            return f"{op} {red} of {_name(x.dtype)}: complex tensors are reduced only by SUM or AVG"
    if isinstance(out, (list, tuple)) and any(c.shape != x.shape for c in out):  # scatter's chunks (source)
        return f"{op}: the chunks differ in shape ({[list(c.shape) for c in out]}); NCCL wants equal chunks"
    # all_gather: out is exactly t inputs; reduce_scatter: the input is exactly t outputs.  (all_to_all
    # sends t equal pieces by construction; whether the ranks agree on them is the fingerprint's job.)
    n, m = x.numel(), out.numel() if isinstance(out, torch.Tensor) else None
    if (op == "all_gather" and m != t * n) or (op == "reduce_scatter" and n != t * m):
        big, small = ("out", "input") if op == "all_gather" else ("input", "out")
        return (f"{op}: {n} elements in, {m} out on {t} ranks: NCCL wants the {big} to be exactly {t} x the "
                f"{small} (equal chunks)")
    return ""


def check(op: str, group, x: torch.Tensor, out=None, *, reduce=None, detail: str = "", recv=None,
          shape=None) -> None:
    """Called by :mod:`tensorplay_edu.collectives` before it issues a collective (nothing when inactive):
    ``x`` / ``out`` as they go on the wire, ``shape`` this rank's tensor as the caller sees it."""
    if _ACTIVE:
        _ACTIVE[-1]._check(op, group, x, out, reduce, detail, recv, x.shape if shape is None else shape)


def active() -> bool:
    """Is a mode active on this rank?  (The float8 matmul then pads as on CUDA, so CUDA's path runs here.)"""
    return bool(_ACTIVE)


def _store():
    return dist.distributed_c10d._get_default_store()


class NCCLRulesMode:
    """Check every collective (and ``torch._scaled_mm``) against NCCL's and CUDA's rules.

    ``timeout``: seconds a rank waits for the others' fingerprints before it names the missing
    ranks (keep it below the group's own timeout, which would otherwise speak first).
    ``records``: every collective this rank issued; ``scaled_mm_calls``: float8 matmuls checked.
    Enter (and leave) it on every rank at the same points: collectives are numbered per group for
    the life of the process, across modes, so every rank must have had the same ones checked.
    """

    def __init__(self, timeout: float = 30.0):
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"NCCLRulesMode: timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.records: list[Issued] = []
        self.scaled_mm_calls = 0
        self._original_mm = None

    def __enter__(self):
        self.records, self.scaled_mm_calls = [], 0
        if not _ACTIVE:
            self._original_mm = torch._scaled_mm
            torch._scaled_mm = scaled_mm_rules.checked(self._original_mm, _count_scaled_mm, NCCLRuleError)
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        if self._original_mm is not None:
            torch._scaled_mm, self._original_mm = self._original_mm, None

    def _check(self, op, group, x, out, reduce, detail, recv, shape) -> None:
        ranks = tuple(dist.get_process_group_ranks(group)) if group is not None else \
            tuple(range(dist.get_world_size()))
        if reduce is not None:
            detail = " ".join(filter(None, [_reduction(reduce).lower(), detail]))
        seq = _SEQ.get(ranks, 0)
        _SEQ[ranks] = seq + 1
        mine = Issued(seq, op, ranks, _name(x.dtype), tuple(shape), tuple(x.shape), detail, debug.current_module(),
                      debug._PHASE[-1], tuple(recv) if recv is not None else (),
                      _local_rules(op, x, out, reduce, len(ranks)))
        for mode in _ACTIVE:
            mode.records.append(mine)
        everyone = self._exchange(mine)
        problem = _diverging(everyone) or _unpaired(everyone)
        hint = _HINT
        if not problem:
            problem, hint = _broken(everyone), _REFUSED
        if problem:
            raise NCCLRuleError(f"NCCL rules, collective #{seq} on ranks {ranks}: {problem}. {hint}")

    def _exchange(self, mine: Issued) -> dict[int, Issued]:
        """Every group rank's fingerprint of collective ``mine.seq``, through the default store."""
        store, me = _store(), dist.get_rank()
        base = f"{_PREFIX}/{','.join(map(str, mine.ranks))}/{mine.seq}/"
        store.set(f"{_PREFIX}/last/{me}", f"#{mine.seq} on ranks {mine.ranks}: {mine.what()}")
        store.set(base + str(me), json.dumps(asdict(mine)))
        keys = [base + str(r) for r in mine.ranks]
        start, pause, limit = time.monotonic(), 1e-4, self.timeout
        while not store.check(keys):  # polled here: a FileStore's own wait sleeps 10 ms a round
            if time.monotonic() - start > limit:
                missing = [r for r, k in zip(mine.ranks, keys) if not store.check([k])]
                raise NCCLRuleError(_missing_report(store, mine, missing, limit))
            time.sleep(pause)
            pause = min(2 * pause, 0.005)
        if mine.seq:  # every rank has written #seq, so it has read #seq - 1: this rank's key of it can go
            store.delete_key(f"{_PREFIX}/{','.join(map(str, mine.ranks))}/{mine.seq - 1}/{me}")
        return {r: Issued(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(store.get(key)).items()})
                for r, key in zip(mine.ranks, keys)}

    def table(self) -> str:
        """One line per collective this rank issued: number on its group, phase, module, op, ..."""
        head = ("#", "phase", "module", "op", "ranks", "shape", "dtype", "detail")
        body = [(str(r.seq), r.phase, r.module or "-", r.op, ",".join(map(str, r.ranks)),
                 "x".join(map(str, r.shape)) or "scalar", r.dtype, r.detail or "-") for r in self.records]
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        fmt = "  ".join("{:<%d}" % w for w in widths)
        lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*b) for b in body]
        return "\n".join(line.rstrip() for line in lines)


def _count_scaled_mm() -> None:
    for mode in _ACTIVE:
        mode.scaled_mm_calls += 1


_HINT = ("On NCCL this would hang until the watchdog fires (10 minutes by default), or mix the data: every rank of "
         "a group must issue the same collectives in the same order (look for a branch on the rank, or an uneven "
         "shape)")


_REFUSED = ("gloo let it through here; on NCCL it is an error, or a different answer than gloo's (fix the dtype "
            "or the shapes before the collective)")


def _ranks(rs) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def _diverging(everyone: dict[int, Issued]) -> str:
    kinds: dict[tuple, list[int]] = {}
    for r, issued in everyone.items():
        kinds.setdefault(issued.key(), []).append(r)
    if len(kinds) == 1:
        return ""
    parts = sorted(kinds.values(), key=lambda rs: (len(rs), rs))  # the odd ones out first
    report = "; ".join(f"{_ranks(rs)} issued {everyone[rs[0]].what()}" for rs in parts)
    if len({(i.op, i.dtype, i.detail, math.prod(i.wire)) for i in everyone.values()}) == 1:  # only shapes differ
        report += (" (the same op, dtype and element count: NCCL compares counts only and would run it, "
                   "on data the ranks lay out differently; almost always a bug)")
    return report


def _broken(everyone: dict[int, Issued]) -> str:
    kinds: dict[tuple, list[int]] = {}
    for r, issued in everyone.items():
        if issued.broken:
            kinds.setdefault((issued.what(), issued.broken), []).append(r)
    return "; ".join(f"{_ranks(rs)} issued {what}: {broken}" for (what, broken), rs in kinds.items())


def _unpaired(everyone: dict[int, Issued]) -> str:
    """A ring: rank r's receive must match what the previous rank sends (shape and dtype)."""
    ranks = list(everyone)
    if everyone[ranks[0]].op != "ring_shift":
        return ""
    bad = [f"rank {r} expects {list(everyone[r].recv)} {everyone[r].dtype} from rank {p}, which sends "
           f"{list(everyone[p].shape)} {everyone[p].dtype}" for r, p in zip(ranks, ranks[-1:] + ranks[:-1])
           if everyone[r].recv != everyone[p].shape or everyone[r].dtype != everyone[p].dtype]
    module = everyone[ranks[0]].module
    return "; ".join(bad) + (f" (ring_shift in {module})" if bad and module else "")


def _missing_report(store, mine: Issued, missing: list[int], timeout: float) -> str:
    lasts = []
    for r in missing:
        key = f"{_PREFIX}/last/{r}"
        last = store.get(key).decode() if store.check([key]) else "none"
        lasts.append(f"rank {r} last issued (and may be waiting in): {last}")
    return (f"NCCL rules, collective #{mine.seq} on ranks {mine.ranks}: {_ranks(missing)} did not issue it within "
            f"{timeout:g} s (a skipped collective, or collectives on two groups in different orders); "
            f"rank {dist.get_rank()} issued {mine.what()}; " + "; ".join(lasts) + f". {_HINT}")


_FROM_ENV: list[NCCLRulesMode] = []


def summary() -> str:
    """What the mode of :func:`from_env` checked on this rank ("" when it is off)."""
    if not _FROM_ENV:
        return ""
    mode = _FROM_ENV[0]
    return (f"NCCL rules ({ENV}): {len(mode.records)} collectives and {mode.scaled_mm_calls} float8 matmuls checked "
            f"on rank {dist.get_rank()}, no violation")


def from_env(timeout: float = 30.0) -> NCCLRulesMode | None:
    """Enter a mode for the rest of this rank when ``TENSORPLAY_CHECK_NCCL`` is set (not "" or "0");
    ``TENSORPLAY_CHECK_NCCL_TIMEOUT`` overrides ``timeout``.  Called where ranks start (torchrun, launch)."""
    if os.environ.get(ENV, "") in ("", "0"):
        return None
    if not _FROM_ENV:
        _FROM_ENV.append(NCCLRulesMode(float(os.environ.get(ENV_TIMEOUT) or timeout)).__enter__())
    return _FROM_ENV[0]

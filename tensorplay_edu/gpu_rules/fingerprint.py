"""NCCL's rules as a table: one collective's fingerprint, and what makes a group's fingerprints wrong.

Every rank of a group writes an :class:`Issued` for each collective it is about to issue.  NCCL
refuses, hangs on, or garbles a collective when

* one rank breaks a rule alone (:func:`local_rules`): a dtype NCCL cannot move or reduce,
  unequal chunks, a gather or scatter whose sizes are not t to 1;
* the ranks disagree (:func:`diverging`): another op, dtype, reduction, chunking or shape.
  Shapes are compared, which is stricter than NCCL (it sees element counts only): ranks passing
  [4, 8] and [8, 4] run on NCCL, on data they lay out differently, and are reported with a note;
* a ring's send and receive do not pair up (:func:`unpaired`).

:mod:`tensorplay_edu.gpu_rules.nccl` collects the fingerprints and raises the reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["Issued", "MOVABLE", "local_rules", "diverging", "broken", "unpaired", "missing_report", "HINT",
           "REFUSED"]

# the float8 types (CUDA's, and ROCm's "fnuz" ones): moved as bytes, never reduced
_F8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
# What ProcessGroupNCCL moves (its ncclDataType map; bool and float8 travel as uint8, complex as reals)
MOVABLE = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
           torch.int64, torch.bool, torch.complex64, torch.complex128, *_F8}
_REDUCING = ("all_reduce", "reduce_scatter")

HINT = ("On NCCL this would hang until the watchdog fires (10 minutes by default), or mix the data: every rank of "
        "a group must issue the same collectives in the same order (look for a branch on the rank, or an uneven "
        "shape)")

REFUSED = ("gloo let it through here; on NCCL it is an error, or a different answer than gloo's (fix the dtype "
           "or the shapes before the collective)")


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


def name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def reduction(op) -> str:
    return getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]


def local_rules(op: str, x: torch.Tensor, out, reduce, t: int) -> str:
    """A rule broken by this rank alone, or "" (``t``: the group's size)."""
    if x.dtype not in MOVABLE:
        return f"NCCL cannot move {name(x.dtype)} (it moves {', '.join(sorted(map(name, MOVABLE)))})"
    if op in _REDUCING:
        red = reduction(reduce)
        if x.dtype in _F8:
            return f"{op} of {name(x.dtype)}: NCCL reduces no float8 (gather it, reduce in high precision)"
        if x.dtype == torch.bool and red in ("SUM", "AVG"):
            return f"{op} {red} of bool: NCCL turns a bool SUM into MAX (a logical or), not a count"
        if x.is_complex() and red not in ("SUM", "AVG"):
            return f"{op} {red} of {name(x.dtype)}: complex tensors are reduced only by SUM or AVG"
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


def _ranks(rs) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def diverging(everyone: dict[int, Issued]) -> str:
    """Which ranks issued what, when they did not all issue the same collective ("" when they did)."""
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


def broken(everyone: dict[int, Issued]) -> str:
    """The rules single ranks broke (their :func:`local_rules`), grouped by rank."""
    kinds: dict[tuple, list[int]] = {}
    for r, issued in everyone.items():
        if issued.broken:
            kinds.setdefault((issued.what(), issued.broken), []).append(r)
    return "; ".join(f"{_ranks(rs)} issued {what}: {why}" for (what, why), rs in kinds.items())


def unpaired(everyone: dict[int, Issued]) -> str:
    """A ring: rank r's receive must match what the previous rank sends (shape and dtype)."""
    ranks = list(everyone)
    if everyone[ranks[0]].op != "ring_shift":
        return ""
    bad = [f"rank {r} expects {list(everyone[r].recv)} {everyone[r].dtype} from rank {p}, which sends "
           f"{list(everyone[p].shape)} {everyone[p].dtype}" for r, p in zip(ranks, ranks[-1:] + ranks[:-1])
           if everyone[r].recv != everyone[p].shape or everyone[r].dtype != everyone[p].dtype]
    module = everyone[ranks[0]].module
    return "; ".join(bad) + (f" (ring_shift in {module})" if bad and module else "")


def missing_report(lasts: dict[int, str], mine: Issued, timeout: float) -> str:
    """The ranks that never wrote their fingerprint of ``mine``, with the last collective each did issue."""
    missing = list(lasts)
    said = "; ".join(f"rank {r} last issued (and may be waiting in): {last}" for r, last in lasts.items())
    return (f"NCCL rules, collective #{mine.seq} on ranks {mine.ranks}: {_ranks(missing)} did not issue it within "
            f"{timeout:g} s (a skipped collective, or collectives on two groups in different orders); "
            f"rank {dist.get_rank()} issued {mine.what()}; " + said + f". {HINT}")

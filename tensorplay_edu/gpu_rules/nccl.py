"""NCCLRulesMode: what NCCL and CUDA's float8 matmul would refuse or hang on, checked on the CPU.

    with NCCLRulesMode() as rules:          # on every rank, at the same point
        loss = model(tokens).sum()
        loss.backward()
    print(rules.table())                    # every collective this rank issued, numbered per group

    TENSORPLAY_CHECK_NCCL=1 torchrun --nproc-per-node 4 -m tensorplay_edu.lab.demo    # the same, unchanged code

gloo forgives what NCCL does not: two ranks that issue different collectives fail at once on gloo,
but on NCCL they hang until the watchdog fires, or finish with garbled data.  So, while the mode is
active, it watches every collective (:data:`tensorplay_edu.debug.WATCHERS`) and, before it is issued,
each rank of its group writes its fingerprint (:mod:`~tensorplay_edu.gpu_rules.fingerprint`) under
the collective's number on that group into the default group's store, waits ``timeout`` seconds
for the others', and raises :class:`NCCLRuleError` on every rank, with the same report, when the
fingerprints break a rule or a rank never arrives (it is named, with the last collective it issued).
The first divergence is the one reported, and nothing hangs.

Collectives are numbered per group for the life of the process, across modes: enter and leave the
mode on every rank at the same points.  The store keeps at most two fingerprints per group and rank.
While the mode is active, ``torch._scaled_mm`` is checked against the CUDA kernel's rules
(:mod:`~tensorplay_edu.gpu_rules.scaled_mm`), and ``float8_mm`` takes its CUDA path on the CPU (K and N
zero-padded to multiples of 16), so the code a GPU will run is the code checked.
PyTorch's own checks (``TORCH_DISTRIBUTED_DEBUG=DETAIL``, NCCL's flight recorder): docs/nccl_checker.md.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from .. import debug
from . import scaled_mm as scaled_mm_rules
from .fingerprint import (HINT, REFUSED, Issued, broken, diverging, local_rules, missing_report, name, reduction,
                          unpaired)

__all__ = ["NCCLRulesMode", "NCCLRuleError", "Issued", "ENV", "from_env", "summary", "active"]

ENV, ENV_TIMEOUT = "TENSORPLAY_CHECK_NCCL", "TENSORPLAY_CHECK_NCCL_TIMEOUT"
_ACTIVE: list["NCCLRulesMode"] = []
_SEQ: dict[tuple[int, ...], int] = {}  # group ranks -> collectives checked on it by this process
_PREFIX = "tensorplay_nccl_rules"


class NCCLRuleError(RuntimeError):
    """A collective (or a float8 matmul) NCCL / CUDA would refuse or hang on."""


def check(op: str, group, x: torch.Tensor, out=None, *, reduce=None, detail: str = "", recv=None,
          shape=None) -> None:
    """The watcher (in :data:`tensorplay_edu.debug.WATCHERS` while a mode is active), called before a
    collective is issued: ``x`` / ``out`` as they go on the wire, ``shape`` this rank's tensor as the
    caller sees it.  The innermost mode checks it."""
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
            debug.WATCHERS.append(check)  # every collective now passes through check first
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        if not _ACTIVE:
            debug.WATCHERS.remove(check)
        if self._original_mm is not None:
            torch._scaled_mm, self._original_mm = self._original_mm, None

    def _check(self, op, group, x, out, reduce, detail, recv, shape) -> None:
        ranks = tuple(dist.get_process_group_ranks(group)) if group is not None else \
            tuple(range(dist.get_world_size()))
        if reduce is not None:
            detail = " ".join(filter(None, [reduction(reduce).lower(), detail]))
        seq = _SEQ.get(ranks, 0)
        _SEQ[ranks] = seq + 1
        mine = Issued(seq, op, ranks, name(x.dtype), tuple(shape), tuple(x.shape), detail, debug.current_module(),
                      debug._PHASE[-1], tuple(recv) if recv is not None else (),
                      local_rules(op, x, out, reduce, len(ranks)))
        for mode in _ACTIVE:
            mode.records.append(mine)
        everyone = self._exchange(mine)
        problem = diverging(everyone) or unpaired(everyone)
        hint = HINT
        if not problem:
            problem, hint = broken(everyone), REFUSED
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
                lasts = {r: _last(store, r) for r, k in zip(mine.ranks, keys) if not store.check([k])}
                raise NCCLRuleError(missing_report(lasts, mine, limit))
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


def _last(store, rank: int) -> str:
    """The last collective ``rank`` issued (its own words in the store), or "none"."""
    key = f"{_PREFIX}/last/{rank}"
    return store.get(key).decode() if store.check([key]) else "none"


def _count_scaled_mm() -> None:
    for mode in _ACTIVE:
        mode.scaled_mm_calls += 1


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

"""Timeline: when each rank computed and when its transfers were in flight.

    with Timeline() as tl:
        loss.backward()
    tl.intervals     # [Interval("compute", "chunk 2", start_s, end_s), Interval("transfer", ...), ...]

The decomposed collectives of async TP (:mod:`tensorplay_edu.async_tp`) mark their
matmuls (``compute``) and their ring steps (``transfer``: from the moment a chunk is handed
to the backend until the rank has it in hand, which it checks after its matmul: a transfer
bar as long as the matmul beside it may have finished earlier; one that outlasts it shows
the rank waiting).  ``Timeline.origin_ns`` (``perf_counter_ns`` at entry, one clock for all
processes of a machine) lines ranks up.  On the CPU the clock is ``time.perf_counter_ns``, and
each interval also carries the recording thread's CPU time at its ends (``cpu_start``, ``cpu_end``:
``time.thread_time``, seconds since the recorder opened), so that a stretch whose CPU time falls
short of its wall time shows the thread not running (descheduled, or blocked in a call) rather than
working; on a GPU, CUDA events on the current stream, read when the recorder closes (so recording
does not synchronise the GPU; no CPU times).  ``viz.draw_timeline`` draws it; :func:`overlap` turns the three
measurements of a ring (fused, transfers alone, matmuls alone) and its size into the fraction of
the overlap the ring could reach (:func:`ring_ideal`) that it reached.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

__all__ = ["Timeline", "Interval", "interval", "overlap", "ring_ideal"]

_ACTIVE: list["Timeline"] = []


@dataclass(frozen=True)
class Interval:
    kind: str  # "compute" or "transfer"
    label: str
    start: float  # seconds since the recorder opened
    end: float
    cpu_start: float | None = None  # the recording thread's CPU seconds since the recorder opened (CPU only)
    cpu_end: float | None = None


class Timeline:
    """Context manager recording this rank's intervals while it is active."""

    def __init__(self, device: torch.device | None = None):
        self.cuda = device is not None and device.type == "cuda"
        self.intervals: list[Interval] = []
        self._open: list[tuple] = []

    def __enter__(self):
        self._t0 = self.origin_ns = time.perf_counter_ns()
        self._c0 = time.thread_time_ns()
        if self.cuda:
            self._e0 = torch.cuda.Event(enable_timing=True)
            self._e0.record()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        if self.cuda:  # events are read once, at the end
            torch.cuda.synchronize()
            for kind, label, start, end in self._open:
                self.intervals.append(Interval(kind, label, self._e0.elapsed_time(start) / 1e3,
                                               self._e0.elapsed_time(end) / 1e3))
        self.intervals.sort(key=lambda i: i.start)

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return (time.perf_counter_ns() - self._t0) / 1e9, (time.thread_time_ns() - self._c0) / 1e9

    def add(self, kind: str, label: str, start, end) -> None:
        if self.cuda:
            self._open.append((kind, label, start, end))
        else:  # (wall, thread CPU) marks
            self.intervals.append(Interval(kind, label, start[0], end[0], start[1], end[1]))

    def total(self, kind: str) -> float:
        return sum(i.end - i.start for i in self.intervals if i.kind == kind)


@contextlib.contextmanager
def interval(kind: str, label: str):
    """Mark the enclosed work on every active recorder (nothing when none is active)."""
    if not _ACTIVE:
        yield
        return
    starts = [tl._mark() for tl in _ACTIVE]
    try:
        yield
    finally:
        for tl, start in zip(list(_ACTIVE), starts):
            tl.add(kind, label, start, tl._mark())


def mark() -> list:
    """The current time on every active recorder (for intervals that span code, like a transfer)."""
    return [(tl, tl._mark()) for tl in _ACTIVE]


def close(kind: str, label: str, marks: list) -> None:
    """End the intervals begun by :func:`mark` (on the recorders that are still active)."""
    for tl, start in marks:
        if tl in _ACTIVE:
            tl.add(kind, label, start, tl._mark())


def ring_ideal(comm: float, comp: float, t: int) -> float:
    """The best a ring of ``t`` steps can do: each of its t-1 transfers (``comm / (t-1)`` each) hides
    under one chunk's matmuls (``comp / t``) or the other way round, and the last chunk's matmuls
    have nothing left to hide under: ``(t-1) * max(comm/(t-1), comp/t) + comp/t``."""
    if t < 2:
        return comp
    return (t - 1) * max(comm / (t - 1), comp / t) + comp / t


def overlap(fused: float, comm: float, comp: float, t: int) -> float:
    """How much of the possible overlap a ring reached: ``(serial - fused) / (serial - ideal)`` with
    ``serial = comm + comp`` (transfers and matmuls one after the other, each measured alone) and the
    ring's own :func:`ring_ideal`.  1 at the ideal, 0 for no overlap, below 0 slower than serial; the
    three times are measured at different moments, so noise can also push it a little above 1."""
    serial, ideal = comm + comp, ring_ideal(comm, comp, t)
    if serial - ideal <= 0:
        return 0.0
    return (serial - fused) / (serial - ideal)

"""How a launch fails: which rank failed first and why, in words a user can act on, and ranks
that hang outside any collective.

:func:`~tensorplay_edu.launcher.launch` reads every rank's result or error as it arrives; this
module turns what it read into one error:

* a rank's traceback, or a dead rank's last log lines, are matched against gloo's words
  (``_KINDS``): a wrong size, a lost peer, a timeout, each a sign of mismatched collectives,
  and the error carries a hint (and, for a wrong size, the usual cause: ``from_local`` of
  uneven pieces without ``shape=``);
* the rank that failed first is named, not one that only lost its connection to it;
* :func:`_check_arguments` refuses bad arguments at the call, before any rank starts;
* :class:`_IdleWatch` tells ranks that all wait outside any collective (no CPU used for a
  while: a sleep, a lock) from ranks that compute, which are never cut short.
"""

from __future__ import annotations

import contextlib
import os
import time

__all__ = ["RankError"]


class RankError(RuntimeError):
    """A rank failed; ``rank`` is which, ``remote_traceback`` its traceback (if it had one)."""

    def __init__(self, message: str, rank: int, remote_traceback: str = ""):
        super().__init__(message)
        self.rank, self.remote_traceback = rank, remote_traceback


_GRACE = 2.0  # seconds to wait for the root cause once a rank says that its peer vanished
_KINDS = {  # gloo's words (in a traceback or a dead rank's log), checked in this order -> what the rank did
    "size": (("size doesn't match",), "received a wrong size in a collective (a collective mismatch)"),
    "peer": (("closed by peer", "connection reset", "broken pipe", "socket closed"), "lost its peer in a collective"),
    "timeout": (("timed out", "timeout"), "timed out waiting in a collective")}
_HINT = ("the ranks probably issued different collectives, e.g. rank 0 all_reduce while rank 1 all_gather, one rank "
         "skipped one or issued an extra one, or they passed different sizes")
_FROM_LOCAL = (". A frequent cause: DTensor.from_local of uneven pieces without shape= (each rank infers an even "
               "global shape from its own piece): pass shape= to DTensor.from_local, or run_check=True")


def _check_arguments(fn, world_size, timeout, threads, backend) -> None:
    """``launch``'s arguments, checked in the caller: a wrong one names itself and the fix."""
    if not callable(fn):
        raise TypeError(f"launch: fn must be a function to run on every rank, got {fn!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):  # True would run one rank
        raise TypeError(f"launch: world_size must be an int (the number of ranks), got {world_size!r}, a "
                        f"{type(world_size).__name__}: pass e.g. launch(fn, 2)")
    if world_size < 1:
        raise ValueError(f"launch: world_size must be a positive int (the number of ranks), got {world_size!r}: "
                         "pass 1 or more")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"launch: timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"launch: threads must be a positive int, got {threads!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"launch: backend must be 'gloo' or 'nccl', got {backend!r}")


def _kind(text: str):
    """Which of ``_KINDS`` gloo's words in ``text`` say, or None."""
    return next((k for k, (signs, _) in _KINDS.items() if any(s in text.lower() for s in signs)), None)



_IDLE_EXTRA = 3.0  # a stuck collective fails in its rank after `timeout`: let that error come first


class _IdleWatch:
    """Have all the given ranks used (almost) no CPU for ``window`` seconds?  Read from
    ``/proc/<pid>/stat`` (user + system time); where there is no ``/proc``, never.  ``clock`` and
    ``cpu`` (pid -> CPU seconds, or None) replace the real ones in tests."""

    def __init__(self, procs, window: float, clock=time.monotonic, cpu=None):
        self.procs, self.window, self.seen = procs, window, {}  # rank -> [(time, cpu seconds)]
        self.clock, self.cpu = clock, cpu or self._cpu
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _cpu(self, pid: int) -> float | None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime
        except (OSError, IndexError, ValueError):
            return None

    def all_idle(self, ranks) -> bool:
        now, idle = self.clock(), True
        for r in ranks:
            cpu = self.cpu(self.procs[r].pid)
            if cpu is None:
                return False
            history = self.seen.setdefault(r, [])
            history.append((now, cpu))
            while len(history) > 1 and history[1][0] <= now - self.window:
                history.pop(0)  # keep one sample at least `window` old
            start, cpu0 = history[0]
            idle = idle and now - start >= self.window and cpu - cpu0 < 0.05
        return idle


def _rank_error(failed, procs, results) -> RankError:
    """The error of the rank that failed first (not of one that only lost its peer), with a hint."""
    r, tb, kind = next((f for f in failed if f[2] != "peer"), failed[0])
    n = len(procs)
    message = f"rank {r} of {n} raised:\n{tb}" if tb else (
        f"rank {r} of {n} exited with code {procs[r].exitcode} before returning (no Python traceback: "
        "os._exit, a signal or a crash; its output is above)")
    if kind:
        message += f"\n(rank {r} {_KINDS[kind][1]}: {_HINT}{_FROM_LOCAL if kind == 'size' else ''}.)"
    lost = [q for q, _, k in failed if k == "peer" and q != r]
    done = [q for q in results if procs[q].exitcode is not None]  # in the order their results came
    if kind != "peer" and lost:
        message += f"\n(rank {r} failed first; then rank(s) {lost} lost their connection to it: a consequence.)"
    elif kind == "peer" and done:
        message += f"\n(rank {done[0]} had returned its result and ended first.)"
    return RankError(message, r, tb)


def _read(path: str) -> str:
    """A rank's log, or "" if it never wrote one."""
    with contextlib.suppress(FileNotFoundError), open(path, errors="replace") as f:
        return f.read()
    return ""

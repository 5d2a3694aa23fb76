"""launch's idle watch (launcher/faults.py's _IdleWatch): ranks are called hung only when EVERY one of
them has used no CPU for the whole window. Fake CPU readings and a fake clock: no real timing."""

from types import SimpleNamespace

from tensorplay_edu.launcher.faults import _IdleWatch


def _watch(busy_ranks, n=3, window=10.0):
    """A watch over n fake ranks (pid = rank) whose CPU time grows 1 s per reading on ``busy_ranks``."""
    clock, readings = [0.0], {r: 0.0 for r in range(n)}

    def cpu(pid):
        readings[pid] += 1.0 if pid in busy_ranks else 0.0
        return readings[pid]

    watch = _IdleWatch([SimpleNamespace(pid=r) for r in range(n)], window, clock=lambda: clock[0], cpu=cpu)
    return watch, clock


def _verdicts(watch, clock, ranks, times):
    out = []
    for t in times:
        clock[0] = t
        out.append(watch.all_idle(ranks))
    return out


def test_all_idle_only_when_every_rank_is_idle_for_the_window():
    watch, clock = _watch(busy_ranks=())
    assert _verdicts(watch, clock, [0, 1, 2], [0.0, 5.0, 9.9, 10.0, 20.0]) == [False, False, False, True, True]


def test_one_busy_rank_anywhere_keeps_the_ranks_alive():
    """The busy rank first, in the middle, last: never all idle (a watch that looked at one rank
    only, the first or the last, would call the others hung)."""
    for busy in (0, 1, 2):
        watch, clock = _watch(busy_ranks=(busy,))
        assert not any(_verdicts(watch, clock, [0, 1, 2], [0.0, 10.0, 20.0, 30.0])), busy


def test_a_rank_that_stops_computing_starts_its_window_then():
    """Busy until t = 10, idle after: all idle once a whole window of readings shows no CPU, not before."""
    watch, clock = _watch(busy_ranks=(1,))
    assert _verdicts(watch, clock, [0, 1], [0.0, 5.0, 10.0]) == [False, False, False]
    watch.cpu = lambda pid: 3.0 if pid == 1 else 0.0  # rank 1 now stays at 3 CPU seconds
    assert _verdicts(watch, clock, [0, 1], [15.0, 19.0, 25.0, 30.0]) == [False, False, True, True]


def test_no_reading_means_not_idle():
    watch = _IdleWatch([SimpleNamespace(pid=0)], 1.0, clock=lambda: 100.0, cpu=lambda pid: None)
    assert not watch.all_idle([0]) and not watch.all_idle([0])

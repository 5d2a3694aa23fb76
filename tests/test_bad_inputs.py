"""The catalogue of bad inputs: each must fail with a clear error of the right type whose
message names the argument, module or key at fault (and, where there is one, the fix).

All cases run in one 2-rank launch (rank_bad_inputs.run_all); each is its own test here, so
a failure names the case.  Launcher faults (a rank that raises, dies or hangs, mismatched
collectives) are in test_launch.py; loss_parallel's N-D mesh errors in test_loss_parallel_2d.py."""

import pytest

import rank_bad_inputs
from tensorplay_edu import launch


@pytest.fixture(scope="module")
def outcomes():
    ranks = launch(rank_bad_inputs.run_all, 2)
    assert ranks[0].keys() == ranks[1].keys()
    return ranks


def test_the_catalogue_is_large():
    assert len(rank_bad_inputs.CASES) >= 30


@pytest.mark.parametrize("case", list(rank_bad_inputs.CASES))
def test_bad_input_is_a_clear_error(outcomes, case):
    _, exc_type, fragments = rank_bad_inputs.CASES[case]
    for rank, results in enumerate(outcomes):
        got = results[case]
        assert got is not None, f"{case}: rank {rank} raised nothing"
        name, message = got
        assert name == exc_type.__name__, f"{case}: rank {rank} raised {name}, not {exc_type.__name__}: {message}"
        missing = [f for f in fragments if f not in message]
        assert not missing, f"{case}: rank {rank}'s message lacks {missing}: {message}"


def test_a_plan_with_a_bad_key_changes_nothing_and_the_corrected_plan_applies():
    for fails, n in launch(rank_bad_inputs.plan_with_a_bad_key_changes_nothing, 2):
        assert not fails and n == 3, fails


# Bad inputs to launch itself: errors in the calling process, at the call, before any rank starts (issue 18:
# launch(None) failed only inside the ranks, 7.7 s later; launch(timeout=-1) got gloo's "Invalid timeout").
LAUNCH_CASES = {
    "launch(None)": (lambda: launch(None, 2), TypeError, ["fn must be a function", "None"]),
    "launch(timeout=-1)": (lambda: launch(print, 2, timeout=-1), ValueError, ["timeout", "positive", "-1"]),
    "launch(timeout='60')": (lambda: launch(print, 2, timeout="60"), ValueError, ["timeout", "'60'"]),
    "launch(threads=0)": (lambda: launch(print, 2, threads=0), ValueError, ["threads", "positive int"]),
    "launch(f, True)": (lambda: launch(print, True), TypeError, ["world_size", "True", "bool", "launch(fn, 2)"]),
    "launch(f, 2.0)": (lambda: launch(print, 2.0), TypeError, ["world_size", "2.0", "float", "an int"]),
    "launch(f, 0)": (lambda: launch(print, 0), ValueError, ["world_size", "positive int", "got 0", "1 or more"]),
}


@pytest.mark.parametrize("case", list(LAUNCH_CASES))
def test_bad_input_to_launch_is_a_clear_error_at_the_call(case):
    call, exc_type, fragments = LAUNCH_CASES[case]
    with pytest.raises(exc_type) as info:
        call()
    missing = [f for f in fragments if f not in str(info.value)]
    assert not missing, f"{case}: the message lacks {missing}: {info.value}"

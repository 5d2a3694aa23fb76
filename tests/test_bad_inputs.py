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

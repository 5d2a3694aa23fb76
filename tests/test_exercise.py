"""check(): the verdict of a "Try it" cell. Blank answers and wrong ones print, never raise."""

import torch

from tensorplay_edu.lab.exercise import check, untried


def test_blanks_anywhere_are_not_tried_yet(capsys):
    for answer in (..., {"forward": ..., "backward": 1}, [1, ...], (..., 2)):
        assert untried(answer) and check(answer, {"forward": 1, "backward": 1}) is None
        assert "not tried yet" in capsys.readouterr().out
    assert not untried({"a": 1, "b": [2, 3]})


def test_right_answers_say_right(capsys):
    assert check({"all_gather": 1}, {"all_gather": 1}, name="counts")
    assert check(0.1 + 0.2, 0.3) and check(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-9]))
    assert check([1, (2, 3)], [1, (2, 3)]) and check(True, True)
    assert capsys.readouterr().out.splitlines()[0] == "counts: right"


def test_wrong_answers_say_where_and_do_not_raise(capsys):
    cases = [({"all_gather": 1}, {"all_gather": 2}, "'all_gather': 1 is not right"),
             ({"all_gather": 1}, {"all_reduce": 1}, "'all_gather' should not be there"),
             ({"all_gather": 1}, {"all_gather": 1, "all_reduce": 1}, "1 key(s) missing"),
             (torch.zeros(2, 3), torch.zeros(3, 2), "shape [2, 3] is not the shape it has"),
             (torch.tensor([[0.0, 3.0]]), torch.tensor([[0.0, 2.0]]), "at [0, 1]: 3.0 is not right"),
             ([1, 2], [1, 2, 3], "2 items: not the right number"),
             (0.25, 0.5, "0.25 is not right"),
             (True, False, "True is not right"),
             ("a string", torch.zeros(2), "cannot compare str with Tensor")]
    for answer, expected, why in cases:
        assert check(answer, expected, hint="go through the table") is None
        out = capsys.readouterr().out
        assert "not yet: " in out and why in out and "hint: go through the table" in out, out
        if not isinstance(expected, torch.Tensor):  # the right answer is never printed
            assert repr(expected) not in out.split("not yet: ", 1)[1], out


def test_check_against_one_process_names_the_rank_and_the_place():
    from tensorplay_edu.lab.exercise import check_against_one_process
    per_rank = [{"y": torch.ones(2), "n": 1, "extra": 0}, {"y": torch.ones(2), "n": 2, "extra": 0}]
    check_against_one_process(per_rank, lambda r: {"y": torch.ones(2), "n": r + 1})  # extra keys ignored
    for expected, where in ((lambda r: {"y": torch.ones(2), "n": 1}, "rank 1, n: 2, expected 1"),
                            (lambda r: {"y": torch.zeros(2) if r else torch.ones(2), "n": r + 1}, "rank 1, y")):
        try:
            check_against_one_process(per_rank, expected)
        except AssertionError as e:
            assert where in str(e), str(e)
        else:
            raise AssertionError("a difference went unnoticed")


def test_bools_are_not_numbers(capsys):
    """True == 1 in Python, but a prediction of True where a count is asked for (or 1 where True or
    False is) is a wrong answer, and the verdict says why."""
    import numpy as np
    assert check({"pays": np.float64(0.7) >= 1}, {"pays": False})  # numpy's bool is a bool
    for answer, expected, why in ((True, 1, "True is a bool where a number is asked for"),
                                  (1, True, "1 is a number where True or False is asked for"),
                                  (0.0, False, "0.0 is a number where True or False is asked for"),
                                  ("True", True, "'True' is a str where True or False is asked for"),
                                  ([True, 2], [1, 2], "[0] True is a bool where a number")):
        assert check(answer, expected) is None
        assert why in capsys.readouterr().out


def test_integers_compare_exactly_and_floats_relatively(capsys):
    """The documented tolerances: rtol (relative) for floats, none for integers. Each case fails
    under the other reading (an absolute tolerance for floats, rtol for integers)."""
    assert check(1e6 + 0.5, 1e6)  # 5e-7 relative: right, though 0.5 apart
    assert check(2.0, 2) and check(2, 2.0 + 1e-9)  # a float on either side: rtol
    for answer, expected, kwargs, why in ((1e-9, 2e-9, {}, "1e-09 is not right"),  # 1e-9 apart, 50% off
                                          (1000001, 1000000, {"rtol": 1e-3}, "1000001 is not right"),
                                          (torch.tensor([7, 1000001]), torch.tensor([7, 1000000]), {"rtol": 1e-3},
                                           "at [1]: 1000001 is not right")):
        assert check(answer, expected, **kwargs) is None
        assert why in capsys.readouterr().out
    assert check(1.0005, 1.0, rtol=1e-3) and check(torch.tensor([1.0005]), torch.tensor([1.0]), rtol=1e-3)


def test_complex_and_nan(capsys):
    nan = float("nan")
    assert check(1 + 2j, 1 + 2j) and check(nan, nan) and check(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0]))
    for answer, expected, why in ((1 + 3j, 1 + 2j, "(1+3j) is not right"),  # the imaginary part counts
                                  (nan, 0.5, "nan is not right"), (0.5, nan, "0.5 is not right"),
                                  (torch.tensor([1 + 3j]), torch.tensor([1 + 2j]), "at [0]: (1+3j) is not right"),
                                  (torch.tensor([1.0, nan]), torch.tensor([1.0, 2.0]), "at [1]: nan is not right")):
        assert check(answer, expected) is None
        out = capsys.readouterr().out
        assert why in out and "too" not in out, out


def test_tensor_verdict_names_the_first_wrong_place(capsys):
    """Not the place of the largest difference: there [1] is within rtol, [0] is not."""
    assert check(torch.tensor([1.0, 1e6 + 0.5]), torch.tensor([1.1, 1e6])) is None
    assert "at [0]: 1.0 is not right" in capsys.readouterr().out


def test_a_wrong_number_never_says_which_way(capsys):
    """"Too high" on one try and "too low" on the next would let a learner bisect to the answer."""
    for answer, expected in ((3, 2), (1, 2), (2.5, 2.0), (1.5, 2.0), (torch.tensor([3.0]), torch.tensor([2.0]))):
        assert check(answer, expected) is None
        out = capsys.readouterr().out
        assert "is not right" in out and "high" not in out and "low" not in out, out


def test_try_it_runs_the_experiment_only_once_predicted(capsys):
    """The learner's cell holds no measured value: TryIt measures at the first complete prediction,
    once, and keeps the result for the next try and the solution."""
    from tensorplay_edu.lab.exercise import TryIt
    runs = []

    def measure():
        runs.append(1)
        return {"forward": 2, "backward": 1}

    try_counts = TryIt("counts", measure, hint="count the f and g")
    assert try_counts({"forward": ..., "backward": 1}) is None and runs == []
    assert "counts: not tried yet" in capsys.readouterr().out
    assert try_counts({"forward": 1, "backward": 1}) is None and runs == [1]
    out = capsys.readouterr().out
    assert "'forward': 1 is not right" in out and "hint: count the f and g" in out and "2" not in out, out
    assert try_counts({"forward": 2, "backward": 1}) is True and runs == [1]
    assert capsys.readouterr().out == "counts: right\n"
    assert try_counts.measured == {"forward": 2, "backward": 1} and repr(try_counts) == "TryIt('counts')"


def test_try_it_grades_an_answer_that_is_code(capsys):
    """With ``grade``, the answer (here a function standing in for a plan) is run and what it does is
    compared with the measurement; an answer with a ... left in it is not run."""
    from tensorplay_edu.lab.exercise import TryIt
    ran = []

    def grade(answer):
        ran.append(answer["plan"])
        return {"collectives": answer["plan"](2)}

    try_plan = TryIt("a plan", lambda: {"collectives": 4}, grade=grade)
    assert try_plan({"plan": ...}) is None and ran == []
    assert "a plan: not tried yet" in capsys.readouterr().out
    assert try_plan({"plan": lambda t: t + 1}) is None and len(ran) == 1
    assert "is not right" in capsys.readouterr().out
    assert try_plan({"plan": lambda t: 2 * t}) is True
    assert capsys.readouterr().out == "a plan: right\n"


def test_mismatches_lists_every_difference_and_is_empty_when_all_match():
    from tensorplay_edu.lab.exercise import mismatches
    per_rank = [{"y": torch.ones(2), "n": 1}, {"y": torch.ones(2) + 1e-3, "n": 3}]
    assert mismatches(per_rank, lambda r: {"y": torch.ones(2)}, atol=1e-2) == []
    lines = mismatches(per_rank, lambda r: {"y": torch.ones(2), "n": r + 1})
    assert [line.split(":")[0] for line in lines] == ["rank 1, y", "rank 1, n"], lines
    assert "Mismatched elements: 2 / 2" in lines[0] and lines[1].endswith("3, expected 2"), lines
    assert mismatches([[torch.ones(3)]], lambda r: [torch.ones(2)])[0].startswith("rank 0[0]: ")  # shape
    assert mismatches([{"y": 1}], lambda r: {"y": torch.ones(1)})[0].startswith("rank 0, y: ")    # no tensor


def test_ran_turns_true_at_the_first_complete_try():
    from tensorplay_edu.lab.exercise import TryIt
    t = TryIt("x", lambda: {"a": 1})
    t({"a": ...})
    assert not t.ran
    t({"a": 1})
    assert t.ran

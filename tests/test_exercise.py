"""check(): the verdict of a "Try it" cell. Blank answers and wrong ones print, never raise."""

import torch

from tensorplay_edu.exercise import check, untried


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
    cases = [({"all_gather": 1}, {"all_gather": 2}, "'all_gather': 1 is too low"),
             ({"all_gather": 1}, {"all_reduce": 1}, "'all_gather' should not be there"),
             ({"all_gather": 1}, {"all_gather": 1, "all_reduce": 1}, "1 key(s) missing"),
             (torch.zeros(2, 3), torch.zeros(3, 2), "shape [2, 3] is not the shape it has"),
             (torch.tensor([[0.0, 3.0]]), torch.tensor([[0.0, 2.0]]), "at [0, 1]: 3.0 is too high"),
             ([1, 2], [1, 2, 3], "2 items: not the right number"),
             (0.25, 0.5, "0.25 is too low"),
             (True, False, "True is not right"),
             ("a string", torch.zeros(2), "cannot compare str with Tensor")]
    for answer, expected, why in cases:
        assert check(answer, expected, hint="go through the table") is None
        out = capsys.readouterr().out
        assert "not yet: " in out and why in out and "hint: go through the table" in out, out
        if not isinstance(expected, torch.Tensor):  # the right answer is never printed
            assert repr(expected) not in out.split("not yet: ", 1)[1], out


def test_check_against_one_process_names_the_rank_and_the_place():
    from tensorplay_edu.exercise import check_against_one_process
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

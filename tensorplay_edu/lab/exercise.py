"""Exercises that ask before they tell.

Every "Try it" in the notebooks is three cells, and only the middle one is open::

    [collapsed]  try_rows = TryIt("rows first", measure_rows_first, hint=...)   # the experiment
    [yours]      try_rows({"forward bytes": ...})          # "not tried yet" while a ... is left
    [collapsed]  # Solution: open it once you have tried.  (source and outputs hidden)

The experiment runs only once you have predicted every ``...``; its result lives in the ``TryIt``
object, never in a variable of your cell. The verdict says right, or which item is not right, never
in which direction (no bisection). The solution asserts the answer, so running the notebook in CI
proves every answer right.
"""

from __future__ import annotations

import cmath
import math
import numbers

import torch

__all__ = ["TryIt", "check", "untried", "mismatches", "check_against_one_process"]


def untried(answer) -> bool:
    """True while ``answer`` is ``...`` or holds one (in a dict's values, a list, a tuple)."""
    if answer is Ellipsis:
        return True
    if isinstance(answer, dict):
        return any(untried(v) for v in answer.values())
    if isinstance(answer, (list, tuple, set)):
        return any(untried(v) for v in answer)
    return False


def _wrong(answer, where: str) -> str:
    """Where an answer is wrong, not how: "too high" would let a learner bisect to the answer."""
    return f"{where}{answer!r} is not right"


def _is_bool(x) -> bool:
    """True / False, also numpy's (a comparison of numpy numbers gives one)."""
    return isinstance(x, bool) or (type(x).__module__ == "numpy" and type(x).__name__ in ("bool", "bool_"))


def _is_number(x) -> bool:
    return isinstance(x, numbers.Number) and not _is_bool(x)


def _scalar(answer, expected, rtol: float, atol: float, where: str) -> str | None:
    """Two plain values: a bool only equals a bool; integers compare exactly; a float or complex on
    either side within ``rtol`` (relative) / ``atol``; nan equals only nan; anything else with ``==``."""
    if _is_bool(answer) and _is_bool(expected):
        return None if bool(answer) == bool(expected) else _wrong(answer, where)
    if _is_bool(expected):
        kind = "number" if _is_number(answer) else type(answer).__name__
        return f"{where}{answer!r} is a {kind} where True or False is asked for"
    if _is_bool(answer):
        return f"{where}{answer!r} is a bool where {'a number' if _is_number(expected) else 'no bool'} is asked for"
    if not (_is_number(answer) and _is_number(expected)):
        return None if answer == expected else _wrong(answer, where)
    if isinstance(answer, numbers.Integral) and isinstance(expected, numbers.Integral):
        return None if answer == expected else _wrong(answer, where)
    if not (isinstance(answer, numbers.Real) and isinstance(expected, numbers.Real)):  # a complex number
        a, e = complex(answer), complex(expected)
        return None if cmath.isclose(a, e, rel_tol=rtol, abs_tol=atol) else _wrong(answer, where)
    a, e = float(answer), float(expected)
    if math.isnan(a) or math.isnan(e):
        return None if math.isnan(a) and math.isnan(e) else _wrong(answer, where)
    return None if math.isclose(a, e, rel_tol=rtol, abs_tol=atol) else _wrong(answer, where)


def _tensors(answer, expected, rtol: float, atol: float, where: str) -> str | None:
    a, e = torch.as_tensor(answer), torch.as_tensor(expected)
    if a.shape != e.shape:
        return f"{where}shape {list(a.shape)} is not the shape it has"
    if (a.dtype == torch.bool) != (e.dtype == torch.bool):
        return f"{where}a {a.dtype} tensor where a {e.dtype} one is asked for"
    if not any(x.is_floating_point() or x.is_complex() for x in (a, e)):
        rtol, atol = 0.0, 0.0  # integers (and bools) compare exactly
    like = torch.complex128 if a.is_complex() or e.is_complex() else torch.float64
    wrong = ~torch.isclose(a.to(like), e.to(like), rtol=rtol, atol=atol, equal_nan=True)
    if not wrong.any():
        return None
    i = tuple(int(k) for k in wrong.nonzero()[0])  # the first wrong place
    return _wrong(a[i].item(), f"{where}at {list(i)}: ")


def _differs(answer, expected, rtol: float, atol: float, where: str) -> str | None:
    """Where ``answer`` differs from ``expected`` (the first place, and how), or None. It never
    prints the expected value: a wrong guess must not hand the learner the solution."""
    if isinstance(expected, torch.Tensor) or isinstance(answer, torch.Tensor):
        return _tensors(answer, expected, rtol, atol, where)
    if isinstance(expected, dict):
        if not isinstance(answer, dict):
            return f"{where}a {type(answer).__name__} where a dict is asked for"
        for k in sorted(set(answer) | set(expected), key=str):
            if k not in expected:
                return f"{where}{k!r} should not be there"
        if missing := len(set(expected) - set(answer)):
            return f"{where}{missing} key(s) missing"
        for k in sorted(expected, key=str):
            why = _differs(answer[k], expected[k], rtol, atol, f"{where}{k!r}: ")
            if why:
                return why
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(answer, (list, tuple)) or len(answer) != len(expected):
            n = len(answer) if isinstance(answer, (list, tuple)) else "not a list of"
            return f"{where}{n} items: not the right number"
        for i, (a, e) in enumerate(zip(answer, expected)):
            why = _differs(a, e, rtol, atol, f"{where}[{i}] ")
            if why:
                return why
        return None
    return _scalar(answer, expected, rtol, atol, where)


def check(answer, expected, *, name: str = "your answer", rtol: float = 1e-6, atol: float = 0.0,
          hint: str | None = None) -> bool | None:
    """Compare a learner's ``answer`` with ``expected``, print the verdict; ``True`` when right, else ``None``.

    ``...`` anywhere in ``answer`` prints "not tried yet". Integers compare exactly; floats, complex
    numbers and float tensors within ``rtol`` (relative) or ``atol`` (absolute, 0 by default); nan
    equals nan; a bool only a bool (``True`` is not ``1``: a number where True or False is asked for,
    or the other way round, is wrong, and says so); dicts key by key, lists item by item. The first
    difference is printed with where it is (the key, the index) but neither the expected value nor
    its direction, then ``hint``. Never raises for a missing or wrong answer.
    """
    if untried(answer):
        print(f"{name}: not tried yet (replace each ... with your prediction, then run this cell again)")
        return None
    try:
        why = _differs(answer, expected, rtol, atol, "")
    except Exception as e:  # an answer of a type we cannot compare is a wrong answer, not a crash
        why = f"cannot compare {type(answer).__name__} with {type(expected).__name__} ({e})"
    if why is None:
        print(f"{name}: right")
        return True
    print(f"{name}: not yet: {why}" + (f"\n  hint: {hint}" if hint else ""))
    return None


class TryIt:
    """One exercise's experiment, run once the learner has predicted.

    ``measure()`` returns what the prediction is compared with, the same shape as the answer (a
    dict, mostly). It runs at the first complete prediction and is kept in ``.measured`` for the
    next try and for the solution, which reads it to explain. Calling the object with a prediction
    prints the verdict of :func:`check` and returns ``True`` when right, ``None`` otherwise.
    ``grade``, when given, turns an answer that is code (a plan, a model) into what it does, and
    that is compared instead: the learner's plan is run, not read.
    """

    def __init__(self, name: str, measure, *, hint: str | None = None, rtol: float = 1e-6, atol: float = 0.0,
                 grade=None):
        self.name, self._measure, self.hint, self.rtol, self.atol = name, measure, hint, rtol, atol
        self._grade = grade
        self._result = None

    @property
    def ran(self) -> bool:
        """True once the experiment has run (a complete try, or the solution's): a cell that shows
        the answer may wait for it."""
        return self._result is not None

    @property
    def measured(self):
        if self._result is None:
            self._result = self._measure()
        return self._result

    def __call__(self, predicted) -> bool | None:
        if untried(predicted):  # nothing is run, nothing is shown, until every ... is filled
            return check(predicted, None, name=self.name)
        got = self._grade(predicted) if self._grade else predicted
        return check(got, self.measured, name=self.name, rtol=self.rtol, atol=self.atol, hint=self.hint)

    def __repr__(self) -> str:  # a cell ending in the object shows no result
        return f"TryIt({self.name!r})"


def mismatches(per_rank, expected, *, rtol: float | None = None, atol: float | None = None) -> list[str]:
    """Where rank r's result (``per_rank[r]``, as ``launch`` returns them) differs from ``expected(r)``,
    computed in this one process: one line per difference, ``[]`` when every rank matches. Tensors
    compare with ``torch.testing.assert_close`` (its dtype-based tolerances unless ``rtol`` / ``atol``
    are given), lists item by item, dicts key by key (of a rank's result dict, only the keys
    ``expected`` names). An experiment reports the list; :func:`check_against_one_process` asserts it."""
    tol = {} if rtol is None and atol is None else {"rtol": rtol or 0.0, "atol": atol or 0.0}

    def diff(got, want, where):
        if isinstance(want, dict):
            if set(got) != set(want):
                return [f"{where}: keys {sorted(map(str, got))}, expected {sorted(map(str, want))}"]
            return [line for key in want for line in diff(got[key], want[key], f"{where}, {key}")]
        if isinstance(want, (list, tuple)):
            if len(got) != len(want):
                return [f"{where}: {len(got)} items, expected {len(want)}"]
            return [line for i, (g, w) in enumerate(zip(got, want)) for line in diff(g, w, f"{where}[{i}]")]
        if isinstance(want, torch.Tensor):
            try:
                torch.testing.assert_close(got, want, **tol)
            except (AssertionError, TypeError) as e:  # TypeError: got is no tensor
                return [f"{where}: " + "; ".join(line for line in str(e).splitlines() if line.strip())]
            return []
        return [] if got == want else [f"{where}: {got!r}, expected {want!r}"]

    lines = []
    for r, got in enumerate(per_rank):
        want = expected(r)
        lines += diff({key: got[key] for key in want} if isinstance(want, dict) else got, want, f"rank {r}")
    return lines


def check_against_one_process(per_rank, expected, **tolerance) -> None:
    """Assert that every rank's result equals one process's ``expected(r)`` (see :func:`mismatches`);
    the message names the rank and the place of each difference. Unlike :func:`check`, this one
    raises: it is the notebooks' proof, not a learner's guess."""
    lines = mismatches(per_rank, expected, **tolerance)
    assert not lines, "\n".join(lines)

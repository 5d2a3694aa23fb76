"""Exercises that ask before they tell.

Every "Try it" in the notebooks is two cells. The first is yours: it computes what happens and
compares it with your prediction, written where the ``...`` are::

    PREDICTED = {"forward": ..., "backward": ...}     # your prediction
    measured = ...run the thing...
    check(PREDICTED, measured, name="collectives")    # "not tried yet" while a ... is left

The second holds the solution, collapsed in JupyterLab (its source hidden: click the "..." to
open it). It fills the answer and asserts ``check(...)``, so the notebook run in CI proves every
answer right.

:func:`check` never raises on an answer you have not written yet or a wrong one: it prints
what it found and returns ``True`` when the answer is right, ``None`` otherwise (so a cell that ends
in ``check(...)`` shows the printed verdict and nothing more).
"""

from __future__ import annotations

import math

import torch

__all__ = ["check", "untried", "check_against_one_process"]


def untried(answer) -> bool:
    """True while ``answer`` is ``...`` or holds one (in a dict's values, a list, a tuple)."""
    if answer is Ellipsis:
        return True
    if isinstance(answer, dict):
        return any(untried(v) for v in answer.values())
    if isinstance(answer, (list, tuple, set)):
        return any(untried(v) for v in answer)
    return False


def _off(a, e, where: str) -> str:
    """How a wrong number is off, without giving the right one away."""
    return f"{where}{a!r} is too {'high' if a > e else 'low'}"


def _differs(answer, expected, rtol: float, atol: float, where: str) -> str | None:
    """Where ``answer`` differs from ``expected`` (the first place, and how), or None. It never
    prints the expected value: a wrong guess must not hand the learner the solution."""
    if isinstance(expected, torch.Tensor) or isinstance(answer, torch.Tensor):
        a, e = torch.as_tensor(answer), torch.as_tensor(expected)
        if a.shape != e.shape:
            return f"{where}shape {list(a.shape)} is not the shape it has"
        if not torch.allclose(a.double(), e.double(), rtol=rtol, atol=atol, equal_nan=True):
            bad = (a.double() - e.double()).abs().argmax()
            i = tuple(int(k) for k in torch.unravel_index(bad, e.shape)) if e.dim() else ()
            return _off(a[i].item(), e[i].item(), f"{where}at {list(i)}: ")
        return None
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
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (answer, expected))
    if numbers and isinstance(expected, float):
        return None if math.isclose(answer, expected, rel_tol=rtol, abs_tol=atol) else _off(answer, expected, where)
    if answer == expected:
        return None
    return _off(answer, expected, where) if numbers else f"{where}{answer!r} is not right"


def check(answer, expected, *, name: str = "your answer", rtol: float = 1e-6, atol: float = 0.0,
          hint: str | None = None) -> bool | None:
    """Compare a learner's ``answer`` with ``expected``, print the verdict; ``True`` when right, else ``None``.

    ``...`` anywhere in ``answer`` prints "not tried yet". Numbers compare with ``rtol`` / ``atol``
    (floats and tensors), dicts key by key, lists item by item; the first difference is printed
    with where it is and how (too high, too low, not right) but never the expected value, then
    ``hint``. Never raises for a missing or wrong answer.
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


def check_against_one_process(per_rank, expected) -> None:
    """Assert that rank r's result (``per_rank[r]``, as ``launch`` returns them) equals ``expected(r)``,
    computed in this one process: tensors with ``torch.testing.assert_close``, lists item by item,
    dicts key by key (of a rank's result dict, only the keys ``expected`` names). The message names
    the rank and the place of the first difference. Unlike :func:`check`, this one raises: it is
    the notebooks' proof, not a learner's guess."""

    def same(got, want, where):
        if isinstance(want, dict):
            assert set(got) == set(want), f"{where}: keys {sorted(map(str, got))}, expected {sorted(map(str, want))}"
            for key in want:
                same(got[key], want[key], f"{where}, {key}")
        elif isinstance(want, (list, tuple)):
            assert len(got) == len(want), f"{where}: {len(got)} items, expected {len(want)}"
            for i, (g, w) in enumerate(zip(got, want)):
                same(g, w, f"{where}[{i}]")
        elif isinstance(want, torch.Tensor):
            torch.testing.assert_close(got, want, msg=lambda m: f"{where}: {m}")
        else:
            assert got == want, f"{where}: {got!r}, expected {want!r}"

    for r, got in enumerate(per_rank):
        want = expected(r)
        same({key: got[key] for key in want} if isinstance(want, dict) else got, want, f"rank {r}")

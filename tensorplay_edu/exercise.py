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

__all__ = ["check", "untried"]


def untried(answer) -> bool:
    """True while ``answer`` is ``...`` or holds one (in a dict's values, a list, a tuple)."""
    if answer is Ellipsis:
        return True
    if isinstance(answer, dict):
        return any(untried(v) for v in answer.values())
    if isinstance(answer, (list, tuple, set)):
        return any(untried(v) for v in answer)
    return False


def _differs(answer, expected, rtol: float, atol: float, where: str) -> str | None:
    """Why ``answer`` is not ``expected`` (the first difference, with its place), or None."""
    if isinstance(expected, torch.Tensor) or isinstance(answer, torch.Tensor):
        a, e = torch.as_tensor(answer), torch.as_tensor(expected)
        if a.shape != e.shape:
            return f"{where}shape {list(a.shape)}, expected {list(e.shape)}"
        if not torch.allclose(a.double(), e.double(), rtol=rtol, atol=atol, equal_nan=True):
            bad = (a.double() - e.double()).abs().argmax()
            i = tuple(int(k) for k in torch.unravel_index(bad, e.shape)) if e.dim() else ()
            return f"{where}at {list(i)}: {a[i].item():.6g}, expected {e[i].item():.6g}"
        return None
    if isinstance(expected, dict):
        if not isinstance(answer, dict):
            return f"{where}a {type(answer).__name__}, expected a dict with keys {sorted(map(str, expected))}"
        for k in sorted(set(answer) | set(expected), key=str):
            if k not in expected:
                return f"{where}{k!r} is not expected"
            if k not in answer:
                return f"{where}{k!r} is missing"
            why = _differs(answer[k], expected[k], rtol, atol, f"{where}{k!r}: ")
            if why:
                return why
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(answer, (list, tuple)) or len(answer) != len(expected):
            return f"{where}{answer!r}, expected {len(expected)} items: {expected!r}"
        for i, (a, e) in enumerate(zip(answer, expected)):
            why = _differs(a, e, rtol, atol, f"{where}[{i}] ")
            if why:
                return why
        return None
    if isinstance(expected, float) and isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return None if math.isclose(answer, expected, rel_tol=rtol, abs_tol=atol) else f"{where}{answer!r}, expected {expected!r}"
    return None if answer == expected else f"{where}{answer!r}, expected {expected!r}"


def check(answer, expected, *, name: str = "your answer", rtol: float = 1e-6, atol: float = 0.0,
          hint: str | None = None) -> bool | None:
    """Compare a learner's ``answer`` with ``expected``, print the verdict; ``True`` when right, else ``None``.

    ``...`` anywhere in ``answer`` prints "not tried yet". Numbers compare with ``rtol`` / ``atol``
    (floats and tensors), dicts key by key, lists item by item; the first difference is printed
    with where it is, and ``hint`` after it. Never raises for a missing or wrong answer.
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

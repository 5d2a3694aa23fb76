"""Helpers every test shares, written once: the test side (`clean`) and the rank side (`Checker`,
`raises`, `chunk`, `gather_all`). Kept free of pytest so launched ranks start light.

The pattern: a rank function (in tests/rank_<feature>.py, beside tests/test_<feature>.py) compares
against single-process math and returns ``(fails, checks)``: the failures it found, as strings, and
how many checks it made. The test asserts both "no failures" and "it really checked"::

    def rank_code() -> tuple[list[str], int]:      # tests/rank_<feature>.py
        check = Checker("a label for every failure")
        check("loss", torch.allclose(loss, ref))   # one check; kept as a failure if not ok
        check.close("grad w", w.grad, ref.grad, rtol=1e-9, atol=1e-11)
        return check.result()

    def test_feature():                            # tests/test_<feature>.py
        clean(launch(rank_code, 4), at_least=2)
"""

from __future__ import annotations

import torch
import torch.distributed as dist


# ---- the test side -----------------------------------------------------------------------------

def clean(results, at_least: int) -> None:
    """Every rank's ``(fails, checks)``: no rank failed a check, and each made at least ``at_least``."""
    fails = sorted({f for rank_fails, _ in results for f in rank_fails})
    assert not fails, "\n".join(fails[:30])
    assert min(n for _, n in results) >= at_least, [n for _, n in results]


# ---- the rank side -----------------------------------------------------------------------------

class Checker:
    """One rank's checks: ``check(what, ok)`` counts a check and keeps ``what`` (after ``label``, if
    given) when it failed; ``result()`` is the ``(fails, checks)`` a rank function returns."""

    def __init__(self, label: str = ""):
        self.fails, self.n, self.label = [], 0, label

    def __call__(self, what: str, ok: bool) -> None:
        self.n += 1
        if not ok:
            self.fails.append(f"{self.label}: {what}" if self.label else what)

    def close(self, what: str, got, want, **tol) -> None:
        """``got`` is there, has ``want``'s shape and is torch.allclose to it (at ``tol``: rtol, atol)."""
        ok = got is not None and got.shape == want.shape and torch.allclose(got, want, **tol)
        if ok:
            self(what, True)
        else:
            err = "None" if got is None else (got - want).abs().max().item() if got.shape == want.shape \
                else f"shape {tuple(got.shape)}"
            self(f"{what} differs ({err})", False)

    def equal(self, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        """Bit for bit, the same shape."""
        same = got.shape == want.shape and torch.equal(got, want)
        self(f"{what}: max diff {(got - want).abs().max() if got.shape == want.shape else 'shape'}", same)

    def result(self) -> tuple[list[str], int]:
        return self.fails, self.n


def raises(fails: list, label: str, exc, fn, *fragments) -> None:
    """Record a failure unless ``fn()`` raises ``exc`` with every fragment in its message (not counted
    as a check: the caller counts)."""
    try:
        fn()
    except exc as err:
        missing = [f for f in fragments if f not in str(err)]
        if missing:
            fails.append(f"{label}: message lacks {missing}: {err}")
        return
    except Exception as err:  # noqa: BLE001
        fails.append(f"{label}: raised {type(err).__name__} instead of {exc.__name__}: {err}")
        return
    fails.append(f"{label}: did not raise {exc.__name__}")


def chunk(x: torch.Tensor, dim: int, t: int, r: int) -> torch.Tensor:
    """Rank r's piece, by torch.chunk itself (the spec the package must follow)."""
    pieces = torch.chunk(x, t, dim=dim)
    if r < len(pieces):
        return pieces[r]
    shape = list(x.shape)
    shape[dim] = 0
    return x.new_empty(shape)


def gather_all(x: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's tensor (same shape), to compare ranks: plain torch.distributed, test bookkeeping
    (CommDebugMode does not count it)."""
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x.contiguous())
    return out


def init_like_one_process(check: "Checker", model, build_reference, label: str, seed: int = 1234):
    """``model.init_weights()`` under ``seed`` on a parallelized model against one process doing the same
    on a model built on meta: the generator ends in the same place, and every gathered tensor is equal,
    bit for bit.  Returns the one-process model."""
    from tensorplay_edu.parallel import full_state_dict

    torch.manual_seed(seed)
    model.init_weights()
    after = torch.get_rng_state()
    with torch.device("meta"):
        ref = build_reference()
    ref.to_empty(device="cpu")
    torch.manual_seed(seed)
    ref.init_weights()
    check("the generator stands where one process's does", torch.equal(after, torch.get_rng_state()))
    got = full_state_dict(model)
    for name, want in ref.state_dict().items():
        check.equal(f"{label}{name}", got[name], want)
    return ref

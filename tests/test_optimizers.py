"""torch.optim on tensor-parallel pieces: the elementwise optimizers train like one device
(test_colwise_rowwise.py and the Llama tests run SGD and AdamW); Adafactor, Muon and LBFGS, which read a
whole matrix, refuse to step on a piece and say why. Before issue 29 they ran on the pieces and
were off by 0.01, 0.006 and 0.08 after 2 steps, with no error."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tensorplay_edu import init_device_mesh, launch
from tensorplay_edu.parallel import ColwiseParallel, RowwiseParallel, full_state_dict, parallelize_module
from tensorplay_edu.parallel.optimizers import ELEMENTWISE

OPTIMIZERS = {
    "Adafactor": (lambda ps: torch.optim.Adafactor(ps, lr=1e-2), "row and column means"),
    "Muon": (lambda ps: torch.optim.Muon(ps, lr=1e-2), "orthogonalises"),
    "LBFGS": (lambda ps: torch.optim.LBFGS(ps, lr=0.5), "dot products over every parameter"),
}


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8, bias=False), nn.Tanh(), nn.Linear(8, 6, bias=False)).double()


def _steps(model, opt, n=2):
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for _ in range(n):
        def closure():
            opt.zero_grad()
            loss = model(x).pow(2).sum()
            loss.backward()
            return loss
        opt.step(closure)


def step_on_pieces(name: str, declare: bool) -> dict:
    """Rank code: ``name`` on a Colwise -> Rowwise MLP; ``declare``: the optimizer joins ELEMENTWISE
    first (what a user does for an optimizer of their own), which lets the step run."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    ref = _mlp()
    model = parallelize_module(copy.deepcopy(ref), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    make, _ = OPTIMIZERS[name]
    if declare:
        ELEMENTWISE.add(type(make([nn.Parameter(torch.zeros(2, 2))])))
    try:
        _steps(model, make(model.parameters()))
        out = {"error": None}
    except RuntimeError as e:
        out = {"error": str(e)}
    _steps(ref, make(ref.parameters()))
    got = full_state_dict(model)
    out["diff"] = max((got[k] - v).abs().max().item() for k, v in ref.state_dict().items())
    whole = _mlp()  # an optimizer on parameters left whole: not tensor-parallel, runs as usual
    _steps(whole, make(whole.parameters()))
    return out


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_an_optimizer_that_reads_whole_matrices_refuses_pieces(name):
    for res in launch(step_on_pieces, 2, name, False, timeout=60):
        assert res["error"] is not None, res
        for words in (f"{name}.step()", OPTIMIZERS[name][1], "ELEMENTWISE.add", "[8, 6]"):
            assert words in res["error"], (words, res["error"])
        assert res["diff"] > 0  # the weights were left as they were: the refused step changed nothing


def test_declared_elementwise_runs_and_is_then_the_users_claim():
    """Declared, Adafactor runs on the pieces, and differs from one device: the list is a promise."""
    for res in launch(step_on_pieces, 2, "Adafactor", True, timeout=60):
        assert res["error"] is None and res["diff"] > 1e-4, res


def test_the_elementwise_list():
    assert {torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW} <= ELEMENTWISE
    assert not {torch.optim.Adafactor, torch.optim.Muon, torch.optim.LBFGS} & ELEMENTWISE

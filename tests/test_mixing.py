"""Errors a user meets where two libraries' DTensors meet, or where a loss meets sharded logits
outside loss_parallel: each names what happened and the fix (issue 29: before, PyTorch's styles in
our parallelize_module gave "Expect Union[ParallelStyle, ...]", a PyTorch DTensor fed to our styled
Linear gave PyTorch's "got mixed torch.Tensor and DTensor", and F.cross_entropy on sharded logits
suggested .to_local(), a wrong loss, without naming loss_parallel). An embedding's max_norm or
scale_grad_by_freq, which read whole rows or every id, is refused where the piece lacks them (before:
wrong gradients, or rows renormalised on every rank), and -x of a Partial("max") is refused."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tensorplay_edu import DTensor, Shard, init_device_mesh, launch


def _error(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the message is what is tested)
        return f"{type(e).__name__}: {e}"
    return "no error"


def errors() -> dict:
    from torch.distributed.device_mesh import DeviceMesh as TorchMesh
    from torch.distributed.tensor import DTensor as TorchDTensor, Replicate as TorchReplicate
    from torch.distributed.tensor.parallel import ColwiseParallel as TorchColwise

    from tensorplay_edu.parallel import ColwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    logits = DTensor.from_local(torch.randn(4, 5), mesh, [Shard(1)])
    theirs = TorchDTensor.from_local(torch.randn(4, 5), TorchMesh.from_group(dist.group.WORLD, "cpu"),
                                     [TorchReplicate()])
    ours = parallelize_module(torch.nn.Linear(5, 6), mesh, ColwiseParallel())
    from tensorplay_edu import Partial
    from tensorplay_edu.parallel import RowwiseParallel

    partial_max = DTensor.from_local(torch.randn(4, 5), mesh, [Partial("max")])
    return {
        "max_norm": _error(lambda: parallelize_module(torch.nn.Embedding(10, 4, max_norm=1.0), mesh,
                                                      RowwiseParallel(input_layouts=_replicate()))),
        "max_norm colwise": _error(lambda: parallelize_module(torch.nn.Embedding(10, 4, max_norm=1.0), mesh,
                                                              ColwiseParallel())),
        "scale_grad_by_freq": _error(lambda: parallelize_module(torch.nn.Embedding(10, 4, scale_grad_by_freq=True),
                                                                mesh, RowwiseParallel(input_layouts=_replicate()))),
        "neg of a max": _error(lambda: -partial_max),
        "cross_entropy": _error(lambda: F.cross_entropy(logits, torch.zeros(4, dtype=torch.long))),
        "add": _error(lambda: logits + theirs),
        "style": _error(lambda: parallelize_module(torch.nn.Linear(5, 6), mesh, {"": TorchColwise()})),
        "style alone": _error(lambda: parallelize_module(torch.nn.Linear(5, 6), mesh, TorchColwise())),
        "input": _error(lambda: ours(theirs)),
    }


def _replicate():
    from tensorplay_edu import Replicate
    return Replicate()


def test_each_error_names_the_cause_and_the_fix():
    res = launch(errors, 2, timeout=60)[0]
    for key in ("max_norm", "max_norm colwise", "scale_grad_by_freq"):
        assert res[key].startswith("NotImplementedError") and key.split()[0] in res[key] and "whole" in res[key], res
    assert res["neg of a max"].startswith("NotImplementedError") and "Partial" in res["neg of a max"], res
    assert "loss_parallel()" in res["cross_entropy"] and "wrong loss" in res["cross_entropy"], res
    assert "PyTorch's torch.distributed.tensor.DTensor" in res["add"] and "one library" in res["add"], res
    for key in ("style", "style alone"):
        assert res[key].startswith("TypeError") and "tensorplay_edu.parallel.ColwiseParallel" in res[key], res
    assert res["input"].startswith("TypeError") and "x.full_tensor()" in res["input"], res

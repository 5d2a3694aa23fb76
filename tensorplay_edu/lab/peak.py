"""A loss's peak memory, counted op by op (notebook 05b).

A ``TorchDispatchMode`` sees every operation PyTorch runs, forward and backward, and the tensors it returns.
:class:`LiveBytes` notes each new storage of at least ``min_numel`` elements (one rank's ``[b*s, V_r]`` logits in
05b, so ``[b*s]`` vectors and weight gradients are left out) and puts a weakref finalizer on it, which fires when
its last tensor is gone. The largest sum alive at once is the **peak**. :func:`measure` sorts each storage alive
then into three roles: **held** (the caller's logits), **saved** (what autograd keeps for backward, found by a
``saved_tensors_hooks``; a buffer counts as saved even if the loss saves it a moment after the peak) and
**temporaries** (everything else). It sees what operations return, not the allocator: no caching, no scratch
space inside a kernel, no NCCL buffers; the count starts once the output layer has returned its logits.
"""

import contextlib
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["LiveBytes", "LocalBytes", "measure", "loss_peaks", "pytorch_loss_peaks", "per_logit", "check_peak",
           "peak_bars"]

ROLES = ("held", "saved", "temporaries")


class LiveBytes(TorchDispatchMode):
    """Storages of >= ``min_numel`` elements, from the op that makes them until their last tensor is gone: the
    bytes alive ``now``, their ``peak``, the phase it came in (``peak_phase``), the highest per phase (``top``) and
    what was alive at the peak (``at_peak``: {storage pointer: [bytes, role]}, the same lists as ``live``, so a
    role given a moment later counts)."""

    def __init__(self, min_numel):
        super().__init__()
        self.min_numel, self.live, self.now, self.peak, self.at_peak = min_numel, {}, 0, 0, {}
        self.phase, self.peak_phase, self.top = "forward", None, {"forward": 0, "backward": 0}

    def add(self, tensor, role="temporaries"):
        storage = tensor.untyped_storage()
        if tensor.numel() >= self.min_numel and storage.data_ptr() not in self.live:   # new, not a view of one known
            self.live[storage.data_ptr()] = [storage.nbytes(), role]
            weakref.finalize(storage, self._free, storage.data_ptr())              # fires when the storage dies
            self.now += storage.nbytes()
            self.top[self.phase] = max(self.top[self.phase], self.now)
            if self.now > self.peak:
                self.peak, self.peak_phase, self.at_peak = self.now, self.phase, dict(self.live)

    def mark(self, tensor, role):
        """Give a storage already noted a role ("held", "saved")."""
        if tensor.untyped_storage().data_ptr() in self.live:
            self.live[tensor.untyped_storage().data_ptr()][1] = role

    def _free(self, ptr):
        self.now -= self.live.pop(ptr)[0]

    def roles_at_peak(self):
        """{held, saved, temporaries}: bytes of each role alive at the peak."""
        roles = dict.fromkeys(ROLES, 0)
        for nbytes, role in self.at_peak.values():
            roles[role] += nbytes
        return roles

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.add(leaf)
        return out


class LocalBytes(LiveBytes):
    """LiveBytes under PyTorch's DTensor: it skips the DTensor-level ops (and their fake tensors), so it sees the
    plain ops each rank runs on its local shard."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor as TorchDTensor
        if any(issubclass(t, TorchDTensor) for t in types):
            return NotImplemented                                  # DTensor runs it; its local ops come back here
        return super().__torch_dispatch__(func, types, args, kwargs)

    def add(self, tensor, role="temporaries"):
        if type(tensor) is torch.Tensor:
            super().add(tensor, role)


def measure(make_logits, loss_fn, kept, min_numel, context=contextlib.nullcontext, counter=LiveBytes):
    """One loss, forward and backward (both inside ``context()``, as PyTorch's loss_parallel needs), on
    ``make_logits()`` (a tensor, or this package's Shard(1) DTensor), the caller keeping its logits or dropping them
    after the forward (torchtitan's ``del pred``), counted by ``counter`` (LocalBytes under PyTorch's DTensor):
    {after_forward, peak, phase, held, saved, temporaries, backward_peak, loss}."""
    from torch.distributed.tensor import DTensor as TorchDTensor
    logits = make_logits()
    with counter(min_numel) as mem, context():
        mem.add(logits if isinstance(logits, torch.Tensor) else logits.to_local(), "held")

        def pack(tensor):                                          # what the loss keeps for backward
            mem.mark(tensor._local_tensor if isinstance(tensor, TorchDTensor) else tensor, "saved")
            return tensor
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = loss_fn(logits.float())                         # a float32 loss: a copy of bf16 logits
        if not kept:
            del logits
        after_forward, mem.phase, mem.top["backward"] = mem.now, "backward", mem.now
        loss.backward()
    return {"after_forward": after_forward, "peak": mem.peak, "phase": mem.peak_phase, **mem.roles_at_peak(),
            "backward_peak": mem.top["backward"], "loss": loss.detach()}


def loss_peaks(h_in, y, vocab):
    """One rank's worker: a seed-0 ``nn.Linear(h, vocab)`` output layer on ``h_in`` [b*s, h], ColwiseParallel,
    its loss against ``y`` gathered (``"gather"``) or under this package's ``loss_parallel``, float32 and bf16,
    the caller keeping or dropping its logits: ({(path, dtype, kept): measure's counts}, what a second backward
    says)."""
    from tensorplay_edu import Replicate, init_device_mesh
    from tensorplay_edu.parallel import ColwiseParallel, loss_parallel, parallelize_module
    from tensorplay_edu.placement import chunk_sizes
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    min_numel = len(y) * min(chunk_sizes(vocab, mesh.size()))      # one rank's [b*s, V_r] block, the smallest
    out = {}
    for path in ("gather", "loss_parallel"):
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            head = nn.Linear(h_in.shape[1], vocab, bias=False).to(dtype)
            style = ColwiseParallel(output_layouts=Replicate()) if path == "gather" else ColwiseParallel(use_local_output=False)
            parallelize_module(head, mesh, style)
            x = h_in.to(dtype).requires_grad_()
            context = loss_parallel if path == "loss_parallel" else contextlib.nullcontext
            for kept in (True, False):
                out[(path, str(dtype).removeprefix("torch."), kept)] = measure(
                    lambda: head(x), lambda z: F.cross_entropy(z, y), kept, min_numel, context)
    with loss_parallel():                                          # its backward overwrites the saved softmax:
        loss = F.cross_entropy(head(x).float(), y)
        loss.backward(retain_graph=True)                           # a second one must refuse, not be wrong
        try:
            loss.backward()
            second = "ran"
        except RuntimeError as e:
            second = str(e)
    return out, second


def pytorch_loss_peaks(h_in, y, weight):
    """One rank's worker: PyTorch's own loss_parallel on this rank's rows of ``weight`` [V, h] applied to ``h_in``,
    the caller dropping its logits, counted by :func:`measure` with LocalBytes: {dtype: measure's counts}."""
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.distributed.tensor import DTensor as TorchDTensor, Shard as TorchShard
    from torch.distributed.tensor.parallel import loss_parallel as torch_loss_parallel
    from tensorplay_edu.placement import chunk_offset, chunk_sizes
    mesh = torch_mesh("cpu", (dist.get_world_size(),))
    (vocab, h), t, r = weight.shape, mesh.size(), mesh.get_local_rank()
    o, n = chunk_offset(vocab, t, r), chunk_sizes(vocab, t)[r]
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        head = nn.Linear(h, n, bias=False).to(dtype)
        with torch.no_grad():
            head.weight.copy_(weight[o:o + n])
        x = h_in.to(dtype).requires_grad_()

        def loss_fn(local):                                        # [b*s, V_r] -> PyTorch's Shard(1) DTensor
            logits = TorchDTensor.from_local(local, mesh, [TorchShard(1)], shape=(len(y), vocab), stride=(vocab, 1))
            return F.cross_entropy(logits, y)
        got = measure(lambda: head(x), loss_fn, False, len(y) * min(chunk_sizes(vocab, t)), torch_loss_parallel,
                      LocalBytes)
        out[str(dtype).removeprefix("torch.")] = {**got, "loss": got["loss"].full_tensor()}
    return out


def per_logit(table, path, dtype, kept):
    """From a table {(path, dtype): (phase of the peak, held, saved, temporaries)} in bytes per logit: (phase,
    (held, saved, temporaries) at the peak, alive after the forward), the caller keeping or dropping its logits
    (it can drop them after the loss's forward, not during it)."""
    phase, held, saved, temp = table[(path, dtype)]
    return phase, (held if kept or phase == "forward" else 0, saved, temp), (held if kept else 0) + saved


def check_peak(got, table, path, dtype, kept, n):
    """measure's counts on ``n`` logits = the table's bytes per logit: the phase, each role, the peak, and what
    is alive after the forward."""
    phase, (held, saved, temp), alive = per_logit(table, path, dtype, kept)
    assert got["phase"] == phase, (path, dtype, kept, got["phase"])
    assert (got["held"], got["saved"], got["temporaries"]) == (held * n, saved * n, temp * n), (path, dtype, kept)
    assert got["peak"] == (held + saved + temp) * n and got["after_forward"] == alive * n, (path, dtype, kept)


def peak_bars(parts_by_bar, scale):
    """{bar label: counts} -> viz.draw_memory's {bar label: {part: bytes / scale}}."""
    return {label: {"logits held by the caller": got["held"] / scale, "saved by the loss": got["saved"] / scale,
                    "temporaries": got["temporaries"] / scale} for label, got in parts_by_bar.items()}

"""Initialising a parallelized model exactly as one device would.

torchtitan's recipe for a model too big for one device: build it on the ``meta`` device,
parallelize it (shapes only, nothing moves), ``to_empty(device=...)``, then
``model.init_weights()`` under a seed.  Each rank then holds uninitialised pieces, and an
``nn.init`` call on a piece would get two things wrong:

* **the values**: every rank seeded alike draws the *same* numbers into its piece, so rank
  0's heads and rank 1's heads start as copies (a symmetric network that stays symmetric);
* **the scale**: ``kaiming_uniform_`` reads the fan-in from the tensor it is given, and a
  row-split weight's piece has ``in / t`` columns: bounds ``sqrt(t)`` times too wide.

PyTorch's DTensor solves the first with random ops that know their placements: an
offset-based RNG tracker (CUDA's philox generator can skip ahead) makes each rank draw
only its own part of one global random stream; the fan-in comes from the DTensor's global
shape.  On a CPU mesh it has no tracker, and every rank draws the same numbers.

Here every rank draws **the whole parameter** from the default generator, exactly the
numbers the single device draws for it, and keeps its piece.  The generator then stands
where the single device's stands, so the next parameter is right too, and the model is
bit for bit the single-device model initialised with that seed, on any backend and device.
The price: each rank spends the time of initialising the whole model, and holds one
module's parameters at full size (a Linear's weight and bias) while it initialises that
module, never more.  Three ways in, the same rule:

==================================================  ========================================
the call                                            how it sees the whole parameter
==================================================  ========================================
``module.reset_parameters()`` of a styled Linear /  the module runs its own method on
Embedding (what ``init_weights`` of our Llama and   full-size stand-ins (the fan-in, a
``nn.Linear.__init__``-style code call)             padding row, a bias bound all right)
``torch.nn.init.<fn>_(piece, ...)`` (torchtitan's   importing this package wraps the
``init_weights``)                                   ``torch.nn.init`` functions
``torch.nn.init.<fn>_(dtensor, ...)``               the DTensor's global shape
``torch.nn.init.<fn>_(piece[5])``, ``piece[:, 2]``   the same indices of the whole parameter
(HF's ``init.zeros_(weight[padding_idx])``)         (:func:`_indexed`): the owner writes them
==================================================  ========================================

An indexed view of a piece is read as an index of the whole parameter, as the code that
wrote it meant: ``weight[5]`` is global row 5 (on every rank the view is local row 5, so each
rank zeroed its own row 5 before: rows 5 and 36 of a vocabulary split in two); a dimension
the view takes whole (``weight[:, 2]`` of a row-split weight) is the whole dimension. Along
the split dimension a view takes one index or all of it; a part of it (``weight[2:5]``)
cannot be told from this rank's piece, and is refused. An index past this rank's local size
fails in the indexing itself, before ``nn.init`` sees it.

A meta DTensor (``distribute_tensor`` of a meta tensor) becomes real with
``torch.empty_like(dtensor, device="cpu")``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import types

import torch
from torch import nn

from ..dtensor import DTensor, register_torch_function
from ..placement import Replicate
from ..transition import redistribute_local
from .layout import ParamLayout, _is_torch_dtensor, param_layout, tp_offsets, where

__all__ = ["full_size", "reset_parameters_full_size", "INIT_FUNCTIONS"]

# The in-place initialisers of torch.nn.init (each takes the tensor first).
INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                  "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


def _piece_of(full: torch.Tensor, mesh, placements) -> torch.Tensor:
    """This rank's part of ``full``: the table's Replicate -> placements, local chunks only."""
    return redistribute_local(full, mesh, (Replicate(),) * mesh.ndim, tuple(placements), full.shape)


@torch.no_grad()
def write_piece(target: torch.Tensor, full: torch.Tensor, layout: ParamLayout) -> None:
    """Copy this rank's part of the whole ``full`` into ``target`` (a TP piece, or FSDP2's DTensor of one)."""
    piece = _piece_of(full, layout.mesh, layout.placements)
    if _is_torch_dtensor(target):  # FSDP2 cut the piece again over the data-parallel mesh
        local, offsets = where(target, layout)
        for d, (size, start, tp_start) in enumerate(zip(local.shape, offsets, tp_offsets(layout))):
            piece = piece.narrow(d, start - tp_start, size)  # FSDP2's part of this rank's TP piece
        target = local
    target.copy_(piece)


def _full_like(piece: torch.Tensor, layout: ParamLayout) -> torch.Tensor:
    device = piece.to_local().device if _is_torch_dtensor(piece) else piece.device
    return torch.empty(layout.shape, dtype=piece.dtype, device=device)


@contextlib.contextmanager
def full_size(module: nn.Module):
    """Inside: ``module``'s parallelized parameters are whole, uninitialised stand-ins; on the way
    out each rank copies its part of them into its pieces (nothing is copied if the body raises)."""
    layouts = {name: layout for name, layout in getattr(module, "_tp_layouts", {}).items()
               if module._parameters.get(name) is not None}
    pieces = {name: module._parameters[name] for name in layouts}
    for name, layout in layouts.items():
        module._parameters[name] = nn.Parameter(_full_like(pieces[name], layout), pieces[name].requires_grad)
    try:
        yield module
        for name, layout in layouts.items():
            if not pieces[name].is_meta:
                write_piece(pieces[name], module._parameters[name], layout)
    finally:
        module._parameters.update(pieces)


def reset_parameters_full_size(module: nn.Module) -> None:
    """A styled module's ``reset_parameters``: its class's own method, run on the whole parameters."""
    with full_size(module):
        type(module).reset_parameters(module)


def install_reset_parameters(module: nn.Module) -> None:
    """Called by the styles on a module they shard."""
    if hasattr(type(module), "reset_parameters"):
        module.reset_parameters = types.MethodType(reset_parameters_full_size, module)


# ---- torch.nn.init on a piece or a DTensor ---------------------------------------------------------

def _split_layout(tensor) -> ParamLayout | None:
    layout = param_layout(tensor) if isinstance(tensor, torch.Tensor) else None
    if layout is None:
        return None
    cut = any(p.is_shard() or p.is_partial() for p in layout.placements)
    return layout if cut or _is_torch_dtensor(tensor) else None


def _wrap(fn):
    """``fn`` (a torch.nn.init function) drawing the whole tensor for a piece or a DTensor."""
    first = next(iter(inspect.signature(fn).parameters))

    @functools.wraps(fn)
    def init(*args, **kwargs):
        tensor = args[0] if args else kwargs.get(first)
        rest = args[1:] if args else ()
        kw = {k: v for k, v in kwargs.items() if k != first}
        if isinstance(tensor, DTensor):
            if tensor.to_local().is_meta:
                return tensor
            full = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
            fn(full, *rest, **kw)
            with torch.no_grad():
                tensor.to_local().copy_(_piece_of(full, tensor.device_mesh, tensor.placements))
            return tensor
        layout = _split_layout(tensor)
        base = tensor._base if isinstance(tensor, torch.Tensor) and layout is None else None
        if base is not None and not base.is_meta and not _is_torch_dtensor(base) and _split_layout(base):
            return _indexed(fn, tensor, base, _split_layout(base), rest, kw)
        if layout is None or tensor.is_meta:
            return fn(*args, **kwargs)
        full = _full_like(tensor, layout)
        fn(full, *rest, **kw)
        write_piece(tensor, full, layout)
        return tensor

    init.__tensorplay_guard__ = True
    return init


def _whole_view(view: torch.Tensor, base: torch.Tensor, layout: ParamLayout) -> tuple[list, list, int]:
    """(size, stride, storage offset) of ``view``'s indices in the contiguous whole parameter:
    an index is global, a dimension this rank's piece gives whole is the whole dimension."""
    size, stride = list(base.shape), base.stride()
    start, rest = [0] * base.ndim, view.storage_offset() - base.storage_offset()
    for d in sorted((d for d in range(base.ndim) if size[d] > 1), key=lambda d: -stride[d]):
        start[d], rest = divmod(rest, stride[d])
    if rest or any(start[d] >= size[d] for d in range(base.ndim)):
        raise ValueError("cannot map it to the whole parameter (not a plain index or slice of the piece)")
    split = {p.dim % base.ndim for d, p in enumerate(layout.placements) if p.is_shard() and layout.mesh.size(d) > 1}
    whole = torch.empty(layout.shape, device="meta").stride()
    out_size, out_stride, used = [], [], set()
    for n, step in zip(view.shape, view.stride()):
        if n <= 1:
            out_size.append(n)
            out_stride.append(1)
            continue
        dims = [d for d in range(base.ndim) if d not in used and size[d] > 1 and step and step % stride[d] == 0
                and start[d] + (n - 1) * (step // stride[d]) < size[d]]
        if not dims:
            raise ValueError("cannot map it to the whole parameter (not a plain index or slice of the piece)")
        d = max(dims, key=lambda d: stride[d])
        used.add(d)
        if d in split and not (start[d] == 0 and step == stride[d] and n == size[d]):
            raise ValueError(f"it takes part of dimension {d}, which is split over ranks: the part cannot be told "
                             "from this rank's piece")
        out_size.append(layout.shape[d] if d in split else n)
        out_stride.append(step // stride[d] * whole[d])
    offset = sum(start[d] * whole[d] for d in range(base.ndim))  # a split dimension taken whole starts at 0
    return out_size, out_stride, offset


@torch.no_grad()
def _indexed(fn, view: torch.Tensor, base: torch.Tensor, layout: ParamLayout, rest, kw) -> torch.Tensor:
    """``fn`` on an indexed view of a piece: drawn on the same view of the whole parameter (the
    generator moves as one process's), and each rank writes the elements that lie in its piece."""
    try:
        geometry = _whole_view(view, base, layout)
    except ValueError as e:
        raise ValueError(
            f"torch.nn.init.{fn.__name__} on a view {list(view.shape)} of this rank's piece {list(base.shape)} of a "
            f"tensor-parallel parameter {list(layout.shape)}: {e}. Index the whole parameter inside "
            "tensorplay_edu.parallel.init.full_size(module), or index one row / column at a time") from None
    full = _full_like(base, layout)
    fn(full.as_strided(*geometry), *rest, **kw)
    mark = torch.zeros(layout.shape, dtype=torch.bool, device=full.device)
    mark.as_strided(*geometry).fill_(True)
    mine = _piece_of(mark, layout.mesh, layout.placements)
    base[mine] = _piece_of(full, layout.mesh, layout.placements)[mine]
    return view


def _empty_like(dt: DTensor, *args, **kwargs) -> DTensor:
    """``torch.empty_like(dtensor, device=...)``: a DTensor of the same layout, real memory (from meta)."""
    local = torch.empty_like(dt.to_local(), *args, **kwargs)
    return DTensor.from_local(local, dt.device_mesh, dt.placements, shape=dt.shape)


def install_guards() -> None:
    """Wrap the torch.nn.init functions (idempotent; called on import) and teach DTensor ``empty_like``."""
    for name in INIT_FUNCTIONS:
        fn = getattr(nn.init, name, None)
        if fn is None or getattr(fn, "__tensorplay_guard__", False):
            continue
        wrapped = _wrap(fn)
        setattr(nn.init, name, wrapped)
        register_torch_function(fn, wrapped)  # a reference taken before the import dispatches here too
        register_torch_function(wrapped, wrapped)
    register_torch_function(torch.empty_like, _empty_like)
    guard_transformers_init()


def guard_transformers_init() -> int:
    """Point transformers' copies of the ``torch.nn.init`` functions at the wrapped ones.

    ``transformers.initialization.TORCH_INIT_FUNCTIONS`` is filled when transformers is imported;
    an entry that is PyTorch's own function, which this package wraps, is replaced by the wrapper
    (any other entry is left alone). Nothing happens while transformers is not imported: imported
    later, it copies the wrapped functions itself. Returns how many entries were replaced."""
    table = getattr(sys.modules.get("transformers.initialization"), "TORCH_INIT_FUNCTIONS", None)
    if not isinstance(table, dict):
        return 0
    replaced = 0
    for name, fn in list(table.items()):
        ours = getattr(nn.init, name, None)
        if getattr(ours, "__tensorplay_guard__", False) and getattr(ours, "__wrapped__", None) is fn:
            table[name] = ours
            replaced += 1
    return replaced


install_guards()

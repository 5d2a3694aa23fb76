"""``Piece``: this rank's part of a tensor-parallel state-dict entry, knowing where it lies.

A split parameter's state-dict entry (and its optimizer state: AdamW's ``exp_avg``) is this
rank's local tensor, but every global view of it (a DCP checkpoint, a file written by
``torch.save`` and read on another rank) must know which part of the whole it is. A
``Piece`` is a tensor of the *whole* tensor's size holding ``.local`` (the data) and
``.offsets`` (where it starts in the whole):

* DCP asks it three questions (``__create_write_items__``, ``__create_chunk_list__``,
  ``__get_tensor_shard__``): each rank writes its own chunk, and ``dcp.load`` fills exactly
  the chunk this rank holds, from whichever saved chunks overlap it (resharding);
* ``torch.save`` pickles the place with the data, and a default ``torch.load``
  (``weights_only=True``) gives the Piece back, so ``load_state_dict`` can refuse a piece
  of another rank's place instead of silently taking it;
* any other op is refused: a Piece never passes for the whole tensor.

``model.state_dict(keep_vars=True)`` hands out Pieces whose ``.local`` is the live parameter
(and ``.param`` the entry ``state_dict`` gave): ``dcp.load`` into it writes the parameter.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

__all__ = ["Piece"]


class Piece(torch.Tensor):
    """A state-dict entry: this rank's ``local`` tensor of a bigger one, at ``offsets``.

    Its size is the whole tensor's (what DCP compares with the checkpoint); ``.local`` is the
    data.  Ops other than ``detach`` / ``clone`` / ``to`` / ``copy_`` / ``empty_like`` are
    refused: take ``.local``, or gather with ``tensorplay_edu.parallel.full_state_dict``.
    """

    @staticmethod
    def __new__(cls, local: torch.Tensor, shape, offsets, param=None):
        piece = torch.Tensor._make_wrapper_subclass(cls, torch.Size(shape), dtype=local.dtype, device=local.device)
        piece.local, piece.offsets, piece.param = local, tuple(int(o) for o in offsets), param
        return piece

    def __init__(self, local, shape, offsets, param=None):
        super().__init__()

    # ---- DCP's protocol: which chunk this rank holds, and its data ----------------------------
    def __create_write_items__(self, fqn: str, obj) -> list[WriteItem]:
        if self.local.numel() == 0:  # torch.chunk left this rank nothing (2 rows over 4 ranks)
            return []
        chunk = self.__create_chunk_list__()[0]
        return [WriteItem(index=MetadataIndex(fqn, chunk.offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(chunk=chunk, properties=TensorProperties.create_from_tensor(
                              self.local), size=self.shape))]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        if self.local.numel() == 0:
            return []
        return [ChunkStorageMetadata(offsets=torch.Size(self.offsets), sizes=self.local.shape)]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        return self.local.detach()  # the same memory: dcp.load writes a keep_vars parameter in place

    # ---- as a tensor ---------------------------------------------------------------------------
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _KEPT:
            piece = args[0]
            return Piece(func(piece.local, *args[1:], **kwargs), piece.shape, piece.offsets)
        if func is torch.ops.aten.copy_.default and isinstance(args[0], Piece):
            dst, src = args[0], args[1]
            if isinstance(src, Piece) and (src.shape, src.offsets) != (dst.shape, dst.offsets):
                raise ValueError(f"copy_ between pieces of different places ({src.offsets} and {dst.offsets})")
            with torch.no_grad():
                dst.local.copy_(src.local if isinstance(src, Piece) else src)
            return dst
        piece = next((a for a in args if isinstance(a, Piece)), None)
        where = f" (the part at offsets {list(piece.offsets)}, shape {list(piece.local.shape)}, of a " \
                f"{list(piece.shape)} tensor)" if piece is not None else ""
        raise NotImplementedError(
            f"{func} on a Piece{where}: this rank's part of a tensor-parallel state-dict entry is not the whole "
            "tensor. Load it into the parallelized model (load_state_dict on the rank that saved it, or dcp.load, "
            "which reshards); use .local for this rank's tensor, tensorplay_edu.parallel.full_state_dict(model) for "
            "the whole one (what a single-device model loads)")

    def __repr__(self):
        return f"Piece(shape={list(self.shape)}, offsets={list(self.offsets)}, local={self.local!r})"

    def __reduce_ex__(self, proto):
        # torch.save: the data and its place (a keep_vars entry saves the parameter's values)
        return rebuild_piece, (self.local.detach(), tuple(self.shape), self.offsets)


def rebuild_piece(local: torch.Tensor, shape: tuple, offsets: tuple) -> Piece:
    """``torch.load`` of a saved Piece (an allowed global of ``weights_only`` loading)."""
    return Piece(local, shape, offsets)


_KEPT = tuple(  # the aten ops a Piece answers with a Piece
    getattr(torch.ops.aten, op).default for op in ("detach", "clone", "_to_copy", "empty_like", "alias"))
torch.serialization.add_safe_globals([rebuild_piece])

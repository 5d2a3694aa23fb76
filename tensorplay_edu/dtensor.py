"""DTensor: this rank's local tensor plus the layout that says what it is a piece of.

A DTensor is not a ``torch.Tensor`` subclass: it holds a plain local tensor (which carries
autograd), a :class:`~tensorplay_edu.mesh.DeviceMesh`, one placement per mesh dimension and
the global shape.  Nothing happens behind your back:

* ``DTensor.from_local`` and ``to_local`` never communicate (``run_check=True`` aside);
* ``redistribute`` / ``full_tensor`` communicate through the transition table
  (:mod:`tensorplay_edu.transition`), and their backward is that same table;
* the few ops a loss path needs (``flatten``, ``view``/``reshape`` keeping the sharded
  dim whole, ``float``/``to(dtype)``, ``detach``) act on the local tensor;
* any other torch op raises an error naming the op, unless a feature registered it below.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import collectives as C
from .debug import current_module, module_scope
from .mesh import DeviceMesh
from .placement import Replicate, Shard, global_shape, local_shape, resolve_placements
from .transition import GradLayout, Redistribute

__all__ = ["DTensor", "register_torch_function"]


# ---- what a DTensor accepts beyond its own methods: features register theirs -------------
# (loss_parallel: F.cross_entropy & co; parallel/pointwise.py: a scale or tanh; parallel/init.py: nn.init)
_TORCH_FUNCTIONS: dict = {}  # func -> handler(*args, **kwargs), read by DTensor.__torch_function__
_OPERATORS: dict = {}  # "__mul__" -> handler(self, *args), read by the DTensor's operator methods
_HINTS: dict = {}  # func -> the advice its error gives instead of the generic one ("{placements}" filled in)


def register_torch_function(func, handler):
    """Let ``func(dtensor, ...)`` run ``handler`` (``None`` removes it); returns the handler
    it replaces (or None), so that a caller can put it back."""
    previous = _TORCH_FUNCTIONS.get(func)
    if handler is None:
        _TORCH_FUNCTIONS.pop(func, None)
    else:
        _TORCH_FUNCTIONS[func] = handler
    return previous


def register_hint(func, hint: str) -> None:
    """The advice the error of ``func(dtensor, ...)`` gives instead of the generic one."""
    _HINTS[func] = hint


for _loss in (F.cross_entropy, F.log_softmax, F.nll_loss):  # where these work, and why .to_local() is wrong
    register_hint(_loss, f"F.{_loss.__name__} of a DTensor (placements {{placements}}) works under `with "
                         "tensorplay_edu.parallel.loss_parallel():` (vocabulary-parallel, no gather). Not on "
                         ".to_local(): that would normalise over this rank's classes only, a wrong loss; "
                         ".full_tensor() gathers the logits first (correct, more memory).")


def _unsupported(name: str, placements, args=()) -> NotImplementedError:
    """The error for an op a DTensor does not run: what to do instead."""
    if any(type(a).__module__.startswith("torch.distributed.tensor") for a in args):  # PyTorch's DTensor
        return NotImplementedError(
            f"{name} mixes a tensorplay_edu DTensor (placements {list(placements)}) with PyTorch's "
            "torch.distributed.tensor.DTensor: they are different classes that cannot be combined. Use one "
            "library for the whole model (tensorplay_edu.parallel's styles and DTensor, or PyTorch's).")
    return NotImplementedError(
        f"{name} is not implemented for tensorplay_edu DTensor (placements {list(placements)}). "
        "Take this rank's piece with .to_local(), or the whole tensor with .full_tensor(), apply "
        f"{name} to that plain tensor, and wrap a sharded result with DTensor.from_local(...)."
    )


class DTensor:
    """A global tensor laid out over a mesh; construct with ``from_local`` or ``distribute_tensor``."""

    # made in every hook: its own fields in slots (a feature may still tag one: __dict__)
    __slots__ = ("_local", "_mesh", "_placements", "_shape", "_grad_layout", "_scope", "__dict__", "__weakref__")

    def __init__(self, local: torch.Tensor, mesh: DeviceMesh, placements: tuple, shape, grad_layout: GradLayout,
                 scope: str | None = None):
        self._local, self._mesh, self._placements = local, mesh, tuple(placements)
        self._shape = shape if type(shape) is torch.Size else torch.Size(shape)
        self._grad_layout = grad_layout
        self._scope = scope  # from_local's: its identity node is not made yet (see _identity_node)

    def _identity_node(self) -> None:
        """from_local's identity node: forward the identity, backward the table from the gradient layout the
        readers declared to the tensor's own.  Reading a Replicate DTensor with ``grad_placements=[Partial()]``
        is Megatron's f: identity forward, all-reduce backward (the table's Partial -> Replicate row).

        It is made when first needed (a reader declaring another layout, or a view) and shared by later
        readers: autograd sums their gradients first, so they cost one collective, recorded under
        from_local's module.  Readers keeping the default layout need no node, nor does a tensor sharded
        on every mesh dim (its readers can only declare its own layout)."""
        if self._scope is not None and self._local.requires_grad and not all(
                isinstance(p, Shard) for p in self._placements):
            with module_scope(self._scope):
                self._local = Redistribute.apply(self._local, self._mesh, self._placements, self._placements,
                                                 self._shape, self._grad_layout)
        self._scope = None

    # ---- construction --------------------------------------------------------------
    @staticmethod
    def from_local(local_tensor: torch.Tensor, device_mesh: DeviceMesh | None = None, placements=None, *,
                   run_check: bool = False, shape=None, stride=None) -> "DTensor":
        """Declare what ``local_tensor`` is a piece of.  No communication (unless ``run_check``).

        Without ``shape`` the global shape assumes even shards (local size x ranks); pass
        ``shape`` for uneven ones.  ``run_check`` broadcasts Replicate pieces from rank 0
        of their mesh dim and checks every rank's local shape against ``shape``.
        """
        mesh, placements = resolve_placements(device_mesh, placements, local_tensor.ndim, "DTensor.from_local")
        shape = global_shape(local_tensor, mesh, placements, shape, stride)  # checked against the piece
        if run_check:  # the one from_local that communicates
            local_tensor = C.run_check(local_tensor, mesh, placements, shape)
        return DTensor(local_tensor, mesh, placements, shape, GradLayout(placements), scope=current_module())

    def to_local(self, *, grad_placements=None) -> torch.Tensor:
        """This rank's piece.  No communication.

        ``grad_placements`` says how the gradient that comes back to the piece is laid
        out, when not like the tensor itself: ``[Partial()]`` when each rank's gradient
        is an addend (the piece fed a matmul on a sharded weight).
        """
        if self._local.requires_grad:
            if grad_placements is None:
                self._grad_layout.declare(self._grad_layout.default)
            else:
                what = "to_local(grad_placements=...)"
                _, gp = resolve_placements(self._mesh, grad_placements, len(self._shape), what)
                for p, g in zip(self._placements, gp):
                    if (isinstance(p, Shard) or isinstance(g, Shard)) and p != g:
                        raise ValueError(
                            f"to_local(grad_placements={list(gp)}): the gradient must have the local tensor's "
                            f"shape, so where the tensor is {p} it cannot be {g}; only Replicate and Partial "
                            "can stand for each other")
                self._grad_layout.declare(gp)
            if self._grad_layout.placements != self._grad_layout.default:
                self._identity_node()
        return self._local

    def redistribute(self, device_mesh: DeviceMesh | None = None, placements=None, *, async_op: bool = False):
        """The same global tensor in other placements: the transition table, forward and backward.

        ``async_op`` is accepted for PyTorch compatibility; collectives here are synchronous.
        """
        if device_mesh is not None and device_mesh != self._mesh:
            raise NotImplementedError("redistribute: moving a DTensor to another mesh is not supported")
        _, dst = resolve_placements(self._mesh, placements, len(self._shape), "DTensor.redistribute")
        if self._local.requires_grad:
            self._grad_layout.declare(self._grad_layout.default)  # backward returns for_gradient(src)
        layout = GradLayout(dst)
        local = Redistribute.apply(self._local, self._mesh, self._placements, dst, self._shape, layout)
        return DTensor(local, self._mesh, dst, self._shape, layout)

    def full_tensor(self, *, grad_placements=None) -> torch.Tensor:
        """The whole global tensor on every rank (gathers / reduces as the table says)."""
        return self.redistribute(placements=[Replicate()] * self._mesh.ndim).to_local(grad_placements=grad_placements)

    # ---- metadata ------------------------------------------------------------------
    placements = property(lambda self: self._placements)
    device_mesh = property(lambda self: self._mesh)
    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._local.dtype)
    device = property(lambda self: self._local.device)
    requires_grad = property(lambda self: self._local.requires_grad)
    ndim = property(lambda self: len(self._shape))

    def size(self, dim: int | None = None):
        return self._shape if dim is None else self._shape[dim]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return self._shape.numel()

    @property
    def grad(self) -> "DTensor | None":
        """For a leaf DTensor (from ``distribute_tensor``): its gradient, laid out as its readers declared."""
        g = self._local.grad
        return None if g is None else DTensor(g, self._mesh, self._grad_layout.placements, self._shape,
                                              GradLayout(self._grad_layout.placements))

    def requires_grad_(self, requires_grad: bool = True) -> "DTensor":
        self._local.requires_grad_(requires_grad)
        return self

    def __repr__(self):
        return f"DTensor(local_tensor={self._local}, device_mesh={self._mesh}, placements={self._placements})"

    # ---- the few local ops of a loss path --------------------------------------------
    def _derived(self, local: torch.Tensor, placements: tuple, shape, to_parent) -> "DTensor":
        layout = GradLayout(placements, parent=self._grad_layout, to_parent=to_parent)
        return DTensor(local, self._mesh, placements, shape, layout)

    def _reshaped(self, name: str, new_shape) -> "DTensor":
        """``view``/``reshape``/``flatten``: each sharded dim must stay one whole dim."""
        if len(new_shape) == 1 and isinstance(new_shape[0], (tuple, list, torch.Size)):
            new_shape = new_shape[0]
        new_shape = list(new_shape)
        if new_shape.count(-1) == 1:
            known = math.prod(s for s in new_shape if s != -1)
            new_shape[new_shape.index(-1)] = self.numel() // known if known else 0
        if math.prod(new_shape) != self.numel():
            raise RuntimeError(f"{name}: shape {new_shape} is invalid for a DTensor of global shape "
                               f"{list(self._shape)}")
        old, dim_map = list(self._shape), {}
        for p in self._placements:
            if isinstance(p, Shard):
                before = math.prod(old[: p.dim])
                hits = [j for j in range(len(new_shape))
                        if new_shape[j] == old[p.dim] and math.prod(new_shape[:j]) == before]
                if not hits:
                    raise _unsupported(f"DTensor.{name} to {new_shape} (it would split or merge sharded dim {p.dim})",
                                       self._placements)
                dim_map[p.dim] = hits[0]
        placements = tuple(Shard(dim_map[p.dim]) if isinstance(p, Shard) else p for p in self._placements)
        back = {v: k for k, v in dim_map.items()}
        local_new = local_shape(new_shape, self._mesh, placements)
        self._identity_node()  # a view's readers declare through it: the node must be under the view
        local = self._local.view(local_new) if name == "view" else self._local.reshape(local_new)

        def to_parent(gp):
            return tuple(Shard(back[p.dim]) if isinstance(p, Shard) and p.dim in back else p for p in gp)

        return self._derived(local, placements, new_shape, to_parent)

    def view(self, *shape) -> "DTensor":
        return self._reshaped("view", shape)

    def reshape(self, *shape) -> "DTensor":
        return self._reshaped("reshape", shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "DTensor":
        s, e = start_dim % max(self.ndim, 1), end_dim % max(self.ndim, 1)
        old = list(self._shape)
        return self._reshaped("flatten", old[:s] + [math.prod(old[s: e + 1])] + old[e + 1:])

    def to(self, *args, **kwargs) -> "DTensor":
        """Only a dtype change: ``x.to(torch.float32)`` or ``x.to(dtype=...)``."""
        dtype = kwargs.pop("dtype", None)
        if args and isinstance(args[0], torch.dtype):
            dtype, args = args[0], args[1:]
        if args or kwargs or dtype is None:
            raise _unsupported(f"DTensor.to({args}, {kwargs}) (only a dtype is supported)", self._placements)
        return self._local_map(lambda t: t.to(dtype))

    def _local_map(self, fn) -> "DTensor":
        """``fn`` on the local tensor, element by element: the same layout, gradients through it alike."""
        self._identity_node()  # a reader's gradient layout reaches self through the new tensor
        return self._derived(fn(self._local), self._placements, self._shape, lambda gp: gp)

    def float(self) -> "DTensor":
        return self.to(torch.float32)

    def double(self) -> "DTensor":
        return self.to(torch.float64)

    def detach(self) -> "DTensor":
        return DTensor(self._local.detach(), self._mesh, self._placements, self._shape, GradLayout(self._placements))

    # ---- everything else is refused, by name -----------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        handler = _TORCH_FUNCTIONS.get(func)
        if handler is not None:
            return handler(*args, **(kwargs or {}))
        placements = next((a.placements for a in args if isinstance(a, DTensor)), ())
        if func in _HINTS:
            raise NotImplementedError(_HINTS[func].format(placements=list(placements)))
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        raise _unsupported(f"torch op {getattr(func, '__module__', '') or ''}.{name}".replace("..", "."), placements,
                           [*args, *(kwargs or {}).values()])

    def __getattr__(self, name: str):
        if not name.startswith("__") and hasattr(torch.Tensor, name):
            raise _unsupported(f"Tensor.{name}", self._placements)
        raise AttributeError(f"'DTensor' object has no attribute {name!r}")


def _refuse(op: str):
    """Operator ``op``: the handler a feature registered (parallel/pointwise.py: a scale, tanh), else an error."""
    def method(self, *args, **kwargs):
        handler = _OPERATORS.get(op)
        if handler is not None:
            return handler(self, *args, **kwargs)
        raise _unsupported(f"operator {op}", self._placements, args)
    return method


# Comparisons too: Python's default ``==`` would answer by identity and ``bool()`` would be
# always True, silently.  (``hash`` stays by identity, like a torch.Tensor's.)
for _op in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "matmul", "rmatmul", "pow",
            "neg", "getitem", "setitem", "iadd", "isub", "imul", "itruediv", "lt", "le", "gt", "ge", "eq", "ne",
            "bool"):
    setattr(DTensor, f"__{_op}__", _refuse(f"__{_op}__"))

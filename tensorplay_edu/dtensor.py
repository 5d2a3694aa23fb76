"""DTensor: this rank's local tensor plus the layout that says what it is a piece of.

A DTensor is deliberately *not* a ``torch.Tensor`` subclass: it holds a plain local
tensor (which carries autograd), a :class:`~tensorplay_edu.mesh.DeviceMesh`, one
placement per mesh dimension and the global shape.  Nothing happens behind your back:

* ``DTensor.from_local`` and ``to_local`` never communicate;
* ``redistribute`` / ``full_tensor`` communicate through the transition table
  (:mod:`tensorplay_edu.transition`), and their backward is that same table;
* the few ops a loss path needs (``flatten``, ``view``/``reshape`` keeping the sharded
  dim whole, ``float``/``to(dtype)``, ``detach``) act on the local tensor;
* any other torch op raises an error that names the op and the placements.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .debug import current_module, module_scope
from .mesh import DeviceMesh, get_current_mesh
from .placement import Partial, Placement, Replicate, Shard, chunk_sizes, normalize
from .transition import GradLayout, Redistribute

__all__ = ["DTensor", "register_torch_function"]

# torch functions a DTensor accepts: filled by features such as loss_parallel.
_TORCH_FUNCTIONS: dict = {}


# what to say when a refused torch function has a better way than .to_local(): filled by features
_HINTS: dict = {}


def register_hint(func, hint: str) -> None:
    """The advice the error of ``func(dtensor, ...)`` gives instead of the generic one."""
    _HINTS[func] = hint


for _loss in (F.cross_entropy, F.log_softmax, F.nll_loss):  # where these work, and why .to_local() is wrong
    register_hint(_loss, f"F.{_loss.__name__} of a DTensor (placements {{placements}}) works under `with "
                         "tensorplay_edu.parallel.loss_parallel():` (vocabulary-parallel, no gather). Not on "
                         ".to_local(): that would normalise over this rank's classes only, a wrong loss; "
                         ".full_tensor() gathers the logits first (correct, more memory).")


def register_torch_function(func, handler):
    """Let ``func(dtensor, ...)`` run ``handler`` (``None`` removes it); returns the handler
    it replaces (or None), so that a caller can put it back."""
    previous = _TORCH_FUNCTIONS.get(func)
    if handler is None:
        _TORCH_FUNCTIONS.pop(func, None)
    else:
        _TORCH_FUNCTIONS[func] = handler
    return previous


_WHOLE = (Replicate, Partial)  # placements with nothing to normalise


def _resolve(mesh, placements, ndim: int, what: str) -> tuple[DeviceMesh, tuple[Placement, ...]]:
    mesh = mesh if mesh is not None else get_current_mesh()
    if mesh is None:
        raise ValueError(f"{what}: pass device_mesh (or call it inside `with mesh:`)")
    if placements is None:
        placements = [Replicate()] * mesh.ndim
    placements = tuple(placements)
    if len(placements) == 1 == mesh.ndim:  # the common case, checked quickly
        p = placements[0]
        if type(p) in _WHOLE or (type(p) is Shard and 0 <= p.dim < ndim):
            return mesh, placements
    wrong = next((p for p in placements if not isinstance(p, Placement)), None)
    if wrong is not None:
        raise TypeError(f"{what}: placements holds {wrong!r}, a {type(wrong).__name__}, not a Placement: use "
                        "Shard(dim), Replicate() or Partial()")
    if len(placements) != mesh.ndim:
        raise ValueError(f"{what}: give one placement per mesh dimension ({mesh.ndim}), got {placements}")
    placements = normalize(placements, ndim)
    shards = [p.dim for p in placements if isinstance(p, Shard)]
    if len(shards) != len(set(shards)):
        raise NotImplementedError(f"{what}: {placements} shards one tensor dim on two mesh dims; use one per tensor dim")
    return mesh, placements


def _local_shape(shape, mesh: DeviceMesh, placements) -> list[int]:
    """This rank's local shape for a tensor of global ``shape``."""
    local = list(shape)
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            local[p.dim] = chunk_sizes(shape[p.dim], mesh.size(i))[mesh.get_local_rank(i)]
    return local


def _unsupported(name: str, placements, args=()) -> NotImplementedError:
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
        """from_local's identity node (backward: the table from the readers' declared gradient layout to the
        tensor's own), made when first needed: a reader declaring another layout (``grad_placements=[Partial()]``,
        f) or a view.  Later readers share it (one collective for their summed gradients); it is attributed to
        from_local's module.  While readers take the default it would move nothing, so a hook costs no node;
        nor does a tensor sharded on every mesh dim, whose readers can only declare its own layout (the
        class-sharded logits that ``loss_parallel`` flattens)."""
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
        mesh, placements = _resolve(device_mesh, placements, local_tensor.ndim, "DTensor.from_local")
        if stride is not None and shape is None:
            raise ValueError("DTensor.from_local: pass shape together with stride")
        if shape is None:  # even pieces: local x ranks (torch.chunk then gives every rank exactly `local`)
            shape = list(local_tensor.shape)
            for i, p in enumerate(placements):
                if isinstance(p, Shard):
                    shape[p.dim] *= mesh.size(i)
            expected = None
        else:
            expected = _local_shape(shape, mesh, placements)
        shape = torch.Size(shape)
        if stride is not None and tuple(stride) != torch.empty(shape, device="meta").stride():
            raise NotImplementedError(f"DTensor.from_local: only contiguous global strides, got {tuple(stride)}")
        if expected is not None and list(local_tensor.shape) != expected:
            raise ValueError(
                f"DTensor.from_local: rank {mesh.get_rank()} holds a local tensor of shape "
                f"{list(local_tensor.shape)}, but a global {list(shape)} laid out as {list(placements)} gives it "
                f"{expected} (torch.chunk sizes); pass the right shape="
            )
        if run_check:
            from .distribute import run_check as _run_check  # the one from_local that communicates

            local_tensor = _run_check(local_tensor, mesh, placements, shape)
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
                _, gp = _resolve(self._mesh, grad_placements, len(self._shape), "to_local(grad_placements=...)")
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
        _, dst = _resolve(self._mesh, placements, len(self._shape), "DTensor.redistribute")
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
            raise RuntimeError(f"{name}: shape {new_shape} is invalid for a DTensor of global shape {list(self._shape)}")
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
        local_new = _local_shape(new_shape, self._mesh, placements)
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


# operators a DTensor accepts: filled by features (parallel/pointwise.py: a scale, tanh, on the logits)
_OPERATORS: dict = {}


def _refuse(op: str):
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

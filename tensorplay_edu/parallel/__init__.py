"""The ``torch.distributed.tensor.parallel`` API, on tensorplay_edu's DTensor.

A parallelized parameter is this rank's piece.  Importing the package also guards the places
where PyTorch would read a piece as the whole parameter (the list, with what each does:
docs/global_views.md): ``torch.nn.utils.clip_grad_norm_`` refuses pieces (clip_grad.py); the
``torch.nn.init`` functions draw the whole parameter and keep this rank's part (init.py);
``Optimizer.state_dict`` / ``load_state_dict`` hand out and take pieces that know their place
(optim_state.py); an optimizer that is not elementwise refuses to step on pieces
(optimizers.py); random ops follow their input's layout (rng.py).
"""

from . import checkpoint, init, optim_state, optimizers  # noqa: F401  (the guards above)
from . import pointwise  # noqa: F401  (element-wise ops on DTensors: a model's scaled logits under loss_parallel)
from .api import parallelize_module
from .clip_grad import clip_grad_norm_  # also guards torch.nn.utils.clip_grad_norm_ (see clip_grad.py)
from .grad_sync import PartialGradBucket, bucket_partial_grads
from .loss import loss_parallel
from .layout import ParamLayout, param_layout
from .params import attach_layouts, full_state_dict, load_full_state_dict
from .prepare import PrepareModuleInput, PrepareModuleInputOutput, PrepareModuleOutput
from .replicated import ReplicatedWithGradAllReduce
from .sequence import SequenceParallel
from .style import ColwiseParallel, ParallelStyle, RowwiseParallel

__all__ = [
    "ColwiseParallel", "ParallelStyle", "PrepareModuleInput", "PrepareModuleInputOutput", "PrepareModuleOutput",
    "RowwiseParallel", "SequenceParallel", "ReplicatedWithGradAllReduce", "parallelize_module", "loss_parallel",
    "ParamLayout", "param_layout", "attach_layouts", "full_state_dict", "load_full_state_dict", "clip_grad_norm_",
    "checkpoint", "bucket_partial_grads", "PartialGradBucket",
]

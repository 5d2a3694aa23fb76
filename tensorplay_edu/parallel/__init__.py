"""The ``torch.distributed.tensor.parallel`` API, on tensorplay_edu's DTensor.

Importing it also installs three guards on PyTorch functions that would give a silently
wrong answer on tensor-parallel parameters: ``torch.nn.utils.clip_grad_norm_`` and
``get_total_norm`` refuse them (clip_grad.py), the ``torch.nn.init`` functions initialise
the whole parameter and keep this rank's piece (init.py), and the optimizer-state functions
of ``torch.distributed.checkpoint.state_dict`` refuse them (checkpoint.py).
"""

from . import checkpoint, init  # noqa: F401  (the guards above)
from .api import parallelize_module
from .clip_grad import clip_grad_norm_  # also guards torch.nn.utils.clip_grad_norm_ (see clip_grad.py)
from .grad_sync import PartialGradBucket, bucket_partial_grads
from .loss import loss_parallel
from .params import ParamLayout, attach_layouts, full_state_dict, load_full_state_dict, param_layout
from .prepare import PrepareModuleInput, PrepareModuleInputOutput, PrepareModuleOutput
from .sequence import SequenceParallel
from .style import ColwiseParallel, ParallelStyle, RowwiseParallel

__all__ = [
    "ColwiseParallel", "ParallelStyle", "PrepareModuleInput", "PrepareModuleInputOutput", "PrepareModuleOutput",
    "RowwiseParallel", "SequenceParallel", "parallelize_module", "loss_parallel",
    "ParamLayout", "param_layout", "attach_layouts", "full_state_dict", "load_full_state_dict", "clip_grad_norm_",
    "checkpoint", "bucket_partial_grads", "PartialGradBucket",
]

"""The ``torch.distributed.tensor.parallel`` API, on tensorplay_edu's DTensor."""

from .api import parallelize_module
from .clip_grad import clip_grad_norm_  # also guards torch.nn.utils.clip_grad_norm_ (see clip_grad.py)
from .loss import loss_parallel
from .params import ParamLayout, attach_layouts, full_state_dict, load_full_state_dict, param_layout
from .prepare import PrepareModuleInput, PrepareModuleInputOutput, PrepareModuleOutput
from .sequence import SequenceParallel
from .style import ColwiseParallel, ParallelStyle, RowwiseParallel

__all__ = [
    "ColwiseParallel", "ParallelStyle", "PrepareModuleInput", "PrepareModuleInputOutput", "PrepareModuleOutput",
    "RowwiseParallel", "SequenceParallel", "parallelize_module", "loss_parallel",
    "ParamLayout", "param_layout", "attach_layouts", "full_state_dict", "load_full_state_dict", "clip_grad_norm_",
]

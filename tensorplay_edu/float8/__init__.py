"""Float8 training with tensorwise dynamic scaling, laid out like ``torchao.float8`` so that
only the package prefix of an import changes:

    from tensorplay_edu.float8 import convert_to_float8_training
    from tensorplay_edu.float8.float8_tensor_parallel import (Float8ColwiseParallel, Float8RowwiseParallel,
                                                              PrepareFloat8ModuleInput)

Reading order: scaling (amax, scale, the saturating cast; why the amax is global under TP)
-> config (torchao's fields, what each does here) -> float8_linear (the three float8 matmuls) -> float8_tensor_parallel (the styles).
"""

from .config import Float8LinearConfig, precompute_float8_dynamic_scale_for_fsdp
from .float8_linear import Float8Linear, convert_to_float8_training

__all__ = ["Float8Linear", "Float8LinearConfig", "convert_to_float8_training", "precompute_float8_dynamic_scale_for_fsdp"]

"""What NCCL and CUDA's float8 matmul would refuse or hang on, checked on the CPU (nccl.py,
scaled_mm.py): run a gloo job under ``NCCLRulesMode`` and see the GPU's errors before a GPU."""

from .nccl import NCCLRuleError, NCCLRulesMode

__all__ = ["NCCLRulesMode", "NCCLRuleError"]

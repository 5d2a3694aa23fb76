"""What NCCL and CUDA's float8 matmul would refuse or hang on, checked on the CPU: run a gloo job
under ``NCCLRulesMode`` and see the GPU's errors before a GPU.  nccl.py is the mode, fingerprint.py
NCCL's rules, scaled_mm.py the float8 matmul's."""

from .nccl import NCCLRuleError, NCCLRulesMode

__all__ = ["NCCLRulesMode", "NCCLRuleError"]

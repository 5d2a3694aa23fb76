"""Models with torchtitan's module names, and their tensor-parallel plans."""

from .llama import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
from .torchtitan import apply_tp

__all__ = ["ModelArgs", "Transformer", "apply_tp", "llama_loss", "loss_context", "parallelize_llama"]

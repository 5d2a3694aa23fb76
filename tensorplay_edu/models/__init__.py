"""Models with torchtitan's module names, and their tensor-parallel plans."""

from .llama import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama

__all__ = ["ModelArgs", "Transformer", "llama_loss", "loss_context", "parallelize_llama"]

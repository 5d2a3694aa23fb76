"""A model of a GPU cluster for tensor parallelism: hardware, Llama shapes, memory per GPU,
step time, the checks against published runs, and a search over layouts.

    from tensorplay_edu.cluster import GPUS, MODELS, Setup, memory, step_time
    python -m tensorplay_edu.cluster.search --model llama3-70b --gpus 64      # the layout search
"""

from .memory_use import LOGIT_PEAK_BYTES, korthikanti_activations, llama_activations, memory
from .model import (DEFAULT_MFU, FLOAT8_EFFICIENCY, GPU, GPUS, MODELS, NCCL_BASE_LATENCY, Model, Setup, collective_time,
                    ring_steps, ring_terms)
from .published import fit_cpu, predict_step, published_checks
from .timing import (step_time, tp_bytes_per_layer, tp_collectives_per_layer, tp_compute_over_comm,
                        tp_crossover_tokens, tp_max_inside, tp_rings)

__all__ = ["GPU", "GPUS", "Model", "MODELS", "Setup", "DEFAULT_MFU", "memory", "korthikanti_activations",
           "FLOAT8_EFFICIENCY", "NCCL_BASE_LATENCY", "LOGIT_PEAK_BYTES", "llama_activations", "ring_steps",
           "ring_terms", "collective_time", "tp_rings", "tp_collectives_per_layer", "tp_bytes_per_layer", "step_time",
           "tp_crossover_tokens", "tp_compute_over_comm", "tp_max_inside", "fit_cpu", "predict_step",
           "published_checks"]

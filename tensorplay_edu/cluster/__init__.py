"""A model of a GPU cluster for tensor parallelism: hardware, Llama shapes, memory per GPU, step time,
the checks against published runs, and a search over layouts.

    from tensorplay_edu.cluster import GPUS, MODELS, Setup, memory, step_time
    python -m tensorplay_edu.cluster.search --model llama3-70b --gpus 64      # the layout search
"""

from .calibration import CALIBRATED, DEFAULT_MFU, Efficiency
from .memory_use import LOGIT_PEAK_BYTES, korthikanti_activations, llama_activations, memory, sac_saved
from .model import (AC_MODES, FLOAT8_RECIPES, GPU, GPUS, LOSS_IMPLS, MODELS, NCCL_BASE_LATENCY, Model, Setup,
                    bytes_sent, collective_time, ring_steps, ring_terms)
from .protocols import NCCL_LL, cheapest_protocol, protocol_terms
from .published import error_bands, format_checks, published_checks
from .intensity import tp_compute_over_comm, tp_crossover_tokens, tp_max_inside
from .timing import (block_matmuls, compute_seconds, dp_bytes, dp_seconds, matmul_seconds, reported_flops, step_time,
                     tp_bytes_per_layer, tp_collectives_per_layer, tp_edge_collectives, tp_rings)

__all__ = ["GPU", "GPUS", "Model", "MODELS", "Setup", "FLOAT8_RECIPES", "AC_MODES", "LOSS_IMPLS", "Efficiency",
           "CALIBRATED", "DEFAULT_MFU", "memory", "sac_saved", "korthikanti_activations", "LOGIT_PEAK_BYTES", "llama_activations",
           "NCCL_BASE_LATENCY", "ring_steps", "bytes_sent", "ring_terms", "collective_time", "block_matmuls", "matmul_seconds",
           "compute_seconds", "reported_flops", "dp_seconds", "dp_bytes", "tp_rings", "tp_collectives_per_layer",
           "tp_bytes_per_layer", "tp_edge_collectives", "step_time", "tp_crossover_tokens", "tp_compute_over_comm", "tp_max_inside",
           "NCCL_LL", "protocol_terms", "cheapest_protocol", "published_checks", "error_bands", "format_checks"]

"""The few constants of :mod:`tensorplay_edu.cluster` that no datasheet gives: efficiencies fitted to
published runs, and which runs.

Every published throughput here was measured by torchtitan's team on H100s capped at 500 W with 96 GB
HBM2e (``GPUS["h100-500w"]``), with torch.compile; torchao's rows are speed-ups (two runs on one GPU, whose
variant it does not say), priced on the same part. The fit uses four of them and nothing else
(``published.FIT_ROWS``; ``published.fit()`` re-derives these numbers from them, and a test holds the two
equal); every other published run is a check the constants never saw (``published.published_checks``).
A 700 W H100 SXM runs faster than the part they were fitted on, so the model is likely pessimistic there
by an amount no published run measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Efficiency", "CALIBRATED", "DEFAULT_MFU"]


@dataclass(frozen=True)
class Efficiency:
    """``matmul``: the share of the peak FLOP/s a matmul's FLOPs run at (the elementwise work around it
    folded in); ``hbm``: the share of HBM bandwidth its bytes move at (fitted low, a quarter: more than
    bandwidth, it holds whatever made the one fitted TP 8 run slow, such as thin matmuls' tiles that
    leave the GPU's cores idle: read it as a fitted penalty on thin matmuls); ``float8``: for each recipe, the
    share of that bf16 efficiency a float8 matmul reaches against the fp8 peak (its casts and scales are
    memory-bound work the peak does not see)."""
    matmul: float
    hbm: float
    float8: dict = field(default_factory=dict)


# Fitted by published.fit() to published.FIT_ROWS (torchtitan Llama 3.1 8B on 8 GPUs: FSDP 8 bf16 and
# float8 tensorwise, FSDP 8 x TP 8 bf16; torchao's rowwise speed-up on 8 GPUs).
CALIBRATED = Efficiency(matmul=0.3972, hbm=0.2486, float8={"tensorwise": 0.6932, "rowwise": 0.5660})

# The MFU torchtitan reports for Llama 3.1 8B on 8 of those GPUs with torch.compile (FSDP, bf16, selective
# AC; 6,667 tokens/s/GPU; 33.7% without compile), with its FLOP convention (timing.reported_flops). The
# notebooks' back-of-envelope estimates use it as "the share of peak a tuned step sustains".
DEFAULT_MFU = 0.39

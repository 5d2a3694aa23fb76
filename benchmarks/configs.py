"""The models `make bench` times: the configs, the model and its batch (float8-converted on request, the
matmul emulated where this CPU's float8 matmul is a reference loop), and PyTorch's own plan for them."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tensorplay_edu.launcher.torchrun import current_device
from tensorplay_edu.models import ModelArgs, Transformer

CONFIGS = {
    "small": dict(dim=256, n_layers=2, vocab_size=8192, seq=128, batch=4),
    "medium": dict(dim=1024, n_layers=4, vocab_size=32000, seq=256, batch=4),
}


def float8_emulated(clock=time.perf_counter) -> bool:
    """True where this CPU's ``torch._scaled_mm`` is a reference loop: oneDNN has a float8 matmul kernel only
    for some CPUs, and elsewhere runs a loop that was measured here at 0.07 GFLOP/s, a thousand times slower
    than a float32 matmul (a medium-config step would take hours).  The float8 models then emulate the
    matmul, as torchao's CPU tests do (``Float8LinearConfig(emulate=True)``: the exact float8 values
    dequantized and multiplied in float32); casts, scales, collectives and bytes are unchanged.  ``clock``:
    the seconds clock read around each matmul (a test passes one that does not depend on the machine)."""
    a, b, one = torch.randn(128, 128), torch.randn(128, 128), torch.tensor(1.0)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()

    def fastest(fn) -> float:  # the least of five: a busy machine only ever adds time
        times = []
        for _ in range(5):
            start = clock()
            fn()
            times.append(clock() - start)
        return min(times)

    float32 = fastest(lambda: a @ b)
    float8 = fastest(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.float32))
    return is_reference_loop(float32, float8)


def is_reference_loop(float32_s: float, float8_s: float) -> bool:
    """The rule :func:`float8_emulated` applies to its two times: a kernel is within a few times float32's, the
    reference loop about a thousand times; 50x (plus a millisecond, for a float32 time near zero) splits them."""
    return float8_s > 50 * float32_s + 1e-3


def build(config: str, float8: bool = False, emulate: bool = False) -> tuple[Transformer, torch.Tensor, torch.Tensor]:
    """The model and one batch; ``float8``: the Linears converted as torchtitan does (the output layer stays),
    their matmul emulated if ``emulate`` (rank_bench asks :func:`float8_emulated`)."""
    c = CONFIGS[config]
    torch.manual_seed(0)
    model = Transformer(ModelArgs(dim=c["dim"], n_layers=c["n_layers"], n_heads=8, vocab_size=c["vocab_size"],
                                  max_seq_len=c["seq"]))
    if float8:
        from tensorplay_edu.float8 import Float8LinearConfig, convert_to_float8_training
        model = convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "output",
                                           config=Float8LinearConfig(emulate=emulate))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, c["vocab_size"], (c["batch"], c["seq"]), generator=g)
    return model, tokens, tokens.roll(-1, dims=1)


def torch_parallelize(model, plan: str):
    """The same two plans with PyTorch's own API (what users would otherwise run)."""
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    mesh = torch_mesh(current_device().type, (dist.get_world_size(),))
    sp = plan == "full"
    parallelize_module(model, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False) if sp
        else ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        **({"norm": SequenceParallel()} if sp else {}),
    })
    block = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
             "attention.wo": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel(),
             "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
             "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel()}
    block_in = Shard(1) if sp else Replicate()  # as parallelize_llama: one DTensor per block input, one f / gather
    block.update({"attention": PrepareModuleInput(input_layouts=(block_in, None), desired_input_layouts=(Replicate(), None)),
                  "feed_forward": PrepareModuleInput(input_layouts=(block_in,), desired_input_layouts=(Replicate(),))})
    if sp:
        block.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
    for layer in model.layers.values():
        parallelize_module(layer, mesh, block)
    return model

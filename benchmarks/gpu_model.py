"""The GPU-sized model of `make gpu-check`: its configs, the FLOPs of a step, the GPU's bf16 peak, the memory
of e2's one-GPU reference, and one training step of each variant.

``CONFIGS["gpu"]`` is Llama-3-8B's block at a few layers (dim 4096, 32 query and 8 key-value heads, FFN 14336,
vocabulary 128256, 4 layers, one sequence of 8192 tokens), trained in bf16 under the full plan: 4 layers so
that the float8 model of ``e2`` still trains on one 80 GB GPU as its reference (about 32 GiB by
:func:`reference_bytes`, logits included). ``CONFIGS["tiny"]`` is the CPU dry run's model. Each rank builds
the model on its device from the same seed.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from tensorplay_edu import async_tp, init_device_mesh
from tensorplay_edu.cluster import GPUS, Model, Setup, memory
from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
from tensorplay_edu.models.by_hand import HandLlama, hand_step
from tensorplay_edu.parallel import bucket_partial_grads

from configs import torch_parallelize

CONFIGS = {
    "gpu": dict(dim=4096, n_layers=4, n_heads=32, n_kv_heads=8, ffn_hidden=14336, vocab_size=128256, seq=8192,
                batch=1),
    "tiny": dict(dim=128, n_layers=2, n_heads=16, n_kv_heads=8, ffn_hidden=352, vocab_size=512, seq=32, batch=2),
}
LR = 3e-4


def model_flops(c: dict) -> float:
    """FLOPs of one training step of the whole model, counted as ``tensorplay_edu.cluster`` (torchtitan's MFU
    convention): 6 per matmul weight and token (2 forward, 4 backward; the output layer counts, the
    embedding lookup does not) plus attention's 12·L·s²·h·b (QKᵀ and AV, the whole square)."""
    m = Model("gpu-check", c["n_layers"], c["dim"], c["n_heads"], c["n_kv_heads"], c["ffn_hidden"], c["vocab_size"])
    tokens = c["batch"] * c["seq"]
    return 6 * (m.layers * m.layer_params() + m.vocab * m.dim) * tokens + 12 * m.layers * c["seq"] * tokens * m.dim


def peak_flops(name: str) -> tuple[float | None, str]:
    """The dense bf16 peak of the GPU called ``name`` (``torch.cuda.get_device_name``) from
    ``scale.GPUS``, SXM parts only (PCIe and NVL cards run slower clocks), or (None, why)."""
    for key, gpu in GPUS.items():
        if key.upper() in name.upper() and not any(w in name for w in ("PCIe", "NVL")):
            return gpu.bf16_flops, f"of {gpu.name}'s bf16 {gpu.bf16_flops / 1e12:.0f} TFLOP/s"
    return None, f"peak unknown: {name} is not in tensorplay_edu.cluster.GPUS"


def build(c: dict, device: torch.device, float8: bool = False):
    """The model (bf16, on ``device``, the same on every rank: one seed) and one batch [b, s]."""
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(ModelArgs(dim=c["dim"], n_layers=c["n_layers"], n_heads=c["n_heads"],
                                      n_kv_heads=c["n_kv_heads"], ffn_hidden=c["ffn_hidden"],
                                      vocab_size=c["vocab_size"], max_seq_len=c["seq"]))
    if float8:
        from tensorplay_edu.float8 import convert_to_float8_training
        model = convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "output")
    tokens = torch.randint(0, c["vocab_size"], (c["batch"], c["seq"]), generator=torch.Generator().manual_seed(1))
    tokens = tokens.to(device)
    return model.to(torch.bfloat16), tokens, tokens.roll(-1, dims=1)


def trainer(kind: str, c: dict, device: torch.device):
    """``step()`` -> the step's loss (a float, the same on every rank) for one variant of gpu_measure.py's ``NAMES``."""
    model, tokens, labels = build(c, device, float8="float8" in kind)
    loss_ctx, fused = contextlib.nullcontext, contextlib.nullcontext
    if kind.startswith("ours"):
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        parallelize_llama(model, mesh, "full", float8=kind == "ours float8")
        loss_ctx = lambda: loss_context("full")  # noqa: E731
        if kind == "ours async":
            fused = lambda: async_tp.enable_async_tp(mesh)  # noqa: E731
    elif kind == "torch":
        from torch.distributed.tensor.parallel import loss_parallel
        model, loss_ctx = torch_parallelize(model, "full"), loss_parallel
    elif kind == "hand":
        model = HandLlama(model, "full")
    on_device(model, tokens, device, kind)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    if kind.startswith("ours"):  # the norms' partial gradients in one bucket, made whole in opt.step(): as
        bucket_partial_grads(model, opt)  # make bench, runners.py's rank_bench and the floor (models/by_hand.py) do

    def step() -> torch.Tensor:
        if kind == "hand":
            loss = hand_step(model, tokens, labels)
        else:
            with loss_ctx():
                with fused():
                    out = model(tokens)
                loss = llama_loss(out, labels)
                loss.backward()  # PyTorch's loss_parallel wants the backward inside
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def on_device(model, tokens: torch.Tensor, device: torch.device, kind: str) -> None:
    """Every parameter's local tensor and the batch on ``device``: a check that fell back to the CPU says so."""
    local = [getattr(p, "to_local", lambda p=p: p)() for p in model.parameters()]
    elsewhere = sorted({str(t.device) for t in [*local, tokens] if t.device.type != device.type})
    if elsewhere:
        raise RuntimeError(f"gpu_measure.py, {kind}: tensors on {elsewhere}, not on {device.type}: the model or the "
                           "batch did not move to this rank's device")



def reference_bytes(c: dict) -> float:
    """e2's one-GPU reference, estimated with ``tensorplay_edu.cluster.memory_use`` (activations, their
    gradients in backward, gathered logits) and 8 bytes per parameter: the model trains in bf16 with no fp32
    master copy (bf16 weights and gradients, AdamW's two moments in bf16) instead of FSDP2's 16; float8 is not
    modelled (bf16 is kept)."""
    m = Model("gpu-check", c["n_layers"], c["dim"], c["n_heads"], c["n_kv_heads"], c["ffn_hidden"], c["vocab_size"])
    parts = memory(m, Setup(tp=1, batch=c["batch"], seq=c["seq"]))
    return parts["activations"] + parts["backward"] + parts["logits"] + 8 * m.params()


def too_small(c: dict, device: torch.device) -> str:
    """Why rank 0's GPU cannot hold e2's one-GPU reference (with 10% room), or ""."""
    if device.type != "cuda":
        return ""
    need, total = 1.1 * reference_bytes(c), torch.cuda.get_device_properties(device).total_memory
    return "" if need <= total else (f"the one-GPU float8 reference needs about {need / 2**30:.0f} GiB by "
                                     f"reference_bytes (with 10% room); this GPU has {total / 2**30:.0f} GiB")


"""A small Llama with torchtitan's module names, and its two tensor-parallel plans.

Names: ``tok_embeddings``, ``layers`` (a ModuleDict "0".."L-1") of blocks with
``attention.wq/wk/wv/wo``, ``attention_norm``, ``feed_forward.w1/w2/w3``, ``ffn_norm``;
then ``norm`` and ``output``.  Attention reshapes with ``view(bs, seqlen, -1, head_dim)``
so that it runs unchanged on this rank's heads after ColwiseParallel.

Plans (:func:`parallelize_llama`):

* ``"vanilla"``: torchtitan's ``apply_tp`` without sequence parallelism: embeddings and
  output replicated at the edges, colwise wq/wk/wv/w1/w3, rowwise wo/w2; plus one
  PrepareModuleInput (Replicate -> Replicate, kept a DTensor) on attention and
  feed_forward, so that wq/wk/wv (and w1/w3) read ONE DTensor and share one ``f``: the
  backward costs one all-reduce per block input (1 + 2L), where torchtitan's plan, like
  PyTorch, pays one per Linear (1 + 5L).
* ``"full"``: torchtitan's plan: the same plus SequenceParallel on every norm,
  PrepareModuleInput (Shard(1) -> Replicate) on attention and feed_forward, rowwise
  outputs on Shard(1), the output layer colwise from Shard(1) to a Shard(-1) DTensor,
  and the loss under ``loss_parallel()``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..mesh import DeviceMesh
from ..parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, loss_parallel,
                        parallelize_module)
from ..placement import Replicate, Shard

__all__ = ["ModelArgs", "Transformer", "parallelize_llama", "llama_loss", "loss_context"]


@dataclass
class ModelArgs:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None
    vocab_size: int = 256
    ffn_hidden: int | None = None  # default: SwiGLU's 8/3 * dim, rounded up to a multiple of 16
    max_seq_len: int = 64
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0


def rope_tables(head_dim: int, seq_len: int, theta: float):
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), freqs)  # [s, hd/2]
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels of ``x`` [b, s, heads, hd] by position-dependent angles."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads = args.n_heads, args.n_kv_heads or args.n_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x, rope):
        bs, seqlen, _ = x.shape  # global shape, also when x is a DTensor
        cos, sin = rope
        q = self.wq(x).view(bs, seqlen, -1, self.head_dim)  # [b, s, heads/t, hd]
        k = self.wk(x).view(bs, seqlen, -1, self.head_dim)  # [b, s, kv_heads/t, hd]
        v = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        q, k = apply_rope(q, cos[:seqlen], sin[:seqlen]), apply_rope(k, cos[:seqlen], sin[:seqlen])
        rep = q.shape[2] // k.shape[2]  # grouped-query attention: the same ratio on every rank
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))  # [b, s, heads/t * hd] -> [b, s, dim]


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(hidden, dim, bias=False), \
            nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # [.., hidden/t] inside


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        hidden = args.ffn_hidden or 16 * math.ceil(8 * args.dim / 3 / 16)
        self.attention, self.feed_forward = Attention(args), FeedForward(args.dim, hidden)
        self.attention_norm, self.ffn_norm = RMSNorm(args.dim, args.norm_eps), RMSNorm(args.dim, args.norm_eps)

    def forward(self, x, rope):
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        cos, sin = rope_tables(args.dim // args.n_heads, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """(Re)initialise after ``to_empty``, as torchtitan's models do: the rotary tables (not
        in the state dict), norm weights to one, Linear / Embedding by their default init.

        On a parallelized model the result is the single-device model initialised under the
        same seed, bit for bit: a styled Linear's or Embedding's ``reset_parameters`` draws the
        whole weight on every rank and keeps this rank's piece (``tensorplay_edu.parallel.init``)."""
        device = buffer_device or self.norm.weight.device
        cos, sin = rope_tables(self.args.dim // self.args.n_heads, self.args.max_seq_len, self.args.rope_theta)
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                module.reset_parameters()

    def forward(self, tokens: torch.Tensor):
        _check_tokens(tokens)
        h = self.tok_embeddings(tokens)  # [b, s, dim] (full plan: [b, s/t, dim])
        rope = (self.rope_cos, self.rope_sin)
        for layer in self.layers.values():
            h = layer(h, rope)
        return self.output(self.norm(h))  # [b, s, vocab] (full plan: a Shard(-1) DTensor)


def llama_loss(logits, labels: torch.Tensor) -> torch.Tensor:
    """torchtitan's loss: cross-entropy over all tokens, in float32 for half-precision
    logits (float64 stays float64); works on a vocab-sharded DTensor under ``loss_parallel()``."""
    if logits.dim() != 3 or labels.dim() != 2:
        raise ValueError(f"llama_loss: logits must be [batch, seq, vocab] and labels [batch, seq], got logits "
                         f"{list(logits.shape)} and labels {list(labels.shape)}: give the model [batch, seq] tokens "
                         "(one sequence: tokens[None]) and the labels in the same shape")
    logits = logits.flatten(0, 1)  # [b*s, vocab]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return F.cross_entropy(logits, labels.flatten(0, 1))


def parallelize_llama(model: Transformer, mesh: DeviceMesh, plan: str = "full", *,
                      gather_logits: bool = False, float8: bool = False) -> Transformer:
    """Apply the ``"vanilla"`` or ``"full"`` plan (see the module docstring) in place.

    ``gather_logits=True`` (full plan) all-gathers the logits instead of leaving them
    vocab-sharded for ``loss_parallel`` (what loss_parallel saves, for comparison).
    ``float8=True``: the blocks' Linears (converted by ``convert_to_float8_training``) get the
    float8 styles (``tensorplay_edu.float8.float8_tensor_parallel``), as torchtitan's
    ``enable_float8_tensorwise_tp``; the embedding and the output layer stay as they are.
    """
    t, args = mesh.size(), model.args
    for name, n in (("n_heads", args.n_heads), ("n_kv_heads", args.n_kv_heads or args.n_heads)):
        if n % t:
            raise ValueError(f"parallelize_llama: {name}={n} does not divide by the TP degree {t}: each rank must "
                             "hold whole heads; pick a TP degree that divides the number of heads")
    if plan not in ("vanilla", "full"):
        raise ValueError(f"parallelize_llama: plan must be 'vanilla' or 'full', got {plan!r}")
    sp = plan == "full"
    parallelize_module(model, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()),
        "output": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(),
                                  output_layouts=Replicate() if gather_logits or not sp else Shard(-1),
                                  use_local_output=gather_logits or not sp),
        **({"norm": SequenceParallel()} if sp else {}),
    })
    colwise, rowwise, prepare = ColwiseParallel, RowwiseParallel, PrepareModuleInput
    if float8:
        from ..float8.float8_tensor_parallel import (Float8ColwiseParallel, Float8RowwiseParallel,
                                                     PrepareFloat8ModuleInput)
        colwise, rowwise, prepare = Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    block_plan = {
        "attention.wq": colwise(), "attention.wk": colwise(), "attention.wv": colwise(),
        "attention.wo": rowwise(output_layouts=Shard(1)) if sp else rowwise(),
        "feed_forward.w1": colwise(), "feed_forward.w3": colwise(),
        "feed_forward.w2": rowwise(output_layouts=Shard(1)) if sp else rowwise(),
    }
    block_in = Shard(1) if sp else Replicate()  # [b, s/t, h] under SP, else [b, s, h] on every rank
    block_plan.update({  # one DTensor for the Colwise readers: one all-gather / f per block input
        "attention": prepare(input_layouts=(block_in, None), desired_input_layouts=(Replicate(), None)),
        "feed_forward": prepare(input_layouts=(block_in,), desired_input_layouts=(Replicate(),)),
    })
    if sp:
        block_plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
    for block in model.layers.values():
        parallelize_module(block, mesh, block_plan)
    if sp:
        model.register_forward_pre_hook(lambda mod, inputs: _check_sequence(inputs[0], t))
    return model


def _check_tokens(tokens) -> None:
    """The model reads a batch of sequences: token ids [batch, seq]."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        got = f"shape {list(tokens.shape)}" if isinstance(tokens, torch.Tensor) else f"a {type(tokens).__name__}"
        raise ValueError(f"Transformer: tokens must be token ids of shape [batch, seq], got {got}: for one "
                         "sequence add the batch dimension, tokens[None] (tokens.unsqueeze(0))")


def _check_sequence(tokens: torch.Tensor, t: int) -> None:
    _check_tokens(tokens)  # (this hook runs before forward)
    if tokens.shape[1] % t:
        raise ValueError(f"the full (sequence-parallel) plan splits the sequence over {t} ranks, but the sequence "
                         f"length {tokens.shape[1]} does not divide by {t}: pad or trim it to a multiple of {t}")


def loss_context(plan: str):
    """``loss_parallel()`` for the full plan, a no-op context for the vanilla one."""
    return loss_parallel() if plan == "full" else contextlib.nullcontext()

"""The same Llama without the abstraction: Megatron's tensor parallelism written by hand.

A floor to time tensorplay_edu against (``make bench``'s "hand" column), and a lesson: everything
the styles, the placements and the transition table decide for you, decided here in place.
:class:`HandLlama` takes a single-device :class:`~tensorplay_edu.models.Transformer`, keeps this rank's
``torch.chunk`` pieces of its weights (rows of wq / wk / wv / w1 / w3, of the embedding and of the
output layer; columns of wo / w2; the norms whole) and runs its forward with raw ``torch.distributed``
calls, in four autograd Functions, Megatron-LM's mappings.py with Korthikanti et al. 2022's letters:
f and f̄ (copy_to_ / reduce_from_tensor_model_parallel_region; Shoeybi et al. 2019 called f̄ g) and
the sequence-parallel g and ḡ (gather_from_sequence_parallel_region, reduce_scatter_to_sequence_parallel_region):

=================  =============================  ==============  ======================
Function           forward                        backward        where
=================  =============================  ==============  ======================
``Copy`` (f)       identity                       all-reduce      block input, vanilla
``Reduce`` (f̄)     all-reduce                     identity        after wo / w2, vanilla
``Gather`` (g)     all-gather along the sequence  reduce-scatter  block input, full
``Scatter`` (ḡ)    reduce-scatter along sequence  all-gather      after wo / w2, full
=================  =============================  ==============  ======================

Plans: ``"vanilla"`` (activations replicated between blocks; the logits all-gathered over the vocabulary
and a plain ``F.cross_entropy``) and ``"full"`` (sequence parallel: between blocks each rank keeps s/t
tokens, the norms run on them; the logits stay vocabulary-sharded for :class:`VocabParallelCrossEntropy`).
A step: ``hand_step(model, tokens, labels)``, then any ``torch.optim`` step.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from tensorplay_edu.models.llama import Transformer, apply_rope

# torch 2.13 renamed the flat collectives (they concatenate on dim 0); older releases only have the old names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

SHARD_DIM = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "tok_embeddings": 0, "output": 0, "wo": 1, "w2": 1}


def shard_dim(name: str) -> int | None:
    """The dim a parameter (``layers.0.attention.wq.weight``) is chunked along; None: whole on every rank."""
    return SHARD_DIM.get(name.split(".")[-2])


def _gather_seq(x: torch.Tensor, group) -> torch.Tensor:
    """[b, s/t, d] -> [b, s, d].  The flat all-gather stacks the ranks' blocks in front: [t, b, s/t, d]."""
    t = dist.get_world_size(group)
    out = x.new_empty((t * x.shape[0], *x.shape[1:]))  # the flat collectives want [t * b, ...]
    _all_gather_flat(out, x.contiguous(), group=group)
    return out.view(t, *x.shape).transpose(0, 1).reshape(x.shape[0], t * x.shape[1], *x.shape[2:])  # one copy


def _scatter_seq(x: torch.Tensor, group) -> torch.Tensor:
    """[b, s, d] partial sums -> [b, s/t, d] whole: rank r's block of the sequence moved in front first."""
    t = dist.get_world_size(group)
    b, s = x.shape[:2]
    send = x.reshape(b, t, s // t, *x.shape[2:]).transpose(0, 1).contiguous()  # [t, b, s/t, d], one copy
    out = x.new_empty(send.shape[1:])
    _reduce_scatter_flat(out, send.flatten(0, 1), group=group)
    return out


class Copy(torch.autograd.Function):
    """Megatron's f: a replicated input read by column-parallel Linears; their input gradients are partial."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()  # a fresh sum autograd made for us alone: reduced in place, as Megatron does
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class Reduce(torch.autograd.Function):
    """f̄ (Megatron's 2019 g): the partial sums of a row-parallel Linear, made whole."""

    @staticmethod
    def forward(ctx, x, group):
        dist.all_reduce(x, group=group)  # x is the matmul's fresh output, saved by nobody
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Gather(torch.autograd.Function):
    """Sequence parallel's g (Korthikanti's; the table's Shard(1) -> Replicate): the block input's sequence
    shards gathered; backward sums and scatters."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _scatter_seq(grad, ctx.group), None


class Scatter(torch.autograd.Function):
    """Sequence parallel's ḡ (the table's Partial -> Shard(1)): partial sums reduce-scattered along the
    sequence; backward gathers."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _scatter_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(grad, ctx.group), None


class GatherVocab(torch.autograd.Function):
    """Vanilla plan's logits: [N, V/t] -> [N, V]; backward keeps this rank's columns (no communication)."""

    @staticmethod
    def forward(ctx, x, offset, vocab, group):
        t, c = dist.get_world_size(group), -(-vocab // dist.get_world_size(group))
        ctx.offset, ctx.width = offset, x.shape[1]
        x = F.pad(x, (0, c - x.shape[1])) if x.shape[1] < c else x.contiguous()  # gloo wants equal sizes
        out = x.new_empty((t * x.shape[0], c))  # [t * N, c]; chunk's padding all sits after the last real column
        _all_gather_flat(out, x, group=group)
        return out.view(t, x.shape[0], c).transpose(0, 1).reshape(x.shape[0], t * c)[:, :vocab]

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.offset:ctx.offset + ctx.width], None, None, None


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of vocab-sharded logits [N, V/t] with Megatron's collectives: three all-reduces of
    [N] forward, none backward, and the gradient written over the saved softmax, in one fresh buffer of
    logit size (Megatron works in place on the caller's logits instead)."""

    @staticmethod
    def forward(ctx, logits, target, offset, group):
        m = logits.amax(1)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)  # 1: the global max of each row
        buf = logits - m[:, None]  # the one fresh [N, V/t] buffer
        mine = (target >= offset) & (target < offset + logits.shape[1])  # rows whose target this rank owns
        local = (target - offset).masked_fill_(~mine, 0)
        target_logit = buf.gather(1, local[:, None]).squeeze(1).masked_fill_(~mine, 0)
        dist.all_reduce(target_logit, group=group)  # 2: x_y - m, from its owner
        buf.exp_()
        sum_exp = buf.sum(1)
        dist.all_reduce(sum_exp, group=group)  # 3: sum over all classes of exp(x - m)
        loss = (sum_exp.log() - target_logit).mean()
        buf.div_(sum_exp[:, None])  # softmax, in the same buffer
        ctx.save_for_backward(buf, local, mine)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        softmax, local, mine = ctx.saved_tensors
        softmax.scatter_add_(1, local[:, None], -mine[:, None].to(softmax.dtype))  # softmax - onehot(y), in place
        return softmax.mul_(grad / softmax.shape[0]), None, None, None  # overwritten: this graph runs backward once


class HandLlama(nn.Module):
    """``model`` (untouched) tensor-parallel over ``group``, plan ``"vanilla"`` or ``"full"``: this rank's
    shards as plain parameters with the model's names."""

    def __init__(self, model: Transformer, plan: str = "full", group=None):
        super().__init__()
        if plan not in ("vanilla", "full"):
            raise ValueError(f"plan must be 'vanilla' or 'full', got {plan!r}")
        self.args, self.group, self.sp = model.args, group, plan == "full"
        t, r = dist.get_world_size(group), dist.get_rank(group)
        n_kv = self.args.n_kv_heads or self.args.n_heads
        if self.args.n_heads % t or n_kv % t or len(torch.chunk(torch.empty(self.args.vocab_size), t)) < t:
            raise ValueError(f"HandLlama: the heads ({self.args.n_heads}, {n_kv}) must divide by {t}, and "
                             f"torch.chunk must give each rank some of the {self.args.vocab_size} vocabulary rows")
        for name, child in model.named_children():
            setattr(self, name, copy.deepcopy(child))
        self.register_buffer("rope_cos", model.rope_cos.clone(), persistent=False)
        self.register_buffer("rope_sin", model.rope_sin.clone(), persistent=False)
        for name, p in list(self.named_parameters()):
            dim = shard_dim(name)
            if dim is not None:
                owner = self.get_submodule(name.rsplit(".", 1)[0])  # the Linear / Embedding
                owner.weight = nn.Parameter(torch.chunk(p.detach(), t, dim)[r].clone())
        self.vocab_offset = r * -(-self.args.vocab_size // t)
        self.norm_weights = [p for name, p in self.named_parameters() if shard_dim(name) is None]
        self.enter, self.leave = (Gather.apply, Scatter.apply) if self.sp else (Copy.apply, Reduce.apply)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens [b, s] -> this rank's logits [b, s, V/t] (every rank reads all tokens)."""
        if self.sp and tokens.shape[1] % dist.get_world_size(self.group):
            raise ValueError(f"the full plan splits the sequence ({tokens.shape[1]}) over the ranks: it must divide")
        w = self.tok_embeddings.weight  # vocab-parallel embedding: rows [offset, offset + V/t)
        ids = tokens - self.vocab_offset
        outside = (ids < 0) | (ids >= w.shape[0])
        h = F.embedding(ids.masked_fill(outside, 0), w).masked_fill_(outside[..., None], 0)
        h = self.leave(h, self.group)  # each token's row from its owner: [b, s, d], or [b, s/t, d] under SP
        for layer in self.layers.values():
            h = h + self.attention(layer.attention, self.enter(layer.attention_norm(h), self.group))
            ff = layer.feed_forward
            x = self.enter(layer.ffn_norm(h), self.group)  # one f / all-gather shared by w1 and w3
            h = h + self.leave(F.linear(F.silu(F.linear(x, ff.w1.weight)) * F.linear(x, ff.w3.weight), ff.w2.weight),
                               self.group)
        return F.linear(self.enter(self.norm(h), self.group), self.output.weight)

    def attention(self, attn, x: torch.Tensor) -> torch.Tensor:
        """llama.py's attention on this rank's heads; x is the whole block input [b, s, d]."""
        bs, seqlen, _ = x.shape
        q = F.linear(x, attn.wq.weight).view(bs, seqlen, -1, attn.head_dim)  # [b, s, heads/t, hd]
        k = F.linear(x, attn.wk.weight).view(bs, seqlen, -1, attn.head_dim)
        v = F.linear(x, attn.wv.weight).view(bs, seqlen, -1, attn.head_dim)
        cos, sin = self.rope_cos[:seqlen], self.rope_sin[:seqlen]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.leave(F.linear(out.transpose(1, 2).reshape(bs, seqlen, -1), attn.wo.weight), self.group)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over all b * s tokens (llama_loss's), the same on every rank."""
        logits, labels = logits.flatten(0, 1), labels.flatten()
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        if self.sp:
            return VocabParallelCrossEntropy.apply(logits, labels, self.vocab_offset, self.group)
        return F.cross_entropy(GatherVocab.apply(logits, self.vocab_offset, self.args.vocab_size, self.group), labels)

    @torch.no_grad()
    def finish_grads(self) -> None:
        """Full plan: each norm weight's gradient is this rank's tokens' part: ONE all-reduce for all of them.
        Call once per optimizer step, after the last backward (accumulated gradients included)."""
        grads = [p.grad for p in self.norm_weights if p.grad is not None]
        if not self.sp or not grads:
            return
        bucket = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(bucket, group=self.group)
        for g, piece in zip(grads, bucket.split([g.numel() for g in grads])):
            g.copy_(piece.view_as(g))


def hand_step(model: HandLlama, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Forward, loss, backward, the norm-gradient bucket: the gradients are ready for the optimizer."""
    loss = model.loss(model(tokens), labels)
    loss.backward()
    model.finish_grads()
    return loss.detach()

"""lab.saved: the bytes autograd saves per layer (notebooks 04, 04b), on one process and on 2 ranks."""

import torch

from tensorplay_edu import launch
from tensorplay_edu.lab.saved import saved_per_layer

ARGS = dict(dim=32, n_heads=4, vocab_size=64, max_seq_len=16)
TOKENS = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))


def per_layer(b=2, s=16, h=32, heads=4, ffn=96, p=4):
    """A layer's saved bytes counted op by op (notebook 04b, section 1), float32, one process."""
    norms = p * 2 * (2 * s * b * h + s * b)            # two RMSNorms: x and x/rms [b, s, h], 1/rms [b, s]
    block_inputs = p * 2 * s * b * h                   # wq|wk|wv's and w1|w3's shared input
    attention = p * (4 * s * b * h + 2 * s * (h // heads)) + 4 * heads * s * b   # q, k, v, out; RoPE tables; lse
    mlp = p * 4 * s * b * ffn                          # w1 and w3 outputs, silu's, the product
    return norms + block_inputs + attention + mlp


def test_one_process_matches_the_op_by_op_count():
    from tensorplay_edu.models import ModelArgs, Transformer
    ffn = Transformer(ModelArgs(n_layers=1, **ARGS)).layers["0"].feed_forward.w1.out_features
    (got,) = saved_per_layer("none", (ARGS,), TOKENS, 2)
    assert got["0"] == got["1"] == per_layer(ffn=ffn), (got, per_layer(ffn=ffn))
    assert 0 < got["edges"] < got["0"]


def test_sp_saves_the_norms_on_two_ranks():
    tp, sp = (launch(saved_per_layer, 2, plan, (ARGS,), TOKENS, 2) for plan in ("vanilla", "full"))
    assert all(r == tp[0] for r in tp) and all(r == sp[0] for r in sp)
    norms = 4 * (4 * 16 * 2 * 32 + 2 * 16 * 2)            # two norms' x, x/rms, 1/rms, float32
    assert tp[0][0]["0"] - sp[0][0]["0"] == norms // 2 == 16_640 // 2


def test_groups_label_the_innermost_forward():
    from tensorplay_edu.lab.saved import saved_bytes
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Tanh())
    x = torch.randn(4, 8, requires_grad=True)
    out, storages = [], {}
    run = lambda: (out.append(model(x)) or out[0] ** 2).sum()
    got = saved_bytes(model, run, groups=[("net", model), ("tanh", model[1])], outside="loss", storages=storages)
    # by hand: Linear saves its input x, tanh its output, the square its input (tanh's output: already counted)
    assert got == {"net": 4 * 4 * 8, "tanh": 4 * 4 * 8}, got
    assert storages == {x.untyped_storage().data_ptr(): 128, out[0].untyped_storage().data_ptr(): 128}

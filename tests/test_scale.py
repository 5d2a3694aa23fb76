"""tensorplay_edu.cluster: parameter counts, the memory conventions (FSDP2's, SAC's, float8's), Korthikanti's
formulas, NCCL's α–β pricing, TP bytes against CommDebugMode, the roofline and the step's parts, the
arithmetic-intensity argument, the calibration and the published checks, fitting the CPU's constants."""

import math

import pytest

from tensorplay_edu import launch
from tensorplay_edu.cluster import (CALIBRATED, GPUS, LOGIT_PEAK_BYTES, MODELS, NCCL_BASE_LATENCY, Efficiency, Model,
                                    Setup, block_matmuls, collective_time, compute_seconds, dp_seconds, error_bands,
                                    format_checks, korthikanti_activations, llama_activations, matmul_seconds, memory,
                                    published_checks, reported_flops, ring_terms, sac_saved, step_time,
                                    tp_bytes_per_layer, tp_collectives_per_layer, tp_compute_over_comm, tp_edge_collectives,
                                    tp_crossover_tokens, tp_max_inside, tp_rings)
from tensorplay_edu.cluster.published import FIT_ROWS, fit

H100, M70 = GPUS["h100"], MODELS["llama3-70b"]


@pytest.mark.parametrize("name, published", [("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 405.9e9)])
def test_parameter_counts(name, published):
    assert abs(MODELS[name].params() / published - 1) < 0.01


def test_gpus_as_nvidia_smi_and_nccl_see_them():
    for gpu in GPUS.values():
        assert gpu.nvlink_bw == 450e9 and gpu.ib_bw == 50e9  # line rates: 900 GB/s both ways; 400 Gb/s
        assert gpu.nvlink_busbw == 370e9 and gpu.nvls_busbw == 480e9  # what NCCL's rings and NVLS achieve
        assert gpu.ib_busbw < gpu.ib_bw and gpu.ib_alpha > gpu.nvlink_alpha and gpu.source
    assert H100.hbm_bytes == 81559 * 2**20 and round(H100.hbm_bytes / 2**30, 1) == 79.6  # nvidia-smi's MiB
    assert GPUS["h200"].hbm_bytes == 143771 * 2**20 and GPUS["h200"].bf16_flops == H100.bf16_flops
    assert "500 W" in GPUS["h100-500w"].name and GPUS["h100-500w"].hbm_bw == 2.4e12  # the calibration GPU


def test_setup_checks_its_fields():
    assert Setup(float8=True).float8 == "tensorwise" and Setup(float8=False).float8 is None
    assert Setup(dp=4, batch=2, micro_batches=3).global_batch == 24
    for bad, match in ((dict(float8="e4m3"), "float8"), (dict(ac="some"), "ac"), (dict(micro_batches=0), "micro"),
                       (dict(tp=2.0), "tp"), (dict(float8="rowwise", fsdp_float8_gather=True), "tensorwise")):
        with pytest.raises(ValueError, match=match):
            Setup(**bad)
    # A degree that splits a head prices no plan that runs: memory and time refuse it, saying why.
    for cost in (lambda s: memory(MODELS["llama3-70b"], s), lambda s: step_time(MODELS["llama3-70b"], s, GPUS["h100"])):
        with pytest.raises(ValueError, match="TP 16 does not divide its 8 KV heads"):
            cost(Setup(tp=16))


def test_memory_conventions():
    base = memory(M70, Setup())
    assert set(base) == {"weights", "gradients", "optimizer", "working", "activations", "backward", "logits"}
    p = M70.params()
    # FSDP2's 16 bytes per parameter: fp32 parameters and gradients, AdamW's two fp32 moments
    assert base["weights"] == base["gradients"] == pytest.approx(4 * p) and base["optimizer"] == pytest.approx(8 * p)
    assert base["working"] == pytest.approx(2 * p)  # no FSDP: the bf16 copies the matmuls read
    tp2 = memory(M70, Setup(tp=2))
    norms = M70.norm_params()  # replicated by TP
    assert tp2["weights"] == pytest.approx(4 * ((p - norms) / 2 + norms)) and tp2["weights"] / base["weights"] < 0.5001
    fsdp = memory(M70, Setup(tp=2, dp=4, fsdp=True))
    for k in ("weights", "gradients", "optimizer"):
        assert fsdp[k] == pytest.approx(tp2[k] / 4)
    assert memory(M70, Setup(tp=2, dp=4))["optimizer"] == tp2["optimizer"]  # plain DP replicates
    # FSDP's transient: the gathered bf16 unit in use (the output layer is the largest) and the next block, the
    # largest unit's bf16 gradients and its reduce-scatter input in float32 (2 + 4 bytes), or bf16 (2 + 2)
    out, blk = M70.vocab * M70.dim / 2, M70.layer_params() / 2
    assert fsdp["working"] == pytest.approx(2 * (out + blk) + 6 * out)
    assert memory(M70, Setup(tp=2, dp=4, fsdp=True, reduce_fp32=False))["working"] == pytest.approx(2 * (out + blk) + 4 * out)
    # activations: L blocks of this Llama's count (notebook 04b's 51.4 GB for 70B at TP 8 + SP, 8k tokens)
    sp8, tp8 = memory(M70, Setup(tp=8, sp=True)), memory(M70, Setup(tp=8))
    sbh = 8192 * M70.dim
    for setup, got in ((Setup(), base), (Setup(tp=8), tp8), (Setup(tp=8, sp=True), sp8)):
        assert got["activations"] == pytest.approx(M70.layers * sum(llama_activations(M70, setup).values()))
        assert got["backward"] == pytest.approx(sum(llama_activations(M70, setup).values()))
    assert round(sp8["activations"] / 1e9, 1) == 51.4 and round(tp8["activations"] / 1e9, 1) == 88.9
    # SP divides the norms by t; the gathered block inputs (2·sbh·p) stay whole under TP, with or without SP
    one, sp = llama_activations(M70, Setup(tp=8)), llama_activations(M70, Setup(tp=8, sp=True))
    assert sp["norms"] == pytest.approx(one["norms"] / 8) and sp["block inputs"] == one["block inputs"] == 2 * sbh * 2
    assert memory(M70, Setup(batch=2))["activations"] == pytest.approx(2 * base["activations"], rel=1e-3)
    # float8 tensorwise TP casts before the gather: the gathered block inputs are saved in 1 byte
    f8 = memory(M70, Setup(tp=8, sp=True, float8="tensorwise"))["activations"]
    assert sp8["activations"] - f8 == pytest.approx(M70.layers * 2 * sbh)
    assert memory(M70, Setup(tp=8, sp=True, float8="rowwise"))["activations"] == sp8["activations"]
    # Korthikanti's GPT layer on request: 34/t·sbh bytes per layer under TP + SP (2-byte activations)
    k = memory(M70, Setup(tp=8, sp=True, activations="korthikanti"))["activations"]
    assert k == pytest.approx(M70.layers * 34 / 8 * sbh)
    with pytest.raises(ValueError, match="activations"):
        memory(M70, Setup(activations="gpt"))
    # logits: the loss's measured peak per logit of b·s·V, sliced by loss_parallel
    assert tp8["logits"] == LOGIT_PEAK_BYTES[2]["gathered"] * 8192 * M70.vocab == 12 * 8192 * M70.vocab
    assert memory(M70, Setup(tp=8, loss_parallel=True))["logits"] == 10 * 8192 * M70.vocab / 8
    assert memory(M70, Setup(tp=8, loss_parallel=True, dtype_bytes=4))["logits"] == 8 * 8192 * M70.vocab / 8
    # PyTorch's own loss_parallel (16 bytes, notebook 05b) when the Setup says so; ours by default
    assert all(LOGIT_PEAK_BYTES[p]["pytorch_loss_parallel"] == 16 for p in (2, 4))
    pt = memory(M70, Setup(tp=8, loss_parallel=True, loss="pytorch"))
    assert pt["logits"] == 16 * 8192 * M70.vocab / 8 and pt["weights"] == tp8["weights"]
    assert memory(M70, Setup(tp=8, loss="pytorch"))["logits"] == tp8["logits"]  # no loss_parallel: gathered
    with pytest.raises(ValueError, match="loss"):
        Setup(loss="torchtitan")
    assert LOGIT_PEAK_BYTES[2]["loss_parallel"] == 10 and LOGIT_PEAK_BYTES[4]["loss_parallel"] == 8
    # full AC keeps each block's input (/t under SP) and one block's activations while it is recomputed
    full = memory(M70, Setup(tp=8, sp=True, ac="full"))["activations"]
    assert full == pytest.approx(sp8["activations"] / M70.layers + M70.layers * 2 * sbh / 8)


def test_selective_ac_keeps_every_other_matmul():
    """torchtitan's per-op SAC keeps wq, wv, w1 and w2's outputs (wk, wo, w3 are recomputed), attention's output
    and log-sum-exp, the block input, and under SP both reduce-scatters' outputs."""
    s, h, kv, f = 8192, M70.dim, M70.kv_heads * M70.head_dim, M70.ffn
    one = (s * h + s * h + s * kv + s * f + s * h + s * h) * 2 + 4 * M70.heads * s  # t = 1
    assert sac_saved(M70, Setup()) == pytest.approx(one)
    t = 8
    sp = (s * h / t + (s * h + s * kv + s * f + s * h) / t + s * h + 2 * s * h / t) * 2 + 4 * M70.heads * s / t
    assert sac_saved(M70, Setup(tp=t, sp=True)) == pytest.approx(sp)
    sel = memory(M70, Setup(tp=t, sp=True, ac="selective"))["activations"]
    layer = sum(llama_activations(M70, Setup(tp=t, sp=True)).values())
    assert sel == pytest.approx(M70.layers * sp + layer)
    assert memory(M70, Setup(tp=t, sp=True, ac="full"))["activations"] < sel < memory(M70, Setup(tp=t, sp=True))["activations"]


def test_korthikanti_formulas_and_flash():
    s, b, h, a, t = 2048, 4, 12288, 96, 8  # GPT-3 175B
    sbh = s * b * h
    assert korthikanti_activations(s, b, h, a) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert korthikanti_activations(s, b, h, a, t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert korthikanti_activations(s, b, h, a, t, sp=True) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
    for tp, sp in ((1, False), (t, False), (t, True)):  # flash removes exactly the s² term
        scores = korthikanti_activations(s, b, h, a, tp, sp) - korthikanti_activations(s, b, h, a, tp, sp, flash=True)
        assert scores == pytest.approx(5 * a * s * s * b / tp)


def test_collective_time_as_nccl_prices_it():
    n, t = 1e9, 8
    base, alpha = NCCL_BASE_LATENCY, H100.nvlink_alpha
    ag = (t - 1) / t * n / 370e9
    assert collective_time("all_gather", n, t, H100) == pytest.approx(ag + base + (t - 1) * alpha)
    assert ring_terms("all_gather", n, t, H100) == pytest.approx((ag, base + (t - 1) * alpha))
    assert collective_time("reduce_scatter", n, t, H100) == collective_time("all_gather", n, t, H100)
    # an all-reduce inside a node: NVLS's busBw, twice the ring steps of latency
    assert ring_terms("all_reduce", n, t, H100) == pytest.approx((2 * (t - 1) / t * n / 480e9, base + 2 * (t - 1) * alpha))
    # one rank per node: every step crosses the network
    ib = collective_time("all_gather", n, t, H100, link="ib")
    assert ib == pytest.approx((t - 1) / t * n / H100.ib_busbw + base + (t - 1) * H100.ib_alpha)
    # 64 ranks on 8 nodes: only the 7 node-crossing steps pay IB's α, the other 56 max(3.4 µs, 3 x 1 µs)
    lat = ring_terms("all_gather", n, 64, H100, link="ib", nodes=8)[1]
    assert lat == pytest.approx(base + 7 * 14.0e-6 + 56 * 3.4e-6)
    assert ring_terms("all_reduce", n, 64, H100, link="ib", nodes=8)[1] == pytest.approx(base + 14 * 14.0e-6 + 112 * 3.4e-6)
    # several ranks of a ring on one node leave it through their own NICs, up to NVLink's bandwidth
    assert ring_terms("all_gather", n, 64, H100, link="ib", nodes=16)[0] == pytest.approx(63 / 64 * n / (4 * H100.ib_busbw))
    assert ring_terms("all_gather", n, 64, H100, link="ib", nodes=8)[0] == pytest.approx(
        63 / 64 * n / min(8 * H100.ib_busbw, H100.nvlink_busbw))
    with pytest.raises(ValueError, match="evenly"):
        ring_terms("all_gather", n, 12, H100, link="ib", nodes=8)
    assert H100.ib_alpha == 14.0e-6 and H100.nvlink_alpha == 3.4e-6 and base == 8.4e-6  # NCCL's tuning model
    assert collective_time("all_reduce", n, 1, H100) == 0.0
    assert collective_time("all_gather", 0, t, H100) == pytest.approx(base + (t - 1) * alpha)  # latency only
    with pytest.raises(ValueError, match="link"):
        collective_time("all_gather", n, t, H100, link="pcie")
    with pytest.raises(ValueError, match="op"):
        collective_time("broadcast", n, t, H100)


def _recorded_per_layer(configs):
    """Rank code: CommDebugMode's bytes and counts of block 0 for each (plan, float8)."""
    import torch
    import torch.distributed as dist

    from tensorplay_edu import CommDebugMode, init_device_mesh
    from tensorplay_edu.float8 import convert_to_float8_training
    from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
    out = []
    for plan, float8 in configs:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        torch.manual_seed(0)
        model = Transformer(ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=40, max_seq_len=16))
        if float8:
            model = convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn.startswith("layers"))
        parallelize_llama(model, mesh, plan, float8=float8)
        tokens = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
        with CommDebugMode() as comm:
            with loss_context(plan):
                llama_loss(model(tokens), tokens).backward()
        got, edges = {"forward": {}, "backward": {}}, {"forward": {}, "backward": {}}
        counts = {"forward": 0, "backward": 0}
        for r in comm.records:
            if r.module.startswith("layers.0."):
                got[r.phase][r.op] = got[r.phase].get(r.op, 0) + r.bytes
                counts[r.phase] += 1
            elif not r.module.startswith("layers."):  # the embedding, the output layer, the loss
                edges[r.phase][r.op] = edges[r.phase].get(r.op, 0) + r.bytes
        out.append((got, counts, edges))
    return out


def test_tp_bytes_match_comm_debug_mode():
    configs = [("vanilla", False), ("full", False), ("vanilla", True), ("full", True)]
    recorded = launch(_recorded_per_layer, 2, configs)[0]
    tiny = Model("tiny", layers=2, dim=64, heads=4, kv_heads=2, ffn=176, vocab=40)
    for (plan, float8), (got, counts, edges) in zip(configs, recorded):
        setup = Setup(tp=2, sp=plan == "full", loss_parallel=plan == "full", float8=float8, batch=2, seq=12,
                      dtype_bytes=4)
        assert tp_bytes_per_layer(tiny, setup) == got, (plan, float8)
        ours = tp_collectives_per_layer(tiny, setup)
        assert {ph: sum(p == ph for p, _, _ in ours) for ph in counts} == counts, (plan, float8)
        # the collectives outside the blocks, bytes sent as CommDebugMode counts them
        assert tp_bytes_per_layer(tiny, setup, tp_edge_collectives(tiny, setup)) == edges, (plan, float8)


PURE = Efficiency(matmul=1.0, hbm=1e9, float8={"tensorwise": 1.0, "rowwise": 1.0})  # FLOPs at the peak only


def test_matmul_roofline():
    m, n, k = 8192, 4096, 4096  # a wide matmul is compute-bound
    assert matmul_seconds(m, n, k, H100) == pytest.approx(2 * m * n * k / (H100.bf16_flops * CALIBRATED.matmul))
    assert matmul_seconds(m, n, k, H100, "rowwise") == pytest.approx(
        2 * m * n * k / (H100.fp8_flops * CALIBRATED.float8["rowwise"] * CALIBRATED.matmul))
    m, n = 98304, 128  # wk at TP 8: the whole input read for a thin slice of output
    assert matmul_seconds(m, n, k, H100) == pytest.approx(2 * (m * k + k * n + m * n) / (H100.hbm_bw * CALIBRATED.hbm))
    assert matmul_seconds(m, n, k, H100) > 2 * m * n * k / (H100.bf16_flops * CALIBRATED.matmul)


def test_compute_counts_what_runs():
    peak, L, s, h = H100.bf16_flops, M70.layers, 8192, M70.dim
    c = compute_seconds(M70, Setup(), H100, PURE)
    assert c["matmuls"] * peak == pytest.approx(6 * L * M70.layer_params() * s)  # 3 passes of 2 FLOPs per weight
    assert c["attention"] * peak == pytest.approx(3.5 * L * 2 * s * s * h)  # causal half; backward recomputes QKᵀ
    assert c["output"] * peak == pytest.approx(6 * M70.vocab * h * s) and c["recompute"] == 0
    # full AC reruns each block's forward (not the output layer's); selective only wk, wo and w3
    full = compute_seconds(M70, Setup(ac="full"), H100, PURE)["recompute"]
    assert full * peak == pytest.approx(L * (2 * M70.layer_params() * s + 2 * s * s * h))
    kv = M70.kv_heads * M70.head_dim
    sel = compute_seconds(M70, Setup(ac="selective"), H100, PURE)["recompute"]
    assert sel * peak == pytest.approx(L * 2 * s * (h * kv + h * h + h * M70.ffn))
    tp8 = compute_seconds(M70, Setup(tp=8, ac="full"), H100, PURE)
    full8 = compute_seconds(M70, Setup(ac="full"), H100, PURE)
    assert all(tp8[k] == pytest.approx(full8[k] / 8) for k in tp8)
    # float8: the blocks' matmuls at the fp8 peak; rowwise_with_gw_hp keeps the weight-gradient pass in bf16
    assert compute_seconds(M70, Setup(float8="rowwise"), H100, PURE)["matmuls"] == pytest.approx(c["matmuls"] / 2, rel=1e-3)
    assert compute_seconds(M70, Setup(float8="rowwise_with_gw_hp"), H100, PURE)["matmuls"] == pytest.approx(
        c["matmuls"] * (2 / 3 / 2 + 1 / 3), rel=1e-3)
    assert compute_seconds(M70, Setup(float8="rowwise"), H100, PURE)["output"] == c["output"]  # output stays bf16
    # MFU is reported torchtitan's way: 6 per matmul weight and token (no embedding) + 12·L·s·h, the whole square
    assert reported_flops(M70, Setup()) == pytest.approx(6 * (L * M70.layer_params() + M70.vocab * h) * s + 12 * L * s * s * h)
    assert reported_flops(M70, Setup(tp=8, dp=8, batch=2)) == pytest.approx(reported_flops(M70, Setup()) * 2 / 8)


def test_step_time_parts():
    s = Setup(tp=8, sp=True, dp=8, fsdp=True)
    t = step_time(M70, s, H100)
    assert t["total"] == pytest.approx(t["compute"] + t["exposed"] + t["optimizer"])
    assert t["exposed"] == pytest.approx(t["tp_exposed"] + t["dp_exposed"])
    assert t["tp_exposed"] == pytest.approx(t["tp_comm"] + t["edge_comm"])  # no async: every TP byte waited on
    edge = sum(collective_time(op, n, 8, H100) for _, op, n in tp_edge_collectives(M70, s))
    assert t["edge_comm"] == pytest.approx(edge) and edge > 0
    assert t["exposed"] >= t["tp_comm"] - 1e-12 and t["tokens_per_s"] == pytest.approx(t["tokens_per_s_per_gpu"] * 64)
    assert t["tokens_per_s_per_gpu"] == pytest.approx(8 * 8192 / 64 / t["total"])
    assert t["mfu"] == pytest.approx(reported_flops(M70, s) / t["total"] / H100.bf16_flops)
    local = (M70.params() - M70.norm_params()) / 64
    assert t["optimizer"] == pytest.approx(28 * local / (H100.hbm_bw * CALIBRATED.hbm))  # AdamW at HBM speed
    # gradient accumulation: four micro-batches compute and gather four times, step the optimizer once
    acc = step_time(M70, Setup(tp=8, sp=True, dp=8, fsdp=True, micro_batches=4), H100)
    assert acc["compute"] == pytest.approx(4 * t["compute"]) and acc["dp_comm"] == pytest.approx(4 * t["dp_comm"])
    assert acc["optimizer"] == t["optimizer"] and acc["tokens_per_s_per_gpu"] > t["tokens_per_s_per_gpu"]
    a = step_time(M70, Setup(tp=8, sp=True, dp=8, fsdp=True, async_tp=True), H100)
    assert a["tp_comm"] == t["tp_comm"] and a["exposed"] < t["exposed"] and a["compute"] == t["compute"]
    # async TP hides each ring under its own matmul only: what stays is the rest of each ring, and the
    # collectives no matmul can cover (backward's reduce-scatters fed by several matmuls, the norms)
    rings = tp_rings(M70, s, H100)
    assert [(r["phase"], r["op"], r["matmul"] > 0) for r in rings] == [
        ("forward", "all_gather", True), ("forward", "reduce_scatter", True)] * 2 + [
        ("backward", "reduce_scatter", False), ("backward", "all_gather", True)] * 2 + [
        ("backward", "all_reduce", False)] * 2
    assert M70.layers * sum(r["comm"] for r in rings) == pytest.approx(t["tp_comm"])
    left = M70.layers * sum(max(0.0, r["comm"] - r["matmul"]) for r in rings)
    assert a["tp_exposed"] == pytest.approx(left + a["edge_comm"])  # the collectives outside the blocks stay whole
    # without SP there is no ring to split: async changes nothing
    assert step_time(M70, Setup(tp=8), H100) == step_time(M70, Setup(tp=8, async_tp=True), H100)
    assert step_time(M70, Setup(float8="tensorwise"), H100)["compute"] < step_time(M70, Setup(), H100)["compute"]


def test_checkpointing_reruns_forward_collectives():
    s = Setup(tp=8, sp=True)
    forward = [r for r in tp_rings(M70, s, H100) if r["phase"] == "forward"][:4]
    full = [r for r in tp_rings(M70, Setup(tp=8, sp=True, ac="full"), H100) if r["phase"] == "recompute"]
    assert full == [{**r, "phase": "recompute"} for r in forward]  # the whole forward again
    sel = [r for r in tp_rings(M70, Setup(tp=8, sp=True, ac="selective"), H100) if r["phase"] == "recompute"]
    assert [(r["op"], r["name"]) for r in sel] == [("all_gather", "attention input"), ("all_gather", "ffn input")]
    wk, w3 = (matmul_seconds(*block_matmuls(M70, s)[name], H100) for name in ("wk", "w3"))
    assert [r["matmul"] for r in sel] == pytest.approx([wk, w3])  # each beside its one recomputed reader
    vanilla = [r for r in tp_rings(M70, Setup(tp=8, ac="selective"), H100) if r["phase"] == "recompute"]
    assert [r["op"] for r in vanilla] == ["all_reduce", "all_reduce"] and all(r["matmul"] == 0 for r in vanilla)
    assert step_time(M70, Setup(tp=8, sp=True, ac="full"), H100)["tp_comm"] == pytest.approx(
        step_time(M70, s, H100)["tp_comm"] + M70.layers * sum(r["comm"] for r in full))


def test_data_parallel_traffic():
    s = Setup(tp=8, sp=True, dp=8, fsdp=True)  # 64 GPUs: the FSDP ring spans 8 nodes
    blk, edge = M70.layer_params() / 8, M70.vocab * M70.dim / 8

    def ag(n):
        return collective_time("all_gather", n, 8, H100, "ib", 8)

    def rs(n):
        return collective_time("reduce_scatter", n, 8, H100, "ib", 8)
    want = M70.layers * (2 * ag(2 * blk) + rs(4 * blk)) + 2 * (2 * ag(2 * edge) + rs(4 * edge))  # fp32 reduce
    assert dp_seconds(M70, s, H100)["per_micro_batch"] == pytest.approx(want)
    bf16 = dp_seconds(M70, Setup(tp=8, sp=True, dp=8, fsdp=True, reduce_fp32=False), H100)["per_micro_batch"]
    f8 = dp_seconds(M70, Setup(tp=8, sp=True, dp=8, fsdp=True, float8="tensorwise"), H100)["per_micro_batch"]
    f8_gather = dp_seconds(M70, Setup(tp=8, sp=True, dp=8, fsdp=True, float8="tensorwise", fsdp_float8_gather=True),
                           H100)["per_micro_batch"]
    assert bf16 < want and f8 == want and f8_gather < want  # torchao's float8 all-gather: block weights in 1 byte
    # at TP 2 each node holds 4 ranks of the same FSDP ring: they leave it through 4 NICs
    two = dp_seconds(M70, Setup(tp=2, dp=32, fsdp=True), H100)["per_micro_batch"]
    blk2 = M70.layer_params() / 2
    assert ring_terms("all_gather", 2 * blk2, 32, H100, "ib", 8)[0] == pytest.approx(31 / 32 * 2 * blk2 / (4 * H100.ib_busbw))
    assert two < M70.layers * 3 * ring_terms("all_gather", 4 * blk2, 32, H100, "ib", 32)[0]
    inside = dp_seconds(M70, Setup(tp=2, dp=4, fsdp=True), H100)["per_micro_batch"]  # 8 GPUs: one node, NVLink
    assert inside == pytest.approx(M70.layers * (2 * collective_time("all_gather", 2 * M70.layer_params() / 2, 4, H100)
                                                 + collective_time("reduce_scatter", 4 * M70.layer_params() / 2, 4, H100))
                                   + 2 * (2 * collective_time("all_gather", M70.vocab * M70.dim, 4, H100)
                                          + collective_time("reduce_scatter", 2 * M70.vocab * M70.dim, 4, H100)))
    ddp = dp_seconds(M70, Setup(tp=2, dp=4), H100)
    assert ddp["per_micro_batch"] == 0 and ddp["per_step"] > 0  # DDP: one all-reduce per step
    assert dp_seconds(M70, Setup(tp=8), H100) == {"per_micro_batch": 0.0, "per_step": 0.0, "unhidden": 0.0}


def test_when_tp_stops_paying():
    # compute/comm ∝ h·β/((t-1)·F): independent of tokens, down with t, down over IB, up with the width
    r = {t: tp_compute_over_comm(M70, H100, "nvlink", t) for t in (2, 4, 8)}
    assert r[2] > r[4] > r[8] > 1 > tp_compute_over_comm(M70, H100, "ib", 8)
    assert r[2] / r[4] == pytest.approx(3, rel=1e-9)  # (t-1): 3 vs 1
    assert tp_compute_over_comm(MODELS["llama3-405b"], H100, "ib", 8) > tp_compute_over_comm(M70, H100, "ib", 8)
    # the latency term sets a minimum number of tokens; none suffices where bandwidth alone loses
    n = tp_crossover_tokens(M70, H100, "nvlink", 8)
    assert 0 < n < 8192 and tp_crossover_tokens(M70, H100, "ib", 8) == math.inf
    assert tp_crossover_tokens(M70, H100, "nvlink", 2) < n
    assert tp_max_inside(M70, H100, "nvlink") == 8  # a whole node
    inside_ib = tp_max_inside(M70, H100, "ib")
    assert 1 <= inside_ib < 8 and tp_compute_over_comm(M70, H100, "ib", inside_ib) >= 1


def test_the_calibration_is_the_fit_of_its_four_rows():
    """calibration.CALIBRATED is what published.fit() derives from FIT_ROWS alone; those rows come out exact."""
    fitted = fit()
    assert fitted.matmul == pytest.approx(CALIBRATED.matmul, abs=1e-4)
    assert fitted.hbm == pytest.approx(CALIBRATED.hbm, abs=1e-4)
    for recipe, value in CALIBRATED.float8.items():
        assert fitted.float8[recipe] == pytest.approx(value, abs=1e-4)
    rows = published_checks()
    fits = [r for r in rows if r["role"] == "fit"]
    assert len(fits) == len(FIT_ROWS) == 4 and all(r["ratio"] == pytest.approx(1, abs=2e-3) for r in fits)


def test_published_checks_rows_and_bands():
    rows = published_checks()
    for r in rows:
        assert set(r) == {"what", "kind", "role", "ours", "theirs", "ratio", "source"} and r["source"]
        assert r["ratio"] == pytest.approx(r["ours"] / r["theirs"]) and r["kind"] in ("throughput", "speed-up", "memory")
    whats = {r["what"]: r for r in rows}
    # the torchtitan points the old model lacked, held out of the fit
    for what in ("8B, FSDP 8 x TP 8, batch 12, SAC, async TP: tokens/s/GPU",
                 "8B, FSDP 8 x TP 8, batch 12, SAC, float8 tensorwise: tokens/s/GPU",
                 "70B, FSDP 32 x TP 8, batch 16, full AC: tokens/s/GPU",
                 "70B, FSDP 32 x TP 8, batch 16, full AC, async TP: tokens/s/GPU"):
        assert whats[what]["role"] == "check"
    checks = [r for r in rows if r["role"] == "check"]
    assert len(checks) >= 20 and any(r["kind"] == "memory" for r in checks)
    slow = [r for r in rows if r["role"] == "slow"]
    assert len(slow) == 6 and all("torchtitan#1207" in r["source"] and "rowwise" in r["what"] for r in slow)
    bands = error_bands(rows)
    tput = [r["ratio"] for r in checks if r["kind"] == "throughput"]
    assert error_bands([r for r in rows if r["role"] != "slow"]) == bands  # slow rows: shown, never in a band
    assert bands["time"] == (min(tput), max(tput)) and bands["time"][0] < 1 < bands["time"][1]
    assert bands["memory"][0] < 1  # the model under-counts some measured peak: the planner's "risky"
    text = format_checks(rows)
    assert "error band on the rows not fitted" in text and f"{bands['time'][0]:.2f}" in text


def test_the_scale_modules_import_in_any_order():
    import subprocess
    import sys
    for first in ("cluster.published", "cluster.memory_use", "cluster.timing", "cluster.model", "cluster.search",
                  "cluster.calibration", "cluster.protocols"):
        code = (f"import tensorplay_edu.{first}; import tensorplay_edu.cluster as s; "
                "import tensorplay_edu.cluster.published as c, tensorplay_edu.cluster.memory_use as m; "
                "import tensorplay_edu.cluster.timing as t, tensorplay_edu.cluster.protocols as p; "
                "assert s.protocol_terms is p.protocol_terms and s.published_checks is c.published_checks; "
                "assert s.memory is m.memory and s.step_time is t.step_time and s.tp_rings is t.tp_rings; "
                "assert all(hasattr(s, name) for name in s.__all__)")
        subprocess.run([sys.executable, "-c", code], check=True)


def _saved_per_layer(plans):
    """Rank code: bytes block 0 saves for backward (storages counted once, parameters left out), per plan."""
    import torch
    import torch.distributed as dist

    from tensorplay_edu import init_device_mesh
    from tensorplay_edu.lab.saved import saved_bytes
    from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
    out = []
    for plan in plans:
        torch.manual_seed(0)
        model = Transformer(ModelArgs(dim=64, n_layers=2, n_heads=8, n_kv_heads=4, vocab_size=40, max_seq_len=16,
                                      ffn_hidden=96))  # grouped-query attention: K does not enter the count
        if plan != "none":
            parallelize_llama(model, init_device_mesh("cpu", (dist.get_world_size(),)), plan)
        tokens = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
        with loss_context(plan if plan != "none" else "vanilla"):
            saved = saved_bytes(model, lambda: llama_loss(model(tokens), tokens))  # lab.saved: one storage once
        out.append(saved["0"])
    return out


@pytest.mark.parametrize("world", [1, 2, 4])
def test_llama_activations_are_what_the_model_saves(world):
    """scale.llama_activations (notebook 04b's count) equals the bytes block 0 saves, to the byte."""
    tiny = Model("tiny", layers=2, dim=64, heads=8, kv_heads=4, ffn=96, vocab=40)
    plans = ["none"] if world == 1 else ["vanilla", "full"]
    got = launch(_saved_per_layer, world, plans)
    for plan, nbytes in zip(plans, got[0]):
        setup = Setup(tp=world, sp=plan == "full", batch=2, seq=12, dtype_bytes=4)
        assert nbytes == sum(llama_activations(tiny, setup).values()), (world, plan)
    assert all(r == got[0] for r in got)

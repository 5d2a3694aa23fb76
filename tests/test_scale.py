"""tensorplay_edu.cluster: parameter counts, the memory conventions, Korthikanti's formulas, the α–β
algebra, TP bytes against CommDebugMode, the arithmetic-intensity argument, fitting the CPU's constants."""

import math

import pytest

from tensorplay_edu import launch
from tensorplay_edu.debug import CommRecord
from tensorplay_edu.cluster import (GPUS, LOGIT_PEAK_BYTES, MODELS, NCCL_BASE_LATENCY, Model, Setup, collective_time,
                                  fit_cpu, korthikanti_activations, llama_activations, memory, predict_step,
                                  published_checks, ring_terms, step_time, tp_bytes_per_layer,
                                  tp_collectives_per_layer, tp_compute_over_comm, tp_crossover_tokens, tp_max_inside,
                                  tp_rings)

H100, M70 = GPUS["h100"], MODELS["llama3-70b"]


@pytest.mark.parametrize("name, published", [("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 405.9e9)])
def test_parameter_counts(name, published):
    assert abs(MODELS[name].params() / published - 1) < 0.01


def test_one_nvlink_figure_and_ib_alpha():
    for gpu in GPUS.values():
        assert gpu.nvlink_bw == 450e9 and gpu.ib_bw == 50e9  # 900 GB/s both ways; 400 Gb/s
        assert gpu.ib_alpha > gpu.nvlink_alpha and gpu.source
    assert GPUS["h200"].hbm_bytes > GPUS["h100"].hbm_bytes and GPUS["h200"].bf16_flops == GPUS["h100"].bf16_flops


def test_memory_conventions():
    base = memory(M70, Setup())
    assert set(base) == {"weights", "gradients", "optimizer", "activations", "logits"}
    p = M70.params()
    assert base["weights"] == base["gradients"] == pytest.approx(2 * p) and base["optimizer"] == pytest.approx(12 * p)
    tp2 = memory(M70, Setup(tp=2))
    norms = M70.norm_params()  # replicated by TP
    assert tp2["weights"] == pytest.approx(2 * ((p - norms) / 2 + norms)) and tp2["weights"] / base["weights"] < 0.5001
    fsdp = memory(M70, Setup(tp=2, dp=4, fsdp=True))
    for k in ("weights", "gradients", "optimizer"):
        assert fsdp[k] == pytest.approx(tp2[k] / 4)
    assert memory(M70, Setup(tp=2, dp=4))["optimizer"] == tp2["optimizer"]  # plain DP replicates
    # activations: L blocks of this Llama's count (notebook 04's 51.4 GB for 70B at TP 8 + SP, 8k tokens)
    sp8, tp8 = memory(M70, Setup(tp=8, sp=True)), memory(M70, Setup(tp=8))
    sbh = 8192 * M70.dim
    for setup, got in ((Setup(), base), (Setup(tp=8), tp8), (Setup(tp=8, sp=True), sp8)):
        assert got["activations"] == pytest.approx(M70.layers * sum(llama_activations(M70, setup).values()))
    assert round(sp8["activations"] / 1e9, 1) == 51.4 and round(tp8["activations"] / 1e9, 1) == 88.9
    # SP divides the norms by t; the gathered block inputs (2·sbh·p) stay whole under TP, with or without SP
    one, sp = llama_activations(M70, Setup(tp=8)), llama_activations(M70, Setup(tp=8, sp=True))
    assert sp["norms"] == pytest.approx(one["norms"] / 8) and sp["block inputs"] == one["block inputs"] == 2 * sbh * 2
    assert memory(M70, Setup(batch=2))["activations"] == pytest.approx(2 * base["activations"], rel=1e-3)
    # Korthikanti's GPT layer on request: 34/t·sbh bytes per layer under TP + SP (2-byte activations)
    k = memory(M70, Setup(tp=8, sp=True, activations="korthikanti"))["activations"]
    assert k == pytest.approx(M70.layers * 34 / 8 * sbh)
    with pytest.raises(ValueError, match="activations"):
        memory(M70, Setup(activations="gpt"))
    # logits: the loss's measured peak per logit of b·s·V, sliced by loss_parallel
    assert tp8["logits"] == LOGIT_PEAK_BYTES[2]["gathered"] * 8192 * M70.vocab == 12 * 8192 * M70.vocab
    assert memory(M70, Setup(tp=8, loss_parallel=True))["logits"] == 10 * 8192 * M70.vocab / 8
    assert memory(M70, Setup(tp=8, loss_parallel=True, dtype_bytes=4))["logits"] == 8 * 8192 * M70.vocab / 8
    ac = memory(M70, Setup(tp=8, sp=True, checkpoint=True))["activations"]
    assert ac == pytest.approx(sp8["activations"] / M70.layers + M70.layers * 2 * sbh / 8)


def test_korthikanti_formulas_and_flash():
    s, b, h, a, t = 2048, 4, 12288, 96, 8  # GPT-3 175B
    sbh = s * b * h
    assert korthikanti_activations(s, b, h, a) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert korthikanti_activations(s, b, h, a, t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert korthikanti_activations(s, b, h, a, t, sp=True) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
    for tp, sp in ((1, False), (t, False), (t, True)):  # flash removes exactly the s² term
        scores = korthikanti_activations(s, b, h, a, tp, sp) - korthikanti_activations(s, b, h, a, tp, sp, flash=True)
        assert scores == pytest.approx(5 * a * s * s * b / tp)


def test_collective_time_alpha_beta():
    n, t = 1e9, 8
    bw, alpha = H100.nvlink_bw, H100.nvlink_alpha
    base = NCCL_BASE_LATENCY
    assert collective_time("all_gather", n, t, H100) == pytest.approx((t - 1) / t * n / bw + base + (t - 1) * alpha)
    assert ring_terms("all_gather", n, t, H100) == pytest.approx(((t - 1) / t * n / bw, base + (t - 1) * alpha))
    assert collective_time("reduce_scatter", n, t, H100) == collective_time("all_gather", n, t, H100)
    assert collective_time("all_reduce", n, t, H100) == pytest.approx(
        2 * collective_time("all_gather", n, t, H100) - base)  # one base latency, twice the ring steps
    ib = collective_time("all_gather", n, t, H100, link="ib")
    assert ib == pytest.approx((t - 1) / t * n / H100.ib_bw + base + (t - 1) * H100.ib_alpha)
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
        got = {"forward": {}, "backward": {}}
        counts = {"forward": 0, "backward": 0}
        for r in comm.records:
            if r.module.startswith("layers.0."):
                got[r.phase][r.op] = got[r.phase].get(r.op, 0) + r.bytes
                counts[r.phase] += 1
        out.append((got, counts))
    return out


def test_tp_bytes_match_comm_debug_mode():
    configs = [("vanilla", False), ("full", False), ("vanilla", True), ("full", True)]
    recorded = launch(_recorded_per_layer, 2, configs)[0]
    tiny = Model("tiny", layers=2, dim=64, heads=4, kv_heads=2, ffn=176, vocab=40)
    for (plan, float8), (got, counts) in zip(configs, recorded):
        setup = Setup(tp=2, sp=plan == "full", float8=float8, batch=2, seq=12, dtype_bytes=4)
        assert tp_bytes_per_layer(tiny, setup) == got, (plan, float8)
        ours = tp_collectives_per_layer(tiny, setup)
        assert {ph: sum(p == ph for p, _, _ in ours) for ph in counts} == counts, (plan, float8)


def test_step_time_parts():
    s = Setup(tp=8, sp=True, dp=8, fsdp=True)
    t = step_time(M70, s, H100)
    assert t["total"] == pytest.approx(t["compute"] + t["exposed"]) and t["exposed"] >= t["tp_comm"] - 1e-12
    assert t["tokens_per_s"] == pytest.approx(t["tokens_per_s_per_gpu"] * 64)
    assert t["tokens_per_s_per_gpu"] == pytest.approx(8192 / 8 / t["total"])
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
    assert a["exposed"] - max(0.0, a["dp_comm"] - a["compute"]) == pytest.approx(left)
    m8 = MODELS["llama3-8b"]  # 8B at TP 8: the attention's rings carry more than their matmuls (notebook 10 §6)
    r8 = {(r["phase"], r["name"]): r for r in tp_rings(m8, Setup(tp=8, sp=True), H100)}
    assert r8[("forward", "attention input")]["comm"] > r8[("forward", "attention input")]["matmul"]
    assert r8[("forward", "ffn input")]["comm"] < r8[("forward", "ffn input")]["matmul"]
    # without SP there is no ring to split: async changes nothing
    v, va = step_time(M70, Setup(tp=8), H100), step_time(M70, Setup(tp=8, async_tp=True), H100)
    assert v == va
    # compute: 6 · params · tokens (no embedding lookup) + attention's whole square (torchtitan's MFU convention)
    one = step_time(M70, Setup(), H100, mfu=1.0)["compute"]
    flops = 6 * (M70.params() - M70.vocab * M70.dim - M70.norm_params()) * 8192 + 12 * M70.layers * 8192**2 * M70.dim
    assert one == pytest.approx(flops / H100.bf16_flops)
    assert step_time(M70, Setup(tp=8), H100, mfu=1.0)["compute"] == pytest.approx(one / 8)
    assert step_time(M70, Setup(checkpoint=True), H100, mfu=1.0)["compute"] == pytest.approx(one * 8 / 6)
    assert step_time(M70, Setup(float8=True), H100)["compute"] < step_time(M70, Setup(), H100)["compute"]


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


def test_fit_cpu_recovers_constants():
    alpha, beta, flops, world = 3e-5, 2e-10, 5e10, 2
    ar = [(n, 2 * (world - 1) * alpha + 2 * (world - 1) / world * n * beta) for n in (1e3, 1e5, 1e6, 4e6)]
    mm = [(f, 1e-4 + f / flops) for f in (1e8, 1e9, 4e9)]
    fit = fit_cpu({"all_reduce": ar, "matmul": mm, "world": world})
    assert fit["alpha"] == pytest.approx(alpha) and fit["beta"] == pytest.approx(beta)
    assert fit["flops"] == pytest.approx(flops) and fit["matmul_overhead"] == pytest.approx(1e-4)
    pred = predict_step(2e9, [("all_reduce", 1e6), ("all_gather", 2e6)], fit, world=2)
    assert pred["compute"] == pytest.approx(2e9 / flops)
    assert pred["comm"] == pytest.approx(ar[2][1] + (alpha + 2e6 / 2 * beta))
    # CommDebugMode's records carry the bytes each rank sent: the same prediction
    records = [CommRecord("all_reduce", "forward", (), "float32", 2, 1_000_000, ""),
               CommRecord("all_gather", "forward", (), "float32", 2, 1_000_000, "")]
    assert predict_step(2e9, records, fit)["comm"] == pytest.approx(pred["comm"])
    assert set(fit_cpu({"matmul": mm})) == {"flops", "matmul_overhead"}
    # timed layout changes (each a list of the collectives it issued) give the same α and β
    transitions = [([("all_reduce", n)], sec) for n, sec in ar[:2]]
    transitions += [([("all_gather", n), ("reduce_scatter", n)], 2 * alpha + n * beta) for n in (1e4, 3e6)]
    fit2 = fit_cpu({"transitions": transitions, "world": world})
    assert fit2["alpha"] == pytest.approx(alpha) and fit2["beta"] == pytest.approx(beta)
    with pytest.raises(ValueError, match="two"):
        fit_cpu({"transitions": transitions[:1]})
    with pytest.raises(ValueError, match="two"):
        fit_cpu({"all_reduce": ar[:1], "matmul": mm})


def test_published_checks_rows():
    rows = published_checks()
    assert len(rows) >= 10
    for r in rows:
        assert set(r) == {"what", "ours", "theirs", "ratio", "source"} and r["source"]
        assert r["ratio"] == pytest.approx(r["ours"] / r["theirs"])
    assert any("torchtitan" in r["source"] for r in rows) and any("Korthikanti" in r["source"] for r in rows)


def test_the_scale_modules_import_in_any_order():
    import subprocess
    import sys
    for first in ("cluster.published", "cluster.memory_use", "cluster.timing", "cluster.model", "cluster.search"):
        code = (f"import tensorplay_edu.{first}; import tensorplay_edu.cluster as s; "
                "import tensorplay_edu.cluster.published as c, tensorplay_edu.cluster.memory_use as m; "
                "import tensorplay_edu.cluster.timing as t; "
                "assert s.fit_cpu is c.fit_cpu and s.published_checks is c.published_checks; "
                "assert s.memory is m.memory and s.step_time is t.step_time and s.tp_rings is t.tp_rings; "
                "assert all(hasattr(s, name) for name in s.__all__)")
        subprocess.run([sys.executable, "-c", code], check=True)


def _saved_per_layer(plans):
    """Rank code: bytes block 0 saves for backward (storages counted once, parameters left out), per plan."""
    import torch
    import torch.distributed as dist

    from tensorplay_edu import init_device_mesh
    from tensorplay_edu.models import ModelArgs, Transformer, llama_loss, loss_context, parallelize_llama
    out = []
    for plan in plans:
        torch.manual_seed(0)
        model = Transformer(ModelArgs(dim=64, n_layers=2, n_heads=8, n_kv_heads=4, vocab_size=40, max_seq_len=16,
                                      ffn_hidden=96))  # grouped-query attention: K does not enter the count
        if plan != "none":
            parallelize_llama(model, init_device_mesh("cpu", (dist.get_world_size(),)), plan)
        skip = {p.untyped_storage().data_ptr() for p in [*model.parameters(), *model.buffers()]}
        where, seen = ["edges"], {}
        model.layers["0"].register_forward_pre_hook(lambda *a: where.__setitem__(0, "0"))
        model.layers["0"].register_forward_hook(lambda *a: where.__setitem__(0, "edges"))

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if where[0] == "0" and ptr not in skip and ptr not in seen:
                seen[ptr] = (t.untyped_storage().nbytes(), t)  # keep t alive: its storage stays unique
            return t

        tokens = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with loss_context(plan if plan != "none" else "vanilla"):
                loss = llama_loss(model(tokens), tokens)
        loss.backward()
        out.append(sum(n for n, _ in seen.values()))
    return out


@pytest.mark.parametrize("world", [1, 2, 4])
def test_llama_activations_are_what_the_model_saves(world):
    """scale.llama_activations (notebook 04's count) equals the bytes block 0 saves, to the byte."""
    tiny = Model("tiny", layers=2, dim=64, heads=8, kv_heads=4, ffn=96, vocab=40)
    plans = ["none"] if world == 1 else ["vanilla", "full"]
    got = launch(_saved_per_layer, world, plans)
    for plan, nbytes in zip(plans, got[0]):
        setup = Setup(tp=world, sp=plan == "full", batch=2, seq=12, dtype_bytes=4)
        assert nbytes == sum(llama_activations(tiny, setup).values()), (world, plan)
    assert all(r == got[0] for r in got)

"""Pins torch's async-TP source that notebook 10's expert box describes (moved from the notebook): Inductor's size
guard, the symmetric-memory mark, the pull order, the two streams, the all-to-all scatter, the unfused sum of matmuls.
On another torch version an assert may fail: re-read the box in notebooks/10_async_tp.ipynb."""

import torch


def test_torch_async_tp_source_matches_notebook_10():
    import inspect
    from torch._inductor.fx_passes import micro_pipeline_tp
    from torch.distributed import _symmetric_memory as symm

    source = inspect.getsource(micro_pipeline_tp.fuse_all_gather_matmul)
    guard = "if _is_last_dim(_get_tensor(shard_node), gather_dim):\n        # Decomposed mms should not be too small\n"
    assert guard + "        if _get_tensor(shard_node).shape[-1] < 1024:" in source  # the guard sits inside the last-dim test
    assert "greatly reducing" in inspect.getsource(symm)  # two streams against wave quantization
    assert all(hasattr(symm, f) for f in ("_fused_all_gather_scaled_matmul", "_fused_scaled_matmul_reduce_scatter"))  # float8
    assert "aten._scaled_mm.default" in inspect.getsource(micro_pipeline_tp)  # the pass matches float8 matmuls too
    assert "_group_name_to_store" in inspect.getsource(symm.is_symm_mem_enabled_for_group)  # the mark still needed
    assert inspect.getsource(symm).count("_group_name_to_store[") == 1 and "_group_name_to_store[group_name] = store" in \
        inspect.getsource(symm.enable_symm_mem_for_group)             # and only the deprecated call sets it
    assert "is_symm_mem_enabled_for_group(group_name)" in inspect.getsource(micro_pipeline_tp)   # the pass reads it
    assert "all_reduce" not in inspect.getsource(micro_pipeline_tp)  # the pass decomposes no all-reduce
    assert "There is no need to call this function anymore" in inspect.getsource(symm)  # though its setter is deprecated
    fused = inspect.getsource(symm._fused_all_gather_matmul)  # small sizes: a native path, then multimem, then the pipeline
    assert fused.index("_should_use_fused_all_gather_matmul_native(") < fused.index("_should_use_multimem") < fused.index("_impl(")
    native, multimem = (inspect.getsource(f) for f in (symm._should_use_fused_all_gather_matmul_native, symm._should_use_multimem_all_gather_matmul))
    assert all(s in native for s in ("TORCH_SYMM_MEM_ENABLE_NATIVE_ASYNC_TP", "_async_input_mm", "gather_dim == 0", "2048 < local_M * group.size() <= 4096", "len(Bs) == 1"))
    assert "_pipelined_multi_all_gather_and_consume(" in inspect.getsource(symm._pipelined_all_gather_and_consume)
    pipeline = inspect.getsource(symm._pipelined_multi_all_gather_and_consume)  # the loop it hands over to
    assert "remote_rank = (step + rank) % group_size" in pipeline
    assert "copy_shard(dst=local_p2p_bufs, src=shard)\n    symm_mem.barrier(channel=1)" in pipeline  # before the first pull
    assert "_pipelined_produce_and_all2all" in inspect.getsource(symm._fused_matmul_reduce_scatter_impl)  # an all-to-all of partials  # at step k, pull rank r + k's shard
    assert all(s in multimem for s in ("has_multicast_support", "not return_A", "gather_dim == 0", "local_M * group.size() <= 2048"))
    # The pass fuses a reduce-scatter only when its input comes straight from one matmul (mm or _scaled_mm,
    # maybe between reshapes). A sum of two matmuls, as backward's dx = dq Wq + dk Wk, is not such a producer:
    aten = torch.ops.aten
    graph = torch.fx.Graph()
    dq, wq, wk = graph.placeholder("dq"), graph.placeholder("Wq"), graph.placeholder("Wk")
    mm_q, mm_k = graph.call_function(aten.mm.default, (dq, wq)), graph.call_function(aten.mm.default, (dq, wk))
    summed = graph.call_function(aten.add.Tensor, (mm_q, mm_k))
    assert micro_pipeline_tp._find_producer_matmul(mm_q) is not None and micro_pipeline_tp._find_producer_matmul(summed) is None

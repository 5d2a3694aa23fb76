"""Notebook 12b's claims about the installed transformers, checked against its source (moved out of the
notebook's collapsed cell): section 1's "no HF style puts one shared DTensor in front of a module's
Linears" on every style of ALL_PARALLEL_STYLES, and the transformers lines the notebook quotes."""

from __future__ import annotations

import inspect

import pytest
import transformers

hf_tp = pytest.importorskip("transformers.distributed.tensor_parallel")
hf_config = pytest.importorskip("transformers.distributed.configuration_utils")
CITED = "5.25"  # the version the notebook's notes quote


def quoted(where, text):
    """Is `text` in the source or docstring of where() (a module, class or function of transformers)?"""
    try:
        return text in inspect.getsource(where()) or text in (where().__doc__ or "")
    except (ImportError, AttributeError, OSError, TypeError):
        return False


def test_no_style_shares_one_f():
    """'replicate' is the do-nothing base; 'all_reduce' sums and returns local; 'sequence_parallel' takes its
    input as already split (from_local); the Linear and embedding styles return local outputs."""
    styles = hf_tp.ALL_PARALLEL_STYLES
    base_input = hf_tp.TensorParallelLayer.transform_inputs_pre_forward
    assert all(s.use_local_output for s in styles.values() if hasattr(s, "use_local_output"))
    assert all(type(styles[n]).transform_inputs_pre_forward is base_input for n in ("all_reduce", "replicate"))
    assert type(styles["replicate"]) is hf_tp.TensorParallelLayer
    assert "to_local()" in inspect.getsource(type(styles["all_reduce"]).transform_output_post_forward)
    assert styles["sequence_parallel"].sequence_dim == 1
    assert "from_local" in inspect.getsource(type(styles["sequence_parallel"]).transform_inputs_pre_forward)


@pytest.mark.skipif(not transformers.__version__.startswith(CITED), reason=f"the notebook quotes transformers {CITED}")
def test_the_quotes_hold():
    quotes = {"the inference note": quoted(lambda: hf_tp.ColwiseParallel.transform_inputs_pre_forward,
                                           "not torch.is_grad_enabled()"),
              "section 2": quoted(lambda: hf_config, "Reserved for sequence parallelism. Not wired up yet."),
              "the accelerate note": quoted(lambda: __import__("transformers.integrations.accelerate").integrations
                                            .accelerate.check_and_set_device_map, "requires `accelerate`"),
              "section 3's data-parallel note": all(quoted(lambda: hf_config.DistributedConfig, w)
                                                    for w in ("fsdp_size", "dp_replicate_size"))}
    assert all(quotes.values()), quotes

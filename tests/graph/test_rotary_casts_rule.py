"""FoldRotaryCasts: the float32 Casts around a half-precision com.microsoft MRotaryEmbedding (Qwen3.5's full-attention
layers in the builder's fp16 / int4 CUDA exports) go. What it folds, what it refuses (with a reason), and the folded
model's values against the three nodes' (bit for bit)."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from crossml.graph.passes.rotary_casts import ROTARY_CASTS
from crossml.runtime.session import fusion_rules
from tests.graph._rules import contrib_model, fold_copy, rule_reason, unfused_session

RNG = np.random.default_rng(12)
HEADS, D, MAX_POS = 2, 16, 32


def cast_rope(*, src: int = T.FLOAT16, back: int | None = None, inner_to: int = T.FLOAT,
              second_reader: bool = False) -> onnx.ModelProto:
    """x (src) -> Cast(inner_to) -> MRotaryEmbedding (sectioned, 8 rotary dims of 16) -> Cast(back)."""
    back = src if back is None else back
    inputs = [h.make_tensor_value_info("x", src, ["batch", "length", HEADS * D]),
              h.make_tensor_value_info("pos", T.INT64, [3, "batch", "length"])]
    freqs = np.arange(MAX_POS)[:, None] * (10000.0 ** (-np.arange(4) / 4))[None, :]
    inits = [numpy_helper.from_array(np.cos(freqs).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(freqs).astype(np.float32), "sin")]
    nodes = [h.make_node("Cast", ["x"], ["x32"], name="in_cast", to=inner_to),
             h.make_node("MRotaryEmbedding", ["x32", "pos", "cos", "sin"], ["r32"], name="rope",
                         domain="com.microsoft", mrope_section=[2, 1, 1], num_heads=HEADS, rotary_embedding_dim=8,
                         interleaved=0),
             h.make_node("Cast", ["r32"], ["y"], name="out_cast", to=back)]
    outputs = [h.make_tensor_value_info("y", back, None)]
    if second_reader:
        nodes.append(h.make_node("Neg", ["r32"], ["n"], name="other"))
        outputs.append(h.make_tensor_value_info("n", T.FLOAT, None))
    return contrib_model(nodes, inputs, outputs, inits)


def test_folds_the_casts_with_the_same_values() -> None:
    for src, dtype in ((T.FLOAT16, np.float16), (T.BFLOAT16, None)):
        m = cast_rope(src=src)
        folded, counts = fold_copy(m, ROTARY_CASTS)
        assert counts == {"FoldRotaryCasts": 1}
        (node,) = folded.graph.node
        assert node.op_type == "MRotaryEmbedding" and list(node.input[:2]) == ["x", "pos"] and node.output[0] == "y"
        if dtype is None:  # bfloat16 inputs cannot be fed from numpy: the fold is checked on float16 values
            continue
        pos = RNG.integers(0, MAX_POS, (3, 2, 5)).astype(np.int64)
        x = {"x": RNG.standard_normal((2, 5, HEADS * D)).astype(dtype), "pos": pos}
        got, = unfused_session(folded).run(None, x)
        want, = unfused_session(m).run(None, x)
        assert got.dtype == want.dtype == np.float16
        np.testing.assert_array_equal(got, want)


def test_refusals_name_the_reason() -> None:
    assert "not known to be float16" in rule_reason(ROTARY_CASTS, cast_rope(src=T.FLOAT), "MRotaryEmbedding")
    assert "does not cast back" in rule_reason(ROTARY_CASTS, cast_rope(back=T.FLOAT), "MRotaryEmbedding")
    assert "does not cast to float32" in rule_reason(ROTARY_CASTS, cast_rope(inner_to=T.DOUBLE), "MRotaryEmbedding")
    assert fold_copy(cast_rope(second_reader=True), ROTARY_CASTS)[1] == {}  # the float32 rotation is read elsewhere too


def test_runs_off_the_cpu_only() -> None:
    assert ROTARY_CASTS in fusion_rules(None, torch.device("cuda"))
    assert ROTARY_CASTS not in fusion_rules(None, torch.device("cpu"))

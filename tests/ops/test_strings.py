"""String ops against onnxruntime (CPU): StringNormalizer case-insensitive stopwords, StringSplit
with maxsplit on 2-D input, RegexFullMatch, TfIdfVectorizer on int64 and string input in every mode."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import crossml

S, F, I64 = TensorProto.STRING, TensorProto.FLOAT, TensorProto.INT64


def both(op_type, x, in_type, outs, opset=20, **attrs):
    node = helper.make_node(op_type, ["x"], [n for n, _ in outs], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", in_type, None)],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    blob = model.SerializeToString()
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = crossml.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype == object:
            assert g.tolist() == w.tolist()
        else:
            np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("sensitive", [0, 1])
def test_string_normalizer(action, sensitive):
    x = np.array([["The", "quick", "THE", "fox", "Fox"]], dtype=object)
    both("StringNormalizer", x, S, [("y", S)], case_change_action=action, is_case_sensitive=sensitive,
         stopwords=["the", "Fox"], locale="C")


def test_string_split_2d_maxsplit():
    x = np.array([["a b  c", "d"], ["", "e f g h"]], dtype=object)
    both("StringSplit", x, S, [("y", S), ("n", I64)], maxsplit=2)
    both("StringSplit", x, S, [("y", S), ("n", I64)], delimiter=" ")


def test_regex_full_match():
    x = np.array([["abc123", "ABC"], ["x1", ""]], dtype=object)
    both("RegexFullMatch", x, S, [("y", TensorProto.BOOL)], pattern=r"[a-z]+\d*")


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("strings", [False, True])
def test_tfidf(mode, strings):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 5, (3, 9))
    attrs = dict(mode=mode, min_gram_length=1, max_gram_length=3, max_skip_count=2, ngram_counts=[0, 3, 7],
                 ngram_indexes=[0, 1, 2, 3, 4, 5], weights=[0.5, 1.0, 2.0, 1.5, 0.25, 3.0])
    pool = [1, 2, 3, 1, 2, 2, 3, 1, 2, 3]
    if strings:
        x = np.array([[f"w{i}" for i in row] for row in ids], dtype=object)
        both("TfIdfVectorizer", x, S, [("y", F)], opset=9, pool_strings=[f"w{i}" for i in pool], **attrs)
    else:
        both("TfIdfVectorizer", ids.astype(np.int64), I64, [("y", F)], opset=9, pool_int64s=pool, **attrs)

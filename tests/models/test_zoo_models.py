"""Models exported from torch (crossml.zoo: ResNet-50, MobileNetV2, BERT-base) match onnxruntime's
CPU provider at fp32 within 1e-4."""

from __future__ import annotations

import numpy as np
import pytest

import crossml as ort
from crossml.zoo import example_inputs, export

onnxruntime = pytest.importorskip("onnxruntime", reason="onnxruntime (test extra) is the reference")


@pytest.mark.parametrize("name,batch,seq", [("resnet50", 2, 0), ("mobilenet_v2", 1, 0), ("bert_base", 2, 128),
                                            ("bert_tiny", 3, 40)])
def test_matches_onnxruntime_cpu(name: str, batch: int, seq: int) -> None:
    path = export(name)
    feeds = example_inputs(name, batch=batch, seq=seq or 128, seed=batch)
    ref = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)

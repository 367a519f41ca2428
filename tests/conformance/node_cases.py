"""Run the ONNX node tests (from the installed onnx package) through crossml.InferenceSession.

Shared by the pytest module and by ``python -m tests.conformance.report``.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
from onnx import numpy_helper

import crossml


@functools.cache
def node_cases() -> dict:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {tc.name: tc for tc in collect_testcases()}


def _to_np(v):
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, onnx.SequenceProto):
        return numpy_helper.to_list(v)
    if isinstance(v, onnx.OptionalProto):
        return numpy_helper.to_optional(v)
    if isinstance(v, onnx.MapProto):
        return numpy_helper.to_dict(v)
    return v


def run_case(name: str, providers=("CPUExecutionProvider",)) -> None:
    """Raise AssertionError (or a crossml error) unless ``name`` passes."""
    tc = node_cases()[name]
    sess = crossml.InferenceSession(tc.model.SerializeToString(), providers=list(providers))
    in_names = [i.name for i in sess.get_inputs()]
    for inputs, outputs in tc.data_sets:
        feed = {n: _to_np(v) for n, v in zip(in_names, inputs)}
        got = sess.run(None, feed)
        assert len(got) == len(outputs), f"{len(got)} outputs, expected {len(outputs)}"
        for i, (g, e) in enumerate(zip(got, outputs)):
            compare(_to_np(e), g, tc.rtol, tc.atol, f"output {i}")


def compare(expected, got, rtol: float, atol: float, where: str) -> None:
    if isinstance(expected, list):
        assert isinstance(got, list), f"{where}: expected a sequence, got {type(got).__name__}"
        assert len(got) == len(expected), f"{where}: sequence length {len(got)} != {len(expected)}"
        for j, (e, g) in enumerate(zip(expected, got)):
            compare(e, g, rtol, atol, f"{where}[{j}]")
        return
    if expected is None:
        assert got is None, f"{where}: expected an empty optional"
        return
    if isinstance(expected, dict):
        assert expected.keys() == got.keys()
        return
    expected = np.asarray(expected)
    assert isinstance(got, np.ndarray), f"{where}: expected ndarray, got {type(got).__name__}"
    assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"{where}: shape {got.shape} != {expected.shape}"
    if expected.dtype == object:
        assert got.tolist() == expected.tolist(), f"{where}: strings differ"
        return
    if expected.dtype.kind in "biu" or expected.dtype == bool:
        np.testing.assert_array_equal(got, expected, err_msg=where)
        return
    e = expected.astype(np.float64) if expected.dtype.kind != "c" else expected
    g = got.astype(np.float64) if got.dtype.kind != "c" else got
    np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=where, equal_nan=True)

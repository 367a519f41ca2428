"""RNN, GRU and LSTM against onnx.reference.ReferenceEvaluator and onnxruntime (CPU) on the cases the
ONNX node tests miss: sequence_lens in every direction, activation lists with alpha/beta, clip,
input_forget, layout 1 with initial states, float64/float16, and the opset-1/7 forms."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

import crossml
from tests.ops._models import one_node_model

RNG = np.random.default_rng(5)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def model(op_type: str, inputs: dict[str, np.ndarray | None], opset: int, n_out: int = 1,
          **attrs: object) -> onnx.ModelProto:
    return one_node_model(op_type, inputs, opset, n_out, ir_version=8, **attrs)


def make_inputs(op_type: str, seq: int, batch: int, inp: int, hid: int, dirs: int, dtype=np.float32,
                bias: bool = True, init: bool = True, peep: bool = False, lens: list[int] | None = None,
                layout: int = 0) -> dict[str, np.ndarray | None]:
    g = GATES[op_type]

    def r(*shape: int) -> np.ndarray:
        return (RNG.standard_normal(shape) * 0.5).astype(dtype)

    x = r(batch, seq, inp) if layout else r(seq, batch, inp)
    state_shape = (batch, dirs, hid) if layout else (dirs, batch, hid)
    d: dict[str, np.ndarray | None] = {
        "X": x, "W": r(dirs, g * hid, inp), "R": r(dirs, g * hid, hid), "B": r(dirs, 2 * g * hid) if bias else None,
        "sequence_lens": np.array(lens, dtype=np.int32) if lens is not None else None,
        "initial_h": r(*state_shape) if init else None,
    }
    if op_type == "LSTM":
        d["initial_c"] = r(*state_shape) if init else None
        d["P"] = r(dirs, 3 * hid) if peep else None
    return d


def compare(op_type: str, inputs: dict[str, np.ndarray | None], opset: int, against: str, rtol: float = 1e-5,
            atol: float = 1e-5, ref_opset: int | None = None, **attrs: object) -> None:
    """crossml at ``opset`` against ``against`` ("ort" or "reference") at ``ref_opset`` (default: the same)."""
    n_out = 3 if op_type == "LSTM" else 2
    m = model(op_type, inputs, opset, n_out, **attrs)
    feed = {k: v for k, v in inputs.items() if v is not None}
    got = crossml.InferenceSession(m.SerializeToString()).run(None, feed)
    m = model(op_type, inputs, ref_opset or opset, n_out, **attrs)
    if against == "ort":
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    else:
        want = ReferenceEvaluator(m).run(None, feed)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == inputs["X"].dtype, f"output {i}: dtype {g.dtype}"
        assert g.shape == w.shape, f"output {i}: shape {g.shape} != {w.shape}"
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=f"output {i}")


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_against_reference(op_type, direction, layout):
    dirs = 2 if direction == "bidirectional" else 1
    inputs = make_inputs(op_type, 4, 3, 5, 6, dirs, peep=op_type == "LSTM", layout=layout)
    compare(op_type, inputs, 14, "reference", direction=direction, layout=layout, hidden_size=6)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(lbr):
    inputs = make_inputs("GRU", 4, 2, 3, 5, 2)
    compare("GRU", inputs, 14, "reference", direction="bidirectional", linear_before_reset=lbr, hidden_size=5)
    compare("GRU", inputs, 14, "ort", direction="bidirectional", linear_before_reset=lbr, hidden_size=5)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens(op_type, direction):
    dirs = 2 if direction == "bidirectional" else 1
    inputs = make_inputs(op_type, 5, 3, 4, 3, dirs, lens=[5, 2, 3], peep=op_type == "LSTM")
    compare(op_type, inputs, 14, "ort", direction=direction, hidden_size=3)


ACTS = {
    "RNN": (["Relu", "Affine"], [0.7], [0.1]),
    "GRU": (["HardSigmoid", "LeakyRelu", "Sigmoid", "ScaledTanh"], [0.3, 0.05, 1.2], [0.4, 0.8]),
    "LSTM": (["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "Elu", "ThresholdedRelu"], [0.2, 0.9, 0.1], [0.5]),
}


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_activations_alpha_beta(op_type):
    names, alpha, beta = ACTS[op_type]
    inputs = make_inputs(op_type, 3, 2, 4, 3, 2)
    compare(op_type, inputs, 14, "ort", direction="bidirectional", hidden_size=3, activations=names,
            activation_alpha=alpha, activation_beta=beta)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_clip(op_type):
    inputs = make_inputs(op_type, 4, 2, 4, 3, 1)
    inputs["X"] = inputs["X"] * 6
    compare(op_type, inputs, 14, "ort", hidden_size=3, clip=0.4)


def test_lstm_input_forget():
    inputs = make_inputs("LSTM", 4, 2, 4, 3, 1, peep=True)
    compare("LSTM", inputs, 14, "ort", hidden_size=3, input_forget=1)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_defaults_without_optional_inputs(op_type):
    inputs = make_inputs(op_type, 3, 2, 4, 3, 1, bias=False, init=False)
    compare(op_type, inputs, 14, "reference", hidden_size=3)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("opset", [1, 7])
def test_old_opsets(op_type, opset):
    inputs = make_inputs(op_type, 3, 2, 4, 3, 1)
    # onnxruntime has no opset-1 kernels; opset 1 has the same semantics as opset 7 here
    compare(op_type, inputs, opset, "ort", ref_opset=7, hidden_size=3)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_dtypes(op_type, dtype):
    inputs = make_inputs(op_type, 3, 2, 4, 3, 2, dtype=dtype)
    tol = 1e-10 if dtype == np.float64 else 5e-3
    compare(op_type, inputs, 22, "reference", rtol=tol, atol=tol, direction="bidirectional", hidden_size=3)


def test_bad_direction_message():
    inputs = make_inputs("RNN", 3, 2, 4, 3, 1)
    m = model("RNN", inputs, 14, 2, direction="bidirectional", hidden_size=3)
    with pytest.raises(Exception, match="direction 'bidirectional' needs W with 2"):
        crossml.InferenceSession(m.SerializeToString()).run(None, {k: v for k, v in inputs.items() if v is not None})

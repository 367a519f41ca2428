"""Shape and layout ops against onnx.reference.ReferenceEvaluator or numpy, on what the ONNX node
tests miss: every element type (uint16/32/64, bfloat16, float8, bool, strings), legacy opsets,
negative axes and steps, clamping, empty tensors and error messages."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator

import crossml
from tests.ops._models import one_node_model

RNG = np.random.default_rng(11)
CPU = ["CPUExecutionProvider"]
PROVIDERS = [
    pytest.param(CPU, id="cpu"),
    pytest.param(["GPUExecutionProvider", "CPUExecutionProvider"], id="gpu",
                 marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")]),
]


def model(op_type: str, inputs: dict[str, np.ndarray | None], opset: int, n_out: int = 1,
          **attrs: object) -> onnx.ModelProto:
    return one_node_model(op_type, inputs, opset, n_out, **attrs)


def run(op_type: str, inputs: dict[str, np.ndarray | None], opset: int = 21, providers=None, n_out: int = 1,
        **attrs: object) -> list[np.ndarray]:
    m = model(op_type, inputs, opset, n_out, **attrs)
    sess = crossml.InferenceSession(m.SerializeToString(), providers=providers or CPU)
    return sess.run(None, {k: v for k, v in inputs.items() if v is not None})


def reference(op_type: str, inputs: dict[str, np.ndarray | None], opset: int = 21, n_out: int = 1,
              **attrs: object) -> list[np.ndarray]:
    m = model(op_type, inputs, opset, n_out, **attrs)
    return ReferenceEvaluator(m).run(None, {k: v for k, v in inputs.items() if v is not None})


def ort_reference(op_type: str, inputs: dict[str, np.ndarray | None], opset: int = 21, n_out: int = 1,
                  **attrs: object) -> list[np.ndarray]:
    import onnxruntime

    m = model(op_type, inputs, opset, n_out, **attrs)
    m.ir_version = min(m.ir_version, 10)
    sess = onnxruntime.InferenceSession(m.SerializeToString(), providers=CPU)
    return sess.run(None, {k: v for k, v in inputs.items() if v is not None})


def same(got: np.ndarray, want: np.ndarray, rtol: float = 0.0) -> None:
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.dtype == object:
        assert got.tolist() == want.tolist()
    elif rtol and want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    else:  # bit for bit (float8 / bfloat16 included; NaNs equal)
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), f"{got} != {want}"


def check(op_type: str, inputs: dict[str, np.ndarray | None], opset: int = 21, providers=None, n_out: int = 1,
          expected: list[np.ndarray] | np.ndarray | None = None, rtol: float = 0.0, **attrs: object) -> None:
    got = run(op_type, inputs, opset, providers, n_out, **attrs)
    if expected is None:
        expected = reference(op_type, inputs, opset, n_out, **attrs)
    elif not isinstance(expected, list):
        expected = [expected]
    assert len(got) == len(expected)
    for g, w in zip(got, expected):
        same(g, w, rtol)


def data(dtype: object, shape: tuple[int, ...]) -> np.ndarray:
    """Distinct-ish values of ``dtype`` (strings: words) in ``shape``."""
    n = int(np.prod(shape))
    if dtype is object:
        return np.array([f"s{i}" for i in range(n)], dtype=object).reshape(shape)
    if dtype is bool:
        return RNG.integers(0, 2, n).astype(bool).reshape(shape)
    dt = np.dtype(dtype)
    if dt == np.uint64:
        return (np.arange(n, dtype=np.uint64) + np.uint64(2**63 + 5)).reshape(shape)
    return (np.arange(n) % 13 - (0 if dt.kind == "u" else 6)).astype(dt).reshape(shape)


I64 = np.int64
ALL_TYPES = [bool, np.uint8, np.int8, np.uint16, np.uint32, np.uint64, np.int64, np.float16,
             ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.complex64, object]
TYPE_IDS = [getattr(t, "__name__", str(t)) for t in ALL_TYPES]


def a(*v: int) -> np.ndarray:
    return np.array(v, dtype=I64)


# --------------------------------------------------------------------------------------------
# every element type through every data-movement op

MOVES = {
    "Reshape": (lambda x: {"x": x, "s": a(4, -1)}, {}, lambda x: x.reshape(4, -1)),
    "Transpose": (lambda x: {"x": x}, {"perm": [2, 0, 1]}, lambda x: x.transpose(2, 0, 1)),
    "Flatten": (lambda x: {"x": x}, {"axis": -1}, lambda x: x.reshape(6, 4)),
    "Squeeze": (lambda x: {"x": x[:, :1], "axes": a(-2)}, {}, lambda x: x[:, 0]),
    "Unsqueeze": (lambda x: {"x": x, "axes": a(-1, 0)}, {}, lambda x: x[None, ..., None]),
    "Concat": (lambda x: {"x": x, "x2": x[:, :1]}, {"axis": -2}, lambda x: np.concatenate([x, x[:, :1]], 1)),
    "Slice": (lambda x: {"x": x, "st": a(-1, 3), "en": a(-100, 0), "ax": a(-1, 1), "sp": a(-2, -2)}, {},
              lambda x: x[:, 3:0:-2, ::-2]),
    "Expand": (lambda x: {"x": x[:, :1], "s": a(2, 1, 3, 1)}, {}, lambda x: np.broadcast_to(x[:, :1], (2, 2, 3, 4))),
    "Tile": (lambda x: {"x": x, "r": a(1, 2, 1)}, {}, lambda x: np.tile(x, (1, 2, 1))),
    "Pad": (lambda x: {"x": x, "p": a(1, -1, 0, 1), "v": None, "ax": a(0, -2)}, {"mode": "reflect"},
            lambda x: np.pad(x[:, 1:], [(1, 0), (0, 1), (0, 0)], mode="reflect")),
    "DepthToSpace": (lambda x: {"x": x.reshape(1, 4, 3, 2)}, {"blocksize": 2, "mode": "CRD"},
                     lambda x: x.reshape(1, 1, 2, 2, 3, 2).transpose(0, 1, 4, 2, 5, 3).reshape(1, 1, 6, 4)),
    "SpaceToDepth": (lambda x: {"x": x.reshape(1, 2, 4, 3)[..., :2]}, {"blocksize": 2},
                     lambda x: x.reshape(1, 2, 4, 3)[..., :2].reshape(1, 2, 2, 2, 1, 2).transpose(0, 3, 5, 1, 2, 4)
                     .reshape(1, 8, 2, 1)),
    "Trilu": (lambda x: {"x": x, "k": a(1)}, {"upper": 0}, None),
    "CenterCropPad": (lambda x: {"x": x, "s": a(1, 6)}, {"axes": [0, -1]}, None),
}


def _trilu_expected(x: np.ndarray) -> np.ndarray:
    keep = np.tril(np.ones(x.shape[-2:], dtype=bool), 1)
    zero = np.zeros((), dtype=x.dtype) if x.dtype != object else np.array("", dtype=object)
    return np.where(keep, x, zero)


def _crop_pad_expected(x: np.ndarray) -> np.ndarray:
    out = np.zeros((1, 3, 6), dtype=x.dtype) if x.dtype != object else np.full((1, 3, 6), "", dtype=object)
    out[:, :, 1:5] = x[:1]
    return out


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", ALL_TYPES, ids=TYPE_IDS)
@pytest.mark.parametrize("op_type", list(MOVES))
def test_every_type_moves_unchanged(op_type, dtype, providers):
    x = data(dtype, (2, 3, 4))
    make, attrs, want = MOVES[op_type]
    expected = {"Trilu": _trilu_expected, "CenterCropPad": _crop_pad_expected}.get(op_type, want)(x)
    check(op_type, make(x), providers=providers, expected=np.ascontiguousarray(expected), **attrs)


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", ALL_TYPES, ids=TYPE_IDS)
def test_split_shape_size_every_type(dtype, providers):
    x = data(dtype, (2, 5))
    check("Split", {"x": x}, opset=18, providers=providers, n_out=2, axis=-1, num_outputs=2,
          expected=[x[:, :3], x[:, 3:]])
    check("Shape", {"x": x}, providers=providers, start=-1, expected=a(5))
    check("Size", {"x": x}, providers=providers, expected=np.array(10, dtype=I64))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.uint64, object],
                         ids=["f32", "bf16", "f8", "u64", "str"])
def test_pad_constant_value_every_type(dtype, providers):
    x = data(dtype, (2, 3))
    v = np.array("pad" if dtype is object else 3, dtype=dtype if dtype is not object else object)
    want = np.pad(x, [(0, 1), (2, 0)], mode="constant", constant_values=v)
    check("Pad", {"x": x, "p": a(0, 2, 1, 0), "v": v}, providers=providers, expected=want)


# --------------------------------------------------------------------------------------------
# against the reference evaluator


@pytest.mark.parametrize("providers", PROVIDERS)
def test_slice_random_against_reference(providers):
    x = RNG.standard_normal((5, 6, 7)).astype(np.float32)
    for _ in range(60):
        axes = RNG.permutation(3)[: RNG.integers(1, 4)]
        starts = RNG.integers(-9, 9, len(axes))
        ends = RNG.integers(-9, 9, len(axes))
        steps = RNG.choice([-3, -2, -1, 1, 2, 3], len(axes))
        if RNG.random() < 0.2:
            ends[0] = np.iinfo(np.int64).max if steps[0] > 0 else np.iinfo(np.int64).min
        axes = np.where(RNG.random(len(axes)) < 0.5, axes - 3, axes)
        inputs = {"x": x, "s": starts.astype(I64), "e": ends.astype(I64), "a": axes.astype(I64), "t": steps.astype(I64)}
        # onnxruntime, not numpy: a negative-step start below -dim clamps to 0 and still yields element 0
        check("Slice", inputs, providers=providers, expected=ort_reference("Slice", inputs))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes_with_axes_and_negative_pads(mode, providers):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    pads = a(2, -1, 1, 1) if mode == "reflect" else a(2, -1, 1, 3)  # onnxruntime reflects at most d - 1
    inputs = {"x": x, "p": pads, "v": np.array(1.5, np.float32), "ax": a(-1, 0)}
    check("Pad", inputs, providers=providers, mode=mode, expected=ort_reference("Pad", inputs, mode=mode))
    check("Pad", {"x": x, "p": a(0, 1, 2, 1, 0, 0)}, providers=providers, mode=mode)


def test_pad_legacy_opsets():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    want = np.pad(x, [(1, 0), (0, 2)], constant_values=0.5)
    check("Pad", {"x": x}, opset=2, pads=[1, 0, 0, 2], value=0.5, expected=want)
    check("Pad", {"x": x}, opset=1, paddings=[1, 0, 0, 2], value=0.5, expected=want)
    check("Pad", {"x": x, "p": a(0, 2, 0, 2)}, opset=11, mode="edge")


def test_legacy_attribute_forms():
    x = RNG.standard_normal((2, 1, 3)).astype(np.float32)
    check("Reshape", {"x": x}, opset=1, shape=[3, 0, -1], expected=x.reshape(3, 1, 2))
    check("Squeeze", {"x": x}, opset=1, expected=x.reshape(2, 3))
    check("Squeeze", {"x": x}, opset=11, axes=[-2])
    check("Unsqueeze", {"x": x}, opset=11, axes=[-1, 0])
    check("Slice", {"x": x}, opset=1, starts=[-1, 1], ends=[100, 3], axes=[0, 2], expected=x[1:, :, 1:3])
    check("Slice", {"x": x}, opset=9, starts=[0], ends=[1], expected=x[:1])
    check("Concat", {"x": x, "y": x}, opset=1, expected=np.concatenate([x, x], 1))
    check("Split", {"x": x}, opset=2, n_out=2, axis=2, split=[1, 2], expected=[x[..., :1], x[..., 1:]])
    check("Split", {"x": x, "s": a(2, 1)}, opset=1, n_out=2, axis=2, expected=[x[..., :2], x[..., 2:]])
    check("Split", {"x": x}, opset=11, n_out=3, axis=-1)
    check("Split", {"x": x, "s": a(1, 2)}, opset=13, n_out=2, axis=-1)
    check("DepthToSpace", {"x": RNG.standard_normal((1, 8, 2, 3)).astype(np.float32)}, opset=1, blocksize=2)
    tiles, axis = np.array(3, dtype=I64), np.array(1, dtype=I64)
    check("Tile", {"x": x, "t": tiles, "a": axis}, opset=1, expected=np.tile(x, (1, 3, 1)))


def test_reshape_allowzero_and_empty():
    x = np.zeros((0, 3), np.float32)
    check("Reshape", {"x": x, "s": a(3, 0)}, opset=14, allowzero=1, expected=x.reshape(3, 0))
    with pytest.raises(Exception, match="cannot reshape"):  # -1 is ambiguous; onnxruntime refuses too
        run("Reshape", {"x": x, "s": a(0, -1, 3)}, opset=14)
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    check("Reshape", {"x": y, "s": a(0, 3)}, opset=14, expected=y)


def test_empty_tensors():
    e = np.zeros((2, 0, 3), np.float32)
    x = np.ones((2, 1, 3), np.float32)
    check("Concat", {"e": e, "x": x}, axis=1, expected=x)
    check("Slice", {"x": x, "s": a(5), "e": a(9), "ax": a(-1)}, expected=x[..., 5:9])
    check("Slice", {"x": x, "s": a(0), "e": a(-9), "ax": a(-1), "t": a(-1)}, expected=x[..., 0:-9:-1])
    check("Pad", {"x": e, "p": a(0, 1, 0, 0, 1, 0)}, expected=np.pad(e, [(0, 0), (1, 1), (0, 0)]))
    check("Transpose", {"x": e}, expected=e.T)
    check("Tile", {"x": x, "r": a(0, 2, 1)}, expected=np.tile(x, (0, 2, 1)))
    check("Expand", {"x": x, "s": a(0, 1, 1, 1)}, expected=np.broadcast_to(x, (0, 2, 1, 3)).copy())


def test_shape_start_end_clamped():
    x = np.zeros((2, 3, 4, 5), np.float32)
    for start, end in [(-10, 10), (1, -1), (3, 1), (-2, None)]:
        kw = {"start": start} | ({"end": end} if end is not None else {})
        check("Shape", {"x": x}, **kw)


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64, np.float32, np.float64])
def test_range(dtype, providers):
    for s, lim, d in [(0, 10, 3), (10, -3, -4), (5, 5, 1), (1, 0, 1), (-2, 7, 2)]:
        args = {k: np.array(v, dtype=dtype) for k, v in zip("sld", (s, lim, d))}
        check("Range", args, providers=providers, rtol=1e-6 if np.dtype(dtype).kind == "f" else 0.0)


def test_range_float16_accumulates_in_float32():
    args = {"s": np.array(2000, np.float16), "l": np.array(2010, np.float16), "d": np.array(0.5, np.float16)}
    want = (2000 + 0.5 * np.arange(20, dtype=np.float32)).astype(np.float16)
    check("Range", args, opset=27, expected=want)


@pytest.mark.parametrize("providers", PROVIDERS)
def test_eyelike_and_trilu(providers):
    x = np.zeros((3, 5), np.int32)
    for k in (-4, -1, 0, 2, 7):
        check("EyeLike", {"x": x}, providers=providers, k=k, dtype=onnx.TensorProto.DOUBLE)
        check("EyeLike", {"x": x}, providers=providers, k=k)
    y = RNG.standard_normal((2, 4, 3)).astype(np.float32)
    for k in (-5, -1, 0, 1, 5):
        for upper in (0, 1):
            check("Trilu", {"x": y, "k": a(k)}, providers=providers, upper=upper)


@pytest.mark.parametrize("providers", PROVIDERS)
def test_onehot(providers):
    idx = np.array([[0, -1, 3], [7, -4, 2]], dtype=np.int32)
    vals = np.array([2, 9], dtype=np.uint64)
    for axis in (-1, 0, 1, -3):
        check("OneHot", {"i": idx, "d": np.array(4.0, np.float32), "v": vals}, providers=providers, axis=axis)
    strings = np.array(["off", "on"], dtype=object)
    want = np.where(np.arange(4) == np.where(idx < 0, idx + 4, idx)[..., None], "on", "off").astype(object)
    check("OneHot", {"i": idx, "d": a(4), "v": strings}, providers=providers, expected=want)


@pytest.mark.parametrize("providers", PROVIDERS)
def test_center_crop_pad_odd_sizes(providers):
    x = RNG.standard_normal((5, 4, 3)).astype(np.float32)
    check("CenterCropPad", {"x": x, "s": a(2, 7, 3)}, providers=providers)
    check("CenterCropPad", {"x": x, "s": a(8, 1)}, providers=providers, axes=[-1, 0])


def test_shape_inputs_from_initializers_fold():
    """Shape-like inputs given as initializers (the usual case) fold into constants."""
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    shape = helper.make_tensor("s", onnx.TensorProto.INT64, [2], [4, -1])
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
                          [onnx.ValueInfoProto(name="y")], initializer=[shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    got = crossml.InferenceSession(m.SerializeToString(), providers=CPU).run(None, {"x": x})[0]
    same(got, x.reshape(4, 6))


@pytest.mark.parametrize(("op_type", "inputs", "attrs", "match"), [
    ("Reshape", {"x": np.zeros((2, 3), np.float32), "s": a(4, -1)}, {}, "cannot reshape"),
    ("Reshape", {"x": np.zeros((2, 3), np.float32), "s": a(-1, -1)}, {}, "more than one -1"),
    ("Squeeze", {"x": np.zeros((2, 3), np.float32), "a": a(0)}, {}, "cannot squeeze axis 0"),
    ("Slice", {"x": np.zeros((2, 3), np.float32), "s": a(0), "e": a(1), "a": a(0), "t": a(0)}, {}, "step cannot be 0"),
    ("Expand", {"x": np.zeros((2, 3), np.float32), "s": a(4, 3)}, {}, "does not broadcast"),
    ("Transpose", {"x": np.zeros((2, 3), np.float32)}, {"perm": [0, 0]}, "not a permutation"),
    ("Pad", {"x": np.zeros((2, 3), np.float32), "p": a(1, 1)}, {}, "2 values for each"),
])
def test_errors_name_the_problem(op_type, inputs, attrs, match):
    with pytest.raises(Exception, match=match):
        run(op_type, inputs, **attrs)

"""Indexing ops against onnx.reference.ReferenceEvaluator, onnxruntime or numpy, on what the ONNX
node tests miss: negative indices, batch_dims, every reduction, element types with few torch
kernels (uint16/32/64, float8, strings), tie-breaking, unsorted Unique, empty tensors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.ops.test_tensor import PROVIDERS, RNG, a, check, data, ort_reference, run

I64 = np.int64
MOVE_TYPES = [np.float32, np.uint16, np.uint64, ml_dtypes.bfloat16, ml_dtypes.float8_e5m2, bool, object]
MOVE_IDS = ["f32", "u16", "u64", "bf16", "f8", "bool", "str"]


# --------------------------------------------------------------------------------------------
# gather


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", MOVE_TYPES, ids=MOVE_IDS)
def test_gathers_every_type_negative_indices(dtype, providers):
    x = data(dtype, (3, 4, 2))
    idx = np.array([[-1, 0], [2, -3]], dtype=I64)
    check("Gather", {"x": x, "i": idx}, providers=providers, axis=1, expected=np.take(x, idx + (idx < 0) * 4, 1))
    check("Gather", {"x": x, "i": np.array(-1, I64)}, providers=providers, expected=x[-1])
    ge = np.array([[[-1, 0]], [[1, -2]]], dtype=I64)  # shape (2, 1, 2): smaller than the data, allowed
    check("GatherElements", {"x": x, "i": ge}, providers=providers, axis=0,
          expected=np.take_along_axis(x[:, :1], ge + (ge < 0) * 3, 0))
    nd = np.array([[[-1, 1]], [[0, -4]]], dtype=I64)
    check("GatherND", {"x": x, "i": nd}, providers=providers, expected=x[[-1, 0], [1, -4]][:, None])


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("batch_dims", [0, 1, 2])
def test_gather_nd_batch_dims(batch_dims, providers):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    for k in range(1, 4 - batch_dims + 1):
        hi = x.shape[batch_dims:batch_dims + k]
        idx = np.stack([RNG.integers(-d, d, (2, 3, 2)[:batch_dims] + (2,)) for d in hi], -1).astype(I64)
        check("GatherND", {"x": x, "i": idx}, providers=providers, batch_dims=batch_dims)


def test_gather_int32_indices_and_empty():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    check("Gather", {"x": x, "i": np.array([[2, -4]], np.int32)}, axis=-1)
    check("Gather", {"x": x, "i": np.zeros((0, 2), I64)})
    check("GatherElements", {"x": x, "i": np.zeros((3, 0), I64)}, axis=1)


def test_gather_out_of_range_raises():
    with pytest.raises(Exception, match="Gather"):
        run("Gather", {"x": np.zeros((3,), np.float32), "i": a(3)})


# --------------------------------------------------------------------------------------------
# scatter

REDUCTIONS = ["none", "add", "mul", "max", "min"]


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8, np.float16, np.uint16, np.uint32, np.uint64])
def test_scatter_elements_and_nd_reductions(dtype, reduction, providers):
    x = data(dtype, (4, 3))
    upd = data(dtype, (2, 3))[::-1].copy()
    idx = np.array([[-1, 0, 2], [2, 1, -4]], dtype=I64)  # no duplicates along the axis: order-free
    check("ScatterElements", {"x": x, "i": idx, "u": upd}, opset=18, providers=providers, reduction=reduction)
    dup = np.array([[1], [-3], [0]], dtype=I64)  # row 1 twice: the reductions combine both updates
    u3 = data(dtype, (3, 3))
    if reduction == "none":
        dup, u3 = dup[1:], u3[1:]
    check("ScatterND", {"x": x, "i": dup, "u": u3}, opset=18, providers=providers, reduction=reduction)


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16, bool, object],
                         ids=["f8", "bf16", "bool", "str"])
def test_scatter_moves_every_type(dtype, providers):
    x = data(dtype, (3, 4))
    upd = data(dtype, (3, 2))[::-1].copy()
    idx = np.array([[0, -1], [2, 1], [-4, 3]], dtype=I64)
    want = x.copy()
    for r in range(3):
        for c in range(2):
            want[r, idx[r, c] % 4] = upd[r, c]
    check("ScatterElements", {"x": x, "i": idx, "u": upd}, providers=providers, axis=1, expected=want)
    check("Scatter", {"x": x, "i": idx, "u": upd}, opset=10, providers=providers, axis=1, expected=want)
    want = x.copy()
    want[[2, 0]] = upd[:2, :1].repeat(4, 1)
    check("ScatterND", {"x": x, "i": np.array([[-1], [0]], I64), "u": upd[:2, :1].repeat(4, 1)},
          providers=providers, expected=want)


def test_scatter_bool_add_is_or():
    x = np.array([False, True, False, False])
    u = np.array([True, True, False])
    i = np.array([[0], [0], [2]], I64)
    check("ScatterND", {"x": x, "i": i, "u": u}, opset=18, reduction="add",
          expected=np.array([True, True, False, False]))
    check("ScatterND", {"x": x, "i": i, "u": u}, opset=18, reduction="mul",
          expected=np.array([False, True, False, False]))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1, 2])
def test_tensor_scatter(axis, mode, providers):
    past = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    shape = list(past.shape)
    shape[axis] = 2
    upd = RNG.standard_normal(shape).astype(np.float32)
    wi = np.array([past.shape[axis] - 2, 1], I64) if mode == "linear" else np.array([4, 2], I64)
    check("TensorScatter", {"p": past, "u": upd, "w": wi}, opset=24, providers=providers, axis=axis, mode=mode)
    check("TensorScatter", {"p": past, "u": upd, "w": None}, opset=24, providers=providers, axis=axis, mode=mode)


# --------------------------------------------------------------------------------------------
# selecting and ordering


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", [np.float32, np.uint64, ml_dtypes.float8_e4m3fn, bool, np.int8])
def test_nonzero(dtype, providers):
    x = (RNG.integers(0, 3, (3, 4)) * (RNG.random((3, 4)) < 0.5)).astype(dtype)
    check("NonZero", {"x": x}, providers=providers, expected=np.array(np.nonzero(x), dtype=I64))
    check("NonZero", {"x": np.array(5, dtype=dtype)}, providers=providers, expected=np.zeros((1, 1), I64))
    check("NonZero", {"x": np.zeros((0, 3), dtype=dtype)}, providers=providers, expected=np.zeros((2, 0), I64))


def test_nonzero_strings():
    x = np.array([["a", ""], ["", "b"]], dtype=object)
    check("NonZero", {"x": x}, expected=np.array([[0, 1], [0, 1]], dtype=I64))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint64, np.float16, np.uint16])
def test_topk_ties_pick_lower_index(dtype, providers):
    x = (RNG.integers(0, 4, (3, 7))).astype(dtype)
    if dtype == np.uint64:
        x = x + np.uint64(2**63 - 2)  # both sides of 2**63
    for largest in (0, 1):
        for axis, k in ((-1, 4), (0, 2), (1, 0), (1, 7)):
            inputs = {"x": x, "k": a(k)}
            if dtype in (np.float32, np.int32):
                want = ort_reference("TopK", inputs, n_out=2, axis=axis, largest=largest)
            else:  # a stable sort: equal values keep their order
                desc = np.iinfo(dtype).max - x if np.dtype(dtype).kind == "u" else -x.astype(np.float64)
                order = np.argsort(desc if largest else x, axis=axis, kind="stable")
                ind = np.take(order, np.arange(k), axis=axis)
                want = [np.take_along_axis(x, ind, axis), ind.astype(I64)]
            check("TopK", inputs, providers=providers, n_out=2, expected=want, axis=axis, largest=largest)


def test_topk_legacy_opsets():
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    check("TopK", {"x": x}, opset=1, n_out=2, k=2)
    check("TopK", {"x": x, "k": a(3)}, opset=10, n_out=2, axis=0)


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint64, np.uint32, ml_dtypes.bfloat16])
def test_argmax_argmin(op_type, dtype, providers):
    x = RNG.integers(0, 3, (3, 4, 5)).astype(dtype)
    if dtype == np.uint64:
        x = x + np.uint64(2**63 - 1)
    fn = np.argmax if op_type == "ArgMax" else np.argmin
    for axis in (0, -1, 1):
        for keepdims in (0, 1):
            want = fn(x.astype(np.float64) if dtype is ml_dtypes.bfloat16 else x, axis=axis, keepdims=bool(keepdims))
            flipped = np.flip(x.astype(np.float64) if dtype is ml_dtypes.bfloat16 else x, axis)
            last = x.shape[axis] - 1 - fn(flipped, axis=axis, keepdims=bool(keepdims))
            check(op_type, {"x": x}, providers=providers, axis=axis, keepdims=keepdims, expected=want.astype(I64))
            check(op_type, {"x": x}, providers=providers, axis=axis, keepdims=keepdims, select_last_index=1,
                  expected=last.astype(I64))
    check(op_type, {"x": x}, opset=11, providers=providers, expected=fn(x, axis=0, keepdims=True).astype(I64))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64])
def test_cumsum_keeps_type(dtype, providers):
    x = data(dtype, (3, 4))
    for axis in (0, -1):
        for exclusive in (0, 1):
            for reverse in (0, 1):
                inputs = {"x": x, "a": np.array(axis, np.int32)}
                check("CumSum", inputs, providers=providers, exclusive=exclusive, reverse=reverse, rtol=1e-6)


@pytest.mark.parametrize("providers", PROVIDERS)
def test_cumprod(providers):
    x = RNG.integers(-3, 4, (3, 4)).astype(np.int32)
    for exclusive in (0, 1):
        for reverse in (0, 1):
            y = np.flip(x, 1) if reverse else x
            want = np.cumprod(y, 1, dtype=np.int32)
            if exclusive:
                want = np.concatenate([np.ones((3, 1), np.int32), want[:, :-1]], 1)
            want = np.flip(want, 1) if reverse else want
            check("CumProd", {"x": x, "a": a(-1)}, opset=26, providers=providers, exclusive=exclusive,
                  reverse=reverse, expected=np.ascontiguousarray(want))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", MOVE_TYPES, ids=MOVE_IDS)
def test_compress(dtype, providers):
    x = data(dtype, (3, 4))
    cond = np.array([True, False, True])
    check("Compress", {"x": x, "c": cond}, providers=providers, axis=0, expected=np.compress(cond, x, 0))
    check("Compress", {"x": x, "c": cond}, providers=providers, axis=-1, expected=np.compress(cond, x, 1))
    check("Compress", {"x": x, "c": cond}, providers=providers, expected=np.compress(cond, x))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", MOVE_TYPES, ids=MOVE_IDS)
def test_reverse_sequence(dtype, providers):
    x = data(dtype, (4, 3, 2))
    lens = np.array([4, 1, 2], I64)
    want = x.copy()
    for b, n in enumerate(lens):
        want[:n, b] = x[:n, b][::-1]
    check("ReverseSequence", {"x": x, "l": lens}, providers=providers, expected=want)
    xt = np.ascontiguousarray(x.transpose(1, 0, 2))
    check("ReverseSequence", {"x": xt, "l": lens}, providers=providers, batch_axis=0, time_axis=1,
          expected=np.ascontiguousarray(want.transpose(1, 0, 2)))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("is_sorted", [0, 1])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_unique_all_outputs(axis, is_sorted, providers):
    x = RNG.integers(0, 3, (4, 3)).astype(np.float32)
    x[2] = x[0]
    x[:, 2] = x[:, 0]
    kw = {} if axis is None else {"axis": axis}
    check("Unique", {"x": x}, providers=providers, n_out=4, sorted=is_sorted, expected=_np_unique(x, axis, is_sorted),
          **kw)


def _np_unique(x: np.ndarray, axis: int | None, is_sorted: int) -> list[np.ndarray]:
    """numpy's unique, reordered by first occurrence when not sorted (the reference evaluator takes
    the unsorted subtensors along axis 0 whatever the axis)."""
    y, idx, inv, cnt = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    inv = inv.reshape(-1)
    if not is_sorted:
        perm = np.argsort(idx, kind="stable")
        y = np.take(x if axis is not None else x.reshape(-1), idx[perm], axis=axis or 0)
        idx, inv, cnt = idx[perm], np.argsort(perm)[inv], cnt[perm]
    return [y, idx.astype(I64), inv.astype(I64), cnt.astype(I64)]


@pytest.mark.parametrize("dtype", [np.uint64, np.int8, object])
def test_unique_types(dtype):
    x = data(dtype, (8,))[[3, 1, 3, 0, 1, 7, 7, 2]]
    for is_sorted in (0, 1):
        check("Unique", {"x": x}, n_out=4, sorted=is_sorted, expected=_np_unique(x, None, is_sorted))
    codes = np.array([[0, 1], [2, 3], [0, 1], [2, 2]])
    x2 = data(dtype, (4,))[codes]  # data() increases with the position: codes sort like x2
    for is_sorted in (0, 1):
        want = _np_unique(codes, 0, is_sorted)
        want[0] = data(dtype, (4,))[want[0]]
        check("Unique", {"x": x2}, n_out=4, sorted=is_sorted, axis=0, expected=want)


def test_unique_empty():
    x = np.zeros((0,), np.float32)
    check("Unique", {"x": x}, n_out=4, expected=[x, np.zeros(0, I64), np.zeros(0, I64), np.zeros(0, I64)])

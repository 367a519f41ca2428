"""The Triton GEMV (crossml.kernels.gemv) against a float64 reference, and the MatMul / Linear ops'
routing to it. CPU cases run in Triton's interpreter; ``gpu`` cases compile (decode shapes, the ops'
fast path, CUDA graph capture)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import crossml.kernels.gemv as gemv_module  # noqa: E402
import crossml.ops.matmul as matmul_module  # noqa: E402
from crossml.kernels._launch import INTERPRET  # noqa: E402
from crossml.kernels.gemv import MAX_SPLIT_K, column_major, gemv, gemv_skip_norm, pick_dot_tiles, pick_tiles  # noqa: E402,E501
from crossml.ops.fused import linear as linear_op  # noqa: E402
from crossml.ops.matmul import gemv_eligible  # noqa: E402
from crossml.ops.matmul import matmul as matmul_op  # noqa: E402
from tests.kernels._common import DEVICES, TOL, assert_close, rand  # noqa: E402


def _gated(a: torch.Tensor, K: int) -> torch.Tensor:
    """SiluMul of [g | up] rows, rounded to a's dtype as the op stores it."""
    g, up = a[:, :K].float(), a[:, K:].float()
    return ((g * torch.sigmoid(g)) * up).to(a.dtype)


def _reference(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = a.double().cpu() @ w.double().cpu()
    return y if bias is None else y + bias.double().cpu()


#: how W is stored: row-major (contiguous) or column-major (its transpose contiguous, a GPU plan's decode weights)
LAYOUTS = ["rows", "cols"]


def _stored(w: torch.Tensor, layout: str) -> torch.Tensor:
    """``w``'s values stored in ``layout`` (the GEMV reads either)."""
    if layout == "rows":
        return w
    packed = w.t().contiguous().t()
    assert column_major(packed) or min(w.shape) <= 1
    return packed


CASES = [  # M, K, N, bias, interpreter tiles (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps): each value of each axis
    (1, 64, 24, False, (1, 32, 16, 1, 4)),  # one N tile wider than N, several K steps
    (3, 96, 130, True, (4, 64, 32, 1, 4)),  # partial N tile, rows past M masked
    (1, 320, 256, True, (1, 128, 32, 3, 4)),  # split K: 3 ranges of 4 steps, the last one partial
    (3, 64, 256, False, (2, 128, 16, 2, 4)),  # BLOCK_M 2 over 3 rows: two row programs, split K
    (1, 96, 130, False, (1, 64, 64, 2, 4)),  # split K with a partial last step
    (3, 320, 24, True, (4, 32, 64, 4, 4)),  # split K, 4 rows block over 3
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "M{}_K{}_N{}{}_split{}".format(*c[:3], "_bias" if c[3] else "",
                                                                                   c[4][3]))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_fp64_reference(device: str, dtype: torch.dtype, case: tuple, layout: str) -> None:
    M, K, N, with_bias, tiles = case
    a = rand(M, K, dtype=dtype, device=device, seed=1)
    w = rand(K, N, dtype=dtype, device=device, seed=2) * 0.1
    bias = rand(N, dtype=dtype, device=device, seed=3) if with_bias else None
    y = gemv(a, _stored(w, layout), bias, tiles=tiles if device == "cpu" else None)
    assert y.device.type == device and y.shape == (M, N)
    assert_close(y, _reference(a, w, bias), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: "M{}_K{}_N{}_split{}".format(*c[:3], c[4][3]))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_constant_weight_launch_gives_the_same_result(device: str, case: tuple, layout: str) -> None:
    """const_w (the first W tiles read before the wait for the previous kernel) changes when W is read,
    not what is computed: bit-identical to the ordinary launch."""
    M, K, N, with_bias, tiles = case
    a = rand(M, K, dtype=torch.float16, device=device, seed=1)
    w = _stored(rand(K, N, dtype=torch.float16, device=device, seed=2) * 0.1, layout)
    bias = rand(N, dtype=torch.float16, device=device, seed=3) if with_bias else None
    tiles = tiles if device == "cpu" else None
    assert torch.equal(gemv(a, w, bias, tiles=tiles, const_w=True), gemv(a, w, bias, tiles=tiles))


@pytest.mark.parametrize("device", DEVICES)
def test_picked_tiles_leading_dims_and_strided_rows(device: str) -> None:
    """The tile rule's own choice (split K in the interpreter: 1 SM), a [2, 1, K] activation, a 1-D
    one, rows of a with a stride (a column slice), an fp32 bias for fp16 data."""
    K, N = 320, 256
    dtype = torch.float16
    w = rand(K, N, dtype=dtype, device=device, seed=4) * 0.1
    bias = rand(N, device=device, seed=5)
    a = rand(2, 1, K, dtype=dtype, device=device, seed=6)
    assert_close(gemv(a, w, bias), _reference(a, w, bias.to(dtype)), dtype)
    a1 = a[0, 0]
    assert_close(gemv(a1, w), _reference(a1, w), dtype)
    wide = rand(3, 2 * K, dtype=dtype, device=device, seed=7)
    a3 = wide[:, ::2]  # strides (2K, 2)
    assert_close(gemv(a3, w), _reference(a3, w), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_zero_k(device: str) -> None:
    w = rand(0, 8, device=device)
    bias = rand(8, device=device, seed=1)
    y = gemv(rand(2, 0, device=device), w, bias)
    assert torch.equal(y.cpu(), bias.cpu().expand(2, 8))
    assert gemv(rand(0, 16, device=device), rand(16, 8, device=device)).shape == (0, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_name_the_problem(device: str) -> None:
    a, w = rand(1, 64, device=device), rand(64, 32, device=device)
    with pytest.raises(TypeError, match="share one of"):
        gemv(a.half(), w)
    with pytest.raises(TypeError, match="share one of"):
        gemv(a.double(), w.double())
    with pytest.raises(ValueError, match="contiguous or column-major"):
        gemv(a[:, :16], w[:, ::2].t())
    with pytest.raises(ValueError, match="K=64"):
        gemv(a[:, :32], w)
    with pytest.raises(ValueError, match="bias"):
        gemv(a, w, rand(31, device=device))
    with pytest.raises(ValueError, match="tiles"):
        gemv(a, w, tiles=(3, 32, 32, 1, 4))


def test_tiles_for_decode_shapes() -> None:
    """The rule on a 132-SM GPU for Qwen2-0.5B's decode GEMVs: legal tiles, 64-byte rows, enough
    programs (K split where the N slices are few), register-sized tiles."""
    for M in (1, 2, 3, 4):
        for K, N in [(896, 1152), (896, 896), (896, 4864), (4864, 896), (896, 151936)]:
            bm, bn, bk, split, warps = pick_tiles(M, K, N, 2, 132)
            assert bm == min(4, 1 << (M - 1).bit_length()) and bn >= 32 and bn & (bn - 1) == 0 and bk & (bk - 1) == 0
            assert 1 <= split <= MAX_SPLIT_K and 1 <= warps <= 4 and bm * bk * bn <= 8192
            programs = -(-N // bn) * split
            assert programs >= 132, (M, K, N, programs)
            assert split == 1 or -(-N // bn) < 2 * 132
    assert pick_tiles(1, 896, 151936, 2, 132)[3] == 1  # wide N: one launch
    assert pick_tiles(1, 4864, 896, 2, 132)[3] > 1
    # the measured tiles of the split products (results/gemv_tiles.md): 32 x 128, 2-3 programs per SM
    assert pick_tiles(1, 4864, 896, 2, 132) == (1, 32, 128, 13, 4)
    assert pick_tiles(1, 2048, 3072, 2, 132) == (1, 32, 128, 4, 4)
    assert pick_tiles(1, 896, 896, 4, 132)[1] == 16  # fp32: 16 values fill 64 bytes


def test_column_major_tiles_for_decode_shapes() -> None:
    """The column-major rule at Qwen2-0.5B's and Llama-3.2-1B's decode shapes on a 132-SM GPU (measured in their
    captured decode steps, kernels/gemv.py's docstring): 1 KB runs along K where the slices are few (the whole K
    range of a 896-deep product in two tiles), 256-byte runs for wide N, K split only for the deep down projections
    (in 2 with 2 KB runs where 8-column slices are fewer than the SMs), register-sized tiles."""
    for M in (1, 2, 3, 4):
        for K, N in [(896, 1152), (896, 896), (896, 9728), (4864, 896), (2048, 3072), (2048, 16384), (8192, 2048),
                     (2048, 128256)]:
            bm, bn, bk, split, warps = pick_tiles(M, K, N, 2, 132, colmajor=True)
            assert bm == min(4, 1 << (M - 1).bit_length()) and bn in (8, 16, 32) and bk & (bk - 1) == 0
            assert 1 <= split <= MAX_SPLIT_K and warps in (4, 8) and bm * bk * bn <= 16384
            assert split == 1 or K >= 4864, (M, K, N, split)
    assert pick_tiles(1, 896, 1152, 2, 132, colmajor=True) == (1, 16, 512, 1, 8)
    assert pick_tiles(1, 896, 9728, 2, 132, colmajor=True) == (1, 8, 128, 1, 4)
    assert pick_tiles(1, 2048, 16384, 2, 132, colmajor=True) == (1, 16, 256, 1, 4)
    assert pick_tiles(1, 2048, 128256, 2, 132, colmajor=True) == (1, 16, 512, 1, 8)  # a vocabulary product
    assert pick_tiles(1, 4864, 896, 2, 132, colmajor=True) == (1, 8, 1024, 2, 8)
    assert pick_tiles(4, 4864, 896, 2, 132, colmajor=True) == (4, 8, 256, 4, 4)
    assert pick_tiles(1, 8192, 2048, 2, 132, colmajor=True) == (1, 16, 256, 4, 4)
    assert pick_tiles(4, 2048, 3072, 2, 132, colmajor=True) == (4, 8, 256, 1, 4)
    assert pick_tiles(4, 2048, 16384, 2, 132, colmajor=True) == (4, 32, 64, 1, 4)
    assert pick_tiles(1, 896, 896, 4, 132, colmajor=True)[2] == 256  # fp32: 1 KB runs of 256 values


# --- the ops' routing ---


def _spy(monkeypatch: pytest.MonkeyPatch, tiles: tuple | None = None) -> list:
    """Record calls of the kernel (running it, with ``tiles`` in the interpreter)."""
    import crossml.kernels.gemv as kernel

    calls = []
    original = kernel.gemv

    def spy(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs, tiles=tiles)

    monkeypatch.setattr(kernel, "gemv", spy)
    return calls


def test_ops_on_cpu_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors keep torch.matmul / linear (bit-identical), eligible shapes and dtypes included."""
    calls = _spy(monkeypatch)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        a, w, b = rand(1, 1, 256, dtype=dtype, seed=1), rand(256, 256, dtype=dtype, seed=2), rand(256, dtype=dtype)
        assert not gemv_eligible(a, w, b)
        assert torch.equal(matmul_op(a, w), torch.matmul(a, w))
        assert torch.equal(linear_op(a, w, b), torch.nn.functional.linear(a, w.t(), b))
    assert not calls


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only: routes CPU tensors to the kernel")
def test_ops_route_eligible_products_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CPU counted as a GPU device (interpreted), the ops call the kernel exactly when eligible."""
    monkeypatch.setattr(matmul_module, "GEMV_DEVICES", ("cpu",))
    calls = _spy(monkeypatch, tiles=(4, 256, 128, 2, 4))
    K, N = 256, 384
    w = rand(K, N, dtype=torch.float16, seed=2) * 0.1
    b = rand(N, dtype=torch.float16, seed=3)
    for a in (rand(K, dtype=torch.float16, seed=1), rand(2, 2, K, dtype=torch.float16, seed=1),
              rand(2, 8, K, dtype=torch.float16, seed=1)):  # up to GEMV_MAX_M = 16 rows
        calls.clear()
        assert gemv_eligible(a, w) and gemv_eligible(a, w, b)
        y = matmul_op(a, w)
        assert len(calls) == 1 and y.shape == (*a.shape[:-1], N)
        assert_close(y, _reference(a, w), torch.float16)
        y = linear_op(a, w, b)
        assert len(calls) == 2
        assert_close(y, _reference(a, w, b), torch.float16)
    a = rand(1, K, dtype=torch.bfloat16, seed=1)
    assert_close(matmul_op(a, w.bfloat16()), _reference(a, w.bfloat16()), torch.bfloat16)
    cols = _stored(w, "cols")  # a plan's packed decode weight
    a = rand(1, K, dtype=torch.float16, seed=1)
    calls.clear()
    assert gemv_eligible(a, cols, b)
    assert_close(matmul_op(a, cols), _reference(a, w), torch.float16)
    assert_close(linear_op(a, cols, b), _reference(a, w, b), torch.float16)
    assert len(calls) == 2 and all(column_major(c[1]) for c in calls)
    calls.clear()

    a = rand(1, K, dtype=torch.float16, seed=1)
    not_eligible = [
        (rand(matmul_module.GEMV_MAX_M + 1, K, dtype=torch.float16), w, b),  # M > GEMV_MAX_M
        (rand(1, 128, dtype=torch.float16), rand(128, N, dtype=torch.float16), b),  # K < 256
        (a, rand(K, 128, dtype=torch.float16), rand(128, dtype=torch.float16)),  # N < 256
        (a.float(), w.float(), b.float()),  # fp32
        (a, w.bfloat16(), b),  # mixed dtypes
        (a, rand(K, 2 * N, dtype=torch.float16)[:, ::2], b),  # neither contiguous nor column-major
        (a, w.unsqueeze(0), b),  # batched weight
    ]
    for x, ww, bb in not_eligible:
        assert not gemv_eligible(x, ww) and not gemv_eligible(x, ww, bb)
        if x.dtype != ww.dtype:  # the ops refuse mixed types
            continue
        assert torch.equal(matmul_op(x, ww), torch.matmul(x, ww))
        if ww.dim() == 2:
            assert torch.equal(linear_op(x, ww, bb), torch.nn.functional.linear(x, ww.t(), bb))
    # a bias of another dtype or shape keeps Linear on torch (which refuses the first on the CPU)
    assert gemv_eligible(a, w) and not gemv_eligible(a, w, b.float()) and not gemv_eligible(a, w, b.reshape(1, N))
    assert torch.equal(linear_op(a, w, b.reshape(1, N)), torch.nn.functional.linear(a, w.t(), b.reshape(1, N)))
    assert not calls


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only: routes CPU tensors to the kernel")
def test_batched_rows_leave_large_weights_to_the_vendor_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past GEMV_BATCHED_MAX_WEIGHT values of W, one row takes the kernel and two or more rows keep torch (bit for
    bit torch.matmul / linear); at the limit both take the kernel."""
    monkeypatch.setattr(matmul_module, "GEMV_DEVICES", ("cpu",))
    calls = _spy(monkeypatch, tiles=(4, 256, 128, 2, 4))
    K, N = 256, 384
    w = rand(K, N, dtype=torch.float16, seed=2) * 0.1
    b = rand(N, dtype=torch.float16, seed=3)
    one, two = rand(1, K, dtype=torch.float16, seed=1), rand(2, K, dtype=torch.float16, seed=1)
    monkeypatch.setattr(matmul_module, "GEMV_BATCHED_MAX_WEIGHT", K * N)
    assert gemv_eligible(one, w, b) and gemv_eligible(two, w, b)
    monkeypatch.setattr(matmul_module, "GEMV_BATCHED_MAX_WEIGHT", K * N - 1)
    assert gemv_eligible(one, w, b) and not gemv_eligible(two, w) and not gemv_eligible(two, w, b)
    assert torch.equal(matmul_op(two, w), torch.matmul(two, w))
    assert torch.equal(linear_op(two, w, b), torch.nn.functional.linear(two, w.t(), b))
    assert not calls
    assert_close(matmul_op(one, w), _reference(one, w), torch.float16)
    assert len(calls) == 1


def _stream_spy(monkeypatch: pytest.MonkeyPatch) -> list:
    """Record the streaming kernel's launches (grid, BLOCK_N, BLOCK_K, AHEAD), running it."""
    launches = []
    original = gemv_module._stream_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((grid, kwargs["BLOCK_N"], kwargs["BLOCK_K"], kwargs["AHEAD"]))
                return original[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(gemv_module, "_stream_kernel", Spy())
    return launches


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("K", "N", "bias", "ahead", "const_w"), [
    (96, 1000, False, 2, True),  # K padded to 128, a partial last block
    (200, 333, True, 3, False),  # three tiles ahead, the bias added, W read after the wait
    (64, 4096, True, 2, True),  # whole blocks only
])
def test_stream_kernel_matches_fp64_reference(device: str, dtype: torch.dtype, K: int, N: int, bias: bool,
                                              ahead: int, const_w: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """One row times a column-major W with many column blocks takes the streaming kernel (every program walking
    several blocks, the last ones past N masked) and matches the float64 product; row-major W and several rows
    take the GEMV's tiles instead."""
    monkeypatch.setattr(gemv_module, "STREAM_MIN_BLOCKS", 2)
    monkeypatch.setattr(gemv_module, "rule_processors", lambda t: 2)  # 8 programs: the small N has enough blocks
    monkeypatch.setattr(gemv_module, "STREAM_AHEAD", ahead)
    monkeypatch.setattr(gemv_module, "STREAM_TILE", 2048)
    launches = _stream_spy(monkeypatch)
    w = rand(K, N, dtype=dtype, device=device, seed=2) * 0.1
    b = rand(N, dtype=dtype, device=device, seed=3) if bias else None
    a = rand(1, K, dtype=dtype, device=device, seed=1)
    y = gemv(a, _stored(w, "cols"), b, const_w=const_w)
    assert_close(y, _reference(a, w, b), dtype)
    (grid, block_n, block_k, got_ahead), = launches
    assert block_k == 1 << (K - 1).bit_length() and block_n * block_k == 2048 and got_ahead == ahead
    assert -(-N // block_n) >= 2 * grid[0]  # every program walks two blocks or more
    assert_close(gemv(a, w, b), _reference(a, w, b), dtype)  # row-major: the GEMV
    two = rand(2, K, dtype=dtype, device=device, seed=4)
    assert_close(gemv(two, _stored(w, "cols"), b), _reference(two, w, b), dtype)
    monkeypatch.setattr(gemv_module, "STREAM", False)
    assert_close(gemv(a, _stored(w, "cols"), b), _reference(a, w, b), dtype)
    assert len(launches) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only: routes CPU tensors to the kernel")
def test_vocabulary_products_take_the_stream_at_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past GEMV_MAX_WEIGHT (a vocabulary product), one row of a column-major weight with K <= GEMV_STREAM_MAX_K runs
    the GEMV (its streaming kernel) and such weights are stored column-major; row-major weights, two rows, a longer
    K and GEMV_STREAM off keep the vendor GEMM (bit for bit torch.matmul)."""
    monkeypatch.setattr(matmul_module, "GEMV_DEVICES", ("cpu",))
    monkeypatch.setattr(gemv_module, "STREAM_MIN_BLOCKS", 2)
    monkeypatch.setattr(gemv_module, "rule_processors", lambda t: 2)
    launches = _stream_spy(monkeypatch)
    K, N = 256, 3000
    monkeypatch.setattr(matmul_module, "GEMV_MAX_WEIGHT", K * N)
    w = rand(K, N, dtype=torch.float16, seed=2) * 0.1
    cols = _stored(w, "cols")
    one, two = rand(1, K, dtype=torch.float16, seed=1), rand(2, K, dtype=torch.float16, seed=1)
    cpu = torch.device("cpu")
    assert matmul_module.column_major_weight("", "MatMul", w, cpu, {}, False)
    assert gemv_eligible(one, cols) and not gemv_eligible(one, w) and not gemv_eligible(two, cols)
    assert_close(matmul_op(one, cols), _reference(one, w), torch.float16)
    assert len(launches) == 1
    assert torch.equal(matmul_op(two, cols), torch.matmul(two, cols))
    monkeypatch.setattr(matmul_module, "GEMV_STREAM_MAX_K", K - 1)
    assert not gemv_eligible(one, cols) and not matmul_module.column_major_weight("", "MatMul", w, cpu, {}, False)
    monkeypatch.setattr(matmul_module, "GEMV_STREAM_MAX_K", K)
    monkeypatch.setattr(matmul_module, "GEMV_STREAM", False)
    assert not gemv_eligible(one, cols) and not matmul_module.column_major_weight("", "MatMul", w, cpu, {}, False)
    assert torch.equal(matmul_op(one, cols), torch.matmul(one, cols))
    assert len(launches) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only: routes CPU tensors to the kernel")
def test_session_marks_constant_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a session, a MatMul whose weight is an initializer launches with const_w (its tiles may be read
    before the previous kernel ends); one whose weight is a graph input, or an initializer a feed may
    override, does not."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import crossml
    import crossml.kernels.gemv as kernel

    monkeypatch.setattr(matmul_module, "GEMV_DEVICES", ("cpu",))
    flags = []
    original = kernel.gemv
    monkeypatch.setattr(kernel, "gemv", lambda *a, **kw: flags.append(kw["const_w"]) or original(*a, **kw,
                                                                                              tiles=(1, 256, 32, 1, 4)))
    K = N = 256
    rng = np.random.default_rng(0)
    w, v = (rng.standard_normal((K, N)).astype(np.float16) * np.float16(0.05) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y1"]), helper.make_node("MatMul", ["x", "z"], ["y2"]),
         helper.make_node("MatMul", ["x", "v"], ["y3"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, K]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT16, [K, N]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT16, [K, N])],  # v: an overridable initializer
        [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [1, N]) for n in ("y1", "y2", "y3")],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = crossml.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, K)).astype(np.float16)
    y1, y2, y3 = sess.run(None, {"x": x, "z": w})
    assert sorted(flags) == [False, False, True], flags
    ref = _reference(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    np.testing.assert_allclose(y1.astype(np.float64), ref, rtol=1e-2, atol=1e-2)
    assert np.array_equal(y1, y2)
    assert onnx.checker.check_model(model) is None


# --- the matrix-unit kernel (2 to 16 rows: a batched decode step, beam search) ---

DOT_CASES = [  # M, K, N, bias, silu_mul, interpreter tiles (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps)
    (2, 64, 24, False, False, (16, 32, 16, 1, 4)),  # one N tile wider than N, several K steps
    (4, 96, 130, True, True, (16, 64, 32, 1, 4)),  # partial N tile, gated activations
    (3, 320, 40, True, False, (16, 16, 32, 3, 4)),  # split K: 3 ranges, the last one partial
    (20, 96, 48, False, True, (16, 16, 64, 2, 4)),  # two row tiles, split K with a partial last step
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", DOT_CASES, ids=lambda c: "M{}_K{}_N{}{}{}_split{}".format(
    *c[:3], "_bias" if c[3] else "", "_silu" if c[4] else "", c[5][3]))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_dot_kernel_matches_fp64_reference(device: str, dtype: torch.dtype, case: tuple, layout: str) -> None:
    """The matrix-unit kernel (tiles with BLOCK_M >= 16 ask for it; the GPU's rule from 2 fp16 / bf16 rows) against
    the fp64 product, gated activations rounded to a's dtype first as the SiluMul op stores them; fp32 in IEEE
    float32."""
    M, K, N, with_bias, silu, tiles = case
    a = rand(M, 2 * K if silu else K, dtype=dtype, device=device, seed=1)
    w = rand(K, N, dtype=dtype, device=device, seed=2) * 0.1
    bias = rand(N, dtype=dtype, device=device, seed=3) if with_bias else None
    dot_tiles = tiles if device == "cpu" else pick_dot_tiles(M, K, N, a.element_size(), 132)
    y = gemv(a, _stored(w, layout), bias, tiles=dot_tiles, silu_mul=silu)
    x = _gated(a, K) if silu else a
    assert y.shape == (M, N)
    assert_close(y, _reference(x, w, bias), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_dot_kernel_skip_norm_const_w_and_replays(device: str, layout: str) -> None:
    """gemv_skip_norm on the matrix-unit kernel's partial sums: the reference's normed output and sum; const_w and a
    second call change nothing, bit for bit."""
    M, K, N = 4, 320, 48
    tiles = (16, 16, 32, 3, 4) if device == "cpu" else None
    a = rand(M, K, dtype=torch.float16, device=device, seed=1)
    w = _stored(rand(K, N, dtype=torch.float16, device=device, seed=2) * 0.1, layout)
    bias, res = rand(N, dtype=torch.float16, device=device, seed=3), rand(M, N, dtype=torch.float16, device=device)
    gamma = rand(N, dtype=torch.float16, device=device, seed=4)
    normed, total = gemv_skip_norm(a, w, bias, res, gamma, 1e-5, tiles=tiles)
    want_n, want_s = _skip_norm_reference(a, w, bias, res, gamma, 1e-5, torch.float16)
    assert_close(total, want_s, torch.float16)
    assert_close(normed, want_n, torch.float16)
    again = gemv_skip_norm(a, w, bias, res, gamma, 1e-5, tiles=tiles, const_w=True)
    assert torch.equal(again[0], normed) and torch.equal(again[1], total)


@pytest.mark.parametrize("device", DEVICES)
def test_dot_kernel_routing_and_errors(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without tiles, DOT_MIN_M or more fp16 / bf16 rows take the matrix-unit rule, fewer rows and fp32 the GEMV's;
    malformed matrix-unit tiles are refused with the rule."""
    picked = []
    for name in ("pick_tiles", "pick_dot_tiles"):
        real = getattr(gemv_module, name)
        monkeypatch.setattr(gemv_module, name, lambda *a, _r=real, _n=name, **kw: picked.append(_n) or _r(*a, **kw))
    K, N = 64, 32
    w = rand(K, N, dtype=torch.float16, device=device, seed=2)
    for M, dtype, want in [(gemv_module.DOT_MIN_M - 1, torch.float16, "pick_tiles"),
                           (gemv_module.DOT_MIN_M, torch.float16, "pick_dot_tiles"),
                           (4, torch.bfloat16, "pick_dot_tiles"), (4, torch.float32, "pick_tiles")]:
        picked.clear()
        a = rand(M, K, dtype=dtype, device=device, seed=M)
        y = gemv(a, w.to(dtype))
        assert picked == [want], (M, dtype)
        assert_close(y, _reference(a, w.to(dtype)), dtype)
    a = rand(4, K, dtype=torch.float16, device=device)
    for bad in [(16, 8, 32, 1, 4), (16, 32, 8, 1, 4), (24, 32, 32, 1, 4), (16, 32, 32, MAX_SPLIT_K + 1, 4)]:
        with pytest.raises(ValueError, match="matrix-unit kernel"):
            gemv(a, w, tiles=bad)


def test_dot_tiles_for_decode_shapes() -> None:
    """The matrix-unit rule on a 132-SM GPU at the decode shapes: 64 x 64 tiles (128 columns for Llama-3.2-1B's
    gate+up), about four programs per SM where the column tiles are fewer, 16-row tiles up to 16 rows."""
    for K, N in [(896, 1152), (896, 896), (896, 9728), (4864, 896), (2048, 3072), (2048, 16384), (8192, 2048)]:
        for M in (2, 4, 16):
            bm, bn, bk, split, warps = pick_dot_tiles(M, K, N, 2, 132, colmajor=True)
            assert (bm, bn, bk, warps) == (16, 128 if N >= 96 * 132 else 64, 64, 4) and 1 <= split <= MAX_SPLIT_K
            n_prog = -(-N // bn)
            # (whole steps per split: Llama's down projection, 32 column tiles, gets 16 splits of 8 steps, not 17)
            assert split == 1 if n_prog >= 4 * 132 else n_prog * split >= min(3 * 132, n_prog * (K // bk))
    assert pick_dot_tiles(4, 4864, 896, 2, 132)[3] == 38
    assert pick_dot_tiles(40, 896, 896, 2, 132)[0] == 64


def test_skip_norm_dot_tiles_keep_a_row_in_one_norm_tile() -> None:
    """gemv_skip_norm's matrix-unit tiles split K no further than keeps a row's partial sums one tile of the norm
    kernel (its chunked path is two latency-bound passes per row), at the decode shapes of both models."""
    from crossml.kernels.gemv import _NORM_TILE, _norm_dot_tiles, _reduce_tiles

    for K, N in [(4864, 896), (896, 896), (8192, 2048), (2048, 2048)]:
        for M in (2, 4, 16):
            bm, bn, bk, split, _ = _norm_dot_tiles(M, K, N, 2, 132)
            assert bm == 16 and bn in (32, 64) and split >= 1
            assert _reduce_tiles(split)[0] * 1 << (N - 1).bit_length() <= _NORM_TILE
    assert _norm_dot_tiles(4, 4864, 896, 2, 132) == (16, 32, 64, 16, 4)


def test_importing_crossml_does_not_import_triton() -> None:
    code = "import sys, crossml, crossml.ops.matmul, crossml.ops.fused; assert 'triton' not in sys.modules"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# --- GPU: compiled kernel at decode shapes, through the ops' fast path, and under graph capture ---

DECODE_SHAPES = [(896, 1152), (896, 896), (896, 4864), (4864, 896), (896, 151936)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("K", "N"), DECODE_SHAPES)
@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_decode_shapes(dtype: torch.dtype, K: int, N: int, M: int, layout: str) -> None:
    a = rand(M, 1, K, dtype=dtype, device="cuda", seed=1)
    w = _stored(rand(K, N, dtype=dtype, device="cuda", seed=2) * 0.05, layout)
    bias = rand(N, dtype=dtype, device="cuda", seed=3)
    rtol, atol = TOL[dtype]
    assert_close(gemv(a, w), _reference(a, w), dtype, tol=(rtol * 2, atol * 4))
    assert_close(gemv(a, w, bias), _reference(a, w, bias), dtype, tol=(rtol * 2, atol * 4))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 4, 8, 16, 17])
def test_gpu_ops_fast_path(M: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """MatMul and Linear on CUDA (kernel for M <= GEMV_MAX_M = 16, torch above) against torch's result."""
    monkeypatch.setattr(matmul_module, "GEMV_DEVICES", ("cuda",))
    K, N = 896, 1152
    a = rand(M, K, dtype=torch.float16, device="cuda", seed=1)
    w = rand(K, N, dtype=torch.float16, device="cuda", seed=2) * 0.05
    b = rand(N, dtype=torch.float16, device="cuda", seed=3)
    assert gemv_eligible(a, w, b) == (M <= 16)
    torch.testing.assert_close(matmul_op(a, w), torch.matmul(a, w), rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(linear_op(a, w, b), torch.nn.functional.linear(a, w.t(), b), rtol=1e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(("K", "N"), [(4864, 896), (896, 9728)])  # split K (2 launches), one launch
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_graph_capture(K: int, N: int, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matmul_module, "GEMV_DEVICES", ("cuda",))
    a = rand(1, 1, K, dtype=torch.float16, device="cuda", seed=1)
    w = _stored(rand(K, N, dtype=torch.float16, device="cuda", seed=2) * 0.05, layout)
    b = rand(N, dtype=torch.float16, device="cuda", seed=3)
    assert gemv_eligible(a, w, b)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compiles) outside the capture
        y0, z0 = matmul_op(a, w), linear_op(a, w, b)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, z = matmul_op(a, w), linear_op(a, w, b)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, y0) and torch.equal(z, z0)
    a.copy_(rand(1, 1, K, dtype=torch.float16, device="cuda", seed=7))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, gemv(a, w)) and torch.equal(z, gemv(a, w, b))
    assert not torch.equal(y, y0)


def _skip_norm_reference(a, w, bias, residual, gamma, eps, dtype):
    """(normed, sum) in float64 from the product rounded to ``dtype`` (the unfused MatMul's output)."""
    s = residual.double().cpu() + _reference(a, w, bias).to(dtype).double()
    normed = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + eps) * gamma.double().cpu()
    return normed, s


NORM_CASES = [  # M, K, N, bias, interpreter tiles (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps)
    (1, 96, 130, False, (1, 64, 32, 2, 4)),  # split K, partial N tile
    (3, 64, 256, True, (2, 128, 16, 1, 4)),  # K not split: a one-slice workspace; bias; rows past M masked
    (1, 1024, 130, True, (1, 128, 16, 64, 4)),  # 64 splits: the row's partial sums in one [64, 256] tile
    (1, 1024, 300, False, (1, 128, 16, 64, 4)),  # 64 splits, too many for one tile: the row walked in 64-column chunks
    (2, 2500, 24, True, (2, 8, 1024, 2, 8)),  # a short down projection's tiles: 2 splits of 2 steps and 1 partial step
    (1, 70, 1, False, (1, 16, 16, 3, 4)),  # one column (one-valued sizes are constants to the GPU compiler)
    (16, 256, 320, True, (16, 64, 32, 2, 4)),  # 16 rows (a batched decode step) on the matrix-unit kernel
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", NORM_CASES, ids=lambda c: "M{}_K{}_N{}{}_split{}".format(*c[:3], "_bias" if c[3] else "",
                                                                                         c[4][3]))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_skip_norm_matches_reference_and_the_unfused_kernels(device: str, dtype: torch.dtype, case: tuple,
                                                             layout: str) -> None:
    """gemv_skip_norm against float64 and against the two kernels it replaces (gemv, then the RMSNorm
    kernel on the rounded product): the same sum bit for bit, the normalized values within an ulp (the
    sum of squares is added in another order)."""
    from crossml.kernels.gemv import gemv_skip_norm
    from crossml.kernels.rmsnorm import skip_rms_norm

    M, K, N, with_bias, tiles = case
    a = rand(M, K, dtype=dtype, device=device, seed=1)
    w = _stored(rand(K, N, dtype=dtype, device=device, seed=2) * 0.1, layout)
    bias = rand(N, dtype=dtype, device=device, seed=3) if with_bias else None
    residual = rand(M, N, dtype=dtype, device=device, seed=4)
    gamma = rand(N, dtype=dtype, device=device, seed=5)
    tiles = tiles if device == "cpu" else None
    normed, total = gemv_skip_norm(a, w, bias, residual, gamma, 1e-6, tiles=tiles)
    ref_normed, ref_sum = _skip_norm_reference(a, w, bias, residual, gamma, 1e-6, dtype)
    assert normed.dtype == dtype and normed.shape == (M, N) and total.shape == (M, N)
    assert_close(normed, ref_normed, dtype)
    assert_close(total, ref_sum, dtype)
    if not (device == "cpu" and dtype == torch.bfloat16):  # the interpreter's gemv truncates its bf16 output
        y, _, s = skip_rms_norm(residual, gemv(a, w, bias, tiles=tiles), gamma, None, 1e-6, store_inv=False)
        assert torch.equal(total, s)
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(normed.float(), y.float(), rtol=eps, atol=eps)
    alone, none = gemv_skip_norm(a, w, bias, residual, gamma, 1e-6, want_sum=False, tiles=tiles, const_w=True)
    assert none is None and torch.equal(alone, normed)


@pytest.mark.parametrize("device", DEVICES)
def test_skip_norm_leading_dims_empty_and_zero_k(device: str) -> None:
    from crossml.kernels.gemv import gemv_skip_norm

    dtype = torch.float16
    a = rand(2, 1, 64, dtype=dtype, device=device, seed=1)
    w = rand(64, 40, dtype=dtype, device=device, seed=2) * 0.1
    residual, gamma = rand(2, 1, 40, dtype=dtype, device=device, seed=3), rand(40, dtype=dtype, device=device, seed=4)
    normed, total = gemv_skip_norm(a, w, None, residual, gamma, 1e-5)
    ref_normed, ref_sum = _skip_norm_reference(a, w, None, residual, gamma, 1e-5, dtype)
    assert normed.shape == (2, 1, 40)
    assert_close(normed, ref_normed, dtype)
    assert_close(total, ref_sum, dtype)
    # K == 0: the product is the bias alone
    bias = rand(40, dtype=dtype, device=device, seed=5)
    normed, total = gemv_skip_norm(rand(2, 0, dtype=dtype, device=device), rand(0, 40, dtype=dtype, device=device),
                                   bias, residual[:, 0], gamma, 1e-5)
    assert torch.equal(total.cpu(), (residual[:, 0].float() + bias.float()).half().cpu())
    normed, total = gemv_skip_norm(rand(0, 64, dtype=dtype, device=device), w, None,
                                   rand(0, 40, dtype=dtype, device=device), gamma, 1e-5)
    assert normed.shape == total.shape == (0, 40)


@pytest.mark.parametrize("device", DEVICES)
def test_skip_norm_errors_name_the_problem(device: str) -> None:
    from crossml.kernels.gemv import gemv_skip_norm

    a, w = rand(1, 64, device=device), rand(64, 32, device=device)
    gamma = rand(32, device=device)
    with pytest.raises(ValueError, match=r"residual must be a torch.float32 tensor of the product's shape \(1, 32\)"):
        gemv_skip_norm(a, w, None, rand(1, 31, device=device), gamma, 1e-5)
    with pytest.raises(ValueError, match="residual"):
        gemv_skip_norm(a, w, None, rand(1, 32, device=device).half(), gamma, 1e-5)
    with pytest.raises(ValueError, match="gamma must be N=32"):
        gemv_skip_norm(a, w, None, rand(1, 32, device=device), rand(33, device=device), 1e-5)
    with pytest.raises(ValueError, match="K=64"):
        gemv_skip_norm(a[:, :32], w, None, rand(1, 32, device=device), gamma, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[5]], ids=lambda c: "M{}_K{}_N{}_split{}".format(*c[:3], c[4][3]))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_silu_mul_activations_equal_the_silu_mul_kernel_then_gemv(device: str, dtype: torch.dtype, case: tuple,
                                                                  layout: str) -> None:
    """silu_mul=True computes SiluMul's output as it loads the activations: bit for bit the SiluMul kernel's
    output fed to the plain GEMV (with and without the skip-norm epilogue), on rows of [g | up]."""
    from crossml.kernels.gemv import gemv_skip_norm
    from crossml.kernels.swiglu import silu_mul_packed

    M, K, N, with_bias, tiles = case
    gu = rand(M, 2 * K, dtype=dtype, device=device, seed=1)
    w = _stored(rand(K, N, dtype=dtype, device=device, seed=2) * 0.1, layout)
    bias = rand(N, dtype=dtype, device=device, seed=3) if with_bias else None
    tiles = tiles if device == "cpu" else None
    h = silu_mul_packed(gu)
    y = gemv(gu, w, bias, tiles=tiles, silu_mul=True)
    assert torch.equal(y, gemv(h, w, bias, tiles=tiles))
    assert_close(y, _reference(h, w, bias), dtype)
    residual, gamma = rand(M, N, dtype=dtype, device=device, seed=4), rand(N, dtype=dtype, device=device, seed=5)
    got = gemv_skip_norm(gu, w, bias, residual, gamma, 1e-6, tiles=tiles, silu_mul=True)
    want = gemv_skip_norm(h, w, bias, residual, gamma, 1e-6, tiles=tiles)
    assert all(torch.equal(g_, w_) for g_, w_ in zip(got, want, strict=True))
    with pytest.raises(ValueError, match=rf"2K={2 * K} \(\[g \| up\] for silu_mul\)"):
        gemv(h, w, silu_mul=True)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("silu", [False, True])
def test_gpu_dot_kernel_graph_capture(layout: str, silu: bool) -> None:
    """The matrix-unit kernel at 4 rows with its K split (Qwen2.5-0.5B's down projection) inside a CUDA graph, with
    the skip-norm: replays follow the input and equal the eager calls bit for bit."""
    K, N, M = 4864, 896, 4
    a = rand(M, 2 * K if silu else K, dtype=torch.float16, device="cuda", seed=1)
    w = _stored(rand(K, N, dtype=torch.float16, device="cuda", seed=2) * 0.05, layout)
    res, gamma = rand(M, N, dtype=torch.float16, device="cuda", seed=3), rand(N, dtype=torch.float16, device="cuda")
    assert pick_dot_tiles(M, K, N, 2, 132)[3] > 1
    y0 = gemv(a, w, silu_mul=silu, const_w=True)
    gemv_skip_norm(a, w, None, res, gamma, 1e-5, silu_mul=silu, const_w=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gemv(a, w, silu_mul=silu, const_w=True)
        normed, total = gemv_skip_norm(a, w, None, res, gamma, 1e-5, silu_mul=silu, const_w=True)
    a.copy_(rand(*a.shape, dtype=torch.float16, device="cuda", seed=7))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, gemv(a, w, silu_mul=silu, const_w=True)) and not torch.equal(y, y0)
    again = gemv_skip_norm(a, w, None, res, gamma, 1e-5, silu_mul=silu, const_w=True)
    assert torch.equal(normed, again[0]) and torch.equal(total, again[1])


# --- the Gluon kernel for 2 to 16 rows of fp16 / bf16 with column-major W (crossml.kernels.gemv_mma) ---

MMA_CASES = [  # M, K, N, bias, silu_mul, tiles (16, BLOCK_N, 128, SPLIT_K, warps) or None (the rule)
    (2, 256, 24, False, False, None),  # N narrower than one tile
    (4, 384, 130, True, True, (16, 64, 128, 1, 2)),  # a partial N tile, gated activations, bias, one launch
    (16, 1024, 200, True, False, (16, 32, 128, 3, 1)),  # K split 3 / 3 / 2 steps, bias in the reduction
    (7, 896, 1152, False, True, (16, 128, 128, 1, 4)),
    (1, 512, 64, True, False, (16, 64, 128, 2, 2)),  # one row, forced
    (9, 4864, 896, False, True, None),  # Qwen2.5-0.5B's down projection at the rule's tiles
    (16, 2048, 3072, True, False, None),  # Llama-3.2-1B's qkv
]


def _mma_reference(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    return _reference(_gated(a, w.shape[0]) if silu else a, w, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", MMA_CASES, ids=lambda c: "M{}_K{}_N{}{}{}_{}".format(
    *c[:3], "_bias" if c[3] else "", "_silu" if c[4] else "", "rule" if c[5] is None else "x".join(map(str, c[5]))))
def test_gpu_mma_kernel_matches_fp64_reference(dtype: torch.dtype, case: tuple,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The Gluon kernel against the fp64 product of the same values (gated activations rounded to a's dtype first,
    as the SiluMul op stores them; gated in a launch of their own and in the kernel's loads), and the ``tl.dot``
    kernel's result within the rounding of its other summation order."""
    M, K, N, with_bias, silu, tiles = case
    a = rand(M, 2 * K if silu else K, dtype=dtype, device="cuda", seed=1)
    w = _stored(rand(K, N, dtype=dtype, device="cuda", seed=2) * 0.05, "cols")
    bias = rand(N, dtype=dtype, device="cuda", seed=3) if with_bias else None
    rtol, atol = TOL[dtype]
    for gate_first in [True, False] if silu else [True]:
        monkeypatch.setattr(gemv_module, "MMA_GATE_FIRST", gate_first)
        y = gemv(a, w, bias, tiles=tiles, silu_mul=silu, mma=True, const_w=True)
        assert y.shape == (M, N) and y.dtype == dtype
        assert_close(y, _mma_reference(a, w, bias, silu), dtype, tol=(rtol * 2, atol * 4))
        assert_close(y, gemv(a, w, bias, silu_mul=silu, mma=False).double().cpu(), dtype, tol=(rtol * 2, atol * 4))


@pytest.mark.gpu
def test_gpu_mma_kernel_picks_single_weights_exactly() -> None:
    """One-hot rows of a pick single rows of W: each K position of each 128-value step (sixteen a call, K split and
    not) comes back as the stored weight bit for bit, so the permuted K order pairs each weight with its own
    activation."""
    K, N = 1024, 72
    w = _stored(rand(K, N, dtype=torch.float16, device="cuda", seed=2), "cols")
    for tiles in [(16, 64, 128, 1, 2), (16, 32, 128, 4, 1)]:
        for k0 in range(0, K, 16):
            a = torch.zeros(16, K, dtype=torch.float16, device="cuda")
            a[torch.arange(16), k0 + torch.arange(16)] = 1.0
            y = gemv(a, w, tiles=tiles, mma=True)
            assert torch.equal(y, w[k0:k0 + 16]), (tiles, k0)


@pytest.mark.gpu
@pytest.mark.parametrize("silu", [False, "first", "inline"])
def test_gpu_mma_kernel_skip_norm_graph_and_const_w(silu: bool | str, monkeypatch: pytest.MonkeyPatch) -> None:
    """gemv_skip_norm on the Gluon kernel's partial sums (the rule's tiles, K split): the reference's normed output
    and sum; const_w and replays of a CUDA graph equal the eager calls bit for bit."""
    monkeypatch.setattr(gemv_module, "MMA_MIN_WEIGHT", 0)  # Qwen2.5-0.5B's down projection takes the kernel
    monkeypatch.setattr(gemv_module, "MMA_GATE_FIRST", silu == "first")
    silu = bool(silu)
    K, N, M = 4864, 896, 4
    a = rand(M, 2 * K if silu else K, dtype=torch.float16, device="cuda", seed=1)
    w = _stored(rand(K, N, dtype=torch.float16, device="cuda", seed=2) * 0.05, "cols")
    bias = rand(N, dtype=torch.float16, device="cuda", seed=3)
    res, gamma = rand(M, N, dtype=torch.float16, device="cuda", seed=4), rand(N, dtype=torch.float16, device="cuda")
    assert gemv_module.mma_eligible(a, w, M)
    normed, total = gemv_skip_norm(a, w, bias, res, gamma, 1e-5, silu_mul=silu)
    x = _gated(a, K) if silu else a
    want_n, want_s = _skip_norm_reference(x, w, bias, res, gamma, 1e-5, torch.float16)
    assert_close(total, want_s, torch.float16)
    assert_close(normed, want_n, torch.float16)
    again = gemv_skip_norm(a, w, bias, res, gamma, 1e-5, silu_mul=silu, const_w=True)
    assert torch.equal(again[0], normed) and torch.equal(again[1], total)
    y0 = gemv(a, w, bias, silu_mul=silu, const_w=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gemv(a, w, bias, silu_mul=silu, const_w=True)
        g_normed, g_total = gemv_skip_norm(a, w, bias, res, gamma, 1e-5, silu_mul=silu, const_w=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, y0) and torch.equal(g_normed, normed) and torch.equal(g_total, total)
    a.copy_(rand(*a.shape, dtype=torch.float16, device="cuda", seed=7))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, gemv(a, w, bias, silu_mul=silu)) and not torch.equal(y, y0)


@pytest.mark.gpu
def test_gpu_mma_kernel_routing_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without tiles, 2 to 16 fp16 / bf16 rows with a column-major W of MMA_MIN_WEIGHT values or more and K a multiple
    of 128 take the Gluon kernel; one row, a row-major W, K off the step, fp32, a smaller weight or MMA_MAX_M = 0
    keep the others. The ops take such batched weights past their batched limit only when N <= K (a down
    projection). Forcing the kernel where it does not apply, or malformed tiles, are refused naming what it
    takes."""
    taken = []
    real = gemv_module._mma_product
    monkeypatch.setattr(gemv_module, "_mma_product", lambda *a, **kw: taken.append(1) or real(*a, **kw))
    monkeypatch.setattr(matmul_module, "GEMV_DEVICES", ("cuda",))
    down = _stored(rand(8192, 2048, dtype=torch.float16, device="cuda", seed=5) * 0.02, "cols")
    a4 = rand(4, 8192, dtype=torch.float16, device="cuda", seed=6)
    assert gemv_module.MMA_MIN_WEIGHT <= 8192 * 2048 and gemv_module.mma_eligible(a4, down, 4)
    assert gemv_eligible(a4, down)  # past GEMV_BATCHED_MAX_WEIGHT, N <= K: the Gluon kernel
    assert not gemv_eligible(rand(4, 2048, dtype=torch.float16, device="cuda"), down.t())  # wide: cuBLAS
    assert_close(matmul_op(a4, down), _reference(a4, down), torch.float16, tol=(1e-2, 4e-2))
    assert taken
    taken.clear()
    small = _stored(rand(896, 1152, dtype=torch.float16, device="cuda", seed=5) * 0.05, "cols")
    gemv(rand(4, 896, dtype=torch.float16, device="cuda"), small)
    assert not taken  # below MMA_MIN_WEIGHT: the tl.dot kernel
    monkeypatch.setattr(gemv_module, "MMA_MIN_WEIGHT", 0)
    K, N = 256, 96
    w = rand(K, N, dtype=torch.float16, device="cuda", seed=2) * 0.05
    cols = _stored(w, "cols")
    for M, dtype, stored, want in [(1, torch.float16, cols, False), (2, torch.float16, cols, True),
                                   (16, torch.bfloat16, cols, True), (17, torch.float16, cols, False),
                                   (4, torch.float16, w, False), (4, torch.float32, cols, False)]:
        taken.clear()
        a = rand(M, K, dtype=dtype, device="cuda", seed=M)
        y = gemv(a, stored.to(dtype))
        assert bool(taken) == want, (M, dtype, stored.stride())
        assert_close(y, _reference(a, stored.to(dtype)), dtype, tol=(TOL[dtype][0] * 2, TOL[dtype][1] * 4))
    taken.clear()
    a = rand(4, K, dtype=torch.float16, device="cuda")
    gemv_skip_norm(a, cols, None, rand(4, N, dtype=torch.float16, device="cuda"),
                   rand(N, dtype=torch.float16, device="cuda"), 1e-5)
    assert taken
    monkeypatch.setattr(gemv_module, "MMA_MAX_M", 0)
    taken.clear()
    gemv(a, cols)
    assert not taken and not gemv_eligible(a4, down)
    with pytest.raises(ValueError, match="mma kernel.*column-major with K a multiple of 128"):
        gemv(rand(4, 320, dtype=torch.float16, device="cuda"), _stored(rand(320, N, device="cuda").half(), "cols"),
             mma=True)
    with pytest.raises(ValueError, match="mma kernel.*column-major"):
        gemv(a, w, mma=True)
    for bad in [(16, 64, 64, 1, 2), (32, 64, 128, 1, 2), (16, 48, 128, 1, 2), (16, 64, 128, MAX_SPLIT_K + 1, 2)]:
        with pytest.raises(ValueError, match="mma kernel"):
            gemv(a, cols, tiles=bad, mma=True)


@pytest.mark.skipif(not INTERPRET, reason="calls the kernel on CPU tensors, which needs Triton's interpreter "
                    "(TRITON_INTERPRET=1, set by this module where torch sees no GPU)")
def test_mma_kernel_is_never_taken_on_the_cpu() -> None:
    """On the CPU nothing is mma-eligible, and forcing the kernel names what it needs."""
    a = rand(4, 256, dtype=torch.float16)
    w = _stored(rand(256, 64, dtype=torch.float16), "cols")
    assert not gemv_module.mma_eligible(a, w, 4)
    with pytest.raises(ValueError, match="mma kernel.*NVIDIA GPU of compute capability 8.0"):
        gemv(a, w, mma=True)


def test_mma_tiles_for_decode_shapes() -> None:
    """The Gluon kernel's rule: 64 W rows at two warps, K split in whole 128-value steps (at most 64 ranges) to
    about SPLIT_PER_SM programs per SM; for the skip-norm's products at most the norm tile's splits."""
    assert gemv_module._mma_tiles(8, 896, 1152, 132, False) == (16, 64, 128, 7, 2)  # Qwen2.5-0.5B qkv: 7 steps
    assert gemv_module._mma_tiles(2, 4864, 896, 132, False) == (16, 64, 128, 38, 2)  # its down projection
    assert gemv_module._mma_tiles(2, 4864, 896, 132, True) == (16, 64, 128, 16, 2)  # ... feeding the skip-norm
    assert gemv_module._mma_tiles(16, 8192, 2048, 132, True) == (16, 64, 128, 8, 2)  # Llama-3.2-1B's down
    assert gemv_module._mma_tiles(4, 2048, 16384, 132, False) == (16, 64, 128, 3, 2)  # its gate+up


MMA_COMPILES = [(90, "fp16", {}), (90, "bf16", {"SILU_MUL": True}),
                (80, "fp16", {"PARTIAL": False, "HAS_BIAS": True, "BLOCK_N": 128, "WARPS": 4})]


def test_mma_kernel_compiles_to_register_operands() -> None:
    """Gluon kernels do not run in Triton's interpreter, so the CPU compiles the kernel ahead of time: nothing goes
    through shared memory, a and W load as 128-bit vectors, the products are mma instructions, and (the layout's
    point) the plain kernel's loop has no byte permutes: each loaded word is an operand register as it is. (In a
    process of its own: the interpreted tests' patches of Triton's language break compiling.)"""
    code = (
        "import json, os, sys\n"
        "sys.path.insert(0, 'benchmarks')\n"
        "from int4_mma import _loop_sass\n"
        "from crossml.kernels import gemv_mma\n"
        f"out = []\nfor arch, dtype, consts in {MMA_COMPILES!r}:\n"
        "    k = gemv_mma.compile_for(arch, dtype, **consts)\n"
        "    ptx = k.asm['ptx']\n"
        "    out.append([k.metadata.shared, 'ld.global.v4.b32' in ptx, 'mma.sync.aligned.m16n8k16' in ptx,\n"
        "                _loop_sass(k.asm['cubin'])[1].get('PRMT', 0) if not consts else 0])\n"
        "print(json.dumps(out))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[0, True, True, 0]] * len(MMA_COMPILES)


def _gated_product(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """SiluMul(a @ [Wg | Wu]): the fp64 product rounded to a's dtype (the MatMul's output), then gated as the SiluMul
    op stores it."""
    gu = _reference(a, w).to(a.dtype)
    return _gated(gu, w.shape[1] // 2)


GATE_OUT_CASES = [  # M, K, I, interpreter tiles of the [K, I] product: each path of gemv(silu_out=True)
    (1, 64, 24, (1, 16, 32, 1, 4)),  # per-row GEMV, gate in its epilogue, a partial N tile
    (1, 96, 40, (1, 16, 32, 3, 4)),  # K split: the [K, 2I] product's partial sums, gated by the reduction
    (3, 64, 24, (4, 32, 16, 1, 4)),  # 4-row blocks of the per-row GEMV: through the reduction too
    (4, 96, 40, (16, 16, 32, 1, 4)),  # matrix-unit kernel, gate in its epilogue
    (20, 96, 24, (16, 16, 32, 2, 4)),  # matrix-unit kernel, two row tiles, K split
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", GATE_OUT_CASES, ids=lambda c: "M{}_K{}_I{}_tiles{}x{}_split{}".format(
    *c[:3], c[3][0], c[3][1], c[3][3]))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_silu_out_matches_the_product_then_silu_mul(device: str, dtype: torch.dtype, case: tuple,
                                                    layout: str) -> None:
    """gemv(silu_out=True) of a merged [Wg | Wu] weight: the fp64 reference of the rounded product then SiluMul, and
    the plain GEMV's product gated by the SiluMul kernel (the interpreter: by torch), bit for bit in fp16 (and bf16
    compiled: the interpreter truncates float32 -> bfloat16 casts) where both add K in the same order (same tiles)."""
    M, K, half, tiles = case
    if device != "cpu":
        tiles = None if tiles[0] == 1 or M >= 2 else tiles
        if tiles is not None and tiles[0] < 16 and dtype != torch.float32:
            tiles = None
    elif (tiles[0] >= 16) != (M >= 2 and dtype != torch.float32):
        pytest.skip("the interpreter's tiles are the other kernel's for these rows and this dtype")
    a = rand(M, K, dtype=dtype, device=device, seed=1)
    w = _stored(rand(K, 2 * half, dtype=dtype, device=device, seed=2) * 0.1, layout)
    y = gemv(a, w, tiles=tiles, silu_out=True)
    assert y.shape == (M, half)
    assert_close(y, _gated_product(a, w).double(), dtype)
    if device == "cuda" or dtype != torch.bfloat16:  # the interpreter truncates float32 -> bfloat16 casts
        from crossml.kernels.swiglu import silu_mul_packed

        plain = gemv(a, w, tiles=None if tiles is None or tiles[3] > 1 or tiles[0] == 4 else
                     (tiles[0], tiles[1] * 2, *tiles[2:]))
        want = silu_mul_packed(plain) if device == "cuda" else _gated(plain, half)
        if tiles is not None and tiles[3] == 1 and tiles[0] != 4 and dtype != torch.float32:
            assert torch.equal(y, want)  # float32 keeps the sigmoids' last bits, which torch's and Triton's differ in
        else:
            assert_close(y, want.double().cpu(), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_silu_out_errors_empty_and_zero_k(device: str) -> None:
    a = rand(1, 64, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="even number of columns"):
        gemv(a, rand(64, 33, dtype=torch.float16, device=device), silu_out=True)
    with pytest.raises(ValueError, match="without a bias"):
        gemv(a, rand(64, 32, dtype=torch.float16, device=device), rand(32, dtype=torch.float16, device=device),
             silu_out=True)
    with pytest.raises(ValueError, match="not the Gluon kernel"):
        gemv(a, rand(64, 32, dtype=torch.float16, device=device), silu_out=True, mma=True)
    assert gemv(a[:0], rand(64, 32, dtype=torch.float16, device=device), silu_out=True).shape == (0, 16)
    zero = gemv(a[:, :0], torch.empty(0, 32, dtype=torch.float16, device=device), silu_out=True)
    assert zero.shape == (1, 16) and not zero.any()


@pytest.mark.gpu
@pytest.mark.parametrize(("K", "N"), [(896, 9728), (2048, 16384)])  # the GenAI benchmark models' gate/up weights
@pytest.mark.parametrize("M", [1, 2, 4, 8, 16])
def test_gpu_silu_out_at_decode_shapes_and_in_graphs(K: int, N: int, M: int) -> None:
    """The merged gate/up products of the benchmark models, column-major as GPU plans store them: the rounded
    product's SiluMul within fp16 rounding (bit for bit the plain GEMV's, gated by the SiluMul kernel, where one row's
    tiles add K alike), and a CUDA graph's replay of the same bits."""
    from crossml.kernels.swiglu import silu_mul_packed

    a = rand(M, K, dtype=torch.float16, device="cuda", seed=1)
    w = _stored(rand(K, N, dtype=torch.float16, device="cuda", seed=2) * 0.05, "cols")
    y = gemv(a, w, const_w=True, silu_out=True)
    assert_close(y, _gated_product(a, w).double(), torch.float16)
    assert_close(y, silu_mul_packed(gemv(a, w)).double().cpu(), torch.float16)
    out = torch.empty_like(y)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(gemv(a, w, const_w=True, silu_out=True))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, y)


def _norm_chain(x: torch.Tensor, res: torch.Tensor, weights: list, gamma: torch.Tensor) -> tuple:
    """A decode layer stack of one-row products: each layer's first product feeds the residual's skip-norm, whose
    normed row feeds the second product (const weights, so each GEMV requests its weights before its PDL wait)."""
    for w_norm, w_next in weights:
        normed, res = gemv_skip_norm(x, w_norm, None, res, gamma, 1e-5, const_w=True)
        x = gemv(normed, w_next, const_w=True)
    return x, res


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the early launch is a compiled launch")
def test_gpu_skip_norm_early_launch_keeps_the_chain_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """The skip-norm kernel lets the next product launch before its own PDL wait (NORM_EARLY, PDL 2 on sm90+): a
    chain of 24 layers, eager and replayed in a CUDA graph, equals the chain launched in the usual order bit for
    bit, so no kernel reads a row before the kernel that writes it has finished."""
    from crossml.kernels._launch import pdl

    t = torch.empty(1, device="cuda")
    if torch.cuda.get_device_capability()[0] >= 9 and pdl(t):
        assert pdl(t, early=True)["PDL"] == 2 and pdl(t)["PDL"] is True
    K, N = 896, 896
    weights = [(_stored(rand(K, N, dtype=torch.float16, device="cuda", seed=2 * i) * 0.05, "cols"),
                _stored(rand(N, K, dtype=torch.float16, device="cuda", seed=2 * i + 1) * 0.05, "cols"))
               for i in range(24)]
    gamma = rand(N, dtype=torch.float16, device="cuda", seed=99)
    x0, r0 = rand(1, K, dtype=torch.float16, device="cuda", seed=7), rand(1, N, dtype=torch.float16, device="cuda")
    monkeypatch.setattr(gemv_module, "NORM_EARLY", False)
    want = _norm_chain(x0, r0, weights, gamma)
    monkeypatch.setattr(gemv_module, "NORM_EARLY", True)
    got = _norm_chain(x0, r0, weights, gamma)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    x_in, r_in = x0.clone(), r0.clone()
    _norm_chain(x_in, r_in, weights, gamma)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _norm_chain(x_in, r_in, weights, gamma)
    for _ in range(20):
        graph.replay()
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])

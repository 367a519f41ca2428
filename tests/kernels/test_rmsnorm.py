"""The Triton RMSNorm kernels (crossml.kernels.rmsnorm) against the torch ops they replace on GPUs
(SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization in crossml.ops.contrib.norm), and
the ops' routing to them. CPU cases run in Triton's interpreter; ``gpu`` cases compile.

The reference is always the torch op on CPU tensors. Outputs of a half type agree within one ulp;
float32 outputs within a few (the sum of squares is reduced in another order); the residual sum,
computed in the same order and rounded once, is bit-identical.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels import rmsnorm  # noqa: E402
from crossml.kernels.rmsnorm import gather_rms_norm, rms_norm, skip_layer_norm, skip_rms_norm  # noqa: E402
from crossml.ops.contrib import norm  # noqa: E402
from crossml.ops.registry import OpContext  # noqa: E402
from tests.kernels._common import DEVICES, rand, record_calls  # noqa: E402

HALF_FLOATS = [torch.float32, torch.float16, torch.bfloat16]
EPS = 1e-6
#: every (dtype, hidden) pair once, rows 1 and 3 alternating: the interpreter takes ~20 ms a row
CASES = [(dt, h, (1, 3)[(i + j) % 2]) for i, dt in enumerate(HALF_FLOATS) for j, h in enumerate((64, 96, 896))]
#: CASES with and without bias (hidden 896 once per dtype)
SKIP_CASES = [(dt, h, rows, bias) for dt, h, rows in CASES for bias in (False, True) if h != 896 or bias != (rows == 3)]


def _ulps(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |got - ref| in units of the last place of ``ref`` (in ref's dtype)."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    fi = torch.finfo(ref.dtype)
    g, r = got.detach().cpu().double(), ref.detach().cpu().double()
    _, e = torch.frexp(r)
    ulp = (torch.ldexp(torch.ones_like(r), e - 1) * fi.eps).clamp(min=fi.tiny * fi.eps)
    return float(((g - r).abs() / ulp).max()) if r.numel() else 0.0


def _assert_ulps(got: torch.Tensor, ref: torch.Tensor) -> None:
    """One ulp for half types; float32 (outputs and inv_std) within 8: the reduction order differs, and a
    GPU's rsqrt is approximate (2 ulp on CUDA), the CPU reference's is not."""
    limit = 8.0 if ref.dtype == torch.float32 else 1.0
    assert _ulps(got, ref) <= limit, f"{_ulps(got, ref)} ulps apart"


def _ctx(wanted: tuple[bool, ...] = (True, True, True, True)) -> OpContext:
    return OpContext(node_name="n", op_type="SkipSimplifiedLayerNormalization", opset=1, num_outputs=len(wanted),
                     output_types=(None,) * len(wanted), outputs_wanted=wanted)


def _cpu(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.cpu()


@pytest.fixture
def loop_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows longer than 32 take the two-pass loop over 32-element blocks."""
    monkeypatch.setattr(rmsnorm, "_SINGLE_MAX", 32)
    monkeypatch.setattr(rmsnorm, "_LOOP_BLOCK", 32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "hidden", "rows"), CASES)
def test_rms_norm_matches_op(device: str, dtype: torch.dtype, hidden: int, rows: int) -> None:
    x = rand(rows, hidden, dtype=dtype, device=device, seed=1) * 3
    w = rand(hidden, dtype=dtype, device=device, seed=2)
    y, inv = rms_norm(x, w, EPS)
    ry, rinv = norm.simplified_layer_normalization(x.cpu(), w.cpu(), epsilon=EPS)
    assert y.device == x.device and y.dtype == ry.dtype and inv.shape == rinv.shape == (rows, 1)
    _assert_ulps(y, ry)
    _assert_ulps(inv, rinv)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("x_dtype", "w_dtype"), [(torch.float16, torch.float32), (torch.float32, torch.bfloat16)])
def test_rms_norm_mixed_types_and_shapes(device: str, x_dtype: torch.dtype, w_dtype: torch.dtype) -> None:
    """y takes the scale's type (the op's V); 3-D and 1-D inputs, a [1, H] scale."""
    for shape, w_shape in (((1, 2, 96), (96,)), ((96,), (96,)), ((2, 64), (1, 64))):
        x = rand(*shape, dtype=x_dtype, device=device, seed=3)
        w = rand(*w_shape, dtype=w_dtype, device=device, seed=4)
        y, inv = rms_norm(x, w, 1e-5)
        ry, rinv = norm.simplified_layer_normalization(x.cpu(), w.cpu())
        assert y.shape == ry.shape and inv.shape == rinv.shape
        _assert_ulps(y, ry)
        _assert_ulps(inv, rinv)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "hidden", "rows", "bias"), SKIP_CASES)
def test_skip_rms_norm_matches_op(device: str, dtype: torch.dtype, hidden: int, rows: int, bias: bool) -> None:
    lead = (rows,) if bias else (1, rows)  # a [B, S, H] input without bias
    x = rand(*lead, hidden, dtype=dtype, device=device, seed=1) * 2
    skip = rand(*lead, hidden, dtype=dtype, device=device, seed=2)
    w = rand(hidden, dtype=dtype, device=device, seed=3)
    b = rand(hidden, dtype=dtype, device=device, seed=4) if bias else None
    y, inv, s = skip_rms_norm(x, skip, w, b, EPS)
    ry, rmean, rinv, rs = norm.skip_simplified_layer_normalization(x.cpu(), skip.cpu(), w.cpu(), _cpu(b),
                                                                   epsilon=EPS, ctx=_ctx())
    assert rmean is None and y.device == x.device and inv.shape == rinv.shape == (*lead, 1)
    _assert_ulps(y, ry)
    _assert_ulps(inv, rinv)
    assert torch.equal(s.cpu(), rs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "x_shape", "skip_shape"), [
    (torch.float16, (2, 2, 96), (96,)),  # one skip row for every row
    (torch.bfloat16, (2, 2, 96), (2, 96)),  # [S, H] skip shared by the batch
    (torch.float32, (2, 2, 96), (1, 2, 96)),
    (torch.float16, (2, 2, 96), (2, 1, 96)),  # one skip row per batch entry
    (torch.bfloat16, (3, 96), (1, 96)),
])
def test_skip_rms_norm_broadcast_skip(device: str, dtype: torch.dtype, x_shape: tuple[int, ...],
                                      skip_shape: tuple[int, ...]) -> None:
    x = rand(*x_shape, dtype=dtype, device=device, seed=5)
    skip = rand(*skip_shape, dtype=dtype, device=device, seed=6)
    w = rand(1, 96, dtype=dtype, device=device, seed=7)
    b = rand(96, dtype=dtype, device=device, seed=8)
    y, inv, s = skip_rms_norm(x, skip, w, b, EPS)
    ry, _, rinv, rs = norm.skip_simplified_layer_normalization(x.cpu(), skip.cpu(), w.cpu(), b.cpu(),
                                                               epsilon=EPS, ctx=_ctx())
    _assert_ulps(y, ry)
    _assert_ulps(inv, rinv)
    assert torch.equal(s.cpu(), rs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "hidden"), [(torch.float32, 96), (torch.bfloat16, 64)])
def test_long_rows_loop_over_blocks(device: str, dtype: torch.dtype, hidden: int, loop_blocks: None) -> None:
    x = rand(2, hidden, dtype=dtype, device=device, seed=9)
    skip = rand(hidden, dtype=dtype, device=device, seed=10)
    w = rand(hidden, dtype=dtype, device=device, seed=11)
    assert not rmsnorm._tiling(hidden)[1]
    y, inv = rms_norm(x, w, EPS)
    ry, rinv = norm.simplified_layer_normalization(x.cpu(), w.cpu(), epsilon=EPS)
    _assert_ulps(y, ry)
    _assert_ulps(inv, rinv)
    y, inv, s = skip_rms_norm(x, skip, w, w, EPS)
    ry, _, rinv, rs = norm.skip_simplified_layer_normalization(x.cpu(), skip.cpu(), w.cpu(), w.cpu(), epsilon=EPS,
                                                               ctx=_ctx())
    _assert_ulps(y, ry)
    _assert_ulps(inv, rinv)
    assert torch.equal(s.cpu(), rs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "w_dtype", "hidden", "idx_dtype"), [
    (torch.float16, torch.float16, 96, torch.int64), (torch.bfloat16, torch.bfloat16, 64, torch.int32),
    (torch.float32, torch.float32, 896, torch.int64), (torch.float16, torch.float32, 64, torch.int32)])
def test_gather_rms_norm_matches_gather_then_op(device: str, dtype: torch.dtype, w_dtype: torch.dtype, hidden: int,
                                                idx_dtype: torch.dtype) -> None:
    """The rows, bit for bit the gathered ones; y and inv as the RMSNorm op of those rows. Indices of any shape,
    negative ones counted from the end."""
    table = rand(11, hidden, dtype=dtype, device=device, seed=12) * 2
    w = rand(hidden, dtype=w_dtype, device=device, seed=13)
    idx = torch.tensor([[3, -1, 0], [10, 7, -11]], dtype=idx_dtype)
    y, inv, rows = gather_rms_norm(table, idx.to(device), w, EPS)
    want_rows = table.cpu()[idx.long() % 11]
    assert rows.dtype == dtype and torch.equal(rows.cpu(), want_rows)
    ry, rinv = norm.simplified_layer_normalization(want_rows, w.cpu(), epsilon=EPS)
    assert y.shape == ry.shape == (2, 3, hidden) and inv.shape == rinv.shape == (2, 3, 1)
    _assert_ulps(y, ry)
    _assert_ulps(inv, rinv)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_rms_norm_edges(device: str, loop_blocks: None) -> None:
    """Indices outside [-V, V) give zero rows (y 0, inv rsqrt(eps)), as the Gather kernel; a table of strided
    rows (every other row of a bigger one) and rows longer than one block (loop_blocks); no rows output when not asked;
    no indices at all; a transposed table (a tied model's output projection weight, viewed)."""
    big = rand(14, 96, dtype=torch.float16, device=device, seed=14)
    table, w = big[::2], rand(96, dtype=torch.float16, device=device, seed=15)
    assert not rmsnorm._tiling(96)[1] and table.stride(0) == 192
    idx = torch.tensor([1, 7, -8, 6], device=device)
    y, inv, rows = gather_rms_norm(table, idx, w, EPS)
    assert torch.equal(rows[1:3].cpu(), torch.zeros(2, 96, dtype=torch.float16))
    assert torch.equal(y[1:3].cpu(), torch.zeros(2, 96, dtype=torch.float16))
    assert torch.equal(rows[[0, 3]].cpu(), table.cpu()[[1, 6]])
    ry, rinv = norm.simplified_layer_normalization(table.cpu()[[1, 6]], w.cpu(), epsilon=EPS)
    _assert_ulps(y[[0, 3]], ry)
    _assert_ulps(inv[[0, 3]], rinv)
    y2, _, none = gather_rms_norm(table, idx, w, EPS, store_rows=False)
    assert none is None and torch.equal(y2.cpu(), y.cpu())
    y, inv, rows = gather_rms_norm(table, idx[:0], w, EPS)
    assert y.shape == rows.shape == (0, 96) and inv.shape == (0, 1)
    lm_head = rand(96, 9, dtype=torch.float16, device=device, seed=16)  # [H, V]: the table is its transpose
    y, inv, rows = gather_rms_norm(lm_head.t(), idx[[0, 3]], w, EPS)
    assert torch.equal(rows.cpu(), lm_head.t().cpu()[[1, 6]])
    ry, rinv = norm.simplified_layer_normalization(lm_head.t().cpu()[[1, 6]], w.cpu(), epsilon=EPS)
    _assert_ulps(y, ry)
    _assert_ulps(inv, rinv)


def test_gather_rms_norm_errors_name_the_problem() -> None:
    w = rand(8)
    with pytest.raises(ValueError, match="the table must be 2-D"):
        gather_rms_norm(rand(4, 8, 1), torch.tensor([0]), w, EPS)
    with pytest.raises(ValueError, match="int32/int64"):
        gather_rms_norm(rand(4, 8), torch.tensor([0.0]), w, EPS)
    with pytest.raises(ValueError, match="not a vector of the hidden size 8"):
        gather_rms_norm(rand(4, 8), torch.tensor([0]), rand(9), EPS)


@pytest.mark.parametrize("device", DEVICES)
def test_outputs_left_out_and_empty(device: str) -> None:
    x = rand(2, 64, dtype=torch.float16, device=device)
    skip, w = rand(2, 64, dtype=torch.float16, device=device, seed=1), rand(64, dtype=torch.float16, device=device)
    y, inv, s = skip_rms_norm(x, skip, w, None, EPS, store_inv=False, store_sum=False)
    assert inv is None and s is None
    _assert_ulps(y, norm.skip_simplified_layer_normalization(x.cpu(), skip.cpu(), w.cpu(), epsilon=EPS,
                                                             ctx=_ctx((True,)))[0])
    y, inv = rms_norm(x[:0], w, EPS)
    assert y.shape == (0, 64) and inv.shape == (0, 1)
    y, inv, s = skip_rms_norm(x[:0], skip[:0], w, None, EPS)
    assert y.shape == s.shape == (0, 64) and inv.shape == (0, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_name_the_problem(device: str) -> None:
    x = rand(2, 64, device=device)
    with pytest.raises(ValueError, match="hidden size 64"):
        rms_norm(x, rand(32, device=device), EPS)
    with pytest.raises(TypeError, match="float64"):
        rms_norm(x.double(), rand(64, device=device).double(), EPS)
    with pytest.raises(ValueError, match="does not broadcast"):
        skip_rms_norm(x, rand(3, 64, device=device), rand(64, device=device), None, EPS)


# --- the ops' routing: kernels on Triton devices, torch elsewhere ---


def test_ops_use_torch_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("a CPU tensor reached the Triton kernel")

    monkeypatch.setattr(rmsnorm, "rms_norm", fail)
    monkeypatch.setattr(rmsnorm, "skip_rms_norm", fail)
    x, w = rand(2, 64), rand(64, seed=1)
    norm.simplified_layer_normalization(x, w)
    norm.skip_simplified_layer_normalization(x, rand(2, 64, seed=2), w, ctx=_ctx())


@pytest.fixture
def cpu_routes_to_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the ops send CPU tensors to the (interpreted) kernels, to test their routing without a GPU."""
    if not torch.cuda.is_available():
        monkeypatch.setattr(norm, "TRITON_DEVICES", ("cpu",))
        monkeypatch.setattr(norm, "_rmsnorm_kernels", lambda: rmsnorm)


def _both_paths(monkeypatch: pytest.MonkeyPatch, fn, *args: torch.Tensor | None, **kw) -> tuple[tuple, tuple, int]:
    """(op outputs on the device, op outputs on CPU copies, how many kernel calls the device run made)."""
    calls = record_calls(monkeypatch, rmsnorm, "rms_norm", "skip_rms_norm")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    got = fn(*(None if a is None else a.to(dev) for a in args), **kw)
    n = len(calls)
    monkeypatch.setattr(norm, "TRITON_DEVICES", ())
    return got, fn(*(_cpu(a) for a in args), **kw), n


def _same_outputs(got: tuple, ref: tuple) -> None:
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert (g is None) == (r is None)
        if r is not None:
            assert g.shape == r.shape and g.dtype == r.dtype
            _assert_ulps(g, r)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_simplified_op_routes_to_kernel(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch,
                                        cpu_routes_to_kernels: None) -> None:
    x, w = rand(1, 2, 96, dtype=dtype), rand(96, dtype=dtype, seed=1)
    got, ref, n = _both_paths(monkeypatch, norm.simplified_layer_normalization, x, w, epsilon=EPS)
    assert n == 1
    _same_outputs(got, ref)


@pytest.mark.parametrize("kwargs", [{"axis": 1}, {"stash_type": 0}])
def test_simplified_op_other_forms_use_torch(kwargs: dict, monkeypatch: pytest.MonkeyPatch,
                                            cpu_routes_to_kernels: None) -> None:
    x = rand(1, 2, 96)
    w = rand(*x.shape[kwargs.get("axis", -1):], seed=1)
    got, ref, n = _both_paths(monkeypatch, norm.simplified_layer_normalization, x, w, **kwargs)
    assert n == 0
    _same_outputs(got, ref)


@pytest.mark.parametrize("wanted", [(True,), (True, False, True, True), (True, True, False, True)])
@pytest.mark.parametrize("bias", [False, True])
def test_skip_op_routes_to_kernel(wanted: tuple[bool, ...], bias: bool, monkeypatch: pytest.MonkeyPatch,
                                  cpu_routes_to_kernels: None) -> None:
    x, skip = rand(2, 1, 64, dtype=torch.float16), rand(1, 64, dtype=torch.float16, seed=1)
    w, b = rand(64, dtype=torch.float16, seed=2), rand(64, dtype=torch.float16, seed=3) if bias else None
    got, ref, n = _both_paths(monkeypatch, norm.skip_simplified_layer_normalization, x, skip, w, b,
                              epsilon=EPS, ctx=_ctx(wanted))
    assert n == 1
    _same_outputs(got, ref)


def test_skip_op_falls_back_for_float64_and_odd_bias(monkeypatch: pytest.MonkeyPatch,
                                                     cpu_routes_to_kernels: None) -> None:
    x, skip, w = rand(3, 64, dtype=torch.float64), rand(3, 64, dtype=torch.float64, seed=1), rand(64, seed=2)
    got, ref, n = _both_paths(monkeypatch, norm.skip_simplified_layer_normalization, x, skip, w, ctx=_ctx())
    assert n == 0
    _same_outputs(got, ref)
    x, skip = x.float(), skip.float()
    got, ref, n = _both_paths(monkeypatch, norm.skip_simplified_layer_normalization, x, skip, w,
                              rand(3, 64, seed=3), ctx=_ctx())  # a per-row bias is no [H] vector
    assert n == 0
    _same_outputs(got, ref)


# --- GPU: compiled kernels at decode sizes, long rows, CUDA graph capture ---


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF_FLOATS)
@pytest.mark.parametrize("hidden", [896, 4096, 8192, 16384, 20000])
def test_gpu_decode_sizes(dtype: torch.dtype, hidden: int) -> None:
    x, skip = rand(4, hidden, dtype=dtype, device="cuda"), rand(4, hidden, dtype=dtype, device="cuda", seed=1)
    w = rand(hidden, dtype=dtype, device="cuda", seed=2)
    y, inv = rms_norm(x, w, EPS)
    ry, rinv = norm.simplified_layer_normalization(x.cpu(), w.cpu(), epsilon=EPS)
    _assert_ulps(y, ry)
    _assert_ulps(inv, rinv)
    y, inv, s = skip_rms_norm(x, skip, w, None, EPS)
    ry, _, rinv, rs = norm.skip_simplified_layer_normalization(x.cpu(), skip.cpu(), w.cpu(), epsilon=EPS,
                                                               ctx=_ctx())
    _assert_ulps(y, ry)
    _assert_ulps(inv, rinv)
    assert torch.equal(s.cpu(), rs)


@pytest.mark.gpu
def test_gpu_ops_capture_into_a_graph() -> None:
    x = rand(1, 1, 896, dtype=torch.float16, device="cuda")
    skip, w = rand(1, 1, 896, dtype=torch.float16, device="cuda", seed=1), rand(896, dtype=torch.float16,
                                                                                 device="cuda", seed=2)

    def step() -> tuple:
        y, _, _, s = norm.skip_simplified_layer_normalization(x, skip, w, epsilon=EPS, ctx=_ctx())
        return norm.simplified_layer_normalization(y, w, epsilon=EPS)[0], s

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, s = step()
    x.copy_(rand(1, 1, 896, dtype=torch.float16, device="cuda", seed=5))
    graph.replay()
    eager_out, eager_s = step()  # the same kernels run eagerly on the new input: bit-identical
    torch.cuda.synchronize()
    assert torch.equal(out, eager_out) and torch.equal(s, eager_s)
    rs = norm.skip_simplified_layer_normalization(x.cpu(), skip.cpu(), w.cpu(), epsilon=EPS, ctx=_ctx())[3]
    assert torch.equal(s.cpu(), rs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "hidden", "rows", "bias"), SKIP_CASES[::2])
def test_skip_layer_norm_matches_op(device: str, dtype: torch.dtype, hidden: int, rows: int, bias: bool) -> None:
    """LayerNorm of the float32 sum (centered, times gamma, plus beta) against SkipLayerNormalization's torch
    op; the sum is bit-identical, the outputs within an ulp or two of the output type."""
    x = rand(1, rows, hidden, dtype=dtype, device=device, seed=1) * 2 + 1
    skip = rand(rows, hidden, dtype=dtype, device=device, seed=2)
    gamma, beta = rand(hidden, dtype=dtype, device=device, seed=3), rand(hidden, dtype=dtype, device=device, seed=4)
    b = rand(hidden, dtype=dtype, device=device, seed=5) if bias else None
    y, inv, s = skip_layer_norm(x, skip, gamma, beta, b, EPS)
    ry, _, rinv, rs = norm.skip_layer_normalization(x.cpu(), skip.cpu(), gamma.cpu(), beta.cpu(), _cpu(b),
                                                    epsilon=EPS, ctx=_ctx((True, False, True, True)))
    tol = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(y.cpu(), ry, rtol=tol, atol=tol)
    torch.testing.assert_close(inv.cpu(), rinv.reshape(inv.shape).float(), rtol=1e-5, atol=0)
    assert torch.equal(s.cpu(), rs)
    y2, inv2, s2 = skip_layer_norm(x, skip, gamma, None, None, EPS, store_inv=False, store_sum=False)
    assert inv2 is None and s2 is None
    ry2 = norm.skip_layer_normalization(x.cpu(), skip.cpu(), gamma.cpu(), None, None, epsilon=EPS,
                                        ctx=_ctx((True, False, False, False)))[0]
    torch.testing.assert_close(y2.cpu(), ry2, rtol=tol, atol=tol)


def test_skip_layer_norm_refuses_long_rows() -> None:
    x = torch.zeros(1, rmsnorm.LAYER_NORM_MAX + 1)
    with pytest.raises(ValueError, match="rows of at most"):
        skip_layer_norm(x, x, x[0], None, None, EPS)


@pytest.mark.gpu
def test_skip_layer_norm_op_routes_gpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = record_calls(monkeypatch, rmsnorm, "skip_layer_norm")
    x, skip = rand(2, 4, 64, device="cuda", seed=1), rand(2, 4, 64, device="cuda", seed=2)
    gamma, beta = rand(64, device="cuda", seed=3), rand(64, device="cuda", seed=4)
    y = norm.skip_layer_normalization(x, skip, gamma, beta, epsilon=EPS, ctx=_ctx((True, False, False, False)))[0]
    assert calls == ["skip_layer_norm"]
    ref = torch.nn.functional.layer_norm(x + skip, (64,), gamma, beta, EPS)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    norm.skip_layer_normalization(x, skip, gamma, beta, epsilon=EPS, ctx=_ctx())  # the mean is wanted: torch
    assert calls == ["skip_layer_norm"]


def _folded_by_nodes(x, skip, w, bias, kw, x_scale, skip_scale, out_dtype):
    """What the nodes folded into com.crossml SkipSimplifiedLayerNormalization compute, each on its own kernel (the
    Muls in torch, on x's type)."""
    if kw is not None:
        skip = rms_norm(skip, kw, EPS, out_dtype=x.dtype)[0]
    if x_scale is not None:
        x = torch.mul(x, torch.tensor(x_scale, dtype=x.dtype, device=x.device))
    if skip_scale is not None:
        skip = torch.mul(skip, torch.tensor(skip_scale, dtype=x.dtype, device=x.device))
    y, _, s = skip_rms_norm(x, skip, w, bias, EPS, store_inv=False)
    return y.to(out_dtype), s


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "skip_dtype", "out_dtype"), [
    (torch.float32, torch.float16, torch.float16), (torch.float32, torch.float32, torch.bfloat16),
    (torch.float16, torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("parts", ["all", "scales", "norm", "bias-norm"])
def test_folded_skip_rms_norm_is_the_nodes(device: str, dtype: torch.dtype, skip_dtype: torch.dtype,
                                           out_dtype: torch.dtype, parts: str) -> None:
    """folded_skip_rms_norm (Gemma's residual norm: layer-scalar Muls, the skip's own RMSNorm, the result's Cast)
    against the nodes on their own kernels: the same float32 steps, each intermediate rounded to x's type as its node
    stores it, so bit for bit in the interpreter; compiled, within a rounding of the operands (FMA contraction)."""
    H, rows = 96, 3
    x = rand(1, rows, H, dtype=dtype, device=device, seed=1) * 4
    normed = parts != "scales"  # the skip's norm takes the skip of another type to x's; without it, x's type
    skip = rand(1, rows, H, dtype=skip_dtype if normed else dtype, device=device, seed=2) * 3
    w = (1 + 0.1 * rand(H, seed=3)).to(dtype).to(device)
    kw = (1 + 0.1 * rand(H, seed=4)).to(dtype).to(device) if normed else None
    bias = rand(H, dtype=dtype, device=device, seed=5) if "bias" in parts else None
    # the Muls' constants are of x's type (the rule reads their values from there)
    scales = tuple(float(torch.tensor(v, dtype=dtype)) for v in (1.2, 0.7)) if parts in ("all", "scales") \
        else (None, None)
    y, s = rmsnorm.folded_skip_rms_norm(x, skip, w, bias, EPS, out_dtype=out_dtype, x_scale=scales[0],
                                        skip_scale=scales[1], skip_weight=kw, skip_eps=EPS)
    want_y, want_s = _folded_by_nodes(x, skip, w, bias, kw, *scales, out_dtype)
    assert y.dtype == out_dtype and s.dtype == dtype
    if device == "cpu":  # interpreted: the same float32 steps
        assert torch.equal(s, want_s)
        assert torch.equal(y, want_y)
    else:  # compiled, the kernels may contract a product and a sum into one FMA at different steps: one rounding of
        # the operands apart (not an ulp of a sum that cancels)
        tol = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 1e-2), torch.bfloat16: (8e-3, 8e-2)}
        torch.testing.assert_close(s, want_s, rtol=tol[dtype][0], atol=tol[dtype][1])
        torch.testing.assert_close(y, want_y, rtol=tol[out_dtype][0], atol=tol[out_dtype][1])


@pytest.mark.parametrize("device", DEVICES)
def test_folded_skip_rms_norm_refusals(device: str) -> None:
    x = rand(2, 64, device=device)
    with pytest.raises(ValueError, match="must have the input's shape"):
        rmsnorm.folded_skip_rms_norm(x, x[:1], x[0], None, EPS)
    long = rand(1, rmsnorm.FOLDED_MAX + 1, device=device)
    with pytest.raises(ValueError, match="at most 16384 elements"):
        rmsnorm.folded_skip_rms_norm(long, long, long[0], None, EPS)
    y, s = rmsnorm.folded_skip_rms_norm(x, x, x[0], None, EPS, store_sum=False)
    assert s is None and y.shape == x.shape

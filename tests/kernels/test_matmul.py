"""The Triton GEMM (crossml.kernels.matmul) against its torch reference, and the MatMul/Gemm
replacements in METACOMMAND_FREE. CPU cases run in Triton's interpreter; ``gpu`` cases compile."""

from __future__ import annotations

import inspect
import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels import METACOMMAND_FREE  # noqa: E402
from crossml.kernels.matmul import gemm, gemm_reference, matmul, matmul_reference  # noqa: E402
from tests.kernels._common import DEVICES, TF32_TOL, assert_close, rand, run_own_kernels  # noqa: E402

F32_F16 = [torch.float32, torch.float16]
ALL_FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def _mats(device: str, dtype: torch.dtype, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    return [rand(*s, dtype=dtype, device=device, seed=i) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", F32_F16)
@pytest.mark.parametrize("case", ["odd", "transposed", "broadcast", "shared_b", "strided_batch"])
def test_matmul_matches_reference(device: str, dtype: torch.dtype, case: str) -> None:
    if case == "odd":  # partial tiles in M, N and K
        a, b = _mats(device, dtype, (37, 45), (45, 19))
    elif case == "transposed":  # both operands column-major: read through strides, no copy
        a, b = _mats(device, dtype, (45, 37), (19, 45))
        a, b = a.mT, b.mT
    elif case == "broadcast":  # batch dims broadcast both ways: (3, 1) x (4,) -> (3, 4)
        a, b = _mats(device, dtype, (3, 1, 17, 23), (4, 23, 9))
    elif case == "shared_b":  # B without batch dims: one 2-D GEMM over all of A's rows
        a, b = _mats(device, dtype, (2, 3, 17, 23), (23, 9))
    else:  # three broadcast batch dims no pair of strides describes, A transposed
        a, b = _mats(device, dtype, (2, 1, 3, 7, 5), (1, 4, 1, 7, 6))
        a = a.mT
    y = matmul(a, b, allow_tf32=False)
    assert y.device.type == device
    assert_close(y, matmul_reference(a, b), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_matmul_other_dtypes(device: str, dtype: torch.dtype) -> None:
    a, b = _mats(device, dtype, (2, 19, 33), (33, 21))
    assert_close(matmul(a, b), matmul_reference(a, b), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", [((23,), (23, 9)), ((2, 5, 23), (23,)), ((23,), (23,)), ((23,), (3, 23, 4))])
def test_matmul_vectors(device: str, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    a, b = _mats(device, torch.float32, *shapes)
    y = matmul(a, b)
    ref = matmul_reference(a, b)
    assert y.shape == ref.shape
    assert_close(y, ref, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_empty(device: str) -> None:
    a, b = _mats(device, torch.float32, (0, 5), (5, 3))
    assert matmul(a, b).shape == (0, 3)
    a, b = _mats(device, torch.float32, (4, 0), (0, 3))
    y = matmul(a, b)
    assert y.shape == (4, 3) and not y.any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", F32_F16)
@pytest.mark.parametrize(("trans_a", "trans_b", "c_shape", "alpha", "beta"), [
    (0, 0, None, 1.0, 1.0),
    (0, 1, (19,), 0.5, 2.0),  # bias row
    (1, 0, (37, 1), 1.0, -1.0),  # bias column
    (1, 1, (37, 19), 2.0, 0.25),
    (0, 0, (), 1.0, 1.0),  # scalar C
    (0, 0, (37, 19), 1.5, 0.0),  # beta 0: C ignored
])
def test_gemm_matches_reference(device: str, dtype: torch.dtype, trans_a: int, trans_b: int,
                                c_shape: tuple[int, ...] | None, alpha: float, beta: float) -> None:
    a = rand(*((45, 37) if trans_a else (37, 45)), dtype=dtype, device=device, seed=1)
    b = rand(*((19, 45) if trans_b else (45, 19)), dtype=dtype, device=device, seed=2)
    c = None if c_shape is None else rand(*c_shape, dtype=dtype, device=device, seed=3)
    kw = {"alpha": alpha, "beta": beta, "transA": trans_a, "transB": trans_b}
    y = gemm(a, b, c, **kw, allow_tf32=False)
    assert_close(y, gemm_reference(a, b, c, **kw), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_name_the_problem(device: str) -> None:
    a, b = _mats(device, torch.float32, (3, 4), (5, 6))
    with pytest.raises(ValueError, match="inner dimensions"):
        matmul(a, b)
    with pytest.raises(TypeError, match="int32"):
        matmul(a.to(torch.int32), b.to(torch.int32))
    with pytest.raises(TypeError, match="share one element type"):
        matmul(a, b.half())
    with pytest.raises(ValueError, match="does not broadcast"):
        gemm(a, b.mT.contiguous()[:4, :5], rand(2, 3, device=device))


def _signature(fn: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("op_type", ["MatMul", "Gemm", "Conv"])
def test_replacements_have_the_registered_signatures(op_type: str) -> None:
    from crossml.kernels import _registered

    assert _signature(METACOMMAND_FREE[op_type]) == _signature(_registered(op_type))


def test_replacements_defer_on_cpu_and_for_integers() -> None:
    from crossml.kernels import _registered

    a, b = rand(5, 7), rand(7, 3)
    torch.testing.assert_close(METACOMMAND_FREE["MatMul"](a, b), _registered("MatMul")(a, b), rtol=0, atol=0)
    ai, bi = (a * 10).to(torch.int32), (b * 10).to(torch.int32)
    assert torch.equal(METACOMMAND_FREE["MatMul"](ai, bi), ai @ bi)
    y = METACOMMAND_FREE["Gemm"](a, b.mT, rand(3), alpha=2.0, transB=1)
    torch.testing.assert_close(y, _registered("Gemm")(a, b.mT, rand(3), alpha=2.0, transB=1), rtol=0, atol=0)


# --- GPU: compiled kernels, bigger autotuned tiles, TF32, and no vendor GEMM in the trace ---


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gpu_large_and_batched(dtype: torch.dtype) -> None:
    a, b = _mats("cuda", dtype, (8, 384, 320), (320, 200))
    assert_close(matmul(a, b, allow_tf32=False), matmul_reference(a, b), dtype)
    a, b = _mats("cuda", dtype, (4, 1, 257, 96), (3, 96, 129))
    assert_close(matmul(a.mT.contiguous().mT, b, allow_tf32=False), matmul_reference(a, b), dtype)


@pytest.mark.gpu
def test_gpu_tf32() -> None:
    a, b = _mats("cuda", torch.float32, (300, 512), (512, 260))
    assert_close(matmul(a, b, allow_tf32=True), matmul_reference(a, b), torch.float32,
                 tol=(TF32_TOL[0], TF32_TOL[1] * 4))


@pytest.mark.gpu
def test_gpu_replacements_run_no_vendor_gemm() -> None:
    a, b, c = _mats("cuda", torch.float16, (64, 96, 128), (128, 80), (80,))
    y, z = run_own_kernels(lambda: (METACOMMAND_FREE["MatMul"](a, b), METACOMMAND_FREE["Gemm"](a[0], b, c)),
                           "_gemm_kernel", ("gemm", "cublas", "cutlass", "xmma", "hipblas", "rocblas", "tensile"))
    assert_close(y, matmul_reference(a, b), torch.float16)
    assert_close(z, gemm_reference(a[0], b, c), torch.float16)

"""The Triton SiLU-gated product (crossml.kernels.swiglu) against its torch reference, the packed
form (g and up as the halves of one tensor) against the two-input one, and the com.crossml SiluMul
op. CPU cases run in Triton's interpreter; ``gpu`` cases compile."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels.swiglu import silu_mul, silu_mul_packed, silu_mul_reference  # noqa: E402
from crossml.ops.fused import silu_mul_op  # noqa: E402
from tests.kernels._common import DEVICES, assert_close, rand  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1, 4864), (3, 1000), (2, 5, 37), (1,), (1025,)]


def _inputs(device: str, dtype: torch.dtype, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    g = rand(*shape, dtype=dtype, device=device, seed=1) * 4  # σ's tails as well as its middle
    return g, rand(*shape, dtype=dtype, device=device, seed=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_reference(device: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    g, up = _inputs(device, dtype, shape)
    y = silu_mul(g, up)
    assert y.device.type == device and y.shape == g.shape
    # fp64 of the same rounded inputs: the kernel rounds once, at the end
    assert_close(y, silu_mul_reference(g.double().cpu(), up.double().cpu()), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_close_to_node_by_node(device: str, dtype: torch.dtype) -> None:
    """Against the unfused nodes in the input dtype (rounding after each): within that rounding."""
    g, up = _inputs(device, dtype, (3, 1000))
    ref = silu_mul_reference(g.cpu(), up.cpu())
    tol = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}[dtype]
    torch.testing.assert_close(silu_mul(g, up).cpu(), ref, rtol=tol[0], atol=tol[1])


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the interpreter's σ(-1e4)
@pytest.mark.parametrize("device", DEVICES)
def test_kernel_strided_extremes_and_empty(device: str) -> None:
    g = torch.tensor([-1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4, float("inf")], device=device)
    up = torch.full_like(g, 2.0)
    want = silu_mul_reference(g.double().cpu(), up.double().cpu())
    want[-1] = float("inf")  # inf · σ(inf) · 2
    torch.testing.assert_close(silu_mul(g, up).double().cpu(), want)
    a, b = _inputs(device, torch.float32, (37, 19))
    assert_close(silu_mul(a.mT, b.mT), silu_mul_reference(a.mT.double().cpu(), b.mT.double().cpu()), torch.float32)
    assert silu_mul(a[:0], b[:0]).shape == (0, 19)


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_refuses(device: str) -> None:
    g, up = _inputs(device, torch.float32, (3, 8))
    with pytest.raises(ValueError, match="one shape"):
        silu_mul(g, up[:1])
    with pytest.raises(TypeError, match="float16/bfloat16/float32"):
        silu_mul(g, up.half())
    with pytest.raises(TypeError, match="float16/bfloat16/float32"):
        silu_mul(g.double(), up.double())


PACKED_SHAPES = [(1, 2 * 4864), (3, 2000), (2, 5, 74), (2,), (2050,)]


def _halves(gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = gu.shape[-1] // 2
    return gu[..., :n], gu[..., n:]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", PACKED_SHAPES)
def test_packed_kernel_matches_two_inputs(device: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gu = rand(*shape, dtype=dtype, device=device, seed=3) * 4
    g, up = _halves(gu)
    y = silu_mul_packed(gu)
    assert y.device.type == device and y.shape == g.shape and y.is_contiguous()
    assert_close(y, silu_mul_reference(g.double().cpu(), up.double().cpu()), dtype)
    # the same fp32 math as the two-input kernel: bitwise its result on copies of the halves
    assert torch.equal(y, silu_mul(g.contiguous(), up.contiguous()))


@pytest.mark.parametrize("device", DEVICES)
def test_packed_kernel_strided_and_empty(device: str) -> None:
    wide = rand(5, 3, 50, device=device, seed=4)
    tall = rand(40, 3, device=device, seed=5)
    for gu in (wide[..., :40], tall.mT, tall.mT[::2, 2:]):  # rows apart, columns apart, both
        g, up = _halves(gu)
        assert_close(silu_mul_packed(gu), silu_mul_reference(g.double().cpu(), up.double().cpu()), torch.float32)
    assert silu_mul_packed(wide[:0]).shape == (0, 3, 25)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_kernel_refuses(device: str) -> None:
    gu = rand(3, 9, device=device)
    with pytest.raises(ValueError, match=r"even.*\(3, 9\)"):
        silu_mul_packed(gu)
    with pytest.raises(TypeError, match="float16/bfloat16/float32"):
        silu_mul_packed(gu[:, :8].double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_op_single_input_on_cpu_is_the_unfused_nodes_on_the_halves(dtype: torch.dtype) -> None:
    gu = rand(3, 7, 2000, dtype=dtype, seed=5) * 4
    g, up = (h.contiguous() for h in _halves(gu))  # as two matrix products write them
    assert torch.equal(silu_mul_op(gu), (g * torch.sigmoid(g)) * up)
    assert torch.equal(silu_mul_op(gu), silu_mul_op(g, up))


def test_op_single_input_refuses_odd_last_dimension() -> None:
    with pytest.raises(ValueError, match=r"SiluMul.*\(2, 5\)"):
        silu_mul_op(torch.zeros(2, 5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_op_on_cpu_is_the_unfused_nodes(dtype: torch.dtype) -> None:
    """On CPU tensors the op runs Sigmoid, Mul, Mul as the nodes do: bitwise the same, and broadcasts."""
    g, up = _inputs("cpu", dtype, (3, 1000))
    assert torch.equal(silu_mul_op(g, up), (g * torch.sigmoid(g)) * up)
    assert torch.equal(silu_mul_op(g, up[:1]), (g * torch.sigmoid(g)) * up[:1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_op_on_gpu_runs_the_kernel_and_captures(dtype: torch.dtype) -> None:
    g, up = _inputs("cuda", dtype, (4, 4864))
    y = silu_mul_op(g, up)
    assert_close(y, silu_mul_reference(g.double().cpu(), up.double().cpu()), dtype)
    out = torch.empty_like(y)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # no host syncs: capturable
        out.copy_(silu_mul_op(g, up))
    g.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, silu_mul_reference(g.double().cpu(), up.double().cpu()), dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_op_single_input_on_gpu_runs_the_packed_kernel_and_captures(dtype: torch.dtype) -> None:
    gu = rand(1, 2 * 4864, dtype=dtype, device="cuda", seed=6) * 4
    y = silu_mul_op(gu)
    g, up = _halves(gu)
    assert torch.equal(y, silu_mul(g.contiguous(), up.contiguous()))
    out = torch.empty_like(y)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # no host syncs: capturable
        out.copy_(silu_mul_op(gu))
    gu.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, silu_mul_reference(g.double().cpu(), up.double().cpu()), dtype)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the interpreter's σ(2u) tails
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2560), (3, 1000), (1025,)])
def test_gelu_tanh_gate_matches_reference(device: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """activation="gelu_tanh" (GeGLU): both kernels within one rounding of torch's gelu(approximate="tanh") * up in
    float64, and the op's packed and two-input forms agree with the kernels (the registered op's route on a GPU)."""
    g, up = _inputs(device, dtype, shape)
    want = silu_mul_reference(g.double().cpu(), up.double().cpu(), "gelu_tanh")
    y = silu_mul(g, up, activation="gelu_tanh")
    assert_close(y, want, dtype)
    packed = silu_mul_packed(torch.cat([g, up], dim=-1), activation="gelu_tanh")
    torch.testing.assert_close(packed, y, rtol=0, atol=0)
    assert_close(silu_mul_op(torch.cat([g, up], dim=-1), activation="gelu_tanh").cpu(), want, dtype)
    assert_close(silu_mul_op(g, up, activation="gelu_tanh").cpu(), want, dtype)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("device", DEVICES)
def test_gelu_tanh_tails(device: str) -> None:
    """Large negative gates give 0 (no 1 + tanh cancellation to -0 or NaN), large positive ones g itself."""
    g = torch.tensor([-1e4, -30.0, -6.0, 0.0, 6.0, 30.0, 1e4], device=device)
    up = torch.ones_like(g)
    want = silu_mul_reference(g.double().cpu(), up.double().cpu(), "gelu_tanh")
    torch.testing.assert_close(silu_mul(g, up, activation="gelu_tanh").double().cpu(), want, rtol=1e-6, atol=1e-6)


def test_unknown_activation_is_named() -> None:
    g = torch.zeros(4)
    with pytest.raises(ValueError, match="activation 'relu' is not one of silu, gelu_tanh"):
        silu_mul_op(g, activation="relu")
    with pytest.raises(ValueError, match="activation 'relu'"):
        silu_mul_packed(g, activation="relu")


def test_cpu_op_is_the_nodes_torch_calls() -> None:
    """On CPU tensors the gelu_tanh op is torch's gelu (tanh) then mul: the Gelu and Mul nodes' values bit for bit."""
    g, up = _inputs("cpu", torch.float32, (3, 40))
    want = torch.mul(torch.nn.functional.gelu(g, approximate="tanh"), up)
    assert torch.equal(silu_mul_op(g, up, activation="gelu_tanh"), want)
    assert torch.equal(silu_mul_op(torch.cat([g, up], -1), activation="gelu_tanh"), want)

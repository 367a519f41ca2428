"""The numba CPU kernels for 4-bit products (crossml.kernels.cpu_nbits) against MatMulNBits' torch reference:
the weight dequantized (``dequantize_nbits``), A quantized to int8 per block first on the int8 path, multiplied in
float64; the prompt products' dequantization against ``dequantize_nbits`` bit for bit."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

pytest.importorskip("numba", reason="the CPU kernel is compiled by numba (the test extra installs it)")

from crossml.kernels import cpu_nbits  # noqa: E402
from crossml.ops.contrib.matmul_nbits import dequantize_nbits, quantize_dequantize_int8_blocks  # noqa: E402


def _weight(N: int, K: int, block_size: int, zp_kind: str | None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    nb = -(-K // block_size)
    B = torch.randint(0, 256, (N, nb, block_size // 2), generator=g, dtype=torch.uint8)
    scales = torch.rand(N * nb, generator=g) * 0.05 + 0.01
    zp = None
    if zp_kind == "packed":
        zp = torch.randint(0, 256, (N, -(-nb // 2)), generator=g, dtype=torch.uint8)
    elif zp_kind == "float":
        zp = torch.rand(N * nb, generator=g) * 15
    return B, scales, zp


def _reference(A: torch.Tensor, B, scales, zp, *, K: int, N: int, block_size: int, int8: bool) -> torch.Tensor:
    w = dequantize_nbits(B, scales, zp, None, K=K, N=N, bits=4, block_size=block_size, dtype=torch.float64)
    a = quantize_dequantize_int8_blocks(A, block_size) if int8 else A
    return a.double() @ w.T


CASES = [  # block_size, K, N, zero points
    (16, 64, 24, None),
    (16, 80, 37, "float"),
    (32, 96, 40, "packed"),
    (32, 80, 16, "packed"),  # K past the last whole block
    (32, 896, 64, "packed"),  # 28 blocks, padded to 32
    (64, 256, 48, "float"),
    (128, 384, 32, None),  # 3 blocks: no padding
    (128, 200, 9, "packed"),
    (256, 512, 16, None),
    (256, 1280, 8, "packed"),  # 5 blocks, padded to 8
]


@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"bs{c[0]}_K{c[1]}_N{c[2]}_{c[3]}")
def test_cpu_kernel_matches_the_dequantized_product(case, M, int8):
    block_size, K, N, zp_kind = case
    B, scales, zp = _weight(N, K, block_size, zp_kind)
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(1))
    packed = cpu_nbits.prepare(B, scales, zp, K=K, N=N, block_size=block_size)
    got = cpu_nbits.matmul(A, packed, int8=int8)
    ref = _reference(A, B, scales, zp, K=K, N=N, block_size=block_size, int8=int8)
    assert got.dtype == torch.float32 and got.shape == (M, N)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_int8_block_dot_products_are_exact():
    """On the int8 path each block's dot product is an integer computed exactly: with one block per row and a scale
    of 1 for the weight and for A (A's block maximum 127), the result is the integer dot product itself, at the
    largest magnitudes (A at -128 / 127, weights at 0 and 15, zero point 0)."""
    K = N = 256
    q = torch.full((N, K), 15, dtype=torch.uint8)
    q[:, 1::3] = 0
    B = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(N, 1, K // 2)
    scales = torch.ones(N)
    zp = torch.zeros(N, 1, dtype=torch.uint8)
    a = torch.full((1, K), 127.0)
    a[0, 2::5] = -127.0
    got = cpu_nbits.matmul(a, cpu_nbits.prepare(B, scales, zp, K=K, N=N, block_size=K), int8=True)
    exact = (a.double() @ q.double().T)
    assert torch.equal(got.double(), exact)


def test_padded_blocks():
    assert [cpu_nbits.padded_blocks(n) for n in (1, 4, 5, 8, 9, 28, 152)] == [1, 4, 8, 8, 16, 32, 152]


def threads_agree(product, inputs: list[torch.Tensor], calls: int = 20) -> list[str]:
    """Run ``product(a)`` for every input from its own Python thread, all at once, ``calls`` times each; the threads
    whose result differed from the input's single-threaded result (empty: all exact)."""
    expected = [product(a) for a in inputs]
    errors: list[str] = []

    def work(i: int) -> None:
        for _ in range(calls):
            if not torch.equal(product(inputs[i]), expected[i]):
                errors.append(f"thread {i}: result differs")
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_concurrent_calls_from_threads_agree():
    """Calls from several Python threads at once (sessions run concurrently) give each thread its own exact
    result: the kernel releases the GIL and numba's threading layer takes launches from many threads (or they are
    serialized where it does not)."""
    K, N, bs = 512, 256, 32
    B, scales, zp = _weight(N, K, bs, "packed")
    packed = cpu_nbits.prepare(B, scales, zp, K=K, N=N, block_size=bs)
    inputs = [torch.randn(2, K, generator=torch.Generator().manual_seed(s)) for s in range(6)]
    errors = threads_agree(lambda a: cpu_nbits.matmul(a, packed, int8=True), inputs)
    assert not errors, errors


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"bs{c[0]}_K{c[1]}_N{c[2]}_{c[3]}")
def test_dequantize_kernel_equals_dequantize_nbits(case):
    """The prompt products' dequantization gives ``dequantize_nbits``' float32 values bit for bit: (q - z) exact,
    then one rounding by the scale; values past K (the last block's padding) are not written."""
    block_size, K, N, zp_kind = case
    B, scales, zp = _weight(N, K, block_size, zp_kind)
    nb = -(-K // block_size)
    zq, zf, zmode = np.zeros((1, 1), np.uint8), np.zeros((1, 1), np.float32), 0
    if zp_kind == "packed":
        zq, zmode = zp.numpy(), 1
    elif zp_kind == "float":
        zf, zmode = zp.reshape(N, nb).numpy(), 2
    out = torch.full((N, K), float("nan"))
    cpu_nbits._dequantize(B.numpy(), scales.reshape(N, nb).numpy(), zq, zf, zmode, K, out.numpy())
    ref = dequantize_nbits(B, scales, zp, None, K=K, N=N, bits=4, block_size=block_size, dtype=torch.float32)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("chunk_rows", [3, None], ids=["3-row-chunks", "one-chunk"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"bs{c[0]}_K{c[1]}_N{c[2]}_{c[3]}")
def test_product_matches_the_dequantized_product(case, chunk_rows, monkeypatch):
    """``product`` (prompt-sized products) against the float64 product of the dequantized weight, in chunks of 3
    rows (a last partial chunk wherever N % 3) and in one chunk; fp16 scales are read as float32."""
    block_size, K, N, zp_kind = case
    B, scales, zp = _weight(N, K, block_size, zp_kind)
    if chunk_rows is not None:
        monkeypatch.setattr(cpu_nbits, "CHUNK_BYTES", chunk_rows * K * 4)
    A = torch.randn(33, K, generator=torch.Generator().manual_seed(1))
    got = cpu_nbits.product(A, B, scales, zp, K=K, N=N, block_size=block_size)
    ref = _reference(A, B, scales, zp, K=K, N=N, block_size=block_size, int8=False)
    assert got.dtype == torch.float32 and got.shape == (33, N)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    half = cpu_nbits.product(A, B, scales.half(), zp, K=K, N=N, block_size=block_size)
    ref16 = _reference(A, B, scales.half().float(), zp, K=K, N=N, block_size=block_size, int8=False)
    torch.testing.assert_close(half.double(), ref16, rtol=1e-5, atol=1e-5)


def test_cpu_sessions_warm_their_kernels(monkeypatch):
    """A CPU session loads the numba kernels of its ops as it is created (``crossml.kernels.warm_cpu``): a graph with
    MatMulNBits warms ``cpu_nbits`` and ``cpu_int8`` (once a process), one without such ops warms none; each module's
    ``warm`` runs."""
    from onnx import TensorProto, helper

    import crossml
    from crossml import kernels

    for name in sorted({m for modules in kernels.CPU_KERNEL_OPS.values() for m in modules}):
        kernels.load(name).warm()  # every module's warm runs on its own
    warmed: list[str] = []
    monkeypatch.setattr(kernels, "_warm_module", warmed.append)
    K, N, bs = 32, 8, 32
    B = helper.make_tensor("B", TensorProto.UINT8, [N, 1, bs // 2], bytes(N * bs // 2), raw=True)
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [N], [1.0] * N)
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft", K=K, N=N,
                            bits=4, block_size=bs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, N])], [B, scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    crossml.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert warmed == ["cpu_nbits", "cpu_int8"]
    relu = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["A"], ["Y"])], "r", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])]), opset_imports=[helper.make_opsetid("", 21)])
    crossml.InferenceSession(relu.SerializeToString(), providers=["CPUExecutionProvider"])
    assert warmed == ["cpu_nbits", "cpu_int8"]


def test_a_kernel_module_that_fails_to_warm_is_disabled(monkeypatch, caplog):
    """A kernel module whose numba kernels fail to load (an exotic platform) is logged and disabled: ``load`` then
    returns None for it, so its ops keep their torch paths, and the session that warmed it still loads."""
    from crossml import kernels

    monkeypatch.setattr(kernels, "_DISABLED", set())
    kernels._warm_module.cache_clear()
    monkeypatch.setattr(cpu_nbits, "warm", lambda: (_ for _ in ()).throw(RuntimeError("no kernel for this CPU")))
    try:
        with caplog.at_level("WARNING", logger="crossml"):
            kernels.warm_cpu({"MatMulNBits", "Relu"})
        assert kernels.load("cpu_nbits") is None and "no kernel for this CPU" in caplog.text
    finally:
        kernels._warm_module.cache_clear()

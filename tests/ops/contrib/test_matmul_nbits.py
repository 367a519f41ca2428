"""MatMulNBits and GatherBlockQuantized against onnxruntime CPU."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import TensorProto as TP

from tests.ops.contrib._ort import check

RNG = np.random.default_rng(1)


@pytest.fixture(autouse=True)
def _seeded(request):
    """Each test draws its data from a generator seeded by its own id, so its data does not depend on which tests
    ran before it in the process (pytest-xdist deals tests out differently from run to run)."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
#: largest |crossml - onnxruntime| seen per accuracy-level-4 case (reported by test_report_level4)
LEVEL4_DIFFS: dict[str, float] = {}


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """uint values [..., n] -> uint8 [..., n * bits / 8], low bits first."""
    per = 8 // bits
    q = q.astype(np.uint8).reshape(*q.shape[:-1], -1, per)
    out = np.zeros(q.shape[:-1], dtype=np.uint8)
    for i in range(per):
        out |= q[..., i] << (bits * i)
    return out


def quantized_weight(N, K, bits, block_size, zp_kind, dtype=np.float32):
    nb = -(-K // block_size)
    q = RNG.integers(0, 1 << bits, size=(N, nb * block_size))
    B = pack(q, bits).reshape(N, nb, block_size * bits // 8)
    scales = (RNG.random((N, nb)) * 0.05 + 0.01).astype(dtype)
    zp = None
    if zp_kind == "packed":
        zq = RNG.integers(0, 1 << bits, size=(N, -(-nb * bits // 8) * (8 // bits)))
        zp = pack(zq, bits)
    elif zp_kind == "float":
        zp = (RNG.random((N, nb)) * (1 << bits)).astype(dtype)
    return B, scales, zp


CASES = [
    # bits, block_size, K, N, zero points
    (4, 16, 64, 24, None),
    (4, 32, 96, 40, "packed"),
    (4, 32, 80, 16, "packed"),  # K not a multiple of block_size
    (4, 64, 256, 48, "float"),
    (4, 128, 384, 32, "packed"),
    (4, 256, 512, 16, None),
    (8, 16, 48, 24, "packed"),
    (8, 32, 128, 32, None),
    (8, 128, 256, 40, "packed"),
    (2, 32, 64, 16, "packed"),
]


def _run(bits, block_size, K, N, zp_kind, level, M=(2, 5), dtype=np.float32, bias=False):
    B, scales, zp = quantized_weight(N, K, bits, block_size, zp_kind, dtype)
    A = RNG.standard_normal((*M, K)).astype(dtype)
    inits = {"B": B, "scales": scales}
    if zp is not None:
        inits["zp"] = zp
    ins = {"A": A, "B": None, "scales": None, "zp": None, "g_idx": None}
    if bias:
        inits["bias"] = RNG.standard_normal(N).astype(dtype)
        ins["bias"] = None
    tol = 1e-4 if dtype == np.float32 else 2e-2
    if level == 4:
        tol = 2e-3 if dtype == np.float32 else 3e-2
    out_t = TP.FLOAT if dtype == np.float32 else TP.FLOAT16
    return check("MatMulNBits", ins, [("Y", out_t)], inits, atol=tol, rtol=tol, K=K, N=N, bits=bits,
                 block_size=block_size, accuracy_level=level)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}_bs{c[1]}_K{c[2]}_N{c[3]}_{c[4]}")
@pytest.mark.parametrize("level", [0, 1, 4])
def test_matmul_nbits(case, level):
    d = _run(*case, level=level)
    if level == 4:
        LEVEL4_DIFFS["x".join(map(str, case))] = d


@pytest.mark.parametrize("M", [(1, 1), (3, 7), (33,)])
def test_matmul_nbits_level4_shapes(M):
    LEVEL4_DIFFS[f"M{M}"] = _run(4, 32, 256, 64, "packed", level=4, M=M)


@pytest.mark.parametrize("level", [0, 4])
def test_matmul_nbits_bias(level):
    _run(4, 32, 64, 16, "packed", level=level, bias=True)


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("zp_kind", [None, "packed", "float"])
def test_matmul_nbits_fp16(level, zp_kind):
    _run(4, 32, 128, 32, zp_kind, level=level, dtype=np.float16)


PACKED_CASES = [  # bits, block_size, K, N, zero points: K a multiple of the block (the packed kernel's); N any
    (4, 32, 96, 16, "packed"), (4, 64, 256, 48, "float"), (4, 128, 384, 32, None), (4, 256, 512, 16, "packed"),
    (4, 32, 64, 24, "packed"), (4, 64, 128, 7, None),  # N padded to a multiple of 16 for the kernel
]


LAID_OUT_CASES = PACKED_CASES + [  # the numba kernel also takes K past the last whole block and blocks of 16
    (4, 32, 80, 16, "packed"), (4, 16, 64, 24, None), (4, 16, 80, 37, "float"), (4, 128, 200, 9, "packed"),
]


def _spy(monkeypatch, module, name: str, attr: str) -> list[bool]:
    """Record, for each call of ``module.<name>``, whether it returned a weight kept on B under ``attr``."""
    calls = []
    real = getattr(module, name)

    def spy(*args, **kw):
        out = real(*args, **kw)
        calls.append(out is not None and hasattr(args[0], attr))
        return out

    monkeypatch.setattr(module, name, spy)
    return calls


@pytest.mark.parametrize("M", [(1,), (2, 3)])
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("case", LAID_OUT_CASES, ids=lambda c: f"bs{c[1]}_K{c[2]}_N{c[3]}_{c[4]}")
def test_matmul_nbits_cpu_numba_kernel(case, level, M, monkeypatch):
    """Decode-sized products of constant 4-bit weights on the CPU take the numba kernel (``crossml.kernels.cpu_nbits``,
    checked with a spy) where numba is installed, within the same tolerance of onnxruntime as the dequantizing path;
    the weight is laid out once, on its first run."""
    pytest.importorskip("numba", reason="the numba kernel needs numba (the test extra installs it)")
    from crossml.ops.contrib import matmul_nbits as module

    real_load = module.load  # the int8 kernel (level 4, test_matmul_nbits_cpu_int8_kernel) hidden
    monkeypatch.setattr(module, "load", lambda name: None if name == "cpu_int8" else real_load(name))
    calls = _spy(monkeypatch, module, "_cpu_laid_out", module._CPU_NBITS)
    d = _run(*case, level=level, M=M)
    assert calls and all(calls), "the product did not take the numba kernel"
    if level == 4:
        LEVEL4_DIFFS[f"numba {case} M{M}"] = d


@pytest.mark.parametrize("M", [(1,), (2, 3)])
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("case", PACKED_CASES, ids=lambda c: f"bs{c[1]}_K{c[2]}_N{c[3]}_{c[4]}")
def test_matmul_nbits_cpu_packed_kernel(case, level, M, monkeypatch):
    """Without numba (nor the int8 kernel), decode-sized products of constant 4-bit weights on the CPU take torch's
    packed int4 kernel
    (checked with a spy), within the same tolerance of onnxruntime as the dequantizing path; the weight is packed
    once, on its first run."""
    from crossml.ops.contrib import matmul_nbits as module

    real_load = module.load
    monkeypatch.setattr(module, "load", lambda name: None if name in ("cpu_nbits", "cpu_int8") else real_load(name))
    calls = _spy(monkeypatch, module, "_cpu_packed", module._CPU_PACKED)
    d = _run(*case, level=level, M=M)
    assert calls and all(calls), "the product did not take the packed kernel"
    if level == 4:
        LEVEL4_DIFFS[f"packed {case} M{M}"] = d


INT8_CASES = [  # bits, block_size, K, N, zero points: the int8 kernel's blocks of 32-256 values, K past a block too
    (4, 32, 96, 16, "packed"), (4, 32, 80, 16, "packed"), (4, 64, 256, 48, None), (4, 128, 200, 9, "packed"),
    (4, 256, 512, 16, "packed"), (4, 32, 64, 24, None),
]


@pytest.mark.parametrize("M", [(1,), (2, 3)])
@pytest.mark.parametrize("case", INT8_CASES, ids=lambda c: f"bs{c[1]}_K{c[2]}_N{c[3]}_{c[4]}")
def test_matmul_nbits_cpu_int8_kernel(case, M, monkeypatch):
    """At accuracy level 4, decode-sized products of constant 4-bit weights on an AVX2 CPU take the int8 kernel
    (``crossml.kernels.cpu_int8``, checked with a spy), within the same tolerance of onnxruntime as the other paths;
    its scale arrays are made once, on the first run."""
    _int8_run(case, M, "int8", monkeypatch)


def _int8_run(case, M, tag: str, monkeypatch):
    """``_run`` at accuracy level 4 (its difference from onnxruntime kept under ``tag``), checking with a spy that the
    product took the int8 kernel; skips without numba or AVX2. Returns the op's module and the spy's calls."""
    pytest.importorskip("numba", reason="the int8 kernel is called from numba (the test extra installs it)")
    from crossml.kernels import cpu_int8
    from crossml.ops.contrib import matmul_nbits as module

    if not cpu_int8.AVAILABLE:
        pytest.skip("the int8 kernel needs an x86-64 CPU with AVX2")
    calls = _spy(monkeypatch, module, "_cpu_int8", module._CPU_INT8)
    LEVEL4_DIFFS[f"{tag} {case} M{M}"] = _run(*case, level=4, M=M)
    assert calls and all(calls), "the product did not take the int8 kernel"
    return module, calls


@pytest.mark.parametrize("rows", [(2, 9), (1, 33)])
@pytest.mark.parametrize("case", [(4, 32, 96, 40, "packed"), (4, 32, 64, 24, None), (4, 32, 896, 37, "packed")],
                         ids=lambda c: f"bs{c[1]}_K{c[2]}_N{c[3]}_{c[4]}")
def test_matmul_nbits_cpu_int8_kernel_prompt_rows(case, rows, monkeypatch):
    """At accuracy level 4 with blocks of 32 values, prompt-sized products take the int8 kernel too (its two-by-two
    tiles, ``CPU_INT8_ANY_ROWS``; checked with a spy), within the same tolerance of onnxruntime, and each row's values
    are those of that row's product alone, bit for bit (odd row counts included)."""
    import torch

    module, calls = _int8_run(case, rows, "int8 prompt", monkeypatch)
    bits, bs, K, N, zp_kind = case
    B, scales, zp = (None if t is None else torch.from_numpy(t) for t in quantized_weight(N, K, bits, bs, zp_kind))
    A = torch.from_numpy(RNG.standard_normal((*rows, K)).astype(np.float32))
    from crossml.ops.registry import OpContext

    ctx = OpContext("proj", "MatMulNBits", 1, 1, (None,), (True,), const_inputs=(False, True, True, True))
    kw = {"K": K, "N": N, "block_size": bs, "accuracy_level": 4, "ctx": ctx}
    taken = len(calls)
    whole = module.matmul_nbits(A, B, scales, zp, **kw)
    assert len(calls) == taken + 1 and calls[-1]
    each = torch.cat([module.matmul_nbits(A[:, i:i + 1], B, scales, zp, **kw) for i in range(rows[1])], dim=1)
    assert torch.equal(whole, each)


def test_int8_kernel_only_where_it_applies():
    """``_cpu_int8`` declines (the op then tries the numba float kernel): float zero points, blocks of 16 values,
    sizes that do not fit; it keeps its arrays on B for the next call."""
    import torch

    from crossml.kernels import cpu_int8
    from crossml.ops.contrib.matmul_nbits import _cpu_int8

    if not cpu_int8.AVAILABLE:
        pytest.skip("the int8 kernel needs an x86-64 CPU with AVX2")

    def weight(bs, K, N, zp="packed"):
        nb = -(-K // bs)
        B = torch.zeros(N, nb, bs // 2, dtype=torch.uint8)
        z = {"packed": torch.zeros(N, (nb + 1) // 2, dtype=torch.uint8), "float": torch.zeros(N * nb),
             None: None}[zp]
        return B, torch.ones(N * nb), z, K, N, bs

    assert _cpu_int8(*weight(32, 64, 8)) is not None
    assert _cpu_int8(*weight(32, 64, 8, None)) is not None
    assert _cpu_int8(*weight(32, 64, 8, "float")) is None
    assert _cpu_int8(*weight(16, 64, 8)) is None
    B, s, z, K, N, bs = weight(32, 64, 8)
    assert _cpu_int8(B[:4], s, z, K, N, bs) is None
    first = _cpu_int8(B, s, z, K, N, bs)
    assert _cpu_int8(B, s, z, K, N, bs) is first


def _taken(kernel, A, B, scales, zp, g_idx, bits, K, N, bs, constant):
    """What the op gets from a CPU decode kernel's weight function (``_cpu_laid_out`` / ``_cpu_packed``) for these
    arguments: None where ``_cpu_decode`` turns the product away first."""
    from crossml.ops.contrib.matmul_nbits import _cpu_decode

    return kernel(B, scales, zp, K, N, bs) if _cpu_decode(A, B, scales, zp, g_idx, bits, constant) else None


def test_numba_kernel_only_where_it_applies():
    """The numba kernel declines what it does not take (the next path then runs): more than CPU_PACKED_MAX_M rows,
    weights that are not model constants, other bit widths, g_idx, a B or scales of the wrong size; and it lays a
    weight out once."""
    pytest.importorskip("numba", reason="the numba kernel needs numba (the test extra installs it)")
    import torch

    from crossml.ops.contrib.matmul_nbits import CPU_PACKED_MAX_M, _cpu_laid_out

    def args(N, K, bs, rows=1, bits=4):
        B, scales, zp = quantized_weight(N, K, bits, bs, "packed")
        return (torch.zeros(rows, K), torch.from_numpy(B), torch.from_numpy(scales), torch.from_numpy(zp), None, bits,
                K, N, bs)

    assert _taken(_cpu_laid_out, *args(32, 64, 32), True) is not None
    assert _taken(_cpu_laid_out, *args(24, 80, 16), True) is not None
    assert _taken(_cpu_laid_out, *args(32, 64, 32, rows=CPU_PACKED_MAX_M + 1), True) is None
    assert _taken(_cpu_laid_out, *args(32, 64, 32), False) is None
    assert _taken(_cpu_laid_out, *args(32, 64, 32, bits=8), True) is None
    a = list(args(32, 64, 32))
    a[4] = torch.arange(64, dtype=torch.int32) // 32
    assert _taken(_cpu_laid_out, *a, True) is None
    a = list(args(32, 64, 32))
    a[7] = 33  # N does not match B
    assert _taken(_cpu_laid_out, *a, True) is None
    a = args(32, 64, 32)
    first = _taken(_cpu_laid_out, *a, True)
    assert _taken(_cpu_laid_out, *a, True) is first


def test_cpu_packed_kernel_only_where_it_applies():
    """The packed kernel declines what it does not take (the dequantizing path then runs): more than
    CPU_PACKED_MAX_M rows, K not a multiple of the block, blocks of 16, weights that are not model constants; and it
    packs a weight once."""
    import torch

    from crossml.ops.contrib.matmul_nbits import CPU_PACKED_MAX_M, _cpu_packed

    def args(N, K, bs, rows=1):
        B, scales, zp = quantized_weight(N, K, 4, bs, "packed")
        return (torch.zeros(rows, K), torch.from_numpy(B), torch.from_numpy(scales), torch.from_numpy(zp), None, 4, K,
                N, bs)

    assert _taken(_cpu_packed, *args(32, 64, 32), True) is not None
    assert _taken(_cpu_packed, *args(32, 64, 32, rows=CPU_PACKED_MAX_M + 1), True) is None
    assert _taken(_cpu_packed, *args(24, 64, 32), True) is not None  # N padded to 32 inside
    assert _taken(_cpu_packed, *args(32, 80, 16), True) is None
    assert _taken(_cpu_packed, *args(32, 64, 16), True) is None
    assert _taken(_cpu_packed, *args(32, 64, 32), False) is None
    a = args(32, 64, 32)
    first = _taken(_cpu_packed, *a, True)
    assert all(x is y for x, y in zip(_taken(_cpu_packed, *a, True), first, strict=True))


@pytest.mark.parametrize("path", ["numba", "torch"])
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("case", [(4, 32, 96, 40, "packed"), (4, 16, 80, 37, "float"), (4, 64, 128, 20, None),
                                  (8, 32, 64, 33, None), (2, 32, 64, 50, "packed")],
                         ids=lambda c: f"b{c[0]}_K{c[2]}_N{c[3]}_{c[4]}")
def test_matmul_nbits_cpu_chunks(case, level, path, monkeypatch):
    """Prompt-sized CPU products dequantize and multiply the weight in chunks of rows (a last partial chunk
    included): 4-bit weights through numba's dequantization (``cpu_nbits.product``, checked with a spy) where numba
    is installed, the others and every weight without numba through torch ops. Within onnxruntime's tolerance, and
    the product of the whole dequantized weight up to float32 summation order (a one-row chunk's product may add in
    another order: 5e-6 apart, seen)."""
    import torch

    from crossml.ops.contrib import matmul_nbits as module

    bits, bs, K, N, zp_kind = case
    calls = []
    monkeypatch.setattr(module, "CPU_INT8_ANY_ROWS", ())  # level 4's prompt rows on the dequantizing path here
    if path == "numba":
        pytest.importorskip("numba", reason="the numba path needs numba (the test extra installs it)")
        from crossml.kernels import cpu_nbits

        monkeypatch.setattr(cpu_nbits, "CHUNK_BYTES", 8 * K * 4)  # 8 rows a chunk
        real = cpu_nbits.product
        monkeypatch.setattr(cpu_nbits, "product", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    else:
        real_load = module.load
        monkeypatch.setattr(module, "load", lambda name: None if name == "cpu_nbits" else real_load(name))
        monkeypatch.setattr(module, "CPU_DEQUANT_CHUNK_BYTES", 8 * -(-K // bs) * bs * 4)  # 8 rows a chunk
    _run(*case, level=level, M=(2, 9))
    assert bool(calls) == (path == "numba" and bits == 4)
    B, scales, zp = (None if t is None else torch.from_numpy(t) for t in quantized_weight(N, K, bits, bs, zp_kind))
    a = torch.from_numpy(RNG.standard_normal((3, K)).astype(np.float32))
    chunked = module._dequantized_product_cpu(a, B, scales, zp, K=K, N=N, bits=bits, block_size=bs)
    whole = a @ module.dequantize_nbits(B, scales, zp, None, K=K, N=N, bits=bits, block_size=bs,
                                        dtype=torch.float32).T
    torch.testing.assert_close(chunked, whole, rtol=2e-5, atol=2e-5)


def test_report_level4():
    """Print the accuracy-level-4 differences (run with -s to see them)."""
    if LEVEL4_DIFFS:
        print("\nMatMulNBits accuracy_level=4 max |crossml - onnxruntime|:")
        for k, v in LEVEL4_DIFFS.items():
            print(f"  {k}: {v:.3g}")


# ---------------------------------------------------------------- GatherBlockQuantized


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("with_zp", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gather_block_quantized_uint8(bits, block_size, with_zp, dtype):
    vocab, hidden = 50, 256
    nb = hidden // block_size
    q = RNG.integers(0, 1 << bits, size=(vocab, hidden))
    data = pack(q, bits) if bits < 8 else q.astype(np.uint8)
    scales = (RNG.random((vocab, nb)) * 0.1 + 0.01).astype(dtype)
    inits = {"data": data, "scales": scales}
    if with_zp:
        zq = RNG.integers(0, 1 << bits, size=(vocab, nb))
        inits["zp"] = pack(zq, bits) if bits < 8 else zq.astype(np.uint8)
    idx = RNG.integers(-vocab, vocab, size=(2, 7)).astype(np.int64)
    ins = {"data": None, "idx": idx, "scales": None, "zp": None}
    t = TP.FLOAT if dtype == np.float32 else TP.FLOAT16
    check("GatherBlockQuantized", ins, [("y", t)], inits, atol=1e-6, rtol=1e-3, bits=bits, block_size=block_size,
          gather_axis=0, quantize_axis=1)


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("gather_axis,quantize_axis", [(0, 1), (1, 0), (0, 0), (1, 1), (0, 2), (2, 1)])
@pytest.mark.parametrize("with_zp", [False, True])
def test_gather_block_quantized_int4(signed, gather_axis, quantize_axis, with_zp):
    import ml_dtypes

    shape = [6, 32, 16] if quantize_axis != 2 else [6, 4, 32]
    shape = shape[:3]
    block_size = 16
    lo, hi = (-8, 8) if signed else (0, 16)
    dt = ml_dtypes.int4 if signed else ml_dtypes.uint4
    data = RNG.integers(lo, hi, size=shape).astype(dt)
    sshape = list(shape)
    sshape[quantize_axis] = -(-shape[quantize_axis] // block_size)
    scales = (RNG.random(sshape) + 0.5).astype(np.float32)
    inits = {"data": data, "scales": scales}
    if with_zp:
        inits["zp"] = RNG.integers(lo, hi, size=sshape).astype(dt)
    idx = RNG.integers(0, shape[gather_axis], size=(3,)).astype(np.int32)
    ins = {"data": None, "idx": idx, "scales": None, "zp": None}
    check("GatherBlockQuantized", ins, [("y", TP.FLOAT)], inits, atol=1e-6, bits=4, block_size=block_size,
          gather_axis=gather_axis, quantize_axis=quantize_axis)


def test_constant_weight_needs_b_scales_and_zero_points_constant() -> None:
    """The rule MatMulNBits (weight inputs 1-3) and NormMatMulNBits (3-5) share: B and scales constants of the
    model, zero points absent or constant; no context (a direct call) is not constant."""
    import torch

    from crossml.ops.contrib.matmul_nbits import constant_weight
    from crossml.ops.registry import OpContext

    def ctx(*consts: bool) -> OpContext:
        return OpContext("n", "MatMulNBits", 1, 1, (None,), (True,), const_inputs=consts)

    zp = torch.zeros(1, dtype=torch.uint8)
    assert constant_weight(ctx(False, True, True), 1, None)
    assert not constant_weight(ctx(False, True, False), 1, None)
    assert constant_weight(ctx(False, True, True, True), 1, zp)
    assert not constant_weight(ctx(False, True, True, False), 1, zp)
    assert not constant_weight(ctx(False, True, True), 1, zp)  # zero points' input not marked
    assert constant_weight(ctx(False, False, False, True, True, True), 3, zp)
    assert not constant_weight(ctx(False, False, False, True, False, True), 3, zp)
    assert not constant_weight(None, 1, None)


@pytest.mark.parametrize("with_zp", [False, True])
def test_gather_4bit_rows_cpu_kernel_equals_torch_path(with_zp, monkeypatch):
    """4-bit rows with float32 scales take numba's CPU gather (crossml.kernels.cpu_gather): the torch path's values
    bit for bit, zeros for indices outside [-V, V)."""
    import torch

    from crossml.kernels import load
    from crossml.ops.contrib import matmul_nbits as mnb

    kernels = load("cpu_gather")
    if kernels is None:
        pytest.skip("numba is not installed: the torch path is the only one")
    vocab, hidden, block = 40, 128, 32
    nb = hidden // block
    data = torch.from_numpy(pack(RNG.integers(0, 16, size=(vocab, hidden)), 4))
    scales = torch.from_numpy((RNG.random((vocab, nb)) * 0.1 + 0.01).astype(np.float32))
    zp = torch.from_numpy(pack(RNG.integers(0, 16, size=(vocab, nb)), 4)) if with_zp else None
    idx = torch.tensor([[0, 39, -1, -40], [7, 40, -41, 12]])
    calls = []
    real = kernels.gather_rows
    monkeypatch.setattr(kernels, "gather_rows", lambda *a: calls.append(1) or real(*a))
    got = mnb.gather_block_quantized(data, idx, scales, zp, bits=4, block_size=block)
    assert calls
    monkeypatch.setattr(mnb, "_cpu_gather", lambda *a: False)
    want = mnb.gather_block_quantized(data, idx, scales, zp, bits=4, block_size=block)
    assert got.shape == want.shape == (2, 4, hidden)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert not got[1, 1].any() and not got[1, 2].any()  # 40 and -41 are outside the 40 rows

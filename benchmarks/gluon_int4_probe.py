"""Probe: a 4-bit product for 1 to 16 rows whose weights are dequantized straight into the matrix units' operand
registers (Gluon, Triton 3.6's layout-explicit language), against the shipped kernels.

``crossml.kernels.matmul_nbits._matmul_nbits_dot_kernel`` multiplies with ``tl.dot``. Triton keeps its dequantized
weight tiles on a shared-memory round trip. That round trip, with the dequantization, bounds the kernel at about
1.1 TB/s at Llama-3.2-1B's lm_head (H200, 8 rows). Gluon (``triton.experimental.gluon``) names the layouts itself.
A tile built in the ``mma_v2`` B-operand layout (``DotOperandLayout(1, NVMMADistributedLayout v2, k_width=2)``)
goes to the matrix units without that round trip.

``_probe_kernel``:

- it loads int32 words of a weight repacked once (``repack``) so that each thread's word holds the eight nibbles
  its operand fragment needs;
- for block size 32, word t of a row's block holds K offsets 2t, 2t+8, 2t+16, 2t+24 in nibbles 0-3 and the odd
  neighbours in nibbles 4-7;
- a lop3 turns two nibbles into an fp16 pair under the exponent of 1024, as ``_NIBBLE_DQ_PTX`` does;
- one fma leaves q - zero point exactly and one multiply applies the scale: bit for bit ``dequantize``;
- one ``mma_v2`` then takes 16 rows of activations (rows past M are zeros).

The probe launches with programmatic dependent launch as the shipped kernels do, but waits for the previous kernel
before its first load; the shipped kernels request their first weight tiles before that wait, an edge in graphs of
back-to-back calls that the probe lacks (see ``_probe_kernel``).

``--compile`` compiles the probe for sm_90 without a GPU and reports the SASS of its main loop, instructions per
weight held by a thread. ``--check`` runs the probe's index arithmetic in torch on the CPU and compares the weights
it builds with ``dequantize`` bit for bit. With a GPU, ``--run`` checks the probe's products against ``dequantize``
then a float32 matmul. It also times them in CUDA graphs against ``matmul_nbits`` (its GEMVs and matrix-unit kernel)
at the GenAI benchmark's decode shapes (``gemv_tiles.SHAPES``).

    python benchmarks/gluon_int4_probe.py --compile --check           # no GPU needed
    python benchmarks/gluon_int4_probe.py --run --rows 1,2,4,8,16 [--sweep]  # a CUDA GPU of compute capability 8.0+

Writes OUT/gluon_int4_probe.{json,md}.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

sys.path.insert(0, os.path.dirname(__file__))
from _common import in_graph_us, machine, results_parser, write  # noqa: E402

BLOCK_SIZE = 32

#: two nibbles of ``$2 >> shift`` (mask $3) under the exponent of 1024 as an fp16 pair, times $4 (1, or 1/16 for the
#: upper nibbles, which land as 16 q) plus $5 (-(1024 + zero point), or -(64 + zero point)): q - zero point exactly
_PAIR_PTX = gl.constexpr("""
{
.reg .b32 x, c2;
lop3.b32 x, $2, $3, 0x64006400, 0xEA;
mov.b32 c2, {$5, $5};
fma.rn.f16x2 x, x, $4, c2;
mov.b32 {$0, $1}, x;
}
""")


@gluon.jit
def _weight_step(w_ptr, s_ptr, z_ptr, row, ip, k0, K, ZP_BYTES):
    """The words, scales and zero-point bytes of the K step at ``k0``, per pair element of the B-operand tile."""
    blk = (k0 // 32 + ip // 16)[:, None]
    word = gl.load(w_ptr + row * (K // 8) + blk * 4 + (ip % 4)[:, None])
    sc = gl.load(s_ptr + row * (K // 32) + blk)
    zb = gl.load(z_ptr + row * ZP_BYTES + blk // 2).to(gl.int32)
    return word, sc, zb


@gluon.jit
def _mma_step(acc, a_ptr, a_off, a_ok, word, sc, zb, ip, k0, b_l: gl.constexpr):
    """acc + the activations at ``a_off`` + k0 times the step's weights, dequantized in the B-operand layout."""
    a = gl.load(a_ptr + a_off + k0, mask=a_ok, other=0.0)
    j = (ip % 16) // 4  # which of its word's four pairs
    shift = ((j // 2) * 8)[:, None]
    mask = gl.where(j % 2 == 1, 0x00F000F0, 0x000F000F)[:, None]
    mul = gl.where(j % 2 == 1, 0x2C002C00, 0x3C003C00)[:, None]  # 1/16 or 1 in both halves
    odd = (j % 2 == 1)[:, None]
    blk = (k0 // 32 + ip // 16)[:, None]
    zp = (zb >> ((blk % 2) * 4)) & 0xF
    c = (gl.where(odd, 0xD400 | (zp << 4), 0xE400 | zp)).to(gl.int16)  # fp16 bits of -(64 + zp), -(1024 + zp)
    lo, hi = gl.inline_asm_elementwise(_PAIR_PTX, "=h,=h,r,r,r,h", [word >> shift, mask, mul, c],
                                       dtype=(gl.float16, gl.float16), is_pure=True, pack=1)
    w = gl.reshape(gl.permute(gl.join(lo * sc, hi * sc), (0, 2, 1)), (2 * ip.shape[0], sc.shape[1]))
    return mma_v2(a, gl.convert_layout(w, b_l), acc)


@gluon.jit
def _probe_kernel(a_ptr, w_ptr, s_ptr, z_ptr, y_ptr, M, K, N, K_PER_SPLIT, s_am, s_ym, s_ys, ZP_BYTES,
                  BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, WARPS: gl.constexpr, PDL: gl.constexpr = False):
    """y[split, M, N] (float32) = a[M <= 16, K range of the split] @ dequantize(W)^T for W repacked by ``repack``
    (block size 32, fp16 scales [N, K / 32], packed zero points [N, ZP_BYTES]); grid (N / BLOCK_N, splits), K a
    multiple of BLOCK_K and K_PER_SPLIT of BLOCK_K, N of BLOCK_N. PDL: launched with ``launch_pdl``, it waits for the
    previous kernel first. (Requesting the first step's weights before that wait, as the shipped kernels do, peels
    the loop's first step, and ptxas then adds a PRMT per weight to the loop: 4.7 against 3.8 SASS instructions a
    weight at 64 x 64 tiles.)"""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=1)  # fp16 pairs along K, as int32
    n0 = gl.program_id(0) * BLOCK_N
    acc = gl.zeros([16, BLOCK_N], gl.float32, mma)
    ka = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, a_l))
    ma = gl.arange(0, 16, layout=gl.SliceLayout(1, a_l))
    ip = gl.arange(0, BLOCK_K // 2, layout=gl.SliceLayout(1, p_l))  # pair index: K positions 2 ip, 2 ip + 1
    nb = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, p_l))
    row = (n0 + nb)[None, :]
    a_off = ma[:, None] * s_am + ka[None, :]
    a_ok = (ma < M)[:, None]
    k_lo = gl.program_id(1) * K_PER_SPLIT
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    for k0 in range(k_lo, gl.minimum(K, k_lo + K_PER_SPLIT), BLOCK_K):
        word, sc, zb = _weight_step(w_ptr, s_ptr, z_ptr, row, ip, k0, K, ZP_BYTES)
        acc = _mma_step(acc, a_ptr, a_off, a_ok, word, sc, zb, ip, k0, b_l)
    mo = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    no = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    gl.store(y_ptr + gl.program_id(1) * s_ys + mo[:, None] * s_ym + (n0 + no)[None, :], acc, mask=(mo < M)[:, None])


def repack(b: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """MatMulNBits' packed B ([N, K / 32, 16] uint8, block size 32, low nibble first) as the probe's int32 words
    [N, K / 8]: word t of block b holds the nibbles of K offsets 2t, 2t+8, 2t+16, 2t+24 (nibbles 0-3) and 2t+1,
    2t+9, 2t+17, 2t+25 (nibbles 4-7)."""
    q = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(N, K // 32, 32).to(torch.int64)
    t = torch.arange(4)
    offs = torch.stack([2 * t, 2 * t + 8, 2 * t + 16, 2 * t + 24, 2 * t + 1, 2 * t + 9, 2 * t + 17, 2 * t + 25], 1)
    nib = q[:, :, offs.to(q.device)]  # [N, blocks, 4 words, 8 nibbles]
    words = (nib << (4 * torch.arange(8, device=q.device))).sum(-1)  # < 2**32
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).reshape(N, K // 8)


def emulate_weights(words: torch.Tensor, scales: torch.Tensor, zp: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """The fp16 [K, N] tile the probe hands to mma_v2, built on the CPU with the kernel's index arithmetic (word,
    shift, mask, magic per pair index), for ``--check``."""
    ip = torch.arange(K // 2)
    j = (ip % 16) // 4
    blk = ip // 16
    w = words.to(torch.int64) & 0xFFFFFFFF  # [N, K / 8]
    word = w[:, blk * 4 + ip % 4]  # [N, K / 2]
    x = (word >> ((j // 2) * 8)) & torch.where(j % 2 == 1, 0x00F000F0, 0x000F000F)
    lo_bits, hi_bits = (x & 0xFFFF) | 0x6400, (x >> 16) | 0x6400  # each below 2**15: no sign to mind

    zpn = torch.stack([zp & 0xF, zp >> 4], -1).reshape(N, -1)[:, : K // 32].to(torch.int64)[:, blk]  # [N, K / 2]
    mul = torch.where(j % 2 == 1, 1.0 / 16, 1.0)
    c = torch.where(j % 2 == 1, 0xD400 | (zpn << 4), 0xE400 | zpn)  # the kernel's fp16 bits of c
    c = torch.where(c >= 2**15, c - 2**16, c).to(torch.int16).view(torch.float16)
    if not torch.equal(c, (-(zpn + torch.where(j % 2 == 1, 64, 1024))).to(torch.float16)):
        raise AssertionError("the fp16 bits of -(64 + zp) / -(1024 + zp) are not the kernel's")
    sc = scales.reshape(N, K // 32)[:, blk]
    out = []
    for bits in (lo_bits, hi_bits):
        v = bits.to(torch.int16).view(torch.float16)
        # fma.rn.f16x2: x * mul + c, rounded once (exact here: every value is a small integer)
        d = (v.to(torch.float32) * mul + c.to(torch.float32)).to(torch.float16)
        out.append((d.to(torch.float32) * sc.to(torch.float32)).to(torch.float16))  # mul.rn in fp16
    return torch.stack(out, -1).reshape(N, K).t()


def check(n: int = 64, k: int = 256) -> None:
    """The emulated tile against ``dequantize_nbits`` bit for bit, random weights, packed zero points."""
    from crossml.ops.contrib.matmul_nbits import dequantize_nbits

    g = torch.Generator().manual_seed(0)
    b = torch.randint(0, 256, (n, k // 32, 16), dtype=torch.uint8, generator=g)
    s = (torch.rand(n, k // 32, generator=g) * 0.01).half()
    z = torch.randint(0, 256, (n, (k // 32 + 1) // 2), dtype=torch.uint8, generator=g)
    ref = dequantize_nbits(b, s, z, None, K=k, N=n, bits=4, block_size=32, dtype=torch.float16)
    got = emulate_weights(repack(b, n, k), s, z, n, k).t()
    bad = (got.view(torch.int16) != ref.view(torch.int16)).sum().item()
    print(f"check: {n}x{k} emulated probe weights vs dequantize_nbits: {bad} of {n * k} differ", flush=True)
    if bad:
        raise SystemExit("the probe's index arithmetic does not reproduce dequantize")


def _loop_sass(cubin: bytes) -> tuple[int, collections.Counter]:
    """(instructions, their opcodes) of the main loop, the longest backward branch's body, of a compiled kernel."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,5})\*/\s+(.*?);", sass)]
    loop: list = []
    for addr, text in ins:
        m = re.search(r"BRA.*0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [x for x in ins if int(m.group(1), 16) <= x[0] <= addr]
            loop = body if len(body) > len(loop) else loop
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for _, t in loop)
    return len(loop), ops


def _sass_report(kernel: str, compiled: Any, block_n: int, block_k: int, warps: int) -> dict:
    """The loop's SASS of a kernel compiled for BLOCK_N x BLOCK_K weight tiles at ``warps`` warps, per weight a
    thread holds; printed, and returned for the results."""
    n, ops = _loop_sass(compiled.asm["cubin"])
    per_thread = block_n * block_k // (32 * warps)
    shared = compiled.metadata.shared
    print(f"compile {kernel} {block_n}x{block_k} {warps} warps: loop {n} instructions for {per_thread} weights a "
          f"thread ({n / per_thread:.2f} each), shared {shared} B; {dict(ops.most_common(8))}", flush=True)
    return {"kernel": kernel, "block_n": block_n, "block_k": block_k, "warps": warps, "loop_instructions": n,
            "weights_per_thread": per_thread, "per_weight": n / per_thread, "shared_bytes": shared,
            "ops": dict(ops.most_common(12))}


def compile_report(configs: list[tuple[int, int, int]]) -> list[dict]:
    """``_sass_report`` of the probe for each (BLOCK_N, BLOCK_K, warps) of ``configs``, compiled for sm_90."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {"a_ptr": "*fp16", "w_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*u8", "y_ptr": "*fp32", "M": "i32",
           "K": "i32", "N": "i32", "K_PER_SPLIT": "i32", "s_am": "i32", "s_ym": "i32", "s_ys": "i32", "ZP_BYTES": "i32",
           "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "WARPS": "constexpr"}
    rows = []
    for block_n, block_k, warps in configs:
        src = GluonASTSource(fn=_probe_kernel, signature=sig,
                             constexprs={"BLOCK_N": block_n, "BLOCK_K": block_k, "WARPS": warps},
                             attrs={(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11)})
        out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        rows.append(_sass_report("probe", out, block_n, block_k, warps))
    return rows


def compile_shipped() -> dict:
    """``_sass_report`` of the shipped matrix-unit kernel at its rule's tiles for 16-row tiles (64 weight rows by
    128 values of K, 4 warps; fp16, packed zero points, PTX dequantization, two dots, K a multiple of the step)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from crossml.kernels.matmul_nbits import DOT_OPTIONS
    from crossml.kernels.matmul_nbits import _matmul_nbits_dot_kernel as kernel

    sig = {"a_ptr": "*fp16", "w_ptr": "*u8", "s_ptr": "*fp16", "z_ptr": "*u8", "bias_ptr": "*fp16", "y_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "N_BLOCKS": "i32", "ROW_BYTES": "i32", "K_PER_SPLIT": "i32",
           "s_am": "i32", "s_zn": "i32", "s_ym": "i32", "s_ys": "i32"}
    consts = {"BS": 32, "ZP": 1, "HAS_BIAS": False, "PARTIAL": True, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128,
              "CONST_W": True, "F32_DOT": False, "FAST_DQ": True, "PTX_DQ": True, "A_AHEAD": True, "EVEN_K": True,
              "HALVES": True, "MAGIC_BITS": 0x6400, "MAGIC": 1024.0, "PDL": False}
    sig.update(dict.fromkeys(consts, "constexpr"))
    div16 = ["a_ptr", "w_ptr", "s_ptr", "z_ptr", "bias_ptr", "y_ptr", "N", "K", "ROW_BYTES", "K_PER_SPLIT", "s_am",
             "s_ym", "s_ys"]
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts,
                    attrs={(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in div16})
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4,
                                                                       "num_stages": DOT_OPTIONS["stages"]})
    return _sass_report("_matmul_nbits_dot_kernel", out, 64, 128, 4)


def probe(a: torch.Tensor, words: torch.Tensor, s: torch.Tensor, z: torch.Tensor, N: int, K: int,
          tiles: tuple[int, int, int], per_sm: int) -> torch.Tensor:
    """``a @ dequantize(W)^T`` in a's dtype: the probe with K split until there are about ``per_sm`` programs per SM
    (whole BLOCK_K steps, at most 64 splits), then the fp16 GEMV's reduction kernel (a fixed order), as the shipped
    matrix-unit kernel does."""
    from crossml.kernels._launch import cdiv, pdl, processors
    from crossml.kernels.gemv import _k_per_split, _reduce_tiles, _split_k_reduce_kernel

    block_n, block_k, warps = tiles
    M = a.shape[0]
    if M > 16 or K % block_k or N % block_n:
        raise ValueError(f"probe: at most 16 rows, K a multiple of {block_k}, N of {block_n}")
    n_prog = N // block_n
    split = max(1, min(cdiv(per_sm * processors(a), n_prog), K // block_k, 64))
    k_per_split = _k_per_split(K, split, block_k)
    split = cdiv(K, k_per_split)
    ws = torch.empty(split, M, N, device=a.device, dtype=torch.float32)
    _probe_kernel[(n_prog, split)](a, words, s, z, ws, M, K, N, k_per_split, a.stride(0), N, M * N, z.shape[-1],
                                   BLOCK_N=block_n, BLOCK_K=block_k, WARPS=warps, num_warps=warps, **pdl(a))
    y = torch.empty(M, N, device=a.device, dtype=a.dtype)
    block_s, block, reduce_warps = _reduce_tiles(split)
    _split_k_reduce_kernel[(cdiv(M * N, block),)](ws, ws, y, M * N, N, split, HAS_BIAS=False, BLOCK_S=block_s,
                                                   BLOCK=block, num_warps=reduce_warps, **pdl(a))
    return y


#: --sweep's probe settings: (BLOCK_N, BLOCK_K, warps) x programs per SM
SWEEP = [(tiles, per_sm) for tiles in ((64, 64, 1), (64, 128, 1), (128, 64, 2), (64, 64, 4)) for per_sm in (4, 8, 16)]


def run(rows: list[int], tiles: tuple[int, int, int], per_sm: int, sweep: bool = False) -> list[dict]:
    from gemv_tiles import SHAPES, int4_inputs

    from crossml.kernels import matmul_nbits as nbits

    dev = torch.device("cuda")
    out = []
    for model, layer, N, K in SHAPES:
        _, ws = int4_inputs(N, K, dev)
        packed = [(repack(b, N, K), s, z) for b, s, z in ws]
        for m in rows:
            a = torch.randn(m, K, device=dev, dtype=torch.float16)
            b, s, z = ws[0]
            ref = a.float() @ nbits.dequantize(b, s, z, K=K, N=N, block_size=BLOCK_SIZE, dtype=torch.float16).float().t()
            err = (probe(a, *packed[0], N, K, tiles, per_sm).float() - ref).abs().max().item() \
                / max(ref.abs().max().item(), 1e-6)
            shipped = in_graph_us([lambda w=w, a=a, K=K, N=N: nbits.matmul_nbits(a, *w, K=K, N=N, block_size=BLOCK_SIZE,
                                                                                 const_w=True) for w in ws])
            mine = in_graph_us([lambda p=p, a=a, K=K, N=N: probe(a, *p, N, K, tiles, per_sm) for p in packed])
            r = {"model": model, "layer": layer, "N": N, "K": K, "M": m, "rel_err": err, "shipped_us": shipped,
                 "probe_us": mine}
            if sweep:
                points = []
                for t, p_sm in SWEEP:
                    try:
                        e = (probe(a, *packed[0], N, K, t, p_sm).float() - ref).abs().max().item() \
                            / max(ref.abs().max().item(), 1e-6)
                        us = in_graph_us([lambda p=p, a=a, K=K, N=N, t=t, p_sm=p_sm: probe(a, *p, N, K, t, p_sm)
                                          for p in packed])
                        points.append({"tiles": list(t), "per_sm": p_sm, "us": us, "rel_err": e})
                    except Exception as exc:  # noqa: BLE001 - a setting the compiler or the shape rejects
                        points.append({"tiles": list(t), "per_sm": p_sm, "us": None, "error": str(exc)[:200]})
                r["sweep"] = sorted(points, key=lambda q: float("inf") if q["us"] is None else q["us"])
            best = f", best swept {r['sweep'][0]['us']:.1f} us {r['sweep'][0]['tiles']} x{r['sweep'][0]['per_sm']}" \
                if sweep and r["sweep"][0]["us"] is not None else ""
            print(f"{model} {layer} M={m}: shipped {shipped:.1f} us, probe {mine:.1f} us, rel err {err:.2e}{best}",
                  flush=True)
            out.append(r)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = results_parser(__doc__)
    ap.add_argument("--compile", action="store_true", help="compile for sm_90 (no GPU needed), report the loop's SASS")
    ap.add_argument("--check", action="store_true", help="the probe's index arithmetic against dequantize (CPU)")
    ap.add_argument("--run", action="store_true", help="correctness and timings on a CUDA GPU")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--tiles", default="64,64,1", help="BLOCK_N,BLOCK_K,WARPS for --run")
    ap.add_argument("--per-sm", type=int, default=8, help="programs per SM that K is split to reach (--run)")
    ap.add_argument("--sweep", action="store_true", help="with --run, also time every setting of SWEEP")
    args = ap.parse_args(argv)
    payload: dict = {"benchmark": "gluon_int4_probe", "machine": machine()}
    if args.check:
        check()
        payload["check"] = "the emulated weights equal dequantize_nbits bit for bit"
    if args.compile:
        payload["compile"] = [*compile_report([(64, 64, 1), (64, 128, 1), (128, 64, 2), (64, 64, 4)]),
                              compile_shipped()]
    if args.run:
        if not torch.cuda.is_available():
            sys.exit("--run needs a CUDA GPU")
        payload["run"] = run([int(r) for r in args.rows.split(",")], tuple(int(t) for t in args.tiles.split(",")),
                             args.per_sm, args.sweep)
        payload["tiles"], payload["per_sm"] = args.tiles, args.per_sm
    lines = ["# Probe: 4-bit weights dequantized into the mma operand layout (Gluon)", ""]
    if "check" in payload:
        lines += ["The probe's index arithmetic, run in torch on the CPU (`--check`): its fp16 weights equal "
                  "`dequantize_nbits` bit for bit (64 x 256, random weights, packed zero points).", ""]
    if "run" not in payload:
        lines += ["No GPU run in this file: the compile report is of SASS for sm_90, compiled without a GPU, and says "
                  "nothing of speed.", ""]
    for r in payload.get("compile", []):
        what = "the probe" if r["kernel"] == "probe" else f"the shipped matrix-unit kernel (`{r['kernel']}`)"
        lines.append(f"- sm_90 compile of {what}, {r['block_n']} x {r['block_k']} tiles, {r['warps']} warps: loop "
                     f"{r['loop_instructions']} SASS instructions for {r['weights_per_thread']} weights a thread "
                     f"({r['per_weight']:.2f} each), shared memory {r['shared_bytes']} B")
    for r in payload.get("run", []):
        best = r.get("sweep", [{}])[0]
        swept = f"; best swept {best['us']:.1f} us at {best['tiles']}, {best['per_sm']} per SM" if best.get("us") else ""
        lines.append(f"- {r['model']} {r['layer']} M={r['M']}: matmul_nbits {r['shipped_us']:.1f} us, probe "
                     f"{r['probe_us']:.1f} us (relative error {r['rel_err']:.1e}){swept}")
    lines += ["", "Produced by benchmarks/gluon_int4_probe.py.", ""]
    write("gluon_int4_probe", payload, "\n".join(lines), args.out)


if __name__ == "__main__":
    main()

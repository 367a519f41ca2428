"""The Gluon mma kernel for 4-bit products of 2 to 16 rows (``crossml.kernels.nbits_mma``) against the kernels it
replaced there: the per-row GEMVs and the ``tl.dot`` matrix-unit kernel (``_matmul_nbits_dot_kernel``).

At Qwen2.5-0.5B's and Llama-3.2-1B's decode shapes (``gemv_tiles.SHAPES``; block size 32, packed zero points,
constant weights, copies of the weight together larger than L2, timed inside CUDA graphs as ``gemv_tiles.py``
times them), per number of rows M:

* ``gemv``: ``matmul_nbits(mma=False, dot=False)``, the float32 or fp16-pair GEMV at its rule's tiles (to 16 rows);
* ``dot``: ``matmul_nbits(dot=True)``, the ``tl.dot`` kernel at its rule's tiles;
* ``mma``: ``matmul_nbits(mma=True)`` at ``nbits_mma.pick_tiles``' tiles, and with ``--sweep`` the fastest
  points of ``SWEEP`` (each checked against ``dequantize`` then a float32 matmul);
* ``routed``: ``matmul_nbits`` as the op calls it.

``--compile`` (no GPU needed) compiles the mma kernel and the ``tl.dot`` kernel for sm_90 and reports their main
loops' SASS: instructions per weight a thread holds, the loads, and shared memory.

    python benchmarks/int4_mma.py --compile
    python benchmarks/int4_mma.py --run [--rows 1,2,4,8,16] [--sweep]    # a CUDA GPU of compute capability 8.0+

Writes OUT/int4_mma.{json,md}.
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

sys.path.insert(0, os.path.dirname(__file__))
from _common import in_graph_us, machine, results_parser, write  # noqa: E402

from crossml.kernels import matmul_nbits as nbits  # noqa: E402

BLOCK_SIZE = 32

#: --sweep's tiles: (BLOCK_N, WARPS, DEPTH) x programs per SM that K is split to reach
SWEEP = [((bn, w, d), per_sm) for bn, w in ((32, 1), (64, 1), (64, 2), (128, 2), (128, 4)) for d in (1, 2)
         for per_sm in (2, 4, 8)]


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
    loads = {k: v for k, v in ops.items() if k.startswith(("LD", "ST"))}
    print(f"compile {kernel} {block_n}x{block_k} {warps} warps: loop {n} instructions for {per_thread} weights a "
          f"thread ({n / per_thread:.2f} each), shared {shared} B; loads {loads}; {dict(ops.most_common(8))}",
          flush=True)
    return {"kernel": kernel, "block_n": block_n, "block_k": block_k, "warps": warps, "loop_instructions": n,
            "weights_per_thread": per_thread, "per_weight": n / per_thread, "shared_bytes": shared, "loads": loads,
            "ops": dict(ops.most_common(12))}


_DIV16 = ["a_ptr", "w_ptr", "s_ptr", "z_ptr", "bias_ptr", "y_ptr", "N", "K", "s_am", "s_ym", "s_ys"]


def compile_mma(block_n: int, warps: int, depth: int) -> dict:
    """``_sass_report`` of the mma kernel for sm_90: packed zero points, K split (float32 partial sums)."""
    from crossml.kernels.nbits_mma import BLOCK_K, compile_for

    out = compile_for(90, BLOCK_N=block_n, WARPS=warps, DEPTH=depth)
    return _sass_report(f"nbits_mma depth {depth}", out, block_n, BLOCK_K, warps)


def compile_dot() -> dict:
    """``_sass_report`` of the ``tl.dot`` kernel at its rule's tiles for 16-row tiles (64 weight rows by 128 values
    of K, 4 warps; fp16, packed zero points, PTX dequantization, two dots, K a multiple of the step)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from crossml.kernels.matmul_nbits import DOT_OPTIONS
    from crossml.kernels.matmul_nbits import _matmul_nbits_dot_kernel as kernel

    sig = {"a_ptr": "*fp16", "w_ptr": "*u8", "s_ptr": "*fp16", "z_ptr": "*u8", "bias_ptr": "*fp16", "y_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "N_BLOCKS": "i32", "ROW_BYTES": "i32", "K_PER_SPLIT": "i32",
           "s_am": "i32", "s_zn": "i32", "s_ym": "i32", "s_ys": "i32"}
    consts = {"BS": BLOCK_SIZE, "ZP": 1, "HAS_BIAS": False, "PARTIAL": True, "BLOCK_M": 16, "BLOCK_N": 64,
              "BLOCK_K": 128, "CONST_W": True, "F32_DOT": False, "FAST_DQ": True, "PTX_DQ": True, "A_AHEAD": True,
              "EVEN_K": True, "HALVES": True, "MAGIC_BITS": 0x6400, "MAGIC": 1024.0, "PDL": False}
    sig.update(dict.fromkeys(consts, "constexpr"))
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts,
                    attrs={(kernel.arg_names.index(n),): [["tt.divisibility", 16]]
                           for n in [*_DIV16, "ROW_BYTES", "K_PER_SPLIT"]})
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4,
                                                                       "num_stages": DOT_OPTIONS["stages"]})
    return _sass_report("_matmul_nbits_dot_kernel", out, 64, 128, 4)


def _timed(a: torch.Tensor, ws: list[tuple], ref: torch.Tensor, N: int, K: int, tiles: tuple | None = None,
           **how: Any) -> tuple[float, float]:
    """(µs of ``matmul_nbits(a, w, **how)`` inside a CUDA graph of one call per weight copy of ``ws``, its relative
    error against ``ref`` on the first copy)."""
    def call(w: tuple) -> torch.Tensor:
        return nbits.matmul_nbits(a, *w, K=K, N=N, block_size=BLOCK_SIZE, const_w=True, tiles=tiles, **how)

    err = (call(ws[0]).float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
    return in_graph_us([lambda w=w: call(w) for w in ws]), err


def run(rows: list[int], sweep: bool) -> list[dict]:
    from gemv_tiles import SHAPES, int4_inputs

    from crossml.kernels import nbits_mma
    from crossml.kernels._launch import cdiv, processors

    dev = torch.device("cuda")
    sms = processors(torch.empty(0, device=dev))
    out = []
    for model, layer, N, K in SHAPES:
        _, ws = int4_inputs(N, K, dev)
        for m in rows:
            a = torch.randn(m, K, device=dev, dtype=torch.float16)
            b, s, z = ws[0]
            ref = a.float() @ nbits.dequantize(b, s, z, K=K, N=N, block_size=BLOCK_SIZE,
                                               dtype=torch.float16).float().t()

            r: dict = {"model": model, "layer": layer, "N": N, "K": K, "M": m}
            if m <= 16:  # (past 16 rows the GEMVs run a grid row per 16 rows: far behind)
                r["gemv_us"], r["gemv_err"] = _timed(a, ws, ref, N, K, mma=False, dot=False)
            if m >= 2:
                r["dot_us"], r["dot_err"] = _timed(a, ws, ref, N, K, mma=False, dot=True)
            r["mma_tiles"] = list(nbits_mma.pick_tiles(m, N, K, sms))
            r["mma_us"], r["mma_err"] = _timed(a, ws, ref, N, K, mma=True)
            r["routed_us"], _ = _timed(a, ws, ref, N, K)
            if sweep:
                points = []
                for (bn, w, d), per_sm in SWEEP:
                    split = max(1, min(cdiv(per_sm * sms, cdiv(N, bn)), K // nbits_mma.BLOCK_K, 64))
                    us, err = _timed(a, ws, ref, N, K, (bn, w, d, split), mma=True)
                    points.append({"tiles": [bn, w, d, split], "per_sm": per_sm, "us": us, "rel_err": err})
                r["sweep"] = sorted(points, key=lambda q: q["us"])
            best = f", best swept {r['sweep'][0]['us']:.1f} us {r['sweep'][0]['tiles']}" if sweep else ""
            print(f"{model} {layer} M={m}: gemv {r.get('gemv_us', float('nan')):.1f}, dot {r.get('dot_us', float('nan')):.1f}, mma "
                  f"{r['mma_us']:.1f} {r['mma_tiles']} (rel err {r['mma_err']:.1e}), routed {r['routed_us']:.1f}"
                  f"{best}", flush=True)
            out.append(r)
    return out


def markdown(payload: dict) -> str:
    lines = ["# 4-bit products of 2 to 16 rows: the Gluon mma kernel against the GEMVs and the tl.dot kernel", ""]
    if "run" in payload:
        lines += [f"GPU: {payload['machine'].get('gpu', '?')}. Microseconds a product inside CUDA graphs of copies of "
                  "the weight together larger than L2 (block size 32, packed zero points, constant weights). "
                  "`routed` is what the op runs.", "",
                  "| model | product | M | gemv | tl.dot | mma (tiles) | routed | best swept mma |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in payload["run"]:
            best = f"{r['sweep'][0]['us']:.1f} {tuple(r['sweep'][0]['tiles'])}" if "sweep" in r else ""
            dot = f"{r['dot_us']:.1f}" if "dot_us" in r else ""
            gemv = f"{r['gemv_us']:.1f}" if "gemv_us" in r else ""
            lines.append(f"| {r['model']} | {r['layer']} | {r['M']} | {gemv} | {dot} | {r['mma_us']:.1f} "
                         f"{tuple(r['mma_tiles'])} | {r['routed_us']:.1f} | {best} |")
        lines.append("")
    for r in payload.get("compile", []):
        lines.append(f"- sm_90 compile of `{r['kernel']}`, {r['block_n']} x {r['block_k']} tiles, {r['warps']} warps: "
                     f"loop {r['loop_instructions']} SASS instructions for {r['weights_per_thread']} weights a thread "
                     f"({r['per_weight']:.2f} each), loads {r['loads']}, shared memory {r['shared_bytes']} B")
    lines += ["", "Produced by benchmarks/int4_mma.py.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = results_parser(__doc__)
    ap.add_argument("--compile", action="store_true", help="compile for sm_90 (no GPU needed), report the loop's SASS")
    ap.add_argument("--run", action="store_true", help="timings on a CUDA GPU")
    ap.add_argument("--rows", default="1,2,4,8,16", help="rows of A, up to 64")
    ap.add_argument("--sweep", action="store_true", help="with --run, also time every setting of SWEEP")
    args = ap.parse_args(argv)
    payload: dict = {"benchmark": "int4_mma", "machine": machine()}
    if args.compile:
        payload["compile"] = [compile_mma(64, 2, 1), compile_mma(128, 2, 1), compile_mma(64, 2, 2), compile_dot()]
    if args.run:
        if not torch.cuda.is_available():
            sys.exit("--run needs a CUDA GPU")
        payload["run"] = run([int(r) for r in args.rows.split(",")], args.sweep)
    write("int4_mma", payload, markdown(payload), args.out)


if __name__ == "__main__":
    main()

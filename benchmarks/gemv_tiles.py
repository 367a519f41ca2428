"""The decode GEMVs' tiles at LLM decode shapes, timed inside CUDA graphs (as decode replays them).

For each (N, K) of Qwen2.5-0.5B and Llama-3.2-1B decode (qkv, o, merged gate+up, down, lm_head; one row
of fp16 activations) it times, per call:

* the 4-bit GEMV (``crossml.kernels.matmul_nbits``, block size 32, packed zero points, constant weights) at
  the tiles ``pick_tiles`` chooses and at every (BLOCK_N, BLOCK_K, num_warps) of a sweep;
* the fp16 GEMV (``crossml.kernels.gemv``, constant weight) at its ``pick_tiles`` tiles and a sweep of
  (BLOCK_N, BLOCK_K, SPLIT_K, num_warps), against cuBLAS (``torch.matmul``) on the same fp16 weight.

Each time is the mean over graph replays of one graph holding a run of calls on distinct copies of the
weight, together larger than the L2 cache (a decode step reads every weight once, so none is L2-resident),
with programmatic dependent launch between the calls as in a decode step. The tile rules come from these
results. Writes results/gemv_tiles.{json,md} (the JSON holds every sweep point).

``--int4`` instead times the 4-bit GEMV's two kernels at fp16 activations: the float32 kernel at its rule's
tiles, the fp16-pair kernel (``_PAIR_DOT_PTX``) at its rule's tiles and over a sweep, and what ``matmul_nbits``
picks by itself (``pick_pair_tiles`` says which kernel pays). Writes results/gemv_int4.{json,md}.

``--fused`` instead times the fp16 products with the neighbours the GenAI graph rules fuse into them
(``MatMulSkipNorm``, ``SiluMulSkipNorm``), at the rule's tiles, the same way: the GEMV alone, the GEMV then the
RMSNorm kernel against ``gemv_skip_norm``, and the SiluMul kernel, GEMV and RMSNorm kernel against
``gemv_skip_norm(silu_mul=True)``. Writes results/gemv_fused.{json,md}.

``--colmajor`` instead times the fp16 GEMV on the two ways a weight can be stored: row-major (as ONNX gives it)
and column-major (its transpose contiguous, as a GPU plan stores half-precision decode weights,
``crossml.ops.matmul.column_major_weight``), each at its rule's tiles, at 1 and 4 activation rows, with a sweep of
the column-major tiles at both; and cuBLAS on both layouts at 512 rows (a prompt, which runs on cuBLAS).
Writes results/gemv_colmajor.{json,md}.

    python benchmarks/gemv_tiles.py [--out benchmarks/results] [--quick | --fused | --int4 | --colmajor]
"""

from __future__ import annotations

import itertools
import math
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from _common import in_graph_us, machine, results_parser, write  # noqa: E402

from crossml.kernels import gemv as fp16_gemv  # noqa: E402
from crossml.kernels import matmul_nbits as nbits  # noqa: E402
from crossml.kernels._launch import processors  # noqa: E402

#: (model, layer, N, K)
SHAPES = [
    ("qwen2.5-0.5b", "qkv", 1152, 896), ("qwen2.5-0.5b", "o", 896, 896),
    ("qwen2.5-0.5b", "gate+up", 9728, 896), ("qwen2.5-0.5b", "down", 896, 4864),
    ("qwen2.5-0.5b", "lm_head", 151936, 896),
    ("llama-3.2-1b", "qkv", 3072, 2048), ("llama-3.2-1b", "o", 2048, 2048),
    ("llama-3.2-1b", "gate+up", 16384, 2048), ("llama-3.2-1b", "down", 2048, 8192),
    ("llama-3.2-1b", "lm_head", 128256, 2048),
]
BLOCK_SIZE = 32
#: bytes the weight copies of one graph add up to at least (the H200's L2 is 50 MB)
SPAN_BYTES = 160 << 20
MAX_COPIES = 24


def best_two(sweep: list[dict]) -> str:
    """The two fastest points of a sweep sorted by time, as "µs (tiles)" for a table cell."""
    return "; ".join(f"{b['us']:.2f} {tuple(b['tiles'])}" for b in sweep[:2])


def copies(weight_bytes: int) -> int:
    return max(2, min(MAX_COPIES, math.ceil(SPAN_BYTES / weight_bytes)))


def int4_inputs(N: int, K: int, dev: torch.device) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ...]]]:
    """One fp16 row of K activations and copies of a random 4-bit [N, K] weight (packed values, fp16 scales,
    packed zero points; block size BLOCK_SIZE) together larger than the L2 cache, from a fixed seed."""
    nb = K // BLOCK_SIZE
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(1, K, device=dev, dtype=torch.float16, generator=g)
    ws = [(torch.randint(0, 256, (N, nb, BLOCK_SIZE // 2), device=dev, dtype=torch.uint8, generator=g),
           torch.rand(N, nb, device=dev, dtype=torch.float16, generator=g) * 0.01,
           torch.randint(0, 256, (N, (nb + 1) // 2), device=dev, dtype=torch.uint8, generator=g))
          for _ in range(copies(N * K // 2))]
    return a, ws


def measure_4bit(N: int, K: int, dev: torch.device, quick: bool) -> dict:
    a, ws = int4_inputs(N, K, dev)

    def run(tiles: tuple[int, int, int, int] | None) -> float:
        return in_graph_us([lambda w=w: nbits.matmul_nbits(a, *w, K=K, N=N, block_size=BLOCK_SIZE, tiles=tiles,
                                                           const_w=True) for w in ws])

    rule = nbits.pick_tiles(1, N, K, BLOCK_SIZE, processors(a))
    sweep = []
    if not quick:
        for bn, bk, warps in itertools.product([1, 2, 4, 8, 16, 32], [256, 512, 1024, 2048], [1, 2, 4, 8]):
            if 512 <= bn * bk <= 16384 and bk <= triton.next_power_of_2(K) and bn * bk >= 32 * warps * 8:
                sweep.append({"us": run((1, bn, bk, warps)), "tiles": [1, bn, bk, warps]})
    sweep.sort(key=lambda r: r["us"])
    return {"rule_tiles": list(rule), "rule_us": run(None), "sweep": sweep, "copies": len(ws),
            "packed_mb": N * K / 2 / 1e6}


def measure_int4_kernels(N: int, K: int, dev: torch.device) -> dict:
    """The float32 and fp16-pair 4-bit kernels at their rules' tiles, the automatic choice, and a sweep of the
    pair kernel's tiles."""
    a, ws = int4_inputs(N, K, dev)

    def run(pairs: bool | None, tiles: tuple[int, int, int, int] | None = None) -> float:
        return in_graph_us([lambda w=w: nbits.matmul_nbits(a, *w, K=K, N=N, block_size=BLOCK_SIZE, tiles=tiles,
                                                           const_w=True, pairs=pairs) for w in ws])

    sms = processors(a)
    sweep = []
    for bn, bk, warps in itertools.product([2, 4, 8, 16, 32], [256, 512, 1024, 2048], [1, 2, 4]):
        if bk <= max(256, triton.next_power_of_2(K)) and bn * bk // 8 <= 2048 * warps:
            sweep.append({"us": run(True, (1, bn, bk, warps)), "tiles": [1, bn, bk, warps]})
    sweep.sort(key=lambda r: r["us"])
    pair_rule = nbits.pick_pair_tiles(1, N, K, BLOCK_SIZE, sms)
    return {"fp32_tiles": list(nbits.pick_tiles(1, N, K, BLOCK_SIZE, sms)), "fp32_us": run(False),
            "pair_tiles": None if pair_rule is None else list(pair_rule), "pair_us": run(True),
            "auto_us": run(None), "sweep": sweep, "copies": len(ws), "packed_mb": N * K / 2 / 1e6}


def int4_markdown(payload: dict) -> str:
    lines = ["# 4-bit decode GEMV: float32 kernel vs fp16-pair kernel (in-graph µs per call, one fp16 row, "
             "weights not in L2)", "",
             f"GPU: {payload['machine'].get('gpu')}; torch {payload['machine'].get('torch')}. Block size 32, packed "
             "zero points, constant weights. GB/s: packed bytes read / time of the automatic choice. Pair rule "
             "'-': the rule keeps the float32 kernel (the pair kernel is timed at the tiles it would take if "
             "asked).", "",
             "| model | layer | N | K | float32 kernel µs | pair rule tiles | pair kernel µs | automatic µs | GB/s "
             "| best two of the pair sweep |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in payload["rows"]:
        q = r["int4"]
        best = best_two(q["sweep"])
        tiles = "-" if q["pair_tiles"] is None else str(tuple(q["pair_tiles"]))
        lines.append(f"| {r['model']} | {r['layer']} | {r['N']} | {r['K']} | {q['fp32_us']:.2f} | {tiles} | "
                     f"{q['pair_us']:.2f} | {q['auto_us']:.2f} | {q['packed_mb'] / q['auto_us'] * 1e3:.0f} | {best} |")
    return "\n".join([*lines, "", "Produced by benchmarks/gemv_tiles.py --int4.", ""])


def measure_fp16(N: int, K: int, dev: torch.device, quick: bool) -> dict:
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(1, K, device=dev, dtype=torch.float16, generator=g)
    ws = [torch.randn(K, N, device=dev, dtype=torch.float16, generator=g) * 0.02 for _ in range(copies(N * K * 2))]

    def run(tiles: tuple[int, int, int, int, int] | None) -> float:
        return in_graph_us([lambda w=w: fp16_gemv.gemv(a, w, tiles=tiles, const_w=True) for w in ws])

    rule = fp16_gemv.pick_tiles(1, K, N, 2, processors(a))
    sweep = []
    if not quick:
        for bn, tile, split, warps in itertools.product([32, 64, 128, 256], [2048, 4096, 8192], [0, 1, 2, 4, 8, 16],
                                                        [2, 4, 8]):
            bk = tile // bn
            if bk <= triton.next_power_of_2(K):
                t = (1, bn, bk, rule[3] if split == 0 else split, warps)
                sweep.append({"us": run(t), "tiles": list(t)})
    sweep.sort(key=lambda r: r["us"])
    return {"rule_tiles": list(rule), "rule_us": run(None), "sweep": sweep, "copies": len(ws),
            "cublas_us": in_graph_us([lambda w=w: torch.matmul(a, w) for w in ws]), "mb": N * K * 2 / 1e6}


def measure_colmajor(N: int, K: int, dev: torch.device) -> dict:
    g = torch.Generator(device=dev).manual_seed(0)
    ws = [torch.randn(K, N, device=dev, dtype=torch.float16, generator=g) * 0.02 for _ in range(copies(N * K * 2))]
    cols = [w.t().contiguous().t() for w in ws]
    out: dict = {"copies": len(ws), "mb": N * K * 2 / 1e6}
    for M in (1, 4):
        a = torch.randn(M, K, device=dev, dtype=torch.float16, generator=g)
        for name, weights in (("rows", ws), ("cols", cols)):
            out[f"{name}_m{M}_tiles"] = list(fp16_gemv.pick_tiles(M, K, N, 2, processors(a), colmajor=name == "cols"))
            out[f"{name}_m{M}_us"] = in_graph_us([lambda w=w, a=a: fp16_gemv.gemv(a, w, const_w=True) for w in weights])
        torch.testing.assert_close(fp16_gemv.gemv(a, cols[0]), fp16_gemv.gemv(a, ws[0]), rtol=1e-2, atol=1e-2)
    for M in (1, 4):
        a = torch.randn(M, K, device=dev, dtype=torch.float16, generator=g)
        rule = fp16_gemv.pick_tiles(M, K, N, 2, processors(a), colmajor=True)
        sweep = []
        for bn, bk, split, warps in itertools.product([8, 16, 32], [64, 128, 256, 512], sorted({rule[3], 1, 2, 4}),
                                                      [4, 8]):
            if 512 <= bn * bk and bn * bk * rule[0] <= 8192 and bk <= triton.next_power_of_2(K):
                t = (rule[0], bn, bk, split, warps)
                sweep.append({"us": in_graph_us([lambda w=w, t=t, a=a: fp16_gemv.gemv(a, w, tiles=t, const_w=True)
                                                 for w in cols]), "tiles": list(t)})
        out["sweep" if M == 1 else f"sweep_m{M}"] = sorted(sweep, key=lambda r: r["us"])
    prompt = torch.randn(512, K, device=dev, dtype=torch.float16, generator=g)
    out["cublas512_rows_us"] = in_graph_us([lambda w=w: torch.matmul(prompt, w) for w in ws[:4]])
    out["cublas512_cols_us"] = in_graph_us([lambda w=w: torch.matmul(prompt, w) for w in cols[:4]])
    return out


def colmajor_markdown(payload: dict) -> str:
    lines = ["# Decode GEMV on row-major and column-major fp16 weights (in-graph µs per call, weights not in L2)", "",
             f"GPU: {payload['machine'].get('gpu')}; torch {payload['machine'].get('torch')}. Each layout at its "
             "rule's tiles (`pick_tiles(..., colmajor=)`); tiles (M, N, K, split K, warps). cuBLAS at 512 rows: a "
             "prompt's product on the same weights.", "",
             "| model | layer | N | K | 1 row: rows µs | cols µs | cols GB/s | cols tiles | best two of the cols sweep "
             "| 4 rows: rows µs | cols µs | cols tiles | best two of the cols sweep | cuBLAS 512 rows: rows µs | cols µs |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | --- | --- | ---: | ---: |"]
    for r in payload["rows"]:
        c = r["colmajor"]
        best, best4 = best_two(c["sweep"]), best_two(c["sweep_m4"])
        lines.append(f"| {r['model']} | {r['layer']} | {r['N']} | {r['K']} | {c['rows_m1_us']:.2f} | "
                     f"{c['cols_m1_us']:.2f} | {c['mb'] / c['cols_m1_us'] * 1e3:.0f} | {tuple(c['cols_m1_tiles'])} | "
                     f"{best} | {c['rows_m4_us']:.2f} | {c['cols_m4_us']:.2f} | {tuple(c['cols_m4_tiles'])} | {best4} | "
                     f"{c['cublas512_rows_us']:.1f} | {c['cublas512_cols_us']:.1f} |")
    return "\n".join([*lines, "", "Produced by benchmarks/gemv_tiles.py --colmajor.", ""])


def measure_fused(N: int, K: int, dev: torch.device) -> dict:
    from crossml.kernels.rmsnorm import skip_rms_norm
    from crossml.kernels.swiglu import silu_mul_packed

    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(1, K, device=dev, dtype=torch.float16, generator=g)
    gu = torch.randn(1, 2 * K, device=dev, dtype=torch.float16, generator=g)
    res = torch.randn(1, N, device=dev, dtype=torch.float16, generator=g)
    gamma = torch.rand(N, device=dev, dtype=torch.float16, generator=g)
    ws = [torch.randn(K, N, device=dev, dtype=torch.float16, generator=g) * 0.02 for _ in range(copies(N * K * 2))]
    gemv, fused = fp16_gemv.gemv, fp16_gemv.gemv_skip_norm

    def norm(y: torch.Tensor) -> object:
        return skip_rms_norm(res, y, gamma, None, 1e-5, store_inv=False)

    return {
        "gemv_us": in_graph_us([lambda w=w: gemv(a, w, const_w=True) for w in ws]),
        "gemv_then_norm_us": in_graph_us([lambda w=w: norm(gemv(a, w, const_w=True)) for w in ws]),
        "skip_norm_us": in_graph_us([lambda w=w: fused(a, w, None, res, gamma, 1e-5, const_w=True) for w in ws]),
        "silu_gemv_norm_us": in_graph_us([lambda w=w: norm(gemv(silu_mul_packed(gu), w, const_w=True)) for w in ws]),
        "silu_skip_norm_us": in_graph_us([lambda w=w: fused(gu, w, None, res, gamma, 1e-5, const_w=True,
                                                            silu_mul=True) for w in ws]),
        "copies": len(ws)}


def fused_markdown(payload: dict) -> str:
    lines = ["# Decode products with their fused neighbours (in-graph µs per call, one fp16 row, weights not in L2)",
             "", f"GPU: {payload['machine'].get('gpu')}; torch {payload['machine'].get('torch')}. Norm: the "
             "residual's SkipSimplifiedLayerNormalization after the product; gate: the MLP's SiluMul of [g | up] "
             "before it.", "",
             "| model | layer | N | K | GEMV | GEMV, norm kernel | gemv_skip_norm | gate, GEMV, norm kernels | "
             "gemv_skip_norm(silu_mul) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in payload["rows"]:
        f = r["fused"]
        lines.append(f"| {r['model']} | {r['layer']} | {r['N']} | {r['K']} | {f['gemv_us']:.2f} | "
                     f"{f['gemv_then_norm_us']:.2f} | {f['skip_norm_us']:.2f} | {f['silu_gemv_norm_us']:.2f} | "
                     f"{f['silu_skip_norm_us']:.2f} |")
    return "\n".join([*lines, "", "Produced by benchmarks/gemv_tiles.py --fused.", ""])


def markdown(payload: dict) -> str:
    def best(r: dict) -> str:
        return best_two(r["sweep"]) or "-"

    lines = ["# Decode GEMV tiles (in-graph µs per call, one fp16 row, weights not in L2)", "",
             f"GPU: {payload['machine'].get('gpu')}; torch {payload['machine'].get('torch')}. GB/s: weight bytes "
             "read / time (packed bytes for 4-bit).", "",
             "## 4-bit GEMV (block size 32, packed zero points); tiles (M, N, K, warps)", "",
             "| model | layer | N | K | rule tiles | rule µs | GB/s | best two of the sweep |",
             "| --- | --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for r in payload["rows"]:
        q = r["int4"]
        lines.append(f"| {r['model']} | {r['layer']} | {r['N']} | {r['K']} | {tuple(q['rule_tiles'])} | "
                     f"{q['rule_us']:.2f} | {q['packed_mb'] / q['rule_us'] * 1e3:.0f} | {best(q)} |")
    lines += ["", "## fp16 GEMV against cuBLAS; tiles (M, N, K, split K, warps)", "",
              "| model | layer | N | K | rule tiles | rule µs | GB/s | cuBLAS µs | rule ÷ cuBLAS | best two of the sweep |",
              "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in payload["rows"]:
        h = r["fp16"]
        lines.append(f"| {r['model']} | {r['layer']} | {r['N']} | {r['K']} | {tuple(h['rule_tiles'])} | "
                     f"{h['rule_us']:.2f} | {h['mb'] / h['rule_us'] * 1e3:.0f} | {h['cublas_us']:.2f} | "
                     f"{h['rule_us'] / h['cublas_us']:.2f} | {best(h)} |")
    return "\n".join([*lines, "", "Produced by benchmarks/gemv_tiles.py.", ""])


def main(argv: list[str] | None = None) -> None:
    ap = results_parser(__doc__)
    ap.add_argument("--quick", action="store_true", help="the rule's tiles and cuBLAS only, no sweeps")
    ap.add_argument("--fused", action="store_true", help="the fp16 products with their fused norm and gate instead")
    ap.add_argument("--int4", action="store_true", help="the 4-bit GEMV's float32 and fp16-pair kernels instead")
    ap.add_argument("--colmajor", action="store_true", help="the fp16 GEMV on row- and column-major weights instead")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("gemv_tiles: needs a GPU")
    dev = torch.device("cuda")
    if args.colmajor:
        rows = []
        for model, layer, N, K in SHAPES:
            if layer == "lm_head":  # a vocabulary-sized product stays on cuBLAS, row-major
                continue
            rows.append({"model": model, "layer": layer, "N": N, "K": K, "colmajor": measure_colmajor(N, K, dev)})
            c = rows[-1]["colmajor"]
            print(model, layer, {k: v for k, v in c.items() if k.endswith("us")}, c["sweep"][:2], flush=True)
            torch.cuda.empty_cache()
        payload = {"machine": machine(), "rows": rows}
        write("gemv_colmajor", payload, colmajor_markdown(payload), args.out)
        return
    if args.int4:
        rows = []
        for model, layer, N, K in SHAPES:
            rows.append({"model": model, "layer": layer, "N": N, "K": K, "int4": measure_int4_kernels(N, K, dev)})
            q = rows[-1]["int4"]
            print(f"{model} {layer}: float32 {q['fp32_us']:.2f} pair {q['pair_us']:.2f} auto {q['auto_us']:.2f} "
                  f"best {q['sweep'][:2]}", flush=True)
            torch.cuda.empty_cache()
        payload = {"machine": machine(), "block_size": BLOCK_SIZE, "rows": rows}
        write("gemv_int4", payload, int4_markdown(payload), args.out)
        return
    if args.fused:
        rows = []
        for model, layer, N, K in SHAPES:
            if layer == "lm_head":  # a vocabulary-sized product stays on cuBLAS
                continue
            rows.append({"model": model, "layer": layer, "N": N, "K": K, "fused": measure_fused(N, K, dev)})
            print(model, layer, {k: round(v, 2) for k, v in rows[-1]["fused"].items()}, flush=True)
            torch.cuda.empty_cache()
        payload = {"machine": machine(), "rows": rows}
        write("gemv_fused", payload, fused_markdown(payload), args.out)
        return
    rows = []
    for model, layer, N, K in SHAPES:
        r = {"model": model, "layer": layer, "N": N, "K": K, "int4": measure_4bit(N, K, dev, args.quick),
             "fp16": measure_fp16(N, K, dev, args.quick)}
        rows.append(r)
        q, h = r["int4"], r["fp16"]
        print(f"{model} {layer} N={N} K={K}: 4-bit rule {tuple(q['rule_tiles'])} {q['rule_us']:.2f} µs, best "
              f"{q['sweep'][:1]}; fp16 rule {tuple(h['rule_tiles'])} {h['rule_us']:.2f} µs, best {h['sweep'][:1]}, "
              f"cuBLAS {h['cublas_us']:.2f} µs", flush=True)
        torch.cuda.empty_cache()
    payload = {"machine": machine(), "block_size": BLOCK_SIZE, "rows": rows}
    write("gemv_tiles", payload, markdown(payload), args.out)


if __name__ == "__main__":
    main()

"""The fp16 GEMV's Gluon kernel (``crossml.kernels.gemv_mma``) against its ``tl.dot`` kernel and cuBLAS, at batched-
decode sizes, timed inside CUDA graphs.

At Qwen2.5-0.5B's and Llama-3.2-1B's decode shapes (``gemv_tiles.SHAPES``: qkv, o, merged gate+up, down, lm_head),
fp16 weights stored column-major as GPU plans store them, copies of each weight together larger than L2, per number
of rows M:

* ``dot``: ``gemv(mma=False)``, the per-row GEMV at 1 row and ``_gemv_dot_kernel`` from 2, at their rule's tiles;
* ``mma``: ``gemv(mma=True)`` at ``gemv_mma.pick_tiles``' tiles (and with --sweep the fastest of its tile sweep);
* ``cublas``: ``a @ w``;
* at the down projections, the MLP's fused form: ``gemv_skip_norm(silu_mul=True)`` on either kernel.

Each result is checked against the float32 product of the same fp16 values.

    python benchmarks/gemv_mma.py --compile              # SASS of the kernel's loop, no GPU needed
    python benchmarks/gemv_mma.py --run [--rows 1,2,4,8,16] [--sweep] [--out benchmarks/results]

--run writes OUT/gemv_mma.{json,md}.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import in_graph_us, machine, results_parser, write  # noqa: E402

#: --sweep's tiles: (BLOCK_N, WARPS) x programs per SM that K is split to reach
SWEEP = [((bn, w), per_sm) for bn, w in ((32, 1), (64, 1), (64, 2), (128, 2), (128, 4)) for per_sm in (2, 4, 8)]


def compile_report() -> list[dict]:
    """``int4_mma._sass_report`` of the kernel's loop for sm_90 at its rule's tiles, plain and SiLU-gated."""
    from int4_mma import _sass_report

    from crossml.kernels import gemv_mma

    return [_sass_report(f"gemv_mma fp16{' silu_mul' if silu else ''}",
                         gemv_mma.compile_for(90, "fp16", SILU_MUL=silu), 64, gemv_mma.BLOCK_K, 2)
            for silu in (False, True)]


def _err(y: Any, ref: Any) -> float:
    return float((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def measure(N: int, K: int, rows: list[int], sweep: bool, fused: bool) -> dict:
    import torch
    from gemv_tiles import copies

    from crossml.kernels import gemv as g
    from crossml.kernels._launch import processors

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    ws = [torch.randn(N, K, device=dev, dtype=torch.float16, generator=gen).t() for _ in range(copies(N * K * 2))]
    sms = processors(ws[0])
    out: dict = {"mb": N * K * 2 / 1e6, "copies": len(ws), "by_rows": {}}
    for M in rows:
        a = torch.randn(M, K, device=dev, dtype=torch.float16, generator=gen)
        ref = a.float() @ ws[0].float()
        r: dict = {}

        def run(mma: bool, tiles: tuple | None = None, a: torch.Tensor = a) -> float:
            return in_graph_us([lambda w=w: g.gemv(a, w, const_w=True, mma=mma, tiles=tiles) for w in ws])

        r["dot_us"] = run(False)
        r["dot_err"] = _err(g.gemv(a, ws[0], mma=False), ref)
        r["mma_tiles"] = list(g._mma_tiles(M, K, N, sms, False))
        r["mma_us"] = run(True)
        r["mma_err"] = _err(g.gemv(a, ws[0], mma=True), ref)
        r["cublas_us"] = in_graph_us([lambda w=w, a=a: a @ w for w in ws])
        from crossml.kernels import gemv_mma

        gemv_mma.OPTIONS["quad_runs"] = False
        r["mma_lane_runs_us"] = run(True)
        gemv_mma.OPTIONS["quad_runs"] = True
        if sweep:
            pts = []
            for (bn, warps), per_sm in SWEEP:
                split = max(1, min(-(-per_sm * sms // -(-N // bn)), K // 128, 64))
                tiles = (16, bn, 128, split, warps)
                pts.append({"tiles": list(tiles), "us": run(True, tiles)})
            r["sweep"] = sorted(pts, key=lambda p: p["us"])
        if fused:  # the MLP's down projection: SiLU gate in the loads, skip-norm after
            gu = torch.randn(M, 2 * K, device=dev, dtype=torch.float16, generator=gen)
            res = torch.randn(M, N, device=dev, dtype=torch.float16, generator=gen)
            gamma = torch.rand(N, device=dev, dtype=torch.float16, generator=gen)

            def fused_us(mma: bool, gu: torch.Tensor = gu, res: torch.Tensor = res,
                         gamma: torch.Tensor = gamma) -> float:
                return in_graph_us([lambda w=w: g.gemv_skip_norm(gu, w, None, res, gamma, 1e-6, const_w=True,
                                                                 silu_mul=True, mma=mma) for w in ws])

            r["fused_dot_us"], r["fused_mma_us"] = fused_us(False), fused_us(True)
            g.MMA_GATE_FIRST = False
            r["fused_mma_inline_gate_us"] = fused_us(True)
            g.MMA_GATE_FIRST = True
            n0, s0 = g.gemv_skip_norm(gu, ws[0], None, res, gamma, 1e-6, silu_mul=True, mma=False)
            n1, s1 = g.gemv_skip_norm(gu, ws[0], None, res, gamma, 1e-6, silu_mul=True, mma=True)
            r["fused_max_diff"] = float(max((n0.float() - n1.float()).abs().max(),
                                            (s0.float() - s1.float()).abs().max()))
        out["by_rows"][str(M)] = r
        best = f" sweep best {r['sweep'][0]['us']:.2f} {tuple(r['sweep'][0]['tiles'])}" if sweep else ""
        extra = (f" fused dot {r['fused_dot_us']:.2f} mma {r['fused_mma_us']:.2f} (gate inline "
                 f"{r['fused_mma_inline_gate_us']:.2f}) diff {r['fused_max_diff']:.1e}"
                 if fused else "")
        print(f"N={N} K={K} M={M}: dot {r['dot_us']:.2f} mma {r['mma_us']:.2f} (lane runs {r['mma_lane_runs_us']:.2f}) "
              f"{tuple(r['mma_tiles'])} cublas "
              f"{r['cublas_us']:.2f} err {r['dot_err']:.1e}/{r['mma_err']:.1e}{best}{extra}", flush=True)
    return out


def markdown(payload: dict) -> str:
    m = payload["machine"]
    rows = payload["rows_m"]
    lines = ["# fp16 decode products on the GEMV's Gluon kernel (in-graph µs per call, weights not in L2)", "",
             f"GPU: {m.get('gpu')}; torch {m.get('torch')}. Column-major fp16 weights. Per cell: `tl.dot` kernel "
             "(the per-row GEMV at 1 row) / Gluon mma kernel / cuBLAS; at the down projections also the fused "
             "SiLU gate + skip-norm on each kernel.", "",
             "| model | layer | N | K | " + " | ".join(f"M={r}" for r in rows) + " |",
             "| --- | --- | ---: | ---: |" + " --- |" * len(rows)]
    for e in payload["products"]:
        cells = []
        for r in rows:
            x = e["by_rows"][str(r)]
            cell = f"{x['dot_us']:.1f} / **{x['mma_us']:.1f}** / {x['cublas_us']:.1f}"
            if "fused_mma_us" in x:
                cell += f"; fused {x['fused_dot_us']:.1f} / {x['fused_mma_us']:.1f}"
            cells.append(cell)
        lines.append(f"| {e['model']} | {e['layer']} | {e['N']} | {e['K']} | " + " | ".join(cells) + " |")
    if any("sweep" in x for e in payload["products"] for x in e["by_rows"].values()):
        lines += ["", "Best of the tile sweep (16, BLOCK_N, 128, SPLIT_K, warps):", ""]
        for e in payload["products"]:
            best = [f"M={r}: {x['sweep'][0]['us']:.1f} {tuple(x['sweep'][0]['tiles'])}"
                    for r, x in e["by_rows"].items() if "sweep" in x]
            lines.append(f"- {e['model']} {e['layer']}: " + "; ".join(best))
    lines += ["", "Produced by benchmarks/gemv_mma.py --run."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = results_parser(__doc__)
    parser.add_argument("--compile", action="store_true", help="report the loop's SASS (no GPU needed)")
    parser.add_argument("--run", action="store_true", help="time the products (needs a CUDA GPU)")
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--models", default="qwen2.5-0.5b,llama-3.2-1b")
    args = parser.parse_args(argv)
    if args.compile:
        compile_report()
    if not args.run:
        return
    import torch
    from gemv_tiles import SHAPES

    rows = [int(r) for r in args.rows.split(",")]
    products = []
    for model, layer, N, K in SHAPES:
        if model not in args.models.split(","):
            continue
        products.append({"model": model, "layer": layer, "N": N, "K": K,
                         **measure(N, K, rows, args.sweep and layer != "lm_head", layer == "down")})
        torch.cuda.empty_cache()
    payload = {"machine": machine(), "rows_m": rows, "products": products}
    write("gemv_mma", payload, markdown(payload), args.out)


if __name__ == "__main__":
    main()

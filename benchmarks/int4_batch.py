"""4-bit (and with --fp16, fp16) products at batched-decode sizes (a few to 64 rows of fp16 activations): the per-row GEMVs against the
matrix-unit kernel (``crossml.kernels.matmul_nbits._matmul_nbits_dot_kernel``) and the prompt path (dequantize, then
cuBLAS), timed inside CUDA graphs.

At Qwen2.5-0.5B's and Llama-3.2-1B's decode shapes (``gemv_tiles.SHAPES``: qkv, o, merged gate+up, down, lm_head;
block size 32, packed zero points, constant weights, copies of the weight together larger than L2, as
``gemv_tiles.py`` times them), per number of rows M:

* ``gemv``: ``matmul_nbits(dot=False)``, the float32 or fp16-pair GEMV at its rule's tiles;
* ``dot``: the matrix-unit kernel at ``pick_dot_tiles``' tiles, and at the --sweep row counts the fastest points
  of a sweep of its tiles for each of its variants (``VARIANTS``);
* ``dequant+mm``: ``dequantize`` to fp16, then ``a @ w.T`` (what the op runs for prompts).

``--fp16`` adds the fp16 products on column-major weights: the per-row GEMV (``crossml.kernels.gemv``), its
matrix-unit kernel (``_gemv_dot_kernel``) and cuBLAS; ``--no-int4`` leaves the 4-bit ones out.

    python benchmarks/int4_batch.py [--out benchmarks/results] [--rows 1,2,4,8,16,32,64] [--sweep 8]

Writes OUT/int4_batch.{json,md}. Needs a CUDA GPU.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import in_graph_us, machine, results_parser, write  # noqa: E402
from gemv_tiles import BLOCK_SIZE, SHAPES, int4_inputs  # noqa: E402

from crossml.kernels import matmul_nbits as nbits  # noqa: E402
from crossml.kernels._launch import processors  # noqa: E402

#: matrix-unit kernel variants: name -> ``DOT_OPTIONS`` over the module's (``rule``: as shipped; halves and a_ahead
#: are the largest BLOCK_M taking them). results/int4_batch_variants.md has earlier ones: the weight tile as the
#: dot's first operand, three pipeline stages.
VARIANTS = {"plain": {"fast_dq": False, "ptx_dq": False, "halves": 0, "a_ahead": 0},
            "fast": {"fast_dq": True, "ptx_dq": False, "halves": 0, "a_ahead": 0},
            "fast-ahead": {"fast_dq": True, "ptx_dq": False, "halves": 0, "a_ahead": 64},
            "halves": {"fast_dq": True, "ptx_dq": False, "halves": 64, "a_ahead": 0},
            "halves-ahead": {"fast_dq": True, "ptx_dq": False, "halves": 64, "a_ahead": 64},
            "ptx": {"ptx_dq": True, "halves": 0, "a_ahead": 0},
            "ptx-halves": {"ptx_dq": True, "halves": 64, "a_ahead": 0},
            "ptx-halves-ahead": {"ptx_dq": True, "halves": 64, "a_ahead": 64},
            "rule": {}}


def _variant(name: str) -> None:
    nbits.DOT_OPTIONS.update(VARIANTS[name])


def measure(N: int, K: int, rows: list[int], sweep_rows: list[int], variants: list[str], dev: torch.device,
            compare: bool = False) -> dict:
    _, ws = int4_inputs(N, K, dev)
    sms = processors(ws[0][0])
    out: dict = {"packed_mb": N * K / 2 / 1e6, "copies": len(ws), "by_rows": {}}
    default = dict(nbits.DOT_OPTIONS)
    for M in rows:
        a = torch.randn(M, K, device=dev, dtype=torch.float16)

        def run(dot: bool, tiles: tuple | None = None, a: torch.Tensor = a) -> float:
            return in_graph_us([lambda w=w: nbits.matmul_nbits(a, *w, K=K, N=N, block_size=BLOCK_SIZE, tiles=tiles,
                                                               const_w=True, dot=dot) for w in ws])

        def dequant_mm(w: tuple, a: torch.Tensor = a) -> torch.Tensor:
            return a @ nbits.dequantize(*w, K=K, N=N, block_size=BLOCK_SIZE, dtype=torch.float16).T

        r = {"gemv_us": run(False), "dot_tiles": list(nbits.pick_dot_tiles(M, N, K, BLOCK_SIZE, sms)),
             "dot_us": run(True), "dequant_mm_us": in_graph_us([lambda w=w: dequant_mm(w) for w in ws])}
        if compare:  # each variant at the rule's tiles, taken in turn twice (the lower time kept)
            r["variants_us"] = {}
            for _ in range(2):
                for name in variants:
                    _variant(name)
                    us = run(True)
                    r["variants_us"][name] = min(us, r["variants_us"].get(name, us))
                    nbits.DOT_OPTIONS.update(default)
        if M in sweep_rows:
            block_m = nbits.pick_dot_tiles(M, N, K, BLOCK_SIZE, sms)[0]
            r["sweep"] = {}
            for name in variants:
                _variant(name)
                sweep = []
                for bn, bk in itertools.product([16, 32, 64], [64, 128, 256]):
                    n_prog = -(-N // bn) * -(-M // block_m)
                    for split in sorted({1, max(1, min(-(-2 * sms // n_prog), K // bk)),
                                         max(1, min(-(-4 * sms // n_prog), K // bk))}):
                        tiles = (block_m, bn, bk, split, 4)
                        try:
                            sweep.append({"us": run(True, tiles), "tiles": list(tiles)})
                        except Exception as exc:  # noqa: BLE001 - a tile the compiler rejects (resources)
                            sweep.append({"us": None, "tiles": list(tiles), "error": str(exc)[:200]})
                r["sweep"][name] = sorted((s for s in sweep if s["us"] is not None), key=lambda s: s["us"]) + \
                    [s for s in sweep if s["us"] is None]
                nbits.DOT_OPTIONS.update(default)
        out["by_rows"][str(M)] = r
        best = "; ".join(f"{v} {sw[0]['us']:.2f} {tuple(sw[0]['tiles'])}" for v, sw in r.get("sweep", {}).items()
                         if sw and sw[0]["us"] is not None)
        print(f"N={N} K={K} M={M}: gemv {r['gemv_us']:.2f} dot {r['dot_us']:.2f} {tuple(r['dot_tiles'])} "
              f"dequant+mm {r['dequant_mm_us']:.2f} {best}", flush=True)
    return out


def measure_fp16(N: int, K: int, rows: list[int], sweep_rows: list[int], dev: torch.device) -> dict:
    """The fp16 products (column-major weights, as GPU plans store decode weights): the per-row GEMV, the
    matrix-unit kernel (``crossml.kernels.gemv._gemv_dot_kernel``) and cuBLAS, per number of rows."""
    from gemv_tiles import copies

    from crossml.kernels import gemv as fp16_gemv

    ws = [torch.randn(N, K, device=dev, dtype=torch.float16).t() for _ in range(copies(N * K * 2))]
    sms = processors(ws[0])
    out: dict = {"mb": N * K * 2 / 1e6, "copies": len(ws), "by_rows": {}}
    for M in rows:
        a = torch.randn(M, K, device=dev, dtype=torch.float16)

        def run(tiles: tuple, a: torch.Tensor = a) -> float:
            return in_graph_us([lambda w=w: fp16_gemv.gemv(a, w, tiles=tiles, const_w=True) for w in ws])

        gemv_tiles = fp16_gemv.pick_tiles(M, K, N, 2, sms, colmajor=True)
        dot_tiles = fp16_gemv.pick_dot_tiles(M, K, N, 2, sms, colmajor=True)
        r = {"gemv_tiles": list(gemv_tiles), "gemv_us": run(gemv_tiles), "dot_tiles": list(dot_tiles),
             "dot_us": run(dot_tiles), "cublas_us": in_graph_us([lambda w=w, a=a: a @ w for w in ws])}
        if M in sweep_rows:
            sweep = []
            for bn, bk in itertools.product([32, 64, 128], [64, 128, 256]):
                n_prog = -(-N // bn)
                for split in sorted({1, max(1, min(-(-2 * sms // n_prog), K // bk)),
                                     max(1, min(-(-4 * sms // n_prog), K // bk))}):
                    tiles = (16, bn, bk, split, 4)
                    try:
                        sweep.append({"us": run(tiles), "tiles": list(tiles)})
                    except Exception as exc:  # noqa: BLE001 - a tile the compiler rejects (resources)
                        sweep.append({"us": None, "tiles": list(tiles), "error": str(exc)[:200]})
            r["sweep"] = {"fp16": sorted((s for s in sweep if s["us"] is not None), key=lambda s: s["us"])
                          + [s for s in sweep if s["us"] is None]}
        out["by_rows"][str(M)] = r
        best = "; ".join(f"best {sw[0]['us']:.2f} {tuple(sw[0]['tiles'])}" for sw in r.get("sweep", {}).values() if sw)
        print(f"fp16 N={N} K={K} M={M}: gemv {r['gemv_us']:.2f} {tuple(gemv_tiles)} dot {r['dot_us']:.2f} "
              f"{tuple(dot_tiles)} cublas {r['cublas_us']:.2f} {best}", flush=True)
    return out


def _table(rows: list[int], entries: list[dict], cell: Callable[[dict], str]) -> list[str]:
    """A markdown table of ``entries`` (one line per product) by row count, each cell ``cell`` of that row count's
    measurements."""
    return ["| model | layer | N | K | " + " | ".join(f"M={r}" for r in rows) + " |",
            "| --- | --- | ---: | ---: | " + " | ".join("---" for _ in rows) + " |",
            *(f"| {r['model']} | {r['layer']} | {r['N']} | {r['K']} | "
              + " | ".join(cell(r["by_rows"][str(M)]) for M in rows) + " |" for r in entries)]


def markdown(payload: dict) -> str:
    m = payload["machine"]
    rows = payload["rows_list"]
    lines = ["# 4-bit products at batched-decode sizes (in-graph µs per call, fp16 activations, weights not in L2)",
             "", f"GPU: {m['gpu']}; torch {m['torch']}. Block size {BLOCK_SIZE}, packed zero points. Per cell: "
             "per-row GEMV / matrix-unit kernel at its rule's tiles / dequantize + cuBLAS; the best swept tiles "
             "(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps) below.", "",
             *_table(rows, payload["results"],
                     lambda c: f"{c['gemv_us']:.1f} / {c['dot_us']:.1f} / {c['dequant_mm_us']:.1f}")]
    if payload.get("fp16"):
        lines += ["", "## fp16 weights (column-major, as GPU plans store them)", "",
                  "Per cell: per-row GEMV / matrix-unit kernel at its rule's tiles / cuBLAS.", "",
                  *_table(rows, payload["fp16"],
                          lambda c: f"{c['gemv_us']:.1f} / {c['dot_us']:.1f} / {c['cublas_us']:.1f}")]
    compared = [r for r in payload["results"] if "variants_us" in r["by_rows"][str(rows[0])]]
    if compared:
        names = list(compared[0]["by_rows"][str(rows[0])]["variants_us"])
        lines += ["", "## Matrix-unit kernel variants at the rule's tiles (``DOT_OPTIONS``, ``VARIANTS``)", "",
                  "Per cell: " + " / ".join(names) + ".", "",
                  *_table(rows, compared, lambda c: " / ".join(f"{c['variants_us'][n]:.1f}" for n in names))]
    if any("sweep" in c for r in payload["results"] + payload.get("fp16", []) for c in r["by_rows"].values()):
        lines += ["", "Best swept matrix-unit tiles per variant (``VARIANTS``):", ""]
    for r in payload["results"] + payload.get("fp16", []):
        for M, c in r["by_rows"].items():
            for name, sweep in c.get("sweep", {}).items():
                top = "; ".join(f"{s['us']:.2f} {tuple(s['tiles'])}" for s in sweep[:2] if s["us"] is not None)
                lines.append(f"- {r['model']} {r['layer']} M={M} {name}: {top}")
    return "\n".join([*lines, "", "Produced by benchmarks/int4_batch.py.", ""])


def main(argv: list[str] | None = None) -> None:
    ap = results_parser(__doc__)
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--sweep", default="8", help="row counts at which to sweep the matrix-unit kernel's tiles")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"any of {','.join(VARIANTS)}")
    ap.add_argument("--compare", action="store_true",
                    help="time each of --variants at the rule's tiles at every row count (instead of sweeping tiles)")
    ap.add_argument("--shapes", default="", help="comma list of model:layer to run (default: all)")
    ap.add_argument("--fp16", action="store_true", help="also the fp16 products (GEMV, matrix-unit kernel, cuBLAS)")
    ap.add_argument("--no-int4", action="store_true", help="skip the 4-bit products")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("int4_batch needs a CUDA GPU")
    dev = torch.device("cuda")
    rows = [int(x) for x in args.rows.split(",") if x]
    sweep = [] if args.compare else [int(x) for x in args.sweep.split(",") if x]
    pick = {s for s in args.shapes.split(",") if s}
    results, fp16 = [], []
    for model, layer, N, K in SHAPES:
        if pick and f"{model}:{layer}" not in pick:
            continue
        if not args.no_int4:
            results.append({"model": model, "layer": layer, "N": N, "K": K,
                            **measure(N, K, rows, sweep, [v for v in args.variants.split(",") if v], dev, args.compare)})
        if args.fp16:
            fp16.append({"model": model, "layer": layer, "N": N, "K": K, **measure_fp16(N, K, rows, sweep, dev)})
    payload = {"machine": machine(), "rows_list": rows, "results": results, "fp16": fp16}
    write("int4_batch", payload, markdown(payload), args.out)
    print(markdown(payload))


if __name__ == "__main__":
    main()

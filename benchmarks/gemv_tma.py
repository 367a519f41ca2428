"""The one-row fp16 GEMV with TMA-streamed weights (``crossml.kernels.gemv_tma``) against the Triton GEMV, per decode
product, timed inside CUDA graphs.

At Qwen2.5-0.5B's and Llama-3.2-1B's decode shapes (``gemv_tiles.SHAPES`` without the lm_heads), fp16 weights stored
column-major as GPU plans store them, copies of each weight together larger than L2, one activation row:

* ``gemv``: ``gemv(a, w)`` on the Triton GEMV at its rule's tiles;
* ``tma``: the same on the TMA kernel at ``gemv_tma.pick_tiles``' tiles (``--sweep``: and other tiles);
* the products as the decode step runs them: ``gemv_skip_norm`` (the o and down projections; the down projection
  SiLU-gated) on either kernel.

Each result is checked against the float32 product of the same fp16 values, and the two kernels' skip-norm outputs
against each other.

    python benchmarks/gemv_tma.py --compile              # PTX of the kernel's loop, no GPU needed
    python benchmarks/gemv_tma.py --run [--sweep] [--out benchmarks/results]

--run writes OUT/gemv_tma.{json,md}. The decode step's own A/B: ``decode_replay.py --variants cols,tma``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _common import in_graph_us, machine, results_parser, write  # noqa: E402

#: --sweep's tiles: (BLOCK_N, BLOCK_K, STAGES cap, warps)
SWEEP = [(16, 256, 8, 4), (16, 128, 16, 4), (32, 128, 8, 4), (8, 256, 16, 2), (32, 256, 4, 8), (16, 64, 16, 4)]


def compile_report() -> list[dict]:
    """Counts of the loop's instructions in the kernel's PTX for sm_90 at its default tiles, plain and gated."""
    from crossml.kernels import gemv_tma

    rows = []
    for silu in (False, True):
        ptx = gemv_tma.compile_for(90, "fp16", SILU_MUL=silu).asm["ptx"]
        loop = ptx[ptx.index("Inner Loop Header"):]
        loop = loop[:loop.index("crit_edge")]
        rows.append({"kernel": f"gemv_tma fp16{' silu_mul' if silu else ''}",
                     **{k: loop.count(k) for k in ("cp.async.bulk.tensor", "ld.shared.v4", "ld.global.v4",
                                                   "bar.sync", "mbarrier.try_wait", "fma.rn.f32")}})
    return rows


def _err(y: Any, ref: Any) -> float:
    return float((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def measure(N: int, K: int, fused: bool, silu: bool, sweep: bool) -> dict:
    import torch
    from gemv_tiles import copies

    from crossml.kernels import gemv as g
    from crossml.kernels import gemv_tma
    from crossml.kernels._launch import processors

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    ws = [torch.randn(N, K, device=dev, dtype=torch.float16, generator=gen).t() for _ in range(copies(N * K * 2))]
    a = torch.randn(1, K, device=dev, dtype=torch.float16, generator=gen)
    ref = a.float() @ ws[0].float()
    r: dict = {"mb": N * K * 2 / 1e6, "copies": len(ws), "tiles": list(gemv_tma.pick_tiles(K, N, processors(a)))}

    def on(tma: bool, tiles: tuple | None = None):
        g.TMA_SHAPES = "all" if tma else frozenset()
        g.TMA_TILES = {(K, N): tiles} if tiles else {}

    def run(tma: bool, tiles: tuple | None = None) -> float:
        on(tma, tiles)
        return in_graph_us([lambda w=w: g.gemv(a, w, const_w=True) for w in ws])

    r["gemv_us"] = run(False)
    on(True)
    r["tma_err"] = _err(g.gemv(a, ws[0], const_w=True), ref)
    r["tma_us"] = run(True)
    if sweep:
        pts = []
        for bn, bk, st, warps in SWEEP:
            split = r["tiles"][3]
            pts.append({"tiles": [bn, bk, st, split, warps], "us": run(True, (bn, bk, st, split, warps))})
        r["sweep"] = sorted(pts, key=lambda p: p["us"])
    if fused:  # as the decode step runs it: skip-norm after, the down projection's SiLU gate in the loads
        x = torch.randn(1, 2 * K if silu else K, device=dev, dtype=torch.float16, generator=gen)
        res = torch.randn(1, N, device=dev, dtype=torch.float16, generator=gen)
        gamma = torch.rand(N, device=dev, dtype=torch.float16, generator=gen)

        def fused_us(tma: bool) -> float:
            on(tma)
            return in_graph_us([lambda w=w: g.gemv_skip_norm(x, w, None, res, gamma, 1e-6, const_w=True,
                                                             silu_mul=silu) for w in ws])

        r["fused_gemv_us"], r["fused_tma_us"] = fused_us(False), fused_us(True)
        outs = []
        for tma in (False, True):
            on(tma)
            outs.append(g.gemv_skip_norm(x, ws[0], None, res, gamma, 1e-6, const_w=True, silu_mul=silu))
        r["fused_max_diff"] = float(max((outs[0][0].float() - outs[1][0].float()).abs().max(),
                                        (outs[0][1].float() - outs[1][1].float()).abs().max()))
    on(False)
    best = f" sweep best {r['sweep'][0]['us']:.2f} {tuple(r['sweep'][0]['tiles'])}" if sweep else ""
    extra = (f" fused gemv {r['fused_gemv_us']:.2f} tma {r['fused_tma_us']:.2f} diff {r['fused_max_diff']:.1e}"
             if fused else "")
    print(f"N={N} K={K}: gemv {r['gemv_us']:.2f} tma {r['tma_us']:.2f} {tuple(r['tiles'])} err {r['tma_err']:.1e}"
          f"{best}{extra}", flush=True)
    return r


def markdown(payload: dict) -> str:
    m = payload["machine"]
    lines = [
        "# The one-row fp16 GEMV with TMA-streamed weights against the Triton GEMV (in-graph µs per call)", "",
        f"GPU: {m.get('gpu')}; torch {m.get('torch')}. One activation row, fp16 weights column-major, copies of each "
        "weight together larger than L2. `fused`: `gemv_skip_norm` as the decode step runs the product (the down "
        "projection SiLU-gated). tiles: (BLOCK_N, BLOCK_K, STAGES, SPLIT_K, warps).", "",
        "| model | layer | N | K | gemv µs | tma µs | tma tiles | fused gemv µs | fused tma µs | best of sweep |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for row in payload["rows"]:
        r = row["result"]
        sw = r.get("sweep")
        best = f"{sw[0]['us']:.2f} {tuple(sw[0]['tiles'])}" if sw else ""
        lines.append(f"| {row['model']} | {row['layer']} | {row['N']} | {row['K']} | {r['gemv_us']:.2f} | "
                     f"{r['tma_us']:.2f} | {tuple(r['tiles'])} | {r.get('fused_gemv_us', float('nan')):.2f} | "
                     f"{r.get('fused_tma_us', float('nan')):.2f} | {best} |")
    lines += ["", "Produced by benchmarks/gemv_tma.py --run."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = results_parser(__doc__)
    ap.add_argument("--compile", action="store_true", help="PTX counts of the kernel's loop (no GPU)")
    ap.add_argument("--run", action="store_true", help="time the products on this GPU")
    ap.add_argument("--sweep", action="store_true", help="also other tiles")
    args = ap.parse_args(argv)
    if args.compile:
        for row in compile_report():
            print(row)
    if args.run:
        from gemv_tiles import SHAPES

        rows = []
        for model, layer, N, K in SHAPES:
            if layer == "lm_head":
                continue
            fused = layer in ("o", "down")
            rows.append({"model": model, "layer": layer, "N": N, "K": K,
                         "result": measure(N, K, fused, layer == "down", args.sweep)})
        payload = {"machine": machine(), "rows": rows}
        print(write("gemv_tma", payload, markdown(payload), args.out))


if __name__ == "__main__":
    main()

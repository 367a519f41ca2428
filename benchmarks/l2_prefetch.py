"""Can the MLP weights of a decode layer stream into L2 while the layer's attention half runs?

A batch-1 decode layer reads most of its bytes in the MLP's gate+up and down products; the kernels before them
(the qkv product, attention, the output product and its skip-norm) read little and are bound by their dependent
launches, so the memory system idles for several µs per layer (``decode_replay.py --kernels --timeline``). Here a
prefetch kernel on a side stream, forked at the start of each layer, asks L2 for that layer's MLP weights with
bulk prefetches (``cp.async.bulk.prefetch.L2``, sm_90) while the main stream runs a stand-in of the layer's
first half: the qkv GEMV, two small dependent kernels in place of attention and its combine, the output
product with its skip-norm (``crossml.kernels.gemv``, column-major fp16 weights, PDL); then the gate+up GEMV and
the down product with the SiLU gate and skip-norm. Every layer has its own weights (the whole set is many times
L2), all layers in one CUDA graph, µs per layer.

Rows: no prefetch; prefetching the gate+up weights (all, or their first 10 / 25 / 50 %), or gate+up and down,
forked at the layer's start or after its qkv product, with P programs of one warp, each issuing prefetches of
CHUNK bytes for its share; and the MLP products alone with weights resident in L2 (the same layer repeated) or not
(distinct layers), which bound what a prefetch can gain. On an H100 (results/l2_prefetch.md) whole-weight
prefetches made the layer slower and partial ones gained 1-2 %.

    python benchmarks/l2_prefetch.py [--out benchmarks/results]

Writes OUT/l2_prefetch.{json,md}. Needs an NVIDIA GPU of compute capability 9.0 or later.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
import genai_bench as gb  # noqa: E402
from _common import machine, write  # noqa: E402
from persistent_decode import _step_kernel  # noqa: E402  (a small dependent kernel)

from crossml.kernels._launch import cdiv, pdl  # noqa: E402
from crossml.kernels.gemv import gemv, gemv_skip_norm  # noqa: E402


@triton.jit
def _prefetch_kernel(p, nbytes, per_program, CHUNK: tl.constexpr):
    """Program i asks L2 for bytes [i * per_program, +per_program) of the region at ``p``, CHUNK at a time."""
    base = p.to(tl.pointer_type(tl.int8)).to(tl.int64)
    lo = tl.program_id(0).to(tl.int64) * per_program
    hi = tl.minimum(lo + per_program, nbytes)
    for off in range(lo, hi, CHUNK):
        at = off + tl.arange(0, 1)
        size = tl.minimum(hi - at, CHUNK).to(tl.int32)
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                                  [base + at, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch(ts: list[torch.Tensor], programs: int, chunk: int) -> None:
    for t in ts:
        nbytes = t.numel() * t.element_size()
        per = cdiv(cdiv(nbytes, programs), chunk) * chunk
        _prefetch_kernel[(cdiv(nbytes, per),)](t, nbytes, per, CHUNK=chunk, num_warps=1)


def colmajor(k: int, n: int) -> torch.Tensor:
    return (torch.randn(n, k, device="cuda", dtype=torch.float16) * k ** -0.5).t()


def graph_us(body, layers: int, replays: int = 30) -> float:
    """µs per layer of ``body(i)`` for i in range(layers), captured in one CUDA graph."""
    main = torch.cuda.current_stream()
    for i in range(layers):
        body(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        side.wait_stream(torch.cuda.current_stream())  # the side stream joins the capture
        for i in range(layers):
            body(i)
        torch.cuda.current_stream().wait_stream(side)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(main)
    for _ in range(replays):
        g.replay()
    end.record(main)
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays / layers * 1e3


side: torch.cuda.Stream


def run_model(name: str, rounds: int) -> list[dict]:
    global side
    s = gb.SHAPES[name]
    h, inter, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    hd = s.get("head_dim", h // s["num_attention_heads"])
    qkv_n = (s["num_attention_heads"] + 2 * s["num_key_value_heads"]) * hd
    W = [dict(qkv=colmajor(h, qkv_n), o=colmajor(h, h), gu=colmajor(h, 2 * inter), d=colmajor(inter, h))
         for _ in range(layers)]
    x = torch.randn(1, h, device="cuda", dtype=torch.float16)
    gamma = torch.ones(h, device="cuda", dtype=torch.float16)
    buf = [torch.zeros(64 * 128, device="cuda") for _ in range(2)]
    side = torch.cuda.Stream()
    mlp_mb = sum(W[0][k].numel() * 2 for k in ("gu", "d")) / 1e6

    def layer(i: int, what: tuple[str, ...], programs: int, chunk: int, first_half: bool = True,
              after_qkv: bool = False, frac: float = 1.0) -> None:
        w = W[i]

        def fork() -> None:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                prefetch([w[k].t().reshape(-1)[: int(w[k].numel() * frac)] for k in what], programs, chunk)

        if what and not after_qkv:
            fork()
        a = x
        if first_half:
            gemv(x, w["qkv"], const_w=True)
            if what and after_qkv:
                fork()
            _step_kernel[(64,)](buf[0], buf[1], VEC=128, num_warps=4, **pdl(x))
            _step_kernel[(64,)](buf[1], buf[0], VEC=128, num_warps=4, **pdl(x))
            a, _ = gemv_skip_norm(x, w["o"], None, x, gamma, 1e-6, const_w=True)
        g = gemv(a, w["gu"], const_w=True)
        gemv_skip_norm(g, w["d"], None, x, gamma, 1e-6, const_w=True, silu_mul=True)

    variants = [("layer, no prefetch", (), 0, 0, False, 1.0)]
    for what, programs, chunk, after_qkv, frac in (
            (("gu",), 16, 1 << 20, False, 1.0), (("gu",), 132, 1 << 16, False, 1.0), (("gu",), 132, 1 << 14, False, 1.0),
            (("gu", "d"), 132, 1 << 16, False, 1.0), (("gu",), 132, 1 << 16, True, 1.0),
            (("gu",), 132, 1 << 16, False, 0.1), (("gu",), 132, 1 << 16, False, 0.25),
            (("gu",), 132, 1 << 16, False, 0.5), (("gu",), 132, 1 << 16, True, 0.25)):
        part = "+".join(what) if frac == 1 else f"the first {frac:.0%} of {'+'.join(what)}"
        variants.append((f"layer, prefetch {part}{' after the qkv product' if after_qkv else ''}: {programs} programs, "
                         f"{chunk // 1024} KB chunks", what, programs, chunk, after_qkv, frac))
    rows = []
    for rnd in range(rounds):
        for label, what, programs, chunk, after_qkv, frac in variants:
            us = graph_us(lambda i, w=what, p=programs, c=chunk, q=after_qkv, f=frac: layer(i, w, p, c, True, q, f),
                          layers)
            rows.append({"model": name, "variant": label, "round": rnd, "us": us})
            print(f"{name} {label} round {rnd}: {us:.2f} us/layer", flush=True)
        for label, idx in (("MLP products alone, distinct layers (HBM)", lambda i: i),
                           ("MLP products alone, one layer repeated (L2)", lambda i: 0)):
            us = graph_us(lambda i, f=idx: layer(f(i), (), 0, 0, first_half=False), layers)
            rows.append({"model": name, "variant": label, "round": rnd, "us": us})
            print(f"{name} {label} round {rnd}: {us:.2f} us/layer", flush=True)
    for r in rows:
        r["mlp_mb"] = round(mlp_mb, 1)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--models", default=",".join(gb.SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        sys.exit("l2_prefetch.py needs an NVIDIA GPU of compute capability 9.0 or later")
    rows = [r for name in args.models.split(",") for r in run_model(name, args.rounds)]
    med: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        med.setdefault((r["model"], r["variant"]), []).append(r["us"])
    lines = ["# Streaming a decode layer's MLP weights into L2 during its attention half", "",
             f"GPU: {machine()['gpu']}; torch {torch.__version__}; Triton {triton.__version__}. fp16, one activation "
             f"row, column-major weights, every layer its own weights, all layers in one CUDA graph; µs per layer, "
             f"median of {args.rounds} rounds (min-max), variants alternated.", "",
             "| model | MLP MB per layer | variant | µs per layer | min-max |", "| --- | ---: | --- | ---: | --- |"]
    mb = {r["model"]: r["mlp_mb"] for r in rows}
    for (m, v), us in med.items():
        lines.append(f"| {m} | {mb[m]} | {v} | {statistics.median(us):.2f} | {min(us):.2f}-{max(us):.2f} |")
    lines += ["", "Produced by benchmarks/l2_prefetch.py."]
    write("l2_prefetch", {"machine": machine(), "rows": rows}, "\n".join(lines) + "\n", out=args.out)


if __name__ == "__main__":
    main()

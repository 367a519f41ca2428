"""Host time of eager chat turns on one GPU: the prompt-chunk attention routes and the kernels' host wrappers.

A chat turn appended to a running generator (a continuation prompt) runs eagerly: its width seldom repeats, so
no CUDA graph serves it, and the host's time per op is the turn's time (a 100-token Qwen2.5-0.5B turn is about
25 ms of host time against about 6 ms of GPU time). This benchmark measures, in one process each:

* ``routes``: GroupQueryAttention's attention of a chunk of S tokens at context T (fp16, head size 64), on the
  decode kernel with each token as a batch entry (``decode_attention`` over one cache with a batch stride of 0)
  against masked SDPA over the first T rows (the mask, the key heads repeated for their groups, the call). GPU us
  per call from a CUDA graph of ten calls; host us per eager call (no sync). The largest difference between the
  two outputs is reported too.
* ``turns``: the GenAI benchmark's models (random weights, builder folders under --workdir), a 512-token prompt,
  then 16 continuation prompts of 90.. tokens, each until the host holds its first token, alternating
  ``CHUNK_DECODE_ROWS`` between its value (the decode-kernel route) and 0 (every chunk on SDPA) turn by turn;
  medians per route.
* ``wrappers``: host us per call of four kernel wrappers (fp16 GEMV over 896 x 9728 and, split over K,
  896 x 896; the skip RMSNorm of 100 rows of 896; the 4-bit MatMulNBits of 1 x 896 by 1152) with the kernels
  modules' ``cdiv`` / ``next_power_of_2`` bound to Triton's constexpr functions and to the plain-Python ones,
  alternated four times; ``torch.add`` of one row is the host's yardstick.

    PYTHONPATH=src python benchmarks/chat_turns.py --out benchmarks/results

Writes OUT/chat_turns.json and OUT/chat_turns.md.
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROUTE_SHAPES = (("qwen2.5-0.5b", 14, 2, 64), ("llama-3.2-1b", 32, 8, 64))
CHUNKS = (16, 60, 128, 256, 512)
CONTEXTS = (700, 2000)


def _host_us(fn: Callable[[], object], calls: int = 50) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def _route_calls(q: Any, kc: Any, vc: Any, rows: Any, T: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """The chunk's attention (q [S, N, H] at positions ``rows`` over caches [1, Nk, L, H]) on the decode kernel
    and on masked SDPA over the first T rows, both returning [S, N, H]."""
    import torch

    from crossml.kernels.decode_attention import decode_attention
    from crossml.ops._util import sdpa, sdpa_heads

    S, N, H = q.shape
    _, Nk, L, _ = kc.shape

    def on_decode() -> Any:
        return decode_attention(q, kc.expand(S, Nk, L, H), vc.expand(S, Nk, L, H), rows, H ** -0.5, len_offset=1)

    def on_sdpa() -> Any:
        allowed = torch.arange(T, device=q.device) <= rows.unsqueeze(1)
        qh = q.reshape(1, S, N, H).transpose(1, 2)
        keys, values, gqa = sdpa_heads(qh, kc[:, :, :T], vc[:, :, :T], N // Nk, masked=True)
        out = sdpa(qh, keys, values, attn_mask=allowed.reshape(1, 1, S, T), scale=H ** -0.5, enable_gqa=gqa)
        return out.transpose(1, 2).reshape(S, N, H)

    return on_decode, on_sdpa


def routes() -> list[dict[str, Any]]:
    import torch
    from _common import in_graph_us

    rows_out = []
    for name, N, Nk, H in ROUTE_SHAPES:
        L = max(CONTEXTS)
        kc, vc = (torch.randn(1, Nk, L, H, device="cuda", dtype=torch.float16) for _ in range(2))
        for S in CHUNKS:
            for T in CONTEXTS:
                q = torch.randn(S, N, H, device="cuda", dtype=torch.float16)
                on_decode, on_sdpa = _route_calls(q, kc, vc, torch.arange(T - S, T, device="cuda"), T)
                diff = (on_decode().float() - on_sdpa().float()).abs().max().item()
                rows_out.append({"model": name, "N": N, "Nk": Nk, "S": S, "T": T, "max_abs_diff": diff,
                                 "decode_gpu_us": in_graph_us([on_decode] * 10, 10),
                                 "sdpa_gpu_us": in_graph_us([on_sdpa] * 10, 10),
                                 "decode_host_us": _host_us(on_decode), "sdpa_host_us": _host_us(on_sdpa)})
                print(rows_out[-1], flush=True)
    return rows_out


def turns(folder: str) -> dict[str, Any]:
    import numpy as np
    import torch
    from _common import chat_generator

    import crossml.genai as og
    from crossml.ops.contrib import attention

    keep = attention.CHUNK_DECODE_ROWS
    model = og.Model(folder)
    gen = chat_generator(og, model)

    def turn(n: int) -> float:
        t0 = time.perf_counter()
        gen.append_tokens(np.arange(3, 3 + n, dtype=np.int32))
        gen.generate_next_token()
        gen.get_next_tokens()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    times: dict[int, list[float]] = collections.defaultdict(list)
    try:
        for rows in (keep, 0):  # one unmeasured turn each
            attention.CHUNK_DECODE_ROWS = rows
            turn(89)
        n = 90
        for r in range(8):
            for rows in (keep, 0) if r % 2 == 0 else (0, keep):
                attention.CHUNK_DECODE_ROWS = rows
                times[rows].append(turn(n))
                for _ in range(3):
                    gen.generate_next_token()
                n += 1
    finally:
        attention.CHUNK_DECODE_ROWS = keep
    return {"decode_route_ms": times[keep], "sdpa_route_ms": times[0]}


def wrappers() -> dict[str, dict[str, float]]:
    import torch
    import triton

    from crossml.kernels import _launch
    from crossml.kernels import gemv as G
    from crossml.kernels import matmul_nbits as MN
    from crossml.kernels import rmsnorm as R

    def bind(helpers: tuple[Callable[..., int], Callable[..., int]]) -> None:
        for name, mod in list(sys.modules.items()):
            if name.startswith("crossml.kernels") and mod is not None:
                if hasattr(mod, "cdiv"):
                    mod.cdiv = helpers[0]
                if hasattr(mod, "next_power_of_2"):
                    mod.next_power_of_2 = helpers[1]

    dev = "cuda"
    a = torch.randn(1, 896, device=dev, dtype=torch.float16)
    w_wide = torch.randn(896, 9728, device=dev, dtype=torch.float16)
    w_sq = torch.randn(896, 896, device=dev, dtype=torch.float16)
    x = torch.randn(1, 100, 896, device=dev, dtype=torch.float16)
    gamma = torch.randn(896, device=dev, dtype=torch.float16)
    packed = torch.randint(0, 255, (1152, 28, 16), device=dev, dtype=torch.uint8)
    scales = torch.rand(1152 * 28, device=dev, dtype=torch.float16)
    zeros = torch.randint(0, 255, (1152 * 14,), device=dev, dtype=torch.uint8)
    calls = {"GEMV 896x9728": lambda: G.gemv(a, w_wide), "GEMV 896x896 (split K)": lambda: G.gemv(a, w_sq),
             "skip RMSNorm 100x896": lambda: R.skip_rms_norm(x, x, gamma, None, 1e-6, store_inv=False),
             "MatMulNBits 896x1152": lambda: MN.matmul_nbits(a, packed, scales, zeros, K=896, N=1152, block_size=32,
                                                             const_w=True),
             "torch.add": lambda: torch.add(a, a)}
    ours = (_launch.cdiv, _launch.next_power_of_2)
    kinds = {"triton": (triton.cdiv, triton.next_power_of_2), "python": ours}
    got: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    try:
        for _ in range(4):
            for kind, helpers in kinds.items():
                bind(helpers)
                for name, fn in calls.items():
                    got[(name, kind)].append(_host_us(fn, 500))
    finally:
        bind(ours)
    return {name: {kind: statistics.median(got[(name, kind)]) for kind in kinds} for name in calls}


def markdown(payload: dict[str, Any]) -> str:
    m = payload["machine"]
    lines = ["# Eager chat turns: prompt-chunk attention routes and the kernels' host wrappers", "",
             f"GPU: {m.get('gpu')}; torch {m.get('torch')}; Python {m.get('python')}.", "",
             "## Chunk attention: decode kernel (a token per batch entry) vs masked SDPA", "",
             "fp16, head size 64. GPU us per call (CUDA graph of ten calls); host us per eager call.", "",
             "| shape | KV heads | chunk S | context T | decode GPU us | SDPA GPU us | decode host us | SDPA host us "
             "| max abs diff |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in payload["routes"]:
        lines.append(f"| {r['model']} | {r['Nk']} | {r['S']} | {r['T']} | {r['decode_gpu_us']:.1f} | "
                     f"{r['sdpa_gpu_us']:.1f} | {r['decode_host_us']:.0f} | {r['sdpa_host_us']:.0f} | "
                     f"{r['max_abs_diff']:.1e} |")
    lines += ["", "## Chat turns, routes alternated turn by turn in one process", "",
              "A 512-token prompt, then continuation prompts of 90.. tokens (3 tokens generated after each); ms until "
              "the host holds the turn's first token. Decode route: CHUNK_DECODE_ROWS as shipped; SDPA route: 0.", "",
              "| model | precision | decode route median ms | SDPA route median ms | decode route ms | SDPA route ms |",
              "| --- | --- | ---: | ---: | --- | --- |"]
    for r in payload["turns"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['precision']} | error: {r['error'][:120]} | | | |")
            continue
        d, s = r["decode_route_ms"], r["sdpa_route_ms"]
        lines.append(f"| {r['model']} | {r['precision']} | {statistics.median(d):.1f} | {statistics.median(s):.1f} "
                     f"| {' '.join(f'{t:.0f}' for t in d)} | {' '.join(f'{t:.0f}' for t in s)} |")
    lines += ["", "## Kernel wrappers: host us per call", "",
              "The kernels modules' cdiv / next_power_of_2 bound to Triton's constexpr functions or to plain Python "
              "(medians of four alternations of 500 calls).", "",
              "| call | Triton's helpers us | plain Python us |", "| --- | ---: | ---: |"]
    for name, r in payload["wrappers"].items():
        lines.append(f"| {name} | {r['triton']:.1f} | {r['python']:.1f} |")
    lines += ["", f"Wall time: {payload['wall_s']:.0f} s. Produced by benchmarks/chat_turns.py.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, HERE)
    from _common import genai_models, genai_parser, machine, write

    args = genai_parser(__doc__).parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        sys.exit("chat_turns.py needs a CUDA GPU")
    t_start = time.perf_counter()
    folders = genai_models(args)
    payload: dict[str, Any] = {"machine": machine(), "routes": routes(), "wrappers": wrappers(), "turns": []}
    for (name, prec), folder in folders.items():
        row: dict[str, Any] = {"model": name, "precision": prec}
        try:
            row.update(turns(folder))
        except Exception as exc:  # noqa: BLE001 - reported in the table
            row["error"] = f"{type(exc).__name__}: {exc}"
        payload["turns"].append(row)
        print(row, flush=True)
    payload["wall_s"] = time.perf_counter() - t_start
    print(*write("chat_turns", payload, markdown(payload), args.out), sep="\n")


if __name__ == "__main__":
    main()

"""Would one persistent Triton kernel per decode step beat the launch-per-op step? Two measurements say no.

The captured decode step launches about nine dependent kernels per layer, chained by programmatic dependent launch
(PDL). Replacing them with one persistent kernel (one program per SM, a grid-wide barrier where a launch boundary
was) only pays if a barrier costs less than a boundary. This measures, in CUDA graphs on one GPU:

1. **A boundary against a barrier.** R dependent copies of a small vector by one program per SM: as R launches
   (with and without PDL), and as one persistent kernel with R grid barriers. A barrier is what a cooperative
   grid sync does: a CTA barrier, a release atomic on one counter, polling it with acquire atomics (or with
   volatile loads then one acquire) until every program has arrived.
2. **The products of a layer chained both ways.** The four fp16 products of every layer of the GenAI benchmark's
   Qwen2.5-0.5B- and Llama-3.2-1B-shaped models (qkv, o, merged gate+up, down; each product's input is the
   previous one's output), with one activation row:
   * ``current``: the decode GEMV (``crossml.kernels.gemv``, constant weights, PDL, its split-K reduce
     launches), as the decode step runs them;
   * ``persistent``: one kernel for all layers, a barrier after each product. Work items are (N slice, K range)
     pairs dealt round-robin to the programs; partial sums are added into float32 outputs with atomics (no
     reduce phase, so this is an optimistic bound: the runtime's products are deterministic);
   * ``persistent, prefetching``: the same, with each product's first two items' weights requested before the
     barrier in front of it and each later item two items ahead of its use, which is the point of a persistent
     kernel (the weight stream need not stop at a dependency).
   The persistent kernels' final outputs are checked against the torch product chain in float32.

    python benchmarks/persistent_decode.py [--out benchmarks/results]

Writes OUT/persistent_decode.{json,md}. Needs a CUDA GPU; every configuration's program count is the SM count,
so all programs are resident (nothing else runs on the GPU during the measurement).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
import genai_bench as gb  # noqa: E402
from _common import in_graph_us, machine, results_parser, write  # noqa: E402

from crossml.kernels._launch import pdl, pdl_wait, processors  # noqa: E402
from crossml.kernels.gemv import gemv  # noqa: E402


def _dims(name: str) -> tuple[str, int, int, int, int]:
    """(model, layers, hidden, qkv width, intermediate) of a GenAI benchmark shape."""
    c = gb.SHAPES[name]
    head = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    return (name, c["num_hidden_layers"], c["hidden_size"], c["hidden_size"] + 2 * c["num_key_value_heads"] * head,
            c["intermediate_size"])


MODELS = [_dims(name) for name in gb.SHAPES]
#: dependent steps of part 1
CHAIN = 200
#: values one program copies per step in part 1
VEC = 128
#: a work item's tile: BK rows of K by BN columns of N
BK = 64
BN = 64


@triton.jit
def _grid_sync(ctr_ptr, target, POLL_LOADS: tl.constexpr):
    """Wait until ``target`` arrivals are counted at ``ctr_ptr`` (this program's included), every program's
    earlier writes visible to this one's later reads."""
    tl.debug_barrier()
    tl.atomic_add(ctr_ptr, 1, sem="release", scope="gpu")
    if POLL_LOADS:
        seen = tl.load(ctr_ptr, volatile=True)
        while seen < target:
            seen = tl.load(ctr_ptr, volatile=True)
        tl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
    else:
        seen = tl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
        while seen < target:
            seen = tl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _step_kernel(x_ptr, y_ptr, VEC: tl.constexpr, PDL: tl.constexpr = False):
    """y[program's VEC values] = x[the next program's VEC values] + 1: each step depends on another program."""
    pdl_wait(PDL)
    offs = tl.program_id(0) * VEC + tl.arange(0, VEC)
    tl.store(y_ptr + offs, tl.load(x_ptr + (offs + VEC) % (VEC * tl.num_programs(0))) + 1.0)


@triton.jit
def _steps_persistent(x_ptr, y_ptr, ctr_ptr, R, VEC: tl.constexpr, POLL_LOADS: tl.constexpr):
    """``_step_kernel`` R times, x and y swapping, a grid barrier after each step."""
    P = tl.num_programs(0)
    offs = tl.program_id(0) * VEC + tl.arange(0, VEC)
    for i in range(R):
        tl.store(y_ptr + offs, tl.load(x_ptr + (offs + VEC) % (VEC * P)) + 1.0)
        _grid_sync(ctr_ptr, (i + 1) * P, POLL_LOADS)
        x_ptr, y_ptr = y_ptr, x_ptr


@triton.jit
def _load_item(w_ptr, N, K, KS, it, TILES: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Item ``it``'s weights: rows [ks * KS, +KS) (TILES tiles of BK), columns [ns * BN, +BN) of W[K, N], as a
    [TILES, BK, BN] tile (zeros past the matrix, and for items past the last)."""
    nsl = tl.cdiv(N, BN)
    ns = it % nsl
    ks = it // nsl
    rows = ks * KS + tl.arange(0, TILES)[:, None, None] * BK + tl.arange(0, BK)[None, :, None]
    cols = ns * BN + tl.arange(0, BN)[None, None, :]
    ok = (rows < K) & (rows < ks * KS + KS) & (cols < N) & (it < nsl * tl.cdiv(K, KS))
    return tl.load(w_ptr + rows.to(tl.int64) * N + cols, mask=ok, other=0.0)


@triton.jit
def _use_item(a_ptr, out_ptr, w, N, K, KS, it, TILES: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """out[item's columns] += a[item's rows] @ w (float32 atomics)."""
    nsl = tl.cdiv(N, BN)
    ns = it % nsl
    ks = it // nsl
    rows = ks * KS + tl.arange(0, TILES)[:, None] * BK + tl.arange(0, BK)[None, :]
    a = tl.load(a_ptr + rows, mask=(rows < K) & (rows < ks * KS + KS), other=0.0)
    part = tl.sum(tl.sum(w.to(tl.float32) * a[:, :, None], axis=1), axis=0)
    cols = ns * BN + tl.arange(0, BN)
    tl.atomic_add(out_ptr + cols, part, mask=(cols < N) & (it < nsl * tl.cdiv(K, KS)), sem="relaxed")


@triton.jit
def _product(a_ptr, w_ptr, out_ptr, N, K, KS, TILES: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """This program's items of ``out += a @ W`` in turn, each as TILES [BK, BN] tiles (an unrolled loop, so the
    compiler may request them all before the first product)."""
    nsl = tl.cdiv(N, BN)
    for it in range(tl.program_id(0), nsl * tl.cdiv(K, KS), tl.num_programs(0)):
        ns = it % nsl
        ks = it // nsl
        cols = ns * BN + tl.arange(0, BN)
        acc = tl.zeros((BK, BN), dtype=tl.float32)
        for t in tl.static_range(TILES):
            rows = ks * KS + t * BK + tl.arange(0, BK)
            rows_ok = (rows < K) & (rows < ks * KS + KS)
            tile = tl.load(w_ptr + rows[:, None].to(tl.int64) * N + cols[None, :],
                           mask=rows_ok[:, None] & (cols < N)[None, :], other=0.0)
            acc += tile.to(tl.float32) * tl.load(a_ptr + rows, mask=rows_ok, other=0.0)[:, None]
        tl.atomic_add(out_ptr + cols, tl.sum(acc, axis=0), mask=cols < N, sem="relaxed")


@triton.jit
def _first_two(w_ptr, N, K, KS, TILES: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """This program's first two items' weights."""
    pid = tl.program_id(0)
    return (_load_item(w_ptr, N, K, KS, pid, TILES, BN, BK),
            _load_item(w_ptr, N, K, KS, pid + tl.num_programs(0), TILES, BN, BK))


@triton.jit
def _product_prefetched(a_ptr, w_ptr, out_ptr, w, w_next, N, K, KS, TILES: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr):
    """``_product`` with the first two items' weights given (``_first_two``), each later one requested two items
    ahead of its use."""
    P = tl.num_programs(0)
    for it in range(tl.program_id(0), tl.cdiv(N, BN) * tl.cdiv(K, KS), P):
        ahead = _load_item(w_ptr, N, K, KS, it + 2 * P, TILES, BN, BK)
        _use_item(a_ptr, out_ptr, w, N, K, KS, it, TILES, BN, BK)
        w = w_next
        w_next = ahead


@triton.jit
def _chained(a_ptr, w_ptr, out_ptr, w, w_next, N, K, KS, next_w_ptr, NEXT_N, NEXT_K, NEXT_KS, ctr_ptr, arrivals,
             TILES: tl.constexpr, NEXT_TILES: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             PREFETCH: tl.constexpr):
    """One product of the chain: this program's items of ``out += a @ W``, then (PREFETCH) the next product's
    first two items' weights requested, then the grid barrier counting ``arrivals``. Returns those weights (with
    PREFETCH; else ``w`` and ``w_next``, unused)."""
    if PREFETCH:
        _product_prefetched(a_ptr, w_ptr, out_ptr, w, w_next, N, K, KS, TILES, BN, BK)
        w, w_next = _first_two(next_w_ptr, NEXT_N, NEXT_K, NEXT_KS, NEXT_TILES, BN, BK)
    else:
        _product(a_ptr, w_ptr, out_ptr, N, K, KS, TILES, BN, BK)
    _grid_sync(ctr_ptr, arrivals, False)
    return w, w_next


@triton.jit
def _chain_persistent(h_ptr, wq, wo, wg, wd, yq, yo, yg, yd, ctr_ptr, L, H, NQ, NG, NI, KSQ, KSO, KSG, KSD,
                      TQ: tl.constexpr, TO: tl.constexpr, TG: tl.constexpr, TD: tl.constexpr, BN: tl.constexpr,
                      BK: tl.constexpr, PREFETCH: tl.constexpr):
    """For each layer l: yq[l] = a @ wq[l], yo[l] = yq[l][:H] @ wo[l], yg[l] = yo[l] @ wg[l],
    yd[l] = yg[l][:NI] @ wd[l], a = yd[l] (a = h for layer 0), a grid barrier after each product (outputs zeroed
    beforehand). PREFETCH: each product's first two items' weights are requested before the barrier in front of
    it."""
    P = tl.num_programs(0)
    arrivals = 0
    a = h_ptr
    w, w_next = 0.0, 0.0
    if PREFETCH:
        w, w_next = _first_two(wq, NQ, H, KSQ, TQ, BN, BK)
    for layer in range(L):
        li = layer.to(tl.int64)
        q_w, o_w, g_w, d_w = wq + li * H * NQ, wo + li * H * H, wg + li * H * NG, wd + li * NI * H
        q, o, g, d = yq + li * NQ, yo + li * H, yg + li * NG, yd + li * H
        next_q_w = wq + tl.minimum(layer + 1, L - 1).to(tl.int64) * H * NQ
        arrivals += P
        w_o, w_o_next = _chained(a, q_w, q, w, w_next, NQ, H, KSQ, o_w, H, H, KSO, ctr_ptr, arrivals, TQ, TO, BN, BK,
                                 PREFETCH)
        arrivals += P
        w_g, w_g_next = _chained(q, o_w, o, w_o, w_o_next, H, H, KSO, g_w, NG, H, KSG, ctr_ptr, arrivals, TO, TG, BN,
                                 BK, PREFETCH)
        arrivals += P
        w_d, w_d_next = _chained(o, g_w, g, w_g, w_g_next, NG, H, KSG, d_w, H, NI, KSD, ctr_ptr, arrivals, TG, TD, BN,
                                 BK, PREFETCH)
        arrivals += P
        w, w_next = _chained(g, d_w, d, w_d, w_d_next, H, NI, KSD, next_q_w, NQ, H, KSQ, ctr_ptr, arrivals, TD, TQ,
                             BN, BK, PREFETCH)
        a = d


def boundaries(dev: torch.device) -> list[dict]:
    """Part 1: µs per launch boundary / grid barrier."""
    P = processors(torch.empty(0, device=dev))
    x = torch.randn(VEC * P, device=dev)
    y = torch.empty_like(x)
    ctr = torch.zeros(1, dtype=torch.int32, device=dev)

    def launches(with_pdl: bool) -> Callable[[], None]:
        def run() -> None:
            a, b = x, y
            for _ in range(CHAIN):
                _step_kernel[(P,)](a, b, VEC=VEC, num_warps=4, **(pdl(a) if with_pdl else {}))
                a, b = b, a
        return run

    def persistent(poll_loads: bool) -> Callable[[], None]:
        def run() -> None:
            ctr.zero_()
            _steps_persistent[(P,)](x, y, ctr, CHAIN, VEC=VEC, POLL_LOADS=poll_loads, num_warps=4)
        return run

    rows = [("launches, PDL", launches(True)), ("launches, no PDL", launches(False)),
            ("persistent, grid barriers (polling atomics)", persistent(False)),
            ("persistent, grid barriers (polling loads)", persistent(True))]
    out = []
    for name, fn in rows:
        us = in_graph_us([fn], replays=50) / CHAIN
        print(f"{name}: {us:.3f} us per step", flush=True)
        out.append({"variant": name, "us_per_step": round(us, 3)})
    return out


def _splits(N: int, K: int, items: int, max_tiles: int) -> tuple[int, int]:
    """(K rows per item, BK tiles per item): about ``items`` items of at most ``max_tiles`` tiles."""
    splits = max(1, min(triton.cdiv(K, BK), round(items / triton.cdiv(N, BN))))
    tiles = min(max_tiles, triton.cdiv(triton.cdiv(K, splits), BK))
    return tiles * BK, tiles


#: persistent variants of part 2: (prefetching, items per program about, most tiles per item, warps)
VARIANTS = [(False, 1, 64, 8), (False, 2, 64, 8), (False, 2, 64, 4), (True, 2, 2, 4), (True, 4, 1, 4),
            (True, 2, 1, 8)]


def _current(h16: torch.Tensor, w: dict[str, torch.Tensor]) -> Callable[[], None]:
    """The chain as the decode step runs it: one ``gemv`` (and its reduce launch, when K is split) per product."""
    L, H, NI = w["q"].shape[0], w["o"].shape[1], w["d"].shape[1]

    def run() -> None:
        a = h16
        for layer in range(L):
            q = gemv(a, w["q"][layer], const_w=True)
            o = gemv(q[:, :H], w["o"][layer], const_w=True)
            a = gemv(gemv(o, w["g"][layer], const_w=True)[:, :NI], w["d"][layer], const_w=True)
    return run


def _persistent(h: torch.Tensor, w: dict[str, torch.Tensor], ys: dict[str, torch.Tensor], ctr: torch.Tensor,
                ks: list[tuple[int, int]], prefetch: bool, warps: int) -> Callable[[], None]:
    """The chain as one ``_chain_persistent`` launch on one program per SM (counter and outputs zeroed first)."""
    L, H, NQ = w["q"].shape
    NG, NI = w["g"].shape[2], w["d"].shape[1]
    sms = processors(h)

    def run() -> None:
        ctr.zero_()
        for t in ys.values():
            t.zero_()
        _chain_persistent[(sms,)](h, w["q"], w["o"], w["g"], w["d"], ys["q"], ys["o"], ys["g"], ys["d"], ctr,
                                  L, H, NQ, NG, NI, *(rows for rows, _ in ks), TQ=ks[0][1], TO=ks[1][1],
                                  TG=ks[2][1], TD=ks[3][1], BN=BN, BK=BK, PREFETCH=prefetch, num_warps=warps)
    return run


def chain(dev: torch.device, name: str, L: int, H: int, NQ: int, NI: int) -> list[dict]:
    """Part 2 for one model: µs per layer of its product chain, current kernels against persistent ones."""
    sms = processors(torch.empty(0, device=dev))
    g = torch.Generator(device=dev).manual_seed(0)
    shapes = {"q": (H, NQ), "o": (H, H), "g": (H, 2 * NI), "d": (NI, H)}
    w = {k: (torch.randn(L, K, N, device=dev, generator=g) / K ** 0.5).half() for k, (K, N) in shapes.items()}
    info = {"model": name, "layers": L, "weights_mb": sum(t.numel() * 2 for t in w.values()) / 1e6}
    h16 = torch.randn(1, H, device=dev, dtype=torch.float16, generator=g)
    ref = h16.float()
    for layer in range(L):
        o = (ref @ w["q"][layer].float())[:, :H] @ w["o"][layer].float()
        ref = (o @ w["g"][layer].float())[:, :NI] @ w["d"][layer].float()
    us = in_graph_us([_current(h16, w)], replays=50)
    print(f"{name}: current {us / L:.2f} us/layer", flush=True)
    rows = [{**info, "variant": "current", "us_per_layer": round(us / L, 2)}]
    ys = {k: torch.zeros(L, N, device=dev) for k, (_, N) in shapes.items()}
    ctr = torch.zeros(1, dtype=torch.int32, device=dev)
    for prefetch, items, max_tiles, warps in VARIANTS:
        ks = [_splits(N, K, items * sms, max_tiles) for K, N in shapes.values()]
        us = in_graph_us([_persistent(h16.float(), w, ys, ctr, ks, prefetch, warps)], replays=50)
        err = ((ys["d"][-1] - ref[0]).abs().max() / ref.abs().max()).item()
        if err > 1e-3:
            raise AssertionError(f"{name}: the persistent chain's output is off by {err:.2e} (relative)")
        variant = (f"persistent{', prefetching' if prefetch else ''}: ~{items} items per program, "
                   f"tiles per item {[t for _, t in ks]}, {warps} warps")
        print(f"{name}: {variant} {us / L:.2f} us/layer (relative error {err:.1e})", flush=True)
        rows.append({**info, "variant": variant, "us_per_layer": round(us / L, 2), "relative_error": err})
    return rows


def markdown(payload: dict) -> str:
    lines = ["# A persistent decode kernel against launches (Triton, CUDA graphs)", "",
             f"GPU: {payload['machine']['gpu']}; torch {payload['machine']['torch']}; {payload['sms']} SMs, one "
             f"program per SM in the persistent kernels. Copy bandwidth {payload['copy_gbs']:.0f} GB/s (read + written; "
             "the floor reads the weights at it).", "",
             f"## A launch boundary against a grid barrier ({CHAIN} dependent steps)", "",
             "| variant | µs per step |", "| --- | ---: |"]
    lines += [f"| {r['variant']} | {r['us_per_step']:.3f} |" for r in payload["boundaries"]]
    lines += ["", "## The fp16 products of every layer, chained (one activation row)", "",
              "| model | variant | µs per layer | weight-read floor µs per layer |", "| --- | --- | ---: | ---: |"]
    for r in payload["chains"]:
        floor = r["weights_mb"] / r["layers"] / payload["copy_gbs"] * 1e3
        lines.append(f"| {r['model']} | {r['variant']} | {r['us_per_layer']:.2f} | {floor:.2f} |")
    lines += ["", "Produced by benchmarks/persistent_decode.py."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = results_parser(__doc__)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("persistent_decode.py needs a CUDA GPU")
    dev = torch.device("cuda")
    payload = {"machine": machine(), "sms": processors(torch.empty(0, device=dev)), "copy_gbs": gb.copy_bandwidth() / 1e9,
               "boundaries": boundaries(dev),
               "chains": [r for m in MODELS for r in chain(dev, *m)]}
    write("persistent_decode", payload, markdown(payload), out=args.out)


if __name__ == "__main__":
    main()

"""Can a decode step keep the weight stream going across kernel boundaries? Two ways measured, both slower.

Batch-1 decode of the GenAI benchmark's models is bound by dependent launches, not by reading the weights
(``decode_replay.py``, ``persistent_decode.py``): each kernel waits for the previous one, and the memory system
idles at every boundary. Two ways to read the next weights before the boundary, in CUDA graphs on one GPU:

1. **L2 bulk prefetch** (``cp.async.bulk.prefetch.L2``, sm_90: one instruction asks L2 for up to 4 GB, holding no
   registers). 16 MB fp16 buffers, 40 of them rotated so none is in L2 when read: one read kernel; the same buffer
   read twice (the second read from L2: what a prefetched read could cost); two buffers read one after the
   other; the prefetch kernel alone; and the streaming pattern, the second buffer prefetched on a side stream
   while the first is read, then read.
2. **gate+up and down products in one launch** (a dataflow kernel): the programs that take the first tickets
   (an atomic counter, so a program waits only on work already held by running programs: no deadlock whatever
   order the hardware starts them in) compute the merged gate+up product for a slice of columns, g and up slices
   paired so the first K range of the down projection is complete first, store it and count the slice done on
   their K range's counter (release). The later tickets are down-projection programs: they request their first
   two weight tiles, wait for their K range's counter (acquire; epochs from the ticket, so counters never reset),
   then gate the activations as they load them and store float32 partial sums; the skip-norm kernel follows as
   in the runtime. Against ``crossml.kernels.gemv``'s gate+up GEMV then ``gemv_skip_norm`` with ``silu_mul`` (what
   the decode step runs), all layers' distinct weights in one graph; results checked against it. Variants: tiles
   (columns and K values per gate+up program, columns and K values per down program, K ranges, warps), program
   roles from tickets or from program ids (in-order dispatch, which CUDA does not promise: measured only to price
   the ticket), waiting by polling atomics or volatile loads.

    python benchmarks/weight_streaming.py [--out benchmarks/results]

Writes OUT/weight_streaming.{json,md}. Needs an NVIDIA GPU of compute capability 9.0 or later.
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
import genai_bench as gb  # noqa: E402
from _common import in_graph_us, machine, results_parser, write  # noqa: E402

from crossml.kernels._launch import cdiv, next_power_of_2, pdl, pdl_wait  # noqa: E402
from crossml.kernels.gemv import (  # noqa: E402
    _finish,
    _raw,
    _reduce_tiles,
    _split_k_norm_kernel,
    _w_tile,
    gemv,
    gemv_skip_norm,
)

#: part 1: bytes per buffer, buffers rotated, bytes per prefetch instruction
BUF_BYTES = 16 << 20
BUFFERS = 40
CHUNK = 16384


@triton.jit
def _prefetch_kernel(p, nbytes, CHUNK: tl.constexpr):
    """Program i asks L2 for bytes [i * CHUNK, +CHUNK) of the region at ``p`` (one bulk prefetch)."""
    lo = tl.program_id(0).to(tl.int64) * CHUNK + tl.arange(0, 1)
    size = tl.minimum(nbytes - lo, CHUNK).to(tl.int32)
    addr = p.to(tl.pointer_type(tl.int8)).to(tl.int64) + lo
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r", [addr, size],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _read_kernel(p, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + tl.program_id(0), tl.sum(tl.load(p + offs, mask=offs < n, other=0.0).to(tl.float32)))


def part1() -> list[dict]:
    bufs = [torch.randn(BUF_BYTES // 2, device="cuda", dtype=torch.float16) for _ in range(BUFFERS)]
    n = bufs[0].numel()
    out = torch.empty(n // 4096 + 1, device="cuda")
    side = torch.cuda.Stream()
    turn = iter(range(1 << 30))

    def nxt() -> torch.Tensor:
        return bufs[next(turn) % BUFFERS]

    def read(b: torch.Tensor) -> None:
        _read_kernel[(cdiv(n, 4096),)](b, out, n, BLOCK=4096, num_warps=4)

    def prefetch(b: torch.Tensor) -> None:
        _prefetch_kernel[(cdiv(BUF_BYTES, CHUNK),)](b, BUF_BYTES, CHUNK=CHUNK, num_warps=1)

    def twice() -> None:
        b = nxt()
        read(b)
        read(b)

    def two() -> None:
        read(nxt())
        read(nxt())

    def streamed() -> None:
        b1, b2 = nxt(), nxt()
        cur = torch.cuda.current_stream()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            prefetch(b2)
        read(b1)
        cur.wait_stream(side)
        read(b2)

    cases = [("one 16 MB read", lambda: read(nxt())), ("the same 16 MB read twice", twice),
             ("two 16 MB reads", two), ("prefetch of 16 MB alone", lambda: prefetch(nxt())),
             ("two reads, the second buffer prefetched on a side stream during the first", streamed)]
    rows = []
    for rnd in range(3):
        for name, fn in cases:
            rows.append({"case": name, "round": rnd, "us": round(in_graph_us([fn] * 10, replays=50), 2)})
    return rows


@triton.jit
def _gate_up_role(x_ptr, wgu_ptr, h_ptr, cnt_ptr, t, K, NI, KR, BN_GU: tl.constexpr, BK_GU: tl.constexpr,
                  PDL: tl.constexpr):
    """Ticket t < gate+up programs: columns [s * BN_GU, +BN_GU) of g (t even) or of up (t odd), s = t // 2, of
    ``x @ Wgu`` (Wgu column-major) stored in h, then the slice counted done on its K range's counter."""
    s = t // 2
    col0 = s * BN_GU + (t % 2) * NI
    offs_n = col0 + tl.arange(0, BN_GU)
    n_ok = offs_n < col0 + BN_GU
    offs_k = tl.arange(0, BK_GU)
    w_ptrs = wgu_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :]
    w_cur = _w_tile(w_ptrs, offs_k < K, n_ok, True)
    w_ptrs += BK_GU
    w_nxt = _w_tile(w_ptrs, BK_GU + offs_k < K, n_ok, True)
    pdl_wait(PDL)
    a_ptrs = x_ptr + offs_k
    x0 = tl.load(a_ptrs, mask=offs_k < K, other=0.0)
    acc = tl.zeros((BN_GU, BK_GU), dtype=tl.float32)
    for k in range(0, K, BK_GU):
        w = w_cur.to(tl.float32)
        w_cur = w_nxt
        w_ptrs += BK_GU
        w_nxt = _w_tile(w_ptrs, k + 2 * BK_GU + offs_k < K, n_ok, True)
        a_ptrs += BK_GU
        a0 = x0.to(tl.float32)
        x0 = tl.load(a_ptrs, mask=k + BK_GU + offs_k < K, other=0.0)
        acc += w * a0[None, :]
    tl.store(h_ptr + offs_n, tl.sum(acc, axis=1).to(h_ptr.dtype.element_ty))
    tl.debug_barrier()
    tl.atomic_add(cnt_ptr + (s * BN_GU) // KR, 1, sem="release", scope="gpu")


@triton.jit
def _down_role(h_ptr, wd_ptr, ws_ptr, cnt_ptr, d, epoch, NI, N, KR, ND_SLICES, BN_GU: tl.constexpr,
               BN_D: tl.constexpr, BK_D: tl.constexpr, POLL_LOADS: tl.constexpr, PDL: tl.constexpr):
    """Down program d: columns [pid_n * BN_D, +BN_D) over K range r of SiluMul(h) @ Wd (column-major), once the
    range's gate+up slices of this epoch are all counted; float32 partial sums to ws[r]."""
    pid_n = d % ND_SLICES
    r = d // ND_SLICES
    k_lo = r * KR
    k_hi = tl.minimum(NI, k_lo + KR)
    offs_n = pid_n * BN_D + tl.arange(0, BN_D)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BK_D)
    w_ptrs = wd_ptr + offs_n[:, None].to(tl.int64) * NI + (k_lo + offs_k)[None, :]
    w_cur = _w_tile(w_ptrs, k_lo + offs_k < k_hi, n_ok, True)
    w_ptrs += BK_D
    w_nxt = _w_tile(w_ptrs, k_lo + BK_D + offs_k < k_hi, n_ok, True)
    pdl_wait(PDL)
    need = (epoch + 1) * (2 * ((k_hi - k_lo + BN_GU - 1) // BN_GU))
    if POLL_LOADS:
        seen = tl.load(cnt_ptr + r, volatile=True)
        while seen < need:
            seen = tl.load(cnt_ptr + r, volatile=True)
        tl.atomic_add(cnt_ptr + r, 0, sem="acquire", scope="gpu")
    else:
        seen = tl.atomic_add(cnt_ptr + r, 0, sem="acquire", scope="gpu")
        while seen < need:
            seen = tl.atomic_add(cnt_ptr + r, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # the acquiring thread's view, for every thread of the program
    a_ptrs = h_ptr + k_lo + offs_k
    x0, u0 = _raw(a_ptrs, k_lo + offs_k < k_hi, NI, True)
    acc = tl.zeros((BN_D, BK_D), dtype=tl.float32)
    for k in range(k_lo, k_hi, BK_D):
        w = w_cur.to(tl.float32)
        w_cur = w_nxt
        w_ptrs += BK_D
        w_nxt = _w_tile(w_ptrs, k + 2 * BK_D + offs_k < k_hi, n_ok, True)
        a_ptrs += BK_D
        a0 = _finish(x0, u0, True)
        x0, u0 = _raw(a_ptrs, k + BK_D + offs_k < k_hi, NI, True)
        acc += w * a0[None, :]
    tl.store(ws_ptr + r.to(tl.int64) * N + offs_n, tl.sum(acc, axis=1), mask=n_ok)


@triton.jit
def _mlp_kernel(x_ptr, wgu_ptr, wd_ptr, h_ptr, ws_ptr, tick_ptr, cnt_ptr, K, NI, N, KR, GU_PROGS, D_PROGS, ND_SLICES,
                BN_GU: tl.constexpr, BK_GU: tl.constexpr, BN_D: tl.constexpr, BK_D: tl.constexpr,
                TICKETS: tl.constexpr, POLL_LOADS: tl.constexpr, PDL: tl.constexpr = False):
    if TICKETS:
        ticket = tl.atomic_add(tick_ptr, 1, sem="relaxed", scope="gpu")
        epoch = ticket // (GU_PROGS + D_PROGS)
        t = (ticket % (GU_PROGS + D_PROGS)).to(tl.int32)
    else:  # roles from program ids; only the down programs count launches
        t = tl.program_id(0)
        epoch = tl.program_id(0).to(tl.int64) * 0
        if t >= GU_PROGS:
            epoch = tl.atomic_add(tick_ptr, 1, sem="relaxed", scope="gpu") // D_PROGS
    if t < GU_PROGS:
        _gate_up_role(x_ptr, wgu_ptr, h_ptr, cnt_ptr, t, K, NI, KR, BN_GU, BK_GU, PDL)
    else:
        _down_role(h_ptr, wd_ptr, ws_ptr, cnt_ptr, t - GU_PROGS, epoch, NI, N, KR, ND_SLICES, BN_GU, BN_D, BK_D,
                   POLL_LOADS, PDL)


#: part 2 variants: (gate+up columns, gate+up K step, down columns, down K step, K ranges, warps, tickets, poll loads)
VARIANTS = [(8, 128, 16, 256, 4, 4, True, False), (16, 128, 16, 256, 4, 4, True, False),
            (16, 128, 16, 256, 4, 4, False, False), (16, 128, 16, 256, 4, 4, True, True),
            (16, 256, 16, 256, 4, 8, True, True), (16, 256, 16, 256, 4, 8, False, True),
            (16, 128, 16, 256, 8, 4, True, True)]


def dataflow_mlp(x, w_gu, w_d, residual, gamma, eps, counters, variant):
    """SkipSimplifiedLayerNormalization(residual, SiluMul(x @ w_gu) @ w_d, gamma) for one row: the dataflow kernel,
    then the runtime's skip-norm kernel. ``counters``: this layer's per-variant ticket and K-range counters."""
    bn_gu, bk_gu, bn_d, bk_d, split, warps, tickets, poll_loads = variant
    K, NI, N = w_gu.shape[0], w_d.shape[0], w_d.shape[1]
    kr = cdiv(cdiv(NI, split), bk_d) * bk_d
    split = cdiv(NI, kr)
    if kr % bn_gu or NI % bn_gu:
        raise ValueError(f"variant {variant}: K ranges of {kr} and NI={NI} must be whole gate+up slices (intermediate size NI)")
    if variant not in counters:
        counters[variant] = (torch.zeros(1, dtype=torch.int64, device=x.device),
                             torch.zeros(split, dtype=torch.int64, device=x.device))
    tick, cnt = counters[variant]
    h = torch.empty((1, 2 * NI), dtype=x.dtype, device=x.device)
    ws = torch.empty((split, 1, N), dtype=torch.float32, device=x.device)
    gu_progs, nd = 2 * NI // bn_gu, cdiv(N, bn_d)
    _mlp_kernel[(gu_progs + nd * split,)](x, w_gu, w_d, h, ws, tick, cnt, K, NI, N, kr, gu_progs, nd * split, nd,
                                          BN_GU=bn_gu, BK_GU=bk_gu, BN_D=bn_d, BK_D=bk_d, TICKETS=tickets,
                                          POLL_LOADS=poll_loads, num_warps=warps, **pdl(x))
    normed, total = torch.empty_like(residual), torch.empty_like(residual)
    block_s, _, warps = _reduce_tiles(split)
    block = next_power_of_2(N)
    _split_k_norm_kernel[(1,)](ws, w_d, residual, gamma, normed, total, 1, N, split, 1.0 / N, float(eps),
                               HAS_BIAS=False, STORE_SUM=True, BLOCK_S=block_s, BLOCK=block, SINGLE=True, RTNE=False,
                               num_warps=max(warps, min(16, block_s * block // 1024)), **pdl(x))
    return normed, total


def part2() -> list[dict]:
    torch.manual_seed(0)
    rows = []
    for name, c in gb.SHAPES.items():
        K, NI, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
        layers = []
        for _ in range(L):
            w_gu = (torch.randn(K, 2 * NI, device="cuda", dtype=torch.float16) * 0.03).t().contiguous().t()
            w_d = (torch.randn(NI, K, device="cuda", dtype=torch.float16) * 0.03).t().contiguous().t()
            layers.append((w_gu, w_d, torch.rand(K, device="cuda", dtype=torch.float16) + 0.5, {}))
        x = torch.randn(1, K, device="cuda", dtype=torch.float16)
        res = torch.randn(1, K, device="cuda", dtype=torch.float16)

        def current(w_gu, w_d, g, _, x=x, res=res):
            return gemv_skip_norm(gemv(x, w_gu, const_w=True), w_d, None, res, g, 1e-6, const_w=True, silu_mul=True)

        want = current(*layers[0])
        diffs = {}
        for v in VARIANTS:
            for _ in range(3):  # three epochs of the counters
                got = dataflow_mlp(x, layers[0][0], layers[0][1], res, layers[0][2], 1e-6, layers[0][3], v)
            diffs[v] = max((a.float() - b.float()).abs().max().item() for a, b in zip(want, got))
        for rnd in range(3):
            us = in_graph_us([lambda lay=lay: current(*lay) for lay in layers], replays=50)
            rows.append({"model": name, "variant": "current: gate+up GEMV, down GEMV, skip-norm", "round": rnd,
                         "us_per_layer": round(us, 2), "max_diff": 0.0})
            for v in VARIANTS:
                us = in_graph_us([lambda lay=lay, v=v, x=x, res=res: dataflow_mlp(x, lay[0], lay[1], res, lay[2], 1e-6, lay[3], v)
                                  for lay in layers], replays=50)
                rows.append({"model": name, "variant": _describe(v), "round": rnd, "us_per_layer": round(us, 2),
                             "max_diff": diffs[v]})
            print(f"{name} round {rnd} done", flush=True)
    return rows


def _describe(v: tuple) -> str:
    bn_gu, bk_gu, bn_d, bk_d, split, warps, tickets, poll_loads = v
    return (f"dataflow: gate+up {bn_gu}x{bk_gu}, down {bn_d}x{bk_d}, {split} K ranges, {warps} warps, "
            f"{'tickets' if tickets else 'program ids'}, polling {'loads' if poll_loads else 'atomics'}")


def _median_table(rows: list[dict], keys: tuple[str, ...], value: str) -> list[tuple]:
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r[value])
    return [(*k, sorted(v)[len(v) // 2], min(v), max(v)) for k, v in groups.items()]


def main(argv: list[str] | None = None) -> None:
    ap = results_parser(__doc__)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        sys.exit("weight_streaming.py needs an NVIDIA GPU of compute capability 9.0 or later")
    p1, p2 = part1(), part2()
    lines = ["# Streaming weights across kernel boundaries: L2 bulk prefetch and a dataflow MLP kernel", "",
             f"GPU: {machine()['gpu']}; torch {torch.__version__}; Triton {triton.__version__}. µs in CUDA graphs, "
             "medians of 3 rounds (min-max).", "",
             "## L2 bulk prefetch (cp.async.bulk.prefetch.L2), 16 MB fp16 buffers not in L2", "",
             "| case | µs | min-max |", "| --- | ---: | --- |"]
    lines += [f"| {c} | {m:.2f} | {lo:.2f}-{hi:.2f} |" for c, m, lo, hi in _median_table(p1, ("case",), "us")]
    lines += ["", "## An MLP's gate+up and down products: one dataflow launch against two GEMV launches", "",
              "Per layer, all layers' distinct weights in one graph, one activation row, skip-norm included. max diff: "
              "largest difference of the normed output and the residual sum from the current path's.", "",
              "| model | variant | µs per layer | min-max | max diff |", "| --- | --- | ---: | --- | ---: |"]
    diffs = {(r["model"], r["variant"]): r["max_diff"] for r in p2}
    lines += [f"| {m} | {v} | {med:.2f} | {lo:.2f}-{hi:.2f} | {diffs[(m, v)]:.1e} |"
              for m, v, med, lo, hi in _median_table(p2, ("model", "variant"), "us_per_layer")]
    lines += ["", "Produced by benchmarks/weight_streaming.py."]
    write("weight_streaming", {"machine": machine(), "prefetch": p1, "mlp": p2}, "\n".join(lines) + "\n",
          out=args.out)


if __name__ == "__main__":
    main()

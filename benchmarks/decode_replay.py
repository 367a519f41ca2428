"""The GenAI benchmark's captured decode step, replayed back to back: how long one token's kernels take on the
GPU, without the host's part of a generation loop, and (``--kernels``) where that time goes.

For each of the GenAI benchmark's models (``genai_bench.py``: Qwen2.5-0.5B- and Llama-3.2-1B-shaped, random
weights, fp16 and int4 builder folders, built under --workdir on first use, which needs onnxruntime-genai's
model builder importable), it appends a 512-token prompt, generates 5 tokens (the decode step is recorded as a
CUDA graph), then times --replays back-to-back replays of that graph (after 20 unmeasured) and reports the mean
per replay. With --kernels, one replay under torch.profiler: each kernel's summed duration and count (kernels of
one step overlap under programmatic dependent launch, so durations add up to more than the step), and its critical
µs: how far each of its launches moved the end of the step so far, which adds up to the step (the kernels that
bound it); with --timeline, also every kernel's start and end in OUT/decode_timeline.json.

    python benchmarks/decode_replay.py [--models qwen2.5-0.5b,llama-3.2-1b] [--precisions fp16,int4] [--kernels]
        [--layouts rows,cols --rounds 3] [--variants cols,no-SkipNormProduct --rounds 3]

``--layouts rows,cols`` measures each model with its half-precision decode weights stored as ONNX gives them
(row-major) and as GPU plans store them (column-major, ``crossml.ops.matmul.column_major_weight``), alternating
the two --rounds times in one process; the table then has a row per (model, layout, round), written to
OUT/decode_layout.{json,md}. ``--variants`` does the same with any of ``cols`` (the session as it is), ``rows``,
``lmcols`` (the vocabulary products' half-precision weights stored column-major as well, still on the vendor GEMM),
``blaslt`` (torch's vendor GEMMs through cuBLASLt, ``torch.backends.cuda.preferred_blas_library``),
``no-RULE`` (the session without the graph rule named RULE, e.g. ``no-SkipNormProduct``),
``KxN=BM:BN:BK:SPLIT:WARPS`` (the one-row half-precision GEMVs of K x N weights launched with those tiles instead of
``pick_tiles``'), ``q4:KxN=BM:BN:BK:WARPS`` (the same for 4-bit MatMulNBits products, in the kernel their rule
picks), ``vocab`` / ``cap=BITS`` (the GEMV's weight-size cap lifted / set to 2**BITS), ``normwarps=W`` (the
skip-norm kernel at W warps) and ``rmswarps=W`` (the RMSNorm kernel, GatherNorm's in an fp16 step, at W warps),
``set:MODULE.ATTRIBUTE=VALUE`` (a module constant, as ``genai_batch.py --set``; joined by ``+`` to another variant
or to more of them),
several joined by ``+``; written to OUT/decode_variants.{json,md}.

Writes OUT/decode_replay.{json,md}. This is the measurement the kernel docstrings quote as "decode replay".
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
import genai_bench as gb  # noqa: E402
from _common import apply_settings, genai_parser, machine, parse_settings, write  # noqa: E402

import crossml.genai as og  # noqa: E402
import crossml.kernels.gemv as gemv_module  # noqa: E402
import crossml.kernels.matmul_nbits as nbits_module  # noqa: E402
import crossml.kernels.rmsnorm as rmsnorm_module  # noqa: E402
import crossml.ops.layout as layout_module  # noqa: E402
import crossml.ops.matmul as matmul_ops  # noqa: E402
import crossml.runtime.session as session_module  # noqa: E402


class _Warps:
    """A Triton kernel whose launches (``kernel[grid](...)``) use ``warps`` warps whenever they name a count."""

    def __init__(self, kernel, warps: int) -> None:
        self.kernel, self.warps = kernel, warps

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kw: launch(*args, **({**kw, "num_warps": self.warps} if "num_warps" in kw else kw))


@contextlib.contextmanager
def variant(layout: str):
    """Sessions made inside store half-precision decode weights column-major ("cols", the default) or as given
    ("rows"), or ("lmcols") store the vocabulary products' weights column-major too (still on the vendor GEMM), or
    ("blaslt") run torch's vendor GEMMs through cuBLASLt, or
    ("no-RULE") leave out the graph rule named RULE, or ("KxN=BM:BN:BK:SPLIT:WARPS", several joined by
    "+") launch the one-row half-precision GEMVs of those K x N weights with those tiles instead of ``pick_tiles``'
    ("q4:KxN=BM:BN:BK:WARPS": the one-row 4-bit MatMulNBits products, in the kernel their rule picks), or
    ("vocab", alone or joined by "+") lift the GEMV's weight-size cap, so the vocabulary products run on it too
    ("cap=BITS": set it to 2**BITS; past it one-row vocabulary products stream unless
    ``set:crossml.ops.matmul.GEMV_STREAM=False``, which keeps them on the vendor GEMM), or ("normwarps=W") launch
    the skip-norm kernel after the fp16 products with W warps, or ("rmswarps=W") the RMSNorm kernel (in an fp16 decode
    step, the GatherNorm's) with W warps."""
    kept, kept_rules = matmul_ops.GEMV_WEIGHT_OPS, session_module.fusion_rules
    kept_tiles = gemv_module.pick_tiles, nbits_module.pick_tiles, nbits_module.pick_pair_tiles
    kept_cap, kept_norm = matmul_ops.GEMV_MAX_WEIGHT, gemv_module._split_k_norm_kernel
    kept_rms = rmsnorm_module._rms_norm_kernel
    kept_layout = layout_module.column_major_weight
    kept_blas = torch.backends.cuda.preferred_blas_library()
    kept_settings: dict = {}
    # module constants, as genai_batch.py --set: set:MODULE.ATTR=VALUE parts, alone or beside any other variant
    parts = layout.split("+")
    settings = parse_settings([part.removeprefix("set:") for part in parts if part.startswith("set:")])
    for name in settings:
        module, _, attr = name.rpartition(".")
        kept_settings[name] = getattr(importlib.import_module(module), attr)
    apply_settings(settings)
    layout = "+".join(part for part in parts if not part.startswith("set:")) or "cols"
    if layout == "blaslt":  # torch's vendor GEMMs through cuBLASLt instead of cuBLAS (the lm_head's)
        torch.backends.cuda.preferred_blas_library("cublaslt")
    elif layout == "lmcols":  # the vocabulary products' weights column-major too, still on the vendor GEMM
        def column_major(domain, op_type, w, device, attrs, tf32):
            if ((domain, op_type) in matmul_ops.GEMV_WEIGHT_OPS and isinstance(w, torch.Tensor)
                    and w.dtype in matmul_ops.GEMV_DTYPES and w.dim() == 2 and device.type in matmul_ops.GEMV_DEVICES
                    and w.numel() >= matmul_ops.GEMV_MAX_WEIGHT):
                return True
            return kept_layout(domain, op_type, w, device, attrs, tf32)
        layout_module.column_major_weight = column_major
    elif "=" in layout or layout == "vocab":
        chosen, chosen4 = {}, {}
        for part in layout.split("+"):
            if part.startswith("normwarps="):  # the skip-norm kernel after split products at this many warps
                gemv_module._split_k_norm_kernel = _Warps(kept_norm, int(part[10:]))
                continue
            if part.startswith("rmswarps="):  # the RMSNorm kernel (the fp16 step's GatherNorm) at this many warps
                rmsnorm_module._rms_norm_kernel = _Warps(kept_rms, int(part[9:]))
                continue
            if part == "vocab" or part.startswith("cap="):  # the GEMV's weight-size cap: 2**BITS
                matmul_ops.GEMV_MAX_WEIGHT = 1 << (40 if part == "vocab" else int(part[4:]))
                continue
            shape, _, tiles = part.partition("=")
            four = shape.startswith("q4:")
            k, _, n = shape.removeprefix("q4:").partition("x")
            (chosen4 if four else chosen)[(int(k), int(n))] = tuple(int(v) for v in tiles.split(":"))

        def pick(M, K, N, elem_size, processors, **kw):
            if M == 1 and elem_size == 2 and (K, N) in chosen:
                return chosen[(K, N)]
            return kept_tiles[0](M, K, N, elem_size, processors, **kw)

        def pick4(M, N, K, block_size, processors):
            return chosen4[(K, N)] if M == 1 and (K, N) in chosen4 else kept_tiles[1](M, N, K, block_size, processors)

        def pick4_pairs(M, N, K, block_size, processors, *early):
            rule = kept_tiles[2](M, N, K, block_size, processors, *early)
            return chosen4[(K, N)] if M == 1 and (K, N) in chosen4 and rule is not None else rule
        gemv_module.pick_tiles = pick
        nbits_module.pick_tiles, nbits_module.pick_pair_tiles = pick4, pick4_pairs
    elif layout == "rows":
        matmul_ops.GEMV_WEIGHT_OPS = set()
    elif layout.startswith("no-"):
        def without(*args, name=layout[3:]):
            rules = kept_rules(*args)
            if not any(r.name == name for r in rules):
                raise SystemExit(f"decode_replay: no session graph rule named {name!r}; rules: "
                                 f"{', '.join(r.name for r in rules)}")
            return [r for r in rules if r.name != name]
        session_module.fusion_rules = without
    elif layout != "cols":
        raise SystemExit(f"decode_replay: unknown variant {layout!r}; expected rows, cols, lmcols, blaslt, no-RULE "
                         "or KxN=tiles")
    try:
        yield
    finally:
        matmul_ops.GEMV_WEIGHT_OPS, session_module.fusion_rules, matmul_ops.GEMV_MAX_WEIGHT = kept, kept_rules, kept_cap
        gemv_module._split_k_norm_kernel, layout_module.column_major_weight = kept_norm, kept_layout
        rmsnorm_module._rms_norm_kernel = kept_rms
        torch.backends.cuda.preferred_blas_library(kept_blas)
        gemv_module.pick_tiles, nbits_module.pick_tiles, nbits_module.pick_pair_tiles = kept_tiles
        apply_settings(kept_settings)


def replay_ms(folder: str, replays: int, kernels: bool,
              timeline: list | None = None) -> tuple[float, list[tuple[str, int, float, float]]]:
    """Mean ms per back-to-back replay of the model's recorded decode step, and (with ``kernels``) the kernels of
    one replay as (name, count, summed µs, critical µs), longest critical first: a kernel's critical µs is how far
    its end moved the latest end of the kernels before it (in start order), so the column adds up to the replay's
    span however the kernels overlap. ``timeline``: a list that receives each kernel of that replay as (name,
    start µs, end µs) from the first kernel's start, in start order."""
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=800, min_length=800)
    gen = og.Generator(model, params)
    gen.append_tokens(np.arange(3, 515, dtype=np.int32))
    for _ in range(5):
        gen.generate_next_token()
        gen.get_next_tokens()
    replay = gen._bufs.replay  # the recorded decode step (crossml internals)
    for _ in range(20):
        replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(replays):
        replay()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t) / replays * 1e3
    table: list[tuple[str, int, float, float]] = []
    if kernels:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            replay()
            torch.cuda.synchronize()
        spans = sorted((e.time_range.start, e.time_range.end, e.name[:60]) for e in prof.events()
                       if e.device_type.name == "CUDA")
        agg: dict[str, list[float]] = {}
        latest = spans[0][0] if spans else 0
        for start, end, name in spans:
            a = agg.setdefault(name, [0, 0.0, 0.0])
            a[0] += 1
            a[1] += end - start
            a[2] += max(0, end - latest)
            latest = max(latest, end)
        if timeline is not None and spans:
            timeline += [(n, round(a - spans[0][0], 2), round(b - spans[0][0], 2)) for a, b, n in spans]
        table = sorted(((k, int(n), us, crit) for k, (n, us, crit) in agg.items()), key=lambda r: -r[3])
    del gen, model
    return ms, table


def main(argv: list[str] | None = None) -> None:
    ap = genai_parser(__doc__, models=",".join(gb.SHAPES))
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--kernels", action="store_true", help="also list one replay's kernels")
    ap.add_argument("--timeline", action="store_true",
                    help="with --kernels, also write one replay's kernels in start order (name, start, end µs) to "
                         "OUT/decode_timeline.json")
    ap.add_argument("--layouts", default="cols", help="rows, cols or rows,cols: how half decode weights are stored")
    ap.add_argument("--variants", help="comma-separated cols, rows, no-RULE, KxN=BM:BN:BK:SPLIT:WARPS[+...] "
                                       "(instead of --layouts)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the layouts, alternated")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("decode_replay.py needs a CUDA GPU")
    folders = gb.build_all(args.workdir, args.models.split(","), args.precisions.split(","), print)
    layouts = (args.variants or args.layouts).split(",")
    rows, timelines = [], {}
    for (name, prec), folder in folders.items():
        for rnd in range(args.rounds):
            for layout in layouts:
                spans: list | None = [] if args.timeline and args.kernels else None
                with variant(layout):
                    ms, table = replay_ms(folder, args.replays, args.kernels, spans)
                if spans:
                    timelines[f"{name} {prec} {layout} {rnd}"] = spans
                print(f"{name} {prec} {layout} round {rnd}: {ms:.3f} ms per replay", flush=True)
                rows.append({"model": name, "precision": prec, "layout": layout, "round": rnd,
                             "replay_ms": round(ms, 4),
                             "kernels": [{"name": k, "count": n, "us": round(us, 2), "critical_us": round(c, 2)}
                                         for k, n, us, c in table]})
    several = len(layouts) > 1 or args.rounds > 1
    lines = ["# Decode step replayed back to back (GenAI benchmark models)", "",
             f"GPU: {machine()['gpu']}; torch {torch.__version__}. Prompt 512 tokens, then the recorded decode step "
             f"replayed {args.replays} times back to back (mean)."
             + (" Variants alternated in one process: `cols` the session as it is (half-precision decode weights "
                "column-major), `rows` those weights row-major, `lmcols` the vocabulary weights column-major too "
                "(vendor GEMM), `blaslt` torch's vendor GEMMs through cuBLASLt, "
                "`no-RULE` without that graph rule, "
                "`KxN=BM:BN:BK:SPLIT:WARPS` the one-row GEMVs of that weight shape with those tiles (`q4:` 4-bit "
                "products; `vocab` / `cap=BITS` the GEMV's weight cap; `normwarps=W` the skip-norm's warps)."
                if several else ""), "",
             "| model | precision | weights | round | ms per replay |" if several else
             "| model | precision | ms per replay |",
             "| --- | --- | --- | ---: | ---: |" if several else "| --- | --- | ---: |"]
    lines += [f"| {r['model']} | {r['precision']} | {r['layout']} | {r['round']} | {r['replay_ms']:.3f} |" if several
              else f"| {r['model']} | {r['precision']} | {r['replay_ms']:.3f} |" for r in rows]
    for r in rows:
        if r["kernels"]:
            lines += ["", f"## {r['model']} {r['precision']}{' ' + r['layout'] if several else ''}: kernels of one "
                      "replay", "",
                      "| kernel | count | summed µs | critical µs |", "| --- | ---: | ---: | ---: |"]
            lines += [f"| {k['name']} | {k['count']} | {k['us']:.1f} | {k['critical_us']:.1f} |" for k in r["kernels"]]
    lines += ["", "Produced by benchmarks/decode_replay.py."]
    result = ("decode_variants" if args.variants else "decode_layout") if several else "decode_replay"
    if timelines:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "decode_timeline.json"), "w") as f:
            json.dump({"machine": machine(), "timelines": timelines}, f)
    write(result, {"machine": machine(), "replays": args.replays, "rows": rows}, "\n".join(lines) + "\n", out=args.out)


if __name__ == "__main__":
    main()

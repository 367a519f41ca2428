"""One gpt-oss-20b MoE layer's decode step (one token) on one GPU: the Triton expert GEMV against the torch gather.

The layer: 32 experts, top 4, hidden 2880, intermediate 2880, swiglu with fc1's gate and linear rows interleaved
and biases (alpha 1.702, beta 1, limit 7), routing weights normalized; as fp16 MoE and as int4 QMoE (block 32,
fp16 scales, no zero points: the builder's default). The op functions (``crossml.ops.contrib.moe.moe`` / ``qmoe``)
are called directly on CUDA tensors, in the "gather" mode a decode step takes (tokens x k <= experts):

* ``kernel``: fc1 and fc2 through ``crossml.kernels.moe.expert_gemv``, the chosen experts' weights read in place;
* ``torch gather``: the fallback (``use_expert_kernel`` patched to False): the chosen experts' weights gathered
  (dequantized for QMoE) into a new tensor, then one batched product per projection;
* ``GEMVs only``: the two ``expert_gemv`` calls of the step alone (fc1 for the token's 4 slots, fc2 for each),
  without routing, activation and the weighted sum.

µs per step: mean over CUDA graphs of 8 consecutive steps whose router logits pick 8 disjoint sets of 4 experts
(all 32 experts once per graph, so no step finds its weights in L2 from the step before). The floor: the bytes of
the 4 chosen experts' fc1 + fc2 weights (with scales and biases) / the device's copy bandwidth (bytes read + written,
``genai_bench.copy_bandwidth``): what a step costs if it only streams its weights once at copy speed.

    python benchmarks/moe_decode.py [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

from _common import RESULTS, in_graph_us, machine, write  # noqa: E402
from genai_bench import copy_bandwidth  # noqa: E402

from crossml.ops.contrib import moe as moe_module  # noqa: E402

E, TOP_K, HIDDEN, INTER, BLOCK = 32, 4, 2880, 2880, 32
ATTRS = dict(k=TOP_K, activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=1, swiglu_limit=7.0,
             activation_alpha=1.702, activation_beta=1.0)
STEPS = E // TOP_K  # one graph: every expert chosen once


def _layer(kind: str, dev: torch.device) -> tuple[list, dict, dict]:
    """(op inputs after x and the router logits, op attributes, expert_gemv keywords of fc1 and fc2)."""
    g = torch.Generator(device=dev).manual_seed(0)
    dt = torch.float16
    b1 = torch.randn(E, 2 * INTER, device=dev, generator=g).mul_(0.1).to(dt)
    b2 = torch.randn(E, HIDDEN, device=dev, generator=g).mul_(0.1).to(dt)
    if kind == "fp16 MoE":
        w1 = torch.randn(E, 2 * INTER, HIDDEN, device=dev, generator=g).mul_(0.02).to(dt)
        w2 = torch.randn(E, HIDDEN, INTER, device=dev, generator=g).mul_(0.02).to(dt)
        gemv = ({"weight": w1, "bias": b1}, {"weight": w2, "bias": b2})
        return [w1, b1, w2, b2], dict(ATTRS), gemv
    w1 = torch.randint(0, 256, (E, 2 * INTER, HIDDEN // 2), device=dev, generator=g, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (E, HIDDEN, INTER // 2), device=dev, generator=g, dtype=torch.uint8)
    s1 = torch.rand(E, 2 * INTER, HIDDEN // BLOCK, device=dev, generator=g).mul_(0.004).add_(0.001).to(dt)
    s2 = torch.rand(E, HIDDEN, INTER // BLOCK, device=dev, generator=g).mul_(0.004).add_(0.001).to(dt)
    q = dict(bits=4, block_size=BLOCK)
    gemv = ({"weight": w1, "bias": b1, "scales": s1, **q}, {"weight": w2, "bias": b2, "scales": s2, **q})
    return [w1, s1, b1, w2, s2, b2], dict(ATTRS, expert_weight_bits=4, block_size=BLOCK), gemv


def _expert_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of one expert's slice of each ``[E, ...]`` tensor."""
    return sum(t.numel() * t.element_size() // E for t in tensors if t is not None)


def _router_logits(dev: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """STEPS [1, E] logits; step i picks experts 4i .. 4i+3 (small noise, those four lifted by 6)."""
    g = torch.Generator(device=dev).manual_seed(1)
    out = []
    for i in range(STEPS):
        logits = torch.randn(1, E, device=dev, generator=g) * 0.5
        logits[0, TOP_K * i:TOP_K * (i + 1)] += 6.0
        out.append(logits.to(dtype))
    return out


def _step_calls(fn, x: torch.Tensor, logits: list[torch.Tensor], weights: list, attrs: dict) -> list:
    """One op call per router logits tensor."""
    return [functools.partial(fn, x, lg, *weights, **attrs) for lg in logits]


def _gemv_calls(x: torch.Tensor, act: torch.Tensor, fc1: dict, fc2: dict) -> list:
    """The step's two products on the kernel per set of experts: fc1 for the token's slots, fc2 for each slot."""
    from crossml.kernels.moe import expert_gemv

    def gemvs(ex: torch.Tensor) -> torch.Tensor:
        expert_gemv(x, ex, **fc1, N=2 * INTER, K=HIDDEN, rows_per_token=TOP_K)
        return expert_gemv(act, ex, **fc2, N=HIDDEN, K=INTER, rows_per_token=1)

    experts = [torch.arange(TOP_K * i, TOP_K * (i + 1), device=x.device) for i in range(STEPS)]
    return [functools.partial(gemvs, ex) for ex in experts]


def _measure(kind: str, dev: torch.device, bw: float) -> list[dict]:
    """The rows of one layer kind: kernel, torch gather, GEMVs only."""
    weights, attrs, (fc1, fc2) = _layer(kind, dev)
    fn = moe_module.moe if kind == "fp16 MoE" else moe_module.qmoe
    x = torch.randn(1, HIDDEN, device=dev, dtype=torch.float16)
    logits = _router_logits(dev, torch.float16)
    for i, lg in enumerate(logits):  # the steps' experts are the ones meant
        chosen = moe_module.route(lg.float(), TOP_K, True)[0]
        assert sorted(chosen[0].tolist()) == list(range(TOP_K * i, TOP_K * (i + 1))), chosen
    step_bytes = TOP_K * _expert_bytes([t for t in weights if t.dim() >= 2])
    real_use = moe_module.use_expert_kernel
    rows, outs = [], {}
    for path in ("kernel", "torch gather"):
        moe_module.use_expert_kernel = real_use if path == "kernel" else (lambda device: False)
        try:
            assert moe_module.expert_mode(dev, 1, TOP_K, E) == "gather"
            outs[path] = fn(x, logits[0], *weights, **attrs).float()
            us = in_graph_us(_step_calls(fn, x, logits, weights, attrs))
        finally:
            moe_module.use_expert_kernel = real_use
        rows.append({"layer": kind, "path": path, "us_per_step": us})
    act = torch.randn(TOP_K, INTER, device=dev, dtype=torch.float16)
    rows.append({"layer": kind, "path": "GEMVs only", "us_per_step": in_graph_us(_gemv_calls(x, act, fc1, fc2))})
    floor_us = step_bytes / bw * 1e6
    diff = float((outs["kernel"] - outs["torch gather"]).abs().max())
    for r in rows:
        r.update(weight_bytes=step_bytes, floor_us=floor_us, floor_fraction=floor_us / r["us_per_step"],
                 max_abs_diff_kernel_vs_torch=diff, output_max_abs=float(outs["torch gather"].abs().max()))
        print(r, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("moe_decode: needs a CUDA GPU")
    dev = torch.device("cuda")
    assert moe_module.use_expert_kernel(dev), "the expert GEMV kernel does not run on this device"
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for kind in ("fp16 MoE", "int4 QMoE"):
        rows += _measure(kind, dev, bw)
        torch.cuda.empty_cache()

    lines = ["# gpt-oss-20b MoE layer, one decode step (1 token, top 4 of 32 experts, hidden 2880, inter 2880)", "",
             f"GPU: {machine()['gpu']}; torch {torch.__version__}. Copy bandwidth (read + write): {bw / 1e9:.0f} GB/s. "
             f"µs per step, mean over CUDA graphs of {STEPS} steps on disjoint experts. Floor: the 4 experts' fc1 + "
             "fc2 weights, scales and biases at copy bandwidth.", "",
             "| layer | path | µs / step | weight MB / step | floor µs | floor / time |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['layer']} | {r['path']} | {r['us_per_step']:.1f} | {r['weight_bytes'] / 1e6:.1f} | "
                     f"{r['floor_us']:.1f} | {r['floor_fraction']:.2f} |")
    lines += ["", "Kernel and torch outputs of one step differ by at most "
              + ", ".join(f"{r['max_abs_diff_kernel_vs_torch']:.2g} ({r['layer']}, outputs up to "
                          f"{r['output_max_abs']:.2g})" for r in rows if r["path"] == "kernel") + ".",
              "", "Produced by benchmarks/moe_decode.py."]
    write("moe_decode", {"machine": machine(), "copy_bandwidth_gbs": bw / 1e9, "rows": rows},
          "\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()

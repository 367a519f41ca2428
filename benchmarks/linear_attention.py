"""LinearAttention and CausalConvWithState (com.microsoft, Gated DeltaNet layers: Qwen3.5) on one GPU: the Triton
kernels against the torch paths.

One layer's recurrence (gated_delta, fp16 tensors and state as the builder's fp16 export has them, batch 1):

* ``decode``: one token, µs per call, mean over a CUDA graph of 8 calls (the recorded decode step's cost);
* ``prompt``: 512 tokens, ms per call, eager (prompts of state-carrying models run unrecorded), median of 5.

``kernel`` is the op's path on a GPU (``crossml.kernels.linear_attention``, one launch); ``torch`` the token loop of
``crossml.ops.attention.linear_recurrence``, the path it had before and every other device's.

The layer's convolution (CausalConvWithState, SiLU, kernel 4, fp16, over the q | k | v channels, fed the transposed
view of the projection's output as the builder's graph has it) the same way: ``kernel`` is
``crossml.kernels.short_conv.causal_conv``, ``torch`` the op's torch path (``crossml.ops.attention.causal_conv``).

    python benchmarks/linear_attention.py [--out DIR]
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

from _common import in_graph_us, machine, results_parser, time_ms, write  # noqa: E402

import crossml.ops.attention as attention  # noqa: E402

#: name -> (key heads = query heads, state (value) heads, d_k, d_v)
SHAPES = {"Qwen3_5TextConfig defaults (16 key, 32 value heads of 128)": (16, 32, 128, 128),
          "16 key, 16 value heads of 128": (16, 16, 128, 128)}
PROMPT = 512


def _inputs(hk: int, hv: int, dk: int, dv: int, t: int):
    dev, f16 = torch.device("cuda"), torch.float16
    q = torch.randn(1, t, hk * dk, device=dev, dtype=f16)
    k = torch.nn.functional.normalize(torch.randn(1, t, hk, dk, device=dev), dim=-1).reshape(1, t, -1).to(f16)
    v = torch.randn(1, t, hv * dv, device=dev, dtype=f16)
    past = torch.randn(1, hv, dk, dv, device=dev, dtype=f16)
    decay = -torch.rand(1, t, hv, device=dev).to(f16)
    beta = torch.rand(1, t, hv, device=dev).to(f16)
    return q, k, v, past, decay, beta


def _call(hk: int, hv: int, tensors):
    return lambda: attention.linear_recurrence(*tensors, hk, hv, 0.0, "gated_delta", shared_keys=True)


def _conv_call(channels: int, t: int):
    dev, f16 = torch.device("cuda"), torch.float16
    x = torch.randn(1, t, channels, device=dev, dtype=f16).transpose(1, 2)
    w = torch.randn(channels, 1, 4, device=dev, dtype=f16)
    past = torch.randn(1, channels, 3, device=dev, dtype=f16)
    return lambda: attention.causal_conv(x, w, None, past, "silu")


def main() -> None:
    args = results_parser(__doc__).parse_args()
    rows = []
    real = attention.load_compiled
    for name, (hk, hv, dk, dv) in SHAPES.items():
        for path in ("kernel", "torch"):
            attention.load_compiled = real if path == "kernel" else (lambda _name: None)
            try:
                decode = in_graph_us([_call(hk, hv, _inputs(hk, hv, dk, dv, 1)) for _ in range(8)])
                prompt = time_ms(_call(hk, hv, _inputs(hk, hv, dk, dv, PROMPT)), warmup=1,
                                 runs=5 if path == "kernel" else 3, sync=torch.cuda.synchronize)["median_ms"]
            finally:
                attention.load_compiled = real
            rows.append({"shape": name, "path": path, "decode_us": decode, "prompt_ms": prompt})
            print(rows[-1], flush=True)
    conv_rows = []
    for name, (hk, hv, dk, dv) in SHAPES.items():
        channels = 2 * hk * dk + hv * dv
        for path in ("kernel", "torch"):
            attention.load_compiled = real if path == "kernel" else (lambda _name: None)
            try:
                decode = in_graph_us([_conv_call(channels, 1) for _ in range(8)])
                prompt = time_ms(_conv_call(channels, PROMPT), warmup=1, runs=5,
                                 sync=torch.cuda.synchronize)["median_ms"]
            finally:
                attention.load_compiled = real
            conv_rows.append({"shape": name, "channels": channels, "path": path, "decode_us": decode,
                              "prompt_ms": prompt})
            print(conv_rows[-1], flush=True)
    lines = ["# LinearAttention (gated_delta) on one GPU: Triton kernel against the torch path", "",
             f"GPU: {machine()['gpu']}; torch {torch.__version__}. One layer, batch 1, fp16 tensors and state. decode: "
             "one token, µs per call in a CUDA graph of 8 calls. prompt: 512 tokens, eager, median ms.", "",
             "| layer | decode µs kernel | decode µs torch | torch / kernel | prompt ms kernel | prompt ms torch | "
             "torch / kernel |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in SHAPES:
        t = {r["path"]: r for r in rows if r["shape"] == name}
        k, tp = t["kernel"], t["torch"]
        lines.append(f"| {name} | {k['decode_us']:.1f} | {tp['decode_us']:.1f} | {tp['decode_us'] / k['decode_us']:.1f}x"
                     f" | {k['prompt_ms']:.2f} | {tp['prompt_ms']:.1f} | {tp['prompt_ms'] / k['prompt_ms']:.0f}x |")
    lines += ["", "## The layer's CausalConvWithState (q | k | v channels, kernel 4, SiLU, fp16)", "",
              "| layer | channels | decode µs kernel | decode µs torch | torch / kernel | prompt ms kernel | "
              "prompt ms torch | torch / kernel |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in SHAPES:
        t = {r["path"]: r for r in conv_rows if r["shape"] == name}
        k, tp = t["kernel"], t["torch"]
        lines.append(f"| {name} | {k['channels']} | {k['decode_us']:.1f} | {tp['decode_us']:.1f} | "
                     f"{tp['decode_us'] / k['decode_us']:.1f}x | {k['prompt_ms']:.3f} | {tp['prompt_ms']:.3f} | "
                     f"{tp['prompt_ms'] / k['prompt_ms']:.1f}x |")
    lines += ["", "Produced by benchmarks/linear_attention.py."]
    write("linear_attention", {"machine": machine(), "rows": rows, "conv_rows": conv_rows}, "\n".join(lines) + "\n",
          args.out)


if __name__ == "__main__":
    main()

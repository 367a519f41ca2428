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

import crossml.ops._util as op_util  # noqa: E402
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


def _ab(make_call, prompt_runs: int) -> dict[str, dict[str, float]]:
    """decode µs and prompt ms of ``make_call(tokens)``'s calls with the kernels (``kernel``) and without (``torch``)."""
    out = {}
    for path in ("kernel", "torch"):
        op_util.GPU_KERNELS = path == "kernel"
        try:
            out[path] = {"decode_us": in_graph_us([make_call(1) for _ in range(8)]),
                         "prompt_ms": time_ms(make_call(PROMPT), warmup=1, runs=prompt_runs,
                                              sync=torch.cuda.synchronize)["median_ms"]}
        finally:
            op_util.GPU_KERNELS = True
        print(path, out[path], flush=True)
    return out


def _row(cells: list, t: dict, prompt_digits: int) -> str:
    k, tp = t["kernel"], t["torch"]
    return (f"| {' | '.join(map(str, cells))} | {k['decode_us']:.1f} | {tp['decode_us']:.1f} | "
            f"{tp['decode_us'] / k['decode_us']:.1f}x | {k['prompt_ms']:.{prompt_digits}f} | "
            f"{tp['prompt_ms']:.{prompt_digits}f} | {tp['prompt_ms'] / k['prompt_ms']:.1f}x |")


def main() -> None:
    args = results_parser(__doc__).parse_args()
    rows, conv_rows = [], []
    for name, (hk, hv, dk, dv) in SHAPES.items():
        t = _ab(lambda tokens, hk=hk, hv=hv, dk=dk, dv=dv: _call(hk, hv, _inputs(hk, hv, dk, dv, tokens)), 3)
        rows += [{"shape": name, "path": path, **v} for path, v in t.items()]
        channels = 2 * hk * dk + hv * dv
        t = _ab(lambda tokens, channels=channels: _conv_call(channels, tokens), 5)
        conv_rows += [{"shape": name, "channels": channels, "path": path, **v} for path, v in t.items()]
    head = ("decode µs kernel | decode µs torch | torch / kernel | prompt ms kernel | prompt ms torch | torch / kernel |")
    lines = ["# LinearAttention (gated_delta) on one GPU: Triton kernel against the torch path", "",
             f"GPU: {machine()['gpu']}; torch {torch.__version__}. One layer, batch 1, fp16 tensors and state. decode: "
             "one token, µs per call in a CUDA graph of 8 calls. prompt: 512 tokens, eager, median ms.", "",
             "| layer | " + head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in SHAPES:
        lines.append(_row([name], {r["path"]: r for r in rows if r["shape"] == name}, 2))
    lines += ["", "## The layer's CausalConvWithState (q | k | v channels, kernel 4, SiLU, fp16)", "",
              "| layer | channels | " + head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in SHAPES:
        t = {r["path"]: r for r in conv_rows if r["shape"] == name}
        lines.append(_row([name, t["kernel"]["channels"]], t, 3))
    lines += ["", "Produced by benchmarks/linear_attention.py."]
    write("linear_attention", {"machine": machine(), "rows": rows, "conv_rows": conv_rows}, "\n".join(lines) + "\n",
          args.out)


if __name__ == "__main__":
    main()

"""GroupQueryAttention decode steps on window-sized KV caches (sliding_window_cache=1) on one GPU.

Per decode step of one layer (batch 1, fp16), in CUDA graphs of 17 consecutive steps (one eviction among them
once the cache is full: capacity = window + 16, so it evicts 17 rows every 17 steps):

* ``kernels``: the op's Triton path (``evict_rows``, which does nothing on a step that does not evict, then the
  decode kernel);
* ``torch``: the op's torch path (``_windowed``: the resident rows and the new one joined, attention, the
  present rows gathered), the path every other device takes;
* ``full cache``: the same attention over a max-length cache (``local_window_size`` alone, no eviction) on the
  decode kernel, what the model would cost without window-sized caches.

The Gemma-2 layer runs twice: without a softcap, and with its model's ``attn_logit_softcapping`` of 50 (the
decode kernel caps the scores; the torch path caps them in float32 before the softmax).

    python benchmarks/windowed_decode.py [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

from _common import RESULTS, in_graph_us, machine, write  # noqa: E402

from crossml.ops.contrib import attention  # noqa: E402
from crossml.ops.registry import OpContext  # noqa: E402

#: name -> (query heads, KV heads, head size, window, softcap)
SHAPES = {"gemma-2-2b local layer": (8, 4, 256, 4096, 0.0),
          "gemma-2-2b local layer, softcap 50": (8, 4, 256, 4096, 50.0),
          "mistral-7b layer": (32, 8, 128, 4096, 0.0)}
STEPS = 17


def _steps(N: int, Nk: int, H: int, W: int, softcap: float, start: int, path: str) -> list:
    dev = torch.device("cuda")
    C = W + 16 if path != "full cache" else start + STEPS + 1
    ctx = OpContext("gqa", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)
    ctx.extra["kv_inplace"] = True
    kw = dict(num_heads=N, kv_num_heads=Nk, do_rotary=1, local_window_size=W, softcap=softcap, ctx=ctx,
              sliding_window_cache=int(path != "full cache"))
    kc = torch.randn(1, Nk, C, H, device=dev, dtype=torch.float16)
    vc = torch.randn_like(kc)
    cos = torch.randn(start + 64, H // 2, device=dev, dtype=torch.float16)
    sin = torch.randn_like(cos)
    qkv = torch.randn(1, 1, (N + 2 * Nk) * H, device=dev, dtype=torch.float16)
    total = torch.tensor(start + STEPS, dtype=torch.int32)
    calls = []
    for i in range(STEPS):
        lens = torch.tensor([start + i], dtype=torch.int32, device=dev)
        calls.append(lambda lens=lens: attention.group_query_attention(qkv, None, None, kc, vc, lens, total, cos,
                                                                       sin, **kw))
    return calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args()
    rows = []
    fast_ok = attention._fast_ok
    for name, (N, Nk, H, W, softcap) in SHAPES.items():
        for start in (1024, 3 * W):
            for path in ("kernels", "torch", "full cache"):
                attention._fast_ok = fast_ok if path != "torch" else (lambda *a, **k: False)
                try:
                    us = in_graph_us(_steps(N, Nk, H, W, softcap, start, path))
                finally:
                    attention._fast_ok = fast_ok
                rows.append({"shape": name, "softcap": softcap, "position": start, "path": path,
                             "us_per_step": us})
                print(rows[-1], flush=True)
    lines = ["# GroupQueryAttention decode steps on window-sized KV caches (one layer, batch 1, fp16)", "",
             f"GPU: {machine()['gpu']}; torch {torch.__version__}. µs per step, mean over graphs of {STEPS} "
             "consecutive steps (capacity window + 16: one eviction per graph once the cache is full).", "",
             "| layer | position | kernels | torch path | full-length cache (kernels) | torch / kernels |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name in SHAPES:
        for start in sorted({r["position"] for r in rows if r["shape"] == name}):
            t = {r["path"]: r["us_per_step"] for r in rows if r["shape"] == name and r["position"] == start}
            lines.append(f"| {name} | {start} | {t['kernels']:.1f} | {t['torch']:.1f} | {t['full cache']:.1f} | "
                         f"{t['torch'] / t['kernels']:.1f}x |")
    lines += ["", "Produced by benchmarks/windowed_decode.py."]
    write("windowed_decode", {"machine": machine(), "rows": rows}, "\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()

"""The ONNX Attention op's grouped-query calls on one GPU: SDPA's ``enable_gqa`` against key/value heads repeated
for their groups (what ``crossml.ops._util.sdpa_heads`` picks), per call.

Of torch's fused CUDA attention kernels only flash attention (fp16 / bf16, no mask) broadcasts key/value heads;
with a mask or in float32 ``enable_gqa`` sends the call to the math backend. Each row times the op both ways in
one process (CUDA events over 20 back-to-back calls after one unmeasured call), 32 query heads over 8, head size
64, batch 1, a boolean causal mask or ``is_causal``.

    python benchmarks/attention_gqa.py --out benchmarks/results

Writes OUT/attention_gqa.json and OUT/attention_gqa.md.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def per_call_us(fn, n: int = 20) -> float:  # noqa: ANN001
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e3


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    import torch
    from _common import machine, write

    from crossml.ops import attention as A
    from crossml.ops.registry import OpContext

    if not torch.cuda.is_available():
        sys.exit("attention_gqa needs a CUDA GPU")
    ctx = OpContext("attention", "Attention", 23, 1, (None,), (True,))
    rule = A.sdpa_heads

    def broadcast(q, k, v, groups, masked):  # noqa: ANN001, ANN202
        return k, v, groups > 1

    rows = []
    for dtype in (torch.float16, torch.float32):
        for tokens in (512, 2048):
            q = torch.randn(1, 32, tokens, 64, device="cuda", dtype=dtype)
            k = torch.randn(1, 8, tokens, 64, device="cuda", dtype=dtype)
            v = torch.randn_like(k)
            mask = torch.ones(tokens, tokens, dtype=torch.bool, device="cuda").tril()
            for kind, call in (("boolean mask", lambda q=q, k=k, v=v, m=mask: A.attention(q, k, v, m, ctx=ctx)),
                               ("is_causal", lambda q=q, k=k, v=v: A.attention(q, k, v, None, is_causal=1, ctx=ctx))):
                A.sdpa_heads = broadcast
                try:
                    before = per_call_us(call)
                    y0 = call()
                finally:
                    A.sdpa_heads = rule
                after = per_call_us(call)
                diff = (call().float() - y0.float()).abs().max().item()
                rows.append({"dtype": str(dtype).removeprefix("torch."), "tokens": tokens, "mask": kind,
                             "enable_gqa_us": before, "rule_us": after, "max_abs_diff": diff})
                print(rows[-1], flush=True)
    m = machine()
    lines = ["# ONNX Attention, grouped-query calls: SDPA's enable_gqa vs repeated key/value heads", "",
             f"GPU: {m.get('gpu')}; torch {m.get('torch')}. 32 query heads over 8, head size 64, batch 1; µs per "
             "call (CUDA events, 20 calls). Rule: what `sdpa_heads` picks (repeated heads with a mask or in "
             "float32, `enable_gqa` otherwise, so the is_causal fp16 rows run the same code both ways).", "",
             "| dtype | tokens | mask | enable_gqa µs | rule µs | max abs diff |", "| --- | ---: | --- | ---: | ---: | ---: |"]
    lines += [f"| {r['dtype']} | {r['tokens']} | {r['mask']} | {r['enable_gqa_us']:.1f} | {r['rule_us']:.1f} | "
              f"{r['max_abs_diff']:.1e} |" for r in rows]
    lines += ["", "Produced by benchmarks/attention_gqa.py.", ""]
    write("attention_gqa", {"machine": m, "rows": rows}, "\n".join(lines), args.out)


if __name__ == "__main__":
    main()

"""Triton kernels vs the vendor libraries on a GPU: crossml's GEMM vs torch.matmul (cuBLAS /
hipBLASLt) and its convolution vs F.conv2d (cuDNN / MIOpen), on ResNet-50-like shapes, fp16 and
fp32 (TF32 off for both sides, then on). Prints TFLOP/s and Triton/vendor ratios and writes
results/kernels.{json,md}.

    python benchmarks/kernels.py [--runs 50] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, time_ms, write  # noqa: E402

from crossml.kernels.conv import conv  # noqa: E402
from crossml.kernels.matmul import matmul  # noqa: E402

#: (M, N, K): ResNet-50's fc layer, its 1x1 convolutions as GEMMs (batch 32), square sizes
GEMMS = [(32, 1000, 2048), (25088, 256, 64), (6272, 512, 1024), (1568, 2048, 512), (4096, 4096, 4096),
         (8192, 8192, 8192)]
#: (name, batch, C, H, W, OC, kernel, stride, pad, group): ResNet-50 (batch 32) layers + a depthwise one
CONVS = [
    ("conv1 7x7/2", 32, 3, 224, 224, 64, 7, 2, 3, 1),
    ("res2 1x1", 32, 64, 56, 56, 64, 1, 1, 0, 1),
    ("res2 3x3", 32, 64, 56, 56, 64, 3, 1, 1, 1),
    ("res2 1x1 up", 32, 64, 56, 56, 256, 1, 1, 0, 1),
    ("res3 3x3/2", 32, 128, 56, 56, 128, 3, 2, 1, 1),
    ("res4 3x3", 32, 256, 14, 14, 256, 3, 1, 1, 1),
    ("res5 1x1", 32, 512, 7, 7, 2048, 1, 1, 0, 1),
    ("depthwise 3x3", 32, 256, 28, 28, 256, 3, 1, 1, 256),
]


def _row(name: str, dtype: torch.dtype, flops: float, t_ours: float, t_vendor: float) -> dict:
    ours, vendor = flops / t_ours / 1e9, flops / t_vendor / 1e9  # ms -> TFLOP/s
    print(f"{name:<28} {str(dtype).removeprefix('torch.'):<9} triton {ours:7.1f} TFLOP/s   vendor {vendor:7.1f} "
          f"TFLOP/s   ratio {ours / vendor:5.2f}")
    return {"name": name, "dtype": str(dtype), "triton_tflops": ours, "vendor_tflops": vendor,
            "ratio": ours / vendor, "triton_ms": t_ours, "vendor_ms": t_vendor}


def bench_gemm(dtype: torch.dtype, tf32: bool, runs: int, quick: bool) -> list[dict]:
    rows = []
    for m, n, k in GEMMS[:3] if quick else GEMMS:
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        ours = time_ms(lambda a=a, b=b: matmul(a, b, allow_tf32=tf32), runs=runs, sync=torch.cuda.synchronize)
        vendor = time_ms(lambda a=a, b=b: torch.matmul(a, b), runs=runs, sync=torch.cuda.synchronize)
        rows.append(_row(f"gemm {m}x{n}x{k}", dtype, 2 * m * n * k, ours["median_ms"], vendor["median_ms"]))
    return rows


def bench_conv(dtype: torch.dtype, tf32: bool, runs: int, quick: bool, channels_last: bool) -> list[dict]:
    rows = []
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for name, nb, c, h, w, oc, k, s, p, g in CONVS[:3] if quick else CONVS:
        x = torch.randn(nb, c, h, w, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
        wt = torch.randn(oc, c // g, k, k, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
        bias = torch.randn(oc, device="cuda", dtype=dtype)
        oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        flops = 2 * nb * oc * oh * ow * (c // g) * k * k
        ours = time_ms(lambda x=x, wt=wt, bias=bias, s=s, p=p, g=g: conv(
            x, wt, bias, strides=[s, s], pads=[p] * 4, group=g, allow_tf32=tf32), runs=runs,
            sync=torch.cuda.synchronize)
        vendor = time_ms(lambda x=x, wt=wt, bias=bias, s=s, p=p, g=g: F.conv2d(x, wt, bias, s, p, 1, g),
                         runs=runs, sync=torch.cuda.synchronize)
        label = f"conv {name}{' NHWC' if channels_last else ''}"
        rows.append(_row(label, dtype, flops, ours["median_ms"], vendor["median_ms"]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="first three shapes of each table")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/kernels.py needs a GPU (torch sees none)")
    torch.backends.cudnn.benchmark = True
    results = []
    for dtype, tf32 in ((torch.float16, False), (torch.float32, False), (torch.float32, True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        print(f"\n== {dtype} (TF32 {'on' if tf32 else 'off'}); first calls autotune ==")
        for row in bench_gemm(dtype, tf32, args.runs, args.quick):
            results.append({**row, "tf32": tf32})
        for channels_last in (False, True):
            for row in bench_conv(dtype, tf32, args.runs, args.quick, channels_last):
                results.append({**row, "tf32": tf32})
    md = ["| case | dtype | TF32 | Triton TFLOP/s | vendor TFLOP/s | ratio |", "|---|---|---|---|---|---|"]
    md += [f"| {r['name']} | {r['dtype']} | {r['tf32']} | {r['triton_tflops']:.1f} | {r['vendor_tflops']:.1f} "
           f"| {r['ratio']:.2f} |" for r in results]
    jp, mp = write("kernels", {"machine": machine(), "results": results}, "\n".join(md) + "\n")
    print(f"\nwrote {jp} and {mp}")


if __name__ == "__main__":
    main()

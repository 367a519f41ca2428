"""Frames per second of examples/gpu_pipeline.py: GPU end to end vs numpy pre/post-processing.

    python benchmarks/gpu_pipeline.py [--frames 256] [--batch 1,8]

Writes benchmarks/results/gpu_pipeline.{json,md}.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import machine, write  # noqa: E402

spec = importlib.util.spec_from_file_location("gpu_pipeline", os.path.join(HERE, "..", "examples", "gpu_pipeline.py"))
gp = importlib.util.module_from_spec(spec)
sys.modules["gpu_pipeline"] = gp
spec.loader.exec_module(gp)


def fps(step, batches, n_frames: int, device: torch.device) -> float:
    step(batches[0])
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b in batches:
        step(b)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return n_frames / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=256)
    ap.add_argument("--batch", default="1,8")
    args = ap.parse_args()
    p = gp.make_pipeline("auto")
    frames = gp.synthetic_frames(args.frames, p.device)
    rows = []
    for b in [int(x) for x in args.batch.split(",")]:
        batches = [frames[i:i + b] for i in range(0, args.frames, b)]
        gpu = fps(p.run, batches, args.frames, p.device)
        host = fps(lambda f: gp.host_pipeline(p, f), batches, args.frames, p.device)
        rows.append({"batch": b, "gpu_end_to_end_fps": gpu, "host_prepost_fps": host, "speedup": gpu / host})
        print(f"batch {b}: GPU end to end {gpu:.1f} frames/s, host pre/post {host:.1f} frames/s, x{gpu / host:.2f}",
              flush=True)
    md = ["# Pipeline frames per second: GPU end to end vs host pre/post-processing\n",
          f"Device: {p.device} ({machine()['gpu']}); 480x640 uint8 frames -> ResNet-50 -> top-5.\n",
          "| batch | GPU end to end (fps) | host pre/post (fps) | speed-up |", "|---|---|---|---|"]
    md += [f"| {r['batch']} | {r['gpu_end_to_end_fps']:.1f} | {r['host_prepost_fps']:.1f} | {r['speedup']:.2f} |"
           for r in rows]
    md.append("\nReproduce: `python benchmarks/gpu_pipeline.py`\n")
    write("gpu_pipeline", {"machine": machine(), "rows": rows}, "\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())

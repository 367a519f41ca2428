"""GPU: crossml vs onnxruntime's CUDA provider vs torch eager, one process, one GPU, data on the device.

    python benchmarks/gpu_vs_onnxruntime.py [--models resnet50,mobilenet_v2,bert_base] [--batches 1,32]
                                            [--precisions fp16,fp32] [--runs 50] [--out DIR]

Rows: model x precision x batch (BERT: sequence 128). Columns: crossml (graph capture on; fp32
rows also with use_tf32=0), onnxruntime CUDA without and with its CUDA graph (when
onnxruntime-gpu is importable), torch eager (the same torch module). Inputs and outputs stay on
the device (IOBinding for both runtimes: inputs and outputs bound to fixed device buffers, as onnxruntime's
CUDA graph requires). Writes gpu_vs_onnxruntime.{json,md,png} to --out
(default benchmarks/results). Also times ResNet-50 session creation (cold: first session in the
process, and warm).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import machine, write  # noqa: E402

import crossml  # noqa: E402
from crossml.zoo import MODELS, example_inputs, export  # noqa: E402


def cuda_time_ms(fn: Any, runs: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def device_feeds(name: str, batch: int, fp16: bool) -> dict[str, torch.Tensor]:
    feeds = example_inputs(name, batch=batch, seq=128)
    out = {}
    for k, v in feeds.items():
        t = torch.from_numpy(v).cuda()
        out[k] = t.half() if fp16 and t.is_floating_point() else t
    return out


def crossml_runner(path: str, feeds: dict[str, torch.Tensor], options: dict[str, str]) -> Any:
    sess = crossml.InferenceSession(path, providers=[("GPUExecutionProvider", options)])
    b = sess.io_binding()
    for k, t in feeds.items():
        b.bind_ortvalue_input(k, crossml.OrtValue.from_dlpack(t))
    # fixed output buffers, as onnxruntime's runner binds them, shapes from a first run
    for o in sess.get_outputs():
        b.bind_output(o.name, "cuda")
    sess.run_with_iobinding(b)
    for o, v in zip(sess.get_outputs(), b.get_outputs()):
        b.bind_ortvalue_output(o.name, crossml.OrtValue.from_dlpack(torch.empty_like(torch.from_dlpack(v))))
    return lambda: sess.run_with_iobinding(b)


def ort_runner(ort: Any, path: str, feeds: dict[str, torch.Tensor], graph: bool, tf32: bool) -> Any:
    opts = {"device_id": 0, "use_tf32": int(tf32)}
    if graph:
        opts["enable_cuda_graph"] = "1"
    so = ort.SessionOptions()
    sess = ort.InferenceSession(path, so, providers=[("CUDAExecutionProvider", opts)])
    b = sess.io_binding()
    keep = []
    for k, t in feeds.items():
        t = t.contiguous()
        keep.append(t)
        b.bind_input(k, "cuda", 0, _np_dtype(t), list(t.shape), t.data_ptr())
    # fixed output buffers (required by CUDA-graph replay), shapes from a first eager run
    probe = sess.run(None, {k: v.cpu().numpy() for k, v in feeds.items()})
    for o, arr in zip(sess.get_outputs(), probe):
        buf = torch.empty(arr.shape, dtype=torch.from_numpy(arr).dtype, device="cuda")
        keep.append(buf)
        b.bind_output(o.name, "cuda", 0, arr.dtype, list(arr.shape), buf.data_ptr())
    run = lambda: sess.run_with_iobinding(b)  # noqa: E731
    run._keep = keep  # type: ignore[attr-defined]
    return run


def _np_dtype(t: torch.Tensor) -> Any:
    return {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64}[t.dtype]


def torch_runner(name: str, feeds: dict[str, torch.Tensor], fp16: bool) -> Any:
    torch.manual_seed(0)
    model = MODELS[name][0]().eval().cuda()
    if fp16:
        model = model.half()
    args = tuple(feeds.values())

    def run() -> Any:
        with torch.no_grad():
            return model(*args)

    return run


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,mobilenet_v2,bert_base")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--precisions", default="fp16,fp32")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    try:
        import onnxruntime as ort

        has_ort = "CUDAExecutionProvider" in ort.get_available_providers()
    except ImportError:
        ort, has_ort = None, False

    # session creation, cold (first crossml session of the process) and warm
    path = export("resnet50")
    t0 = time.perf_counter()
    s = crossml.InferenceSession(path, providers=["GPUExecutionProvider"])
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    s = crossml.InferenceSession(path, providers=["GPUExecutionProvider"])
    warm = time.perf_counter() - t0
    del s
    print(f"ResNet-50 session creation: cold {cold:.2f} s, warm {warm:.2f} s", flush=True)

    rows = []
    for name in args.models.split(","):
        for prec in args.precisions.split(","):
            fp16 = prec == "fp16"
            path = export(name, fp16=fp16)
            for batch in [int(b) for b in args.batches.split(",")]:
                feeds = device_feeds(name, batch, fp16)
                row: dict[str, Any] = {"model": name, "precision": prec, "batch": batch}
                tf32_settings = [True, False] if not fp16 else [True]
                for tf32 in tf32_settings:
                    torch.backends.cuda.matmul.allow_tf32 = tf32
                    torch.backends.cudnn.allow_tf32 = tf32
                    sfx = "" if tf32 else "_strict"
                    row[f"crossml{sfx}"] = cuda_time_ms(crossml_runner(path, feeds, {"use_tf32": str(int(tf32))}), args.runs)
                    if has_ort:
                        row[f"ort{sfx}"] = cuda_time_ms(ort_runner(ort, path, feeds, False, tf32), args.runs)
                        try:
                            row[f"ort_graph{sfx}"] = cuda_time_ms(ort_runner(ort, path, feeds, True, tf32), args.runs)
                        except Exception as exc:  # noqa: BLE001 - report rows honestly
                            row[f"ort_graph{sfx}"] = None
                            row["ort_graph_error"] = str(exc)[:200]
                    if tf32:
                        row["torch_eager"] = cuda_time_ms(torch_runner(name, feeds, fp16), args.runs)
                best = [row.get(k) for k in ("ort", "ort_graph") if row.get(k)]
                row["ratio_vs_ort_best"] = row["crossml"] / min(best) if best else None
                if row.get("crossml_strict") and (row.get("ort_strict") or row.get("ort_graph_strict")):
                    row["ratio_strict"] = row["crossml_strict"] / min(
                        v for v in (row.get("ort_strict"), row.get("ort_graph_strict")) if v)
                rows.append(row)
                print(_line(row), flush=True)
                torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    md = _markdown(rows, cold, warm, ort.__version__ if has_ort else None)
    payload = {"machine": machine(), "onnxruntime": ort.__version__ if has_ort else None,
               "session_creation_s": {"resnet50_cold": cold, "resnet50_warm": warm}, "rows": rows}
    jp, mp = write("gpu_vs_onnxruntime", payload, md, args.out)
    _chart(rows, os.path.join(args.out, "gpu_vs_onnxruntime.png"))
    print(md)
    print(f"wrote {jp}, {mp}")
    return 0


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def _line(r: dict) -> str:
    return (f"{r['model']:13s} {r['precision']} b{r['batch']:<3d} crossml {_fmt(r.get('crossml'))} ms | "
            f"ort {_fmt(r.get('ort'))} | ort+graph {_fmt(r.get('ort_graph'))} | torch {_fmt(r.get('torch_eager'))} | "
            f"ratio {_fmt(r.get('ratio_vs_ort_best'))}")


def _markdown(rows: list[dict], cold: float, warm: float, ort_version: str | None) -> str:
    gpu = torch.cuda.get_device_name(0)
    out = [f"# GPU: crossml vs onnxruntime {ort_version or '(not installed)'} CUDA provider vs torch eager — {gpu}\n",
           "Median ms per run, inputs and outputs on the device. ratio = crossml / best onnxruntime "
           "(with or without its CUDA graph); below 1.0 is faster. fp32 rows use TF32 (both runtimes' default); "
           "'strict' columns force fp32 (use_tf32=0 in both).\n",
           "| model | prec | batch | crossml | ort CUDA | ort CUDA+graph | torch eager | ratio | crossml strict | ort strict | ort+graph strict | ratio strict |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['precision']} | {r['batch']} | {_fmt(r.get('crossml'))} | {_fmt(r.get('ort'))} | "
                   f"{_fmt(r.get('ort_graph'))} | {_fmt(r.get('torch_eager'))} | {_fmt(r.get('ratio_vs_ort_best'))} | "
                   f"{_fmt(r.get('crossml_strict'))} | {_fmt(r.get('ort_strict'))} | {_fmt(r.get('ort_graph_strict'))} | "
                   f"{_fmt(r.get('ratio_strict'))} |")
    out.append(f"\nResNet-50 session creation: cold {cold:.2f} s, warm {warm:.2f} s.\n")
    out.append("Reproduce: `python benchmarks/gpu_vs_onnxruntime.py`\n")
    return "\n".join(out)


def _chart(rows: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = [f"{r['model']}\n{r['precision']} b{r['batch']}" for r in rows]
    keys = [("crossml", "crossml"), ("ort", "onnxruntime CUDA"), ("ort_graph", "onnxruntime CUDA+graph"),
            ("torch_eager", "torch eager")]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 1.2), 5))
    for i, (k, lab) in enumerate(keys):
        ax.bar(x + (i - 1.5) * 0.2, [r.get(k) or 0 for r in rows], 0.2, label=lab)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("ms per run (lower is better)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())

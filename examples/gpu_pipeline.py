"""A video-style pipeline that never touches the host: frames on the GPU -> pre-processing on the
GPU -> ResNet-50 (crossml) -> softmax and top-5 on the GPU.

    python examples/gpu_pipeline.py                  # GPU pre/post-processing (the point of this example)
    python examples/gpu_pipeline.py --host-prepost   # the same pipeline with numpy pre/post-processing
    python examples/gpu_pipeline.py --frames 8 --device cpu   # anywhere (no GPU needed)

Frames are uint8 NHWC, as a decoder or camera hands them over. Everything in the loop is queued
on one stream: the session runs on the caller's current stream (its command list is replayed
there), its input is the pre-processing's output tensor (wrapped, no copy) and its output stays on
the device. The host waits once, after the last frame.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

import crossml
from crossml.zoo import export

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


@dataclass
class Pipeline:
    session: crossml.InferenceSession
    device: torch.device
    size: int = 224

    def __post_init__(self) -> None:
        # normalisation constants live on the device: no host->device copy per frame
        self.mean = MEAN.to(self.device)
        self.std = STD.to(self.device)

    def preprocess(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 [N, H, W, 3] -> normalised float32 [N, 3, 224, 224], on the frames' device."""
        x = frames.permute(0, 3, 1, 2).float().div_(255.0)
        x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return ((x - self.mean) / self.std).contiguous()

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """ResNet-50 through an IOBinding: input wrapped without a copy, output left on the device."""
        b = self.session.io_binding()
        b.bind_ortvalue_input("input", crossml.OrtValue.from_dlpack(x))
        b.bind_output("logits", self.device.type if self.device.type == "cpu" else "cuda")
        self.session.run_with_iobinding(b)
        return b.get_outputs()[0].as_torch()

    @staticmethod
    def postprocess(logits: torch.Tensor, k: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
        probs = logits.softmax(dim=1)
        return probs.topk(k, dim=1)

    def run(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.postprocess(self.infer(self.preprocess(frames)))


def host_pipeline(p: Pipeline, frames: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The same work with numpy pre- and post-processing: frames and logits cross to the host."""
    host = frames.cpu().numpy()
    x = torch.from_numpy(host).permute(0, 3, 1, 2).float() / 255.0
    x = F.interpolate(x, size=(p.size, p.size), mode="bilinear", align_corners=False)
    x = ((x - MEAN) / STD).numpy()
    logits = p.session.run(None, {"input": x})[0]
    e = np.exp(logits - logits.max(1, keepdims=True))
    probs = e / e.sum(1, keepdims=True)
    idx = np.argsort(-probs, axis=1)[:, :5]
    return np.take_along_axis(probs, idx, 1), idx


def make_pipeline(device: str = "auto") -> Pipeline:
    dev = torch.device("cuda" if device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    providers = ["GPUExecutionProvider", "CPUExecutionProvider"] if dev.type == "cuda" else ["CPUExecutionProvider"]
    return Pipeline(crossml.InferenceSession(export("resnet50"), providers=providers), dev)


def synthetic_frames(n: int, device: torch.device, h: int = 480, w: int = 640, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, h, w, 3), dtype=torch.uint8, generator=g).to(device)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--host-prepost", action="store_true")
    args = ap.parse_args()
    p = make_pipeline(args.device)
    frames = synthetic_frames(args.frames, p.device)
    batches = [frames[i:i + args.batch] for i in range(0, args.frames, args.batch)]
    step = (lambda f: host_pipeline(p, f)) if args.host_prepost else p.run
    step(batches[0])  # warm-up: captures the command list for this input shape
    if p.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    results = [step(b) for b in batches]
    if p.device.type == "cuda":
        torch.cuda.synchronize()  # the only host wait of the loop
    dt = time.perf_counter() - t0
    top_p, top_i = results[-1]
    mode = "host pre/post-processing" if args.host_prepost else "GPU end to end"
    print(f"{mode} on {p.device}: {args.frames / dt:.1f} frames/s ({args.frames} frames, batch {args.batch})")
    print(f"last frame top-5 classes {np.asarray(torch.as_tensor(top_i).cpu())[0].tolist()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

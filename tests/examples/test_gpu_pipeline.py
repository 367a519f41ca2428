"""examples/gpu_pipeline.py: results match the host pipeline, and on a GPU the loop has no host
synchronisation and no host<->device copy."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest
import torch

HERE = os.path.dirname(__file__)
spec = importlib.util.spec_from_file_location("gpu_pipeline", os.path.join(HERE, "..", "..", "examples", "gpu_pipeline.py"))
gp = importlib.util.module_from_spec(spec)
sys.modules["gpu_pipeline"] = gp  # dataclasses look their module up
spec.loader.exec_module(gp)


def test_pipeline_matches_host_pipeline_cpu():
    p = gp.make_pipeline("cpu")
    frames = gp.synthetic_frames(2, p.device, 96, 128)
    probs, idx = p.run(frames)
    hp, hi = gp.host_pipeline(p, frames)
    np.testing.assert_array_equal(idx.numpy(), hi)
    np.testing.assert_allclose(probs.numpy(), hp, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_gpu_loop_never_touches_the_host():
    p = gp.make_pipeline("cuda")
    frames = gp.synthetic_frames(6, p.device)
    ref_probs, ref_idx = gp.host_pipeline(p, frames[:1])
    p.run(frames[:1])  # warm-up: records the command list for this shape
    torch.cuda.synchronize()
    results = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.cuda.set_sync_debug_mode("error")  # any host sync inside the loop raises
        try:
            for i in range(len(frames)):
                results.append(p.run(frames[i:i + 1]))
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
    copies = [e.name for e in prof.events() if "Memcpy" in e.name and ("HtoD" in e.name or "DtoH" in e.name)]
    assert copies == [], copies
    probs, idx = results[0]
    np.testing.assert_array_equal(idx.cpu().numpy(), ref_idx)
    np.testing.assert_allclose(probs.cpu().numpy(), ref_probs, rtol=2e-3, atol=1e-4)

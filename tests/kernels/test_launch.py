"""kernels._launch.pdl: which launches use programmatic dependent launch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from crossml.kernels._launch import INTERPRET, pdl  # noqa: E402


def test_pdl_only_on_compiled_nvidia_launches() -> None:
    assert pdl(torch.empty(1)) == {}  # CPU tensors: the interpreter or torch, never a PDL launch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET, reason="needs a CUDA GPU and compiled kernels")
def test_pdl_on_hopper_and_switch() -> None:
    """sm90+ launches take PDL (the decode kernels wait for their predecessor first); CROSSML_PDL=0 turns it off."""
    t = torch.empty(1, device="cuda")
    want = {"PDL": True, "launch_pdl": True} if torch.cuda.get_device_capability()[0] >= 9 else {}
    assert pdl(t) == want
    code = "import torch; from crossml.kernels._launch import pdl; assert pdl(torch.empty(1, device='cuda')) == {}"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "CROSSML_PDL": "0", "PYTHONPATH": "src"})

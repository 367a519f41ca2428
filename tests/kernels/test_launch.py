"""kernels._launch: which launches use programmatic dependent launch; the host integer helpers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402

from crossml.kernels._launch import INTERPRET, cdiv, next_power_of_2, pdl  # noqa: E402


def test_host_integer_helpers_match_triton() -> None:
    """cdiv and next_power_of_2 are the host code's plain-Python twins of Triton's constexpr functions."""
    for a in [*range(0, 300), 4095, 4096, 4097, 151936, 2**31 - 1, 2**31, 2**40 + 3]:
        assert next_power_of_2(a) == triton.next_power_of_2(a), a
        for b in (1, 2, 3, 7, 16, 64, 128, 1000):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_pdl_only_on_compiled_nvidia_launches() -> None:
    assert pdl(torch.empty(1)) == {}  # CPU tensors: the interpreter or torch, never a PDL launch
    assert pdl(torch.empty(1), early=True) == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET, reason="needs a CUDA GPU and compiled kernels")
def test_pdl_on_hopper_and_switch() -> None:
    """sm90+ launches take PDL (the decode kernels wait for their predecessor first); CROSSML_PDL=0 turns it off."""
    t = torch.empty(1, device="cuda")
    want = {"PDL": True, "launch_pdl": True} if torch.cuda.get_device_capability()[0] >= 9 else {}
    assert pdl(t) == want
    assert pdl(t, early=True) == ({**want, "PDL": 2} if want else {})  # trigger first, then wait
    code = "import torch; from crossml.kernels._launch import pdl; assert pdl(torch.empty(1, device='cuda')) == {}"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "CROSSML_PDL": "0", "PYTHONPATH": "src"})


def test_sessions_warm_the_compiler_for_their_device(monkeypatch) -> None:
    """InferenceSession hands its device to ``warm_compiler`` before it loads the model."""
    from onnx import TensorProto, helper

    import crossml
    from crossml.runtime import session
    from tests.conftest import make_model

    seen: list[torch.device] = []
    monkeypatch.setattr(session, "warm_compiler", seen.append)
    model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    crossml.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert seen == [torch.device("cpu")]


def test_warm_compiler_hashes_the_key_once_in_a_child() -> None:
    """On a Triton device ``warm_compiler`` has a child process hash Triton's compiler key (once a process; a
    daemon thread waits for it), and Triton's ``triton_key`` then returns the child's key, which is the key
    Triton computes itself; the CPU and the interpreter start nothing. Run in fresh processes: the key and the
    thread are per process."""
    code = ("import torch, crossml.kernels as k\n"
            "from triton.runtime import autotuner, cache\n"
            "original = cache.triton_key\n"
            "assert k.warm_compiler(torch.device('cpu')) is None\n"
            "t = k.warm_compiler(torch.device('cuda'))\n"
            "assert t is not None and t.daemon and cache.triton_key is not original\n"
            "assert autotuner.triton_key is cache.triton_key\n"
            "t.join(300)\n"
            "assert not t.is_alive()\n"
            "key = cache.triton_key()\n"
            "assert original.cache_info().currsize == 0  # the child's key: not computed here\n"
            "assert key == original()\n"
            "assert k.warm_compiler(torch.device('cuda')) is None\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env={**env, "PYTHONPATH": "src"})
    interp = "import torch, crossml.kernels as k; assert k.warm_compiler(torch.device('cuda')) is None"
    subprocess.run([sys.executable, "-c", interp], check=True,
                   env={**env, "TRITON_INTERPRET": "1", "PYTHONPATH": "src"})


def test_warm_compiler_keeps_the_childs_key_for_later_processes(tmp_path) -> None:  # noqa: ANN001
    """The child's key is kept in Triton's cache directory; a later process with the same Triton files takes it
    without a child, and a kept key whose file signature differs is not used (the child computes it again)."""
    code = ("import sys, torch, crossml.kernels as k\n"
            "from triton.runtime import cache\n"
            "original = cache.triton_key\n"
            "children = []\n"
            "child = k._key_in_child\n"
            "k._key_in_child = lambda t: children.append(1) or child(t)\n"
            "k.warm_compiler(torch.device('cuda')).join(300)\n"
            "assert cache.triton_key() == original()\n"
            "print(len(children))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH="src", TRITON_CACHE_DIR=str(tmp_path))

    def children() -> int:
        out = subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True, text=True)
        return int(out.stdout.strip())

    kept = tmp_path / "crossml-triton-key.json"
    assert children() == 1 and kept.is_file()
    assert children() == 0
    import json

    data = json.loads(kept.read_text())
    kept.write_text(json.dumps({"signature": "other files", "key": data["key"]}))
    assert children() == 1
    assert json.loads(kept.read_text()) == data

"""Fixtures for crossml.genai: tiny builder-made models and the onnxruntime-genai reference.

``genai_models`` builds, once per test session and in a subprocess, tiny random-weight Hugging Face
models (hidden 64, 2 layers, 4 heads, 2 KV heads, a ~370-token BPE tokenizer with a chat template)
of each architecture in ARCHS, and converts each with the onnxruntime-genai model builder at fp32
and int4 for the CPU; ``more_models`` does the same for more architectures at fp32. ``og_ref`` is the onnxruntime_genai module (skipped when not installed).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ARCHS = ("llama", "qwen2", "phi3", "mistral", "gemma")
PRECISIONS = ("fp32", "int4")
BUILD = Path(__file__).with_name("_build.py")


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def build_models(tmp_path_factory: pytest.TempPathFactory, name: str, specs: list[str]) -> Path:
    """A new folder ``name`` of tiny builder models (``_build.py``'s specs), built in a subprocess; skips the test
    where the builder's packages are missing."""
    missing = [m for m in ("onnxruntime_genai", "transformers", "onnx_ir") if not _have(m)]
    if missing:
        pytest.skip(f"building genai test models needs {', '.join(missing)} (pip install crossml[test])")
    out = tmp_path_factory.mktemp(name)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run([sys.executable, str(BUILD), str(out), *specs], capture_output=True, text=True, env=env,
                          timeout=900)
    if proc.returncode:
        raise RuntimeError(f"building the tiny genai models failed:\n{proc.stderr[-4000:]}")
    return out


@pytest.fixture(scope="session")
def genai_models(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], str]:
    """(arch, precision) -> model folder written by the onnxruntime-genai model builder."""
    out = build_models(tmp_path_factory, "genai_models", [f"{a}:{p}" for a in ARCHS for p in PRECISIONS])
    return {(a, p): str(out / f"{a}_{p}") for a in ARCHS for p in PRECISIONS}


@pytest.fixture(scope="session")
def more_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """arch -> fp32 CPU model folder of each architecture in ``_build.MORE_CLASSES``, and "arch:int4" -> the int4
    one of those in ``_build.MORE_INT4``."""
    from tests.genai._build import MORE_CLASSES, MORE_INT4

    out = build_models(tmp_path_factory, "genai_more_models",
                       [f"{a}:fp32" for a in MORE_CLASSES] + [f"{a}:int4" for a in MORE_INT4])
    return {**{a: str(out / f"{a}_fp32") for a in MORE_CLASSES}, **{f"{a}:int4": str(out / f"{a}_int4") for a in MORE_INT4}}


@pytest.fixture(scope="session")
def og_ref():
    """The onnxruntime_genai module (the reference implementation)."""
    if not _have("onnxruntime_genai") or not _have("onnxruntime"):
        pytest.skip("onnxruntime-genai is not installed")
    import onnxruntime

    # onnxruntime-genai dlopens libonnxruntime.so.1 from the onnxruntime wheel, which ships the library
    # only as libonnxruntime.so.<version>: load it globally first so the lookup finds it.
    libs = glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*"))
    if libs:
        ctypes.CDLL(libs[0], mode=ctypes.RTLD_GLOBAL)
    import onnxruntime_genai

    return onnxruntime_genai

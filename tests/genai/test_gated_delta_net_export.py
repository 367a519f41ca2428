"""The model builder's Gated DeltaNet export of Qwen3.5 (``-e cuda --extra_options linear_attn_op=gated_delta_net``:
com.microsoft GatedDeltaNet over V-major float32 recurrent states [B, H_v, d_v, d_k]) against onnxruntime-genai 0.18,
both on the CPU (the folders' CUDA provider cleared), and against the default export of the same weights
(LinearAttention)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import crossml.genai as xg
from tests.genai._build import VARIANTS
from tests.genai._generation import assert_greedy_match, generate_with
from tests.genai.conftest import build_models

SPECS = ["qwen35gdn:fp16:cuda", "qwen35gdn:int4:cuda", "qwen35:fp16:cuda"]
PROMPT = "Hello world! How are you"
BATCH = ["The quick brown fox jumps over", "def f(x):"]
MAX_LENGTH = 48


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_models(tmp_path_factory, "genai_gdn_models", SPECS)


def _on_cpu(og, folder: Path):
    config = og.Config(str(folder))
    config.clear_providers()
    return og.Model(config)


def test_the_export_carries_v_major_float32_states(folders: Path) -> None:
    assert VARIANTS["qwen35gdn"][1] == ["linear_attn_op=gated_delta_net"]
    model = _on_cpu(xg, folders / "qwen35gdn_fp16_cuda")
    ops = {n.op_type for n in __import__("onnx").load(str(folders / "qwen35gdn_fp16_cuda" / "model.onnx"),
                                                       load_external_data=False).graph.node}
    assert "GatedDeltaNet" in ops and "LinearAttention" not in ops
    recurrent = [(shape, dtype) for name, shape, dtype in zip(model.io.state_names, model.io.state_shapes,
                                                              model.io.state_dtypes) if name.endswith("recurrent")]
    # the tiny Qwen3.5: 4 value heads of 16, key heads of 16 (V-major: d_v before d_k)
    assert recurrent == [((4, 16, 16), torch.float32)]


@pytest.mark.parametrize("precision", ["fp16", "int4"])
def test_gated_delta_net_export_matches_onnxruntime_genai(folders: Path, og_ref, precision: str) -> None:
    folder = folders / f"qwen35gdn_{precision}_cuda"
    got = generate_with(xg, _on_cpu(xg, folder), [PROMPT], MAX_LENGTH)
    ref = generate_with(og_ref, _on_cpu(og_ref, folder), [PROMPT], MAX_LENGTH)
    # fp16 activations on both sides, rounded in different places: every step within 0.026 of onnxruntime-genai
    # (logits of magnitude ~3), no drift over the 48 tokens; the default export of the weights differs as much (0.031).
    # int4 (its MatMulNBits on fp16 activations): 0.074 at step 1, else within 0.05; the default export 0.098 there
    assert_greedy_match(got, ref, atol=5e-2 if precision == "fp16" else 1e-1)


def test_gated_delta_net_export_batch_rows_equal_their_prompts_alone(folders: Path, og_ref) -> None:
    """A batch of prompts of different lengths (onnxruntime-genai 0.18 runs the shorter row's pad tokens through the
    recurrent states, see tests/genai/test_architectures.py): each row is its prompt run alone; the longest row is
    onnxruntime-genai's."""
    folder = folders / "qwen35gdn_fp16_cuda"
    model = _on_cpu(xg, folder)
    tok = xg.Tokenizer(model)
    lens = [len(tok.encode(p)) for p in BATCH]
    width, pad = max(lens), model.config.model.pad_token_id
    batch = generate_with(xg, model, BATCH, MAX_LENGTH)[0]
    for row, prompt in enumerate(BATCH):
        alone = generate_with(xg, model, [prompt], MAX_LENGTH)[0][0]
        got = batch[row][:lens[row]] + batch[row][width:]
        n = min(len(got), len(alone))
        assert got[:n] == alone[:n] and set(got[n:]) <= {pad, *model.config.model.eos_token_id}
    ref = generate_with(og_ref, _on_cpu(og_ref, folder), BATCH, MAX_LENGTH)[0]
    longest = int(np.argmax(lens))
    assert batch[longest] == ref[longest]


def test_gated_delta_net_and_linear_attention_exports_agree(folders: Path) -> None:
    """The two fp16 exports of one checkpoint (GatedDeltaNet with its fused norms and gates; LinearAttention after
    LpNormalization and LinearAttentionGate nodes, an fp16 recurrent state) give the same greedy tokens."""
    gdn = generate_with(xg, _on_cpu(xg, folders / "qwen35gdn_fp16_cuda"), [PROMPT], MAX_LENGTH)
    default = generate_with(xg, _on_cpu(xg, folders / "qwen35_fp16_cuda"), [PROMPT], MAX_LENGTH)
    assert_greedy_match(gdn, default, atol=5e-2)

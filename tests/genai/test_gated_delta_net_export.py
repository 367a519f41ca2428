"""The model builder's Gated DeltaNet export of Qwen3.5 (``-e cuda --extra_options linear_attn_op=gated_delta_net``:
com.microsoft GatedDeltaNet over V-major float32 recurrent states [B, H_v, d_v, d_k]) against onnxruntime-genai 0.18,
both on the CPU (the folders' CUDA provider cleared), and against the default export of the same weights
(LinearAttention)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
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
    ops = {n.op_type for n in onnx.load(str(folders / "qwen35gdn_fp16_cuda" / "model.onnx"),
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


def test_gpu_rewrites_fold_the_exports_gate_casts_with_the_same_values(folders: Path) -> None:
    """A GPU session's graph rules on the fp16 export: every GatedDeltaNet takes its half-precision gates directly
    (com.crossml's, FoldGatedDeltaNetGateCasts), no Cast feeds one, and a prompt's logits and states equal the
    unrewritten graph's bit for bit where the rest of the rewrites leave the values alone (run here on the CPU with
    only that rule applied)."""
    from crossml.graph.load import prepare
    from crossml.graph.passes import apply_rules
    from crossml.graph.passes.gate_casts import GATE_CASTS
    from crossml.runtime.session import fusion_rules
    from tests.graph._rules import unfused_session

    path = str(folders / "qwen35gdn_fp16_cuda" / "model.onnx")
    rewritten = prepare(onnx.load(path))
    fired = apply_rules(rewritten, fusion_rules(None, torch.device("cuda")))
    assert fired.get("FoldGatedDeltaNetGateCasts") == 1  # the tiny model's one Gated DeltaNet layer
    nodes = {o: n for n in rewritten.graph.node for o in n.output}
    for node in (n for n in rewritten.graph.node if n.op_type == "GatedDeltaNet"):
        assert node.domain == "com.crossml"
        assert all(nodes[i].op_type != "Cast" for i in node.input[4:6] if i in nodes)
    model = prepare(onnx.load(path))
    alone = prepare(onnx.load(path))
    apply_rules(alone, [GATE_CASTS])
    ref, got = unfused_session(model), unfused_session(alone)
    rng = np.random.default_rng(5)
    feeds = {}
    for inp in ref.get_inputs():
        dims = [d if isinstance(d, int) else 1 for d in inp.shape]
        if inp.name == "input_ids":
            feeds[inp.name] = rng.integers(3, 300, (1, 6)).astype(np.int64)
        elif inp.name == "attention_mask":
            feeds[inp.name] = np.ones((1, 6), np.int64)
        elif inp.name == "position_ids":
            feeds[inp.name] = np.broadcast_to(np.arange(6), (3, 1, 6)).astype(np.int64).copy()
        elif "past_key_values" in inp.name:
            dims[2] = 0
            feeds[inp.name] = np.zeros(dims, np.float16)
        else:
            feeds[inp.name] = (0.1 * rng.standard_normal(dims)).astype(
                np.float32 if inp.type == "tensor(float)" else np.float16)
    for a, b in zip(ref.run(None, feeds), got.run(None, feeds)):
        np.testing.assert_array_equal(a, b)

"""og.Adapters, Generator.set_active_adapter / set_model_input, preset inputs: checked against onnxruntime-genai.

The adapter model is a builder model with a LoRA pair on the logits, as Olive exports adapters: the final
hidden state times lora_A [hidden, r] times lora_B [r, vocab] is added to the logits, plus a bias
(onnxruntime-genai's own adapter test adds bias vectors the same way); lora_A, lora_B and the bias are
overridable initializers whose defaults are empty (r = 0) or zero, so the model without an adapter is
the builder's.
"""

from __future__ import annotations

import gc
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import crossml
import crossml.genai as og

PROMPTS = [["Hello world! How are you"], ["The quick brown fox jumps over", "def f(x):"]]
MAX_LENGTH = 24
RANK = 4


def _rewrite(src: str, dst: Path, edit: Callable[[onnx.ModelProto], None]) -> str:
    shutil.copytree(src, dst)
    m = onnx.load(str(dst / "model.onnx"))
    for f in os.listdir(dst):
        if f == "model.onnx" or f.endswith(".data"):
            os.remove(dst / f)
    edit(m)
    onnx.save(m, str(dst / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    return str(dst)


def _logits_node(m: onnx.ModelProto) -> tuple[onnx.NodeProto, int, int]:
    node = next(n for n in m.graph.node if n.output[0] == "logits")
    weight = next(t for t in m.graph.initializer if t.name == node.input[1])
    hidden, vocab = weight.dims
    return node, hidden, vocab


def add_lora(m: onnx.ModelProto) -> None:
    """Put a LoRA pair and a bias on a builder model's logits (overridable initializers, empty / zero defaults)."""
    node, hidden, vocab = _logits_node(m)
    node.output[0] = "logits_base"
    m.graph.input.extend([h.make_tensor_value_info("lora_A", T.FLOAT, [hidden, "rank"]),
                          h.make_tensor_value_info("lora_B", T.FLOAT, ["rank", vocab]),
                          h.make_tensor_value_info("adapter_bias", T.FLOAT, [vocab])])
    m.graph.initializer.extend([onnx.numpy_helper.from_array(np.zeros((hidden, 0), np.float32), "lora_A"),
                                onnx.numpy_helper.from_array(np.zeros((0, vocab), np.float32), "lora_B"),
                                onnx.numpy_helper.from_array(np.zeros(vocab, np.float32), "adapter_bias")])
    m.graph.node.extend([h.make_node("MatMul", [node.input[0], "lora_A"], ["lora_a_out"]),
                         h.make_node("MatMul", ["lora_a_out", "lora_B"], ["lora_out"]),
                         h.make_node("Add", ["logits_base", "lora_out"], ["logits_lora"]),
                         h.make_node("Add", ["logits_lora", "adapter_bias"], ["logits"])])


def write_adapters(folder: str, out: Path) -> dict[str, str]:
    """Adapter files for an ``add_lora`` model: "lora" (written by onnxruntime's writer), "bias" (crossml's), and
    two the model refuses: "half" (float16 values) and "stray" (a name the model lacks)."""
    m = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
    dims = {i.name: i.type.tensor_type.shape.dim for i in m.graph.input}
    hidden, vocab = dims["lora_A"][0].dim_value, dims["adapter_bias"][0].dim_value
    rng = np.random.default_rng(3)
    lora = {"lora_A": rng.standard_normal((hidden, RANK)).astype(np.float32) * 0.5,
            "lora_B": rng.standard_normal((RANK, vocab)).astype(np.float32) * 0.5}
    bias = rng.standard_normal(vocab).astype(np.float32) * 3
    fmt = onnxruntime.AdapterFormat()
    fmt.set_adapter_version(1)
    fmt.set_model_version(1)
    fmt.set_parameters({k: onnxruntime.OrtValue.ortvalue_from_numpy(v) for k, v in lora.items()})
    files = {"lora": str(out / "lora.onnx_adapter")}
    fmt.export_adapter(files["lora"])
    for name, params in {"bias": {"adapter_bias": bias}, "half": {"adapter_bias": bias.astype(np.float16)},
                         "stray": {"not_an_input": bias}}.items():
        ours = crossml.AdapterFormat()
        ours.set_parameters(params)
        files[name] = str(out / f"{name}.onnx_adapter")
        ours.export_adapter(files[name])
    return files


@pytest.fixture(scope="module")
def lora_model(genai_models, tmp_path_factory) -> str:
    """The qwen2 fp32 builder model with a LoRA pair and a bias on its logits."""
    return _rewrite(genai_models[("qwen2", "fp32")], tmp_path_factory.mktemp("lora") / "qwen2_lora", add_lora)


@pytest.fixture(scope="module")
def adapter_files(lora_model, tmp_path_factory) -> dict[str, str]:
    return write_adapters(lora_model, tmp_path_factory.mktemp("adapters"))


def _generate(mod: Any, model: Any, adapters: Any, prompts: list[str], active: list[str],
              late: list[str] = (), mid: list[str] = ()) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy generation with ``active`` adapters set before the prompt, ``late`` ones after it and ``mid`` ones
    after the first generated token."""
    tok = mod.Tokenizer(model)
    params = mod.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH, batch_size=len(prompts))
    gen = mod.Generator(model, params)
    for name in active:
        gen.set_active_adapter(adapters, name)
    gen.append_tokens(tok.encode(prompts[0]) if len(prompts) == 1 else tok.encode_batch(prompts))
    for name in late:
        gen.set_active_adapter(adapters, name)
    logits = [gen.get_logits().copy()]
    while not gen.is_done():
        gen.generate_next_token()
        if mid and not gen.is_done():
            for name in mid:
                gen.set_active_adapter(adapters, name)
            mid = ()
        if not gen.is_done():
            logits.append(gen.get_logits().copy())
    return [gen.get_sequence(i).tolist() for i in range(len(prompts))], logits


CASES = {"none": ([], [], []), "lora": (["lora"], [], []), "bias": (["bias"], [], []),
         "both": (["lora", "bias"], [], []), "late": ([], ["lora"], []), "late_second": (["bias"], ["lora"], []),
         "mid": ([], [], ["lora"]), "mid_second": (["lora"], [], ["bias"])}


def _loaded(mod: Any, folder: str, files: dict[str, str], model: Any = None) -> tuple[Any, Any]:
    model = model if model is not None else mod.Model(folder)
    adapters = mod.Adapters(model)
    for name in ("lora", "bias"):
        adapters.load(files[name], name)
    return model, adapters


@pytest.mark.parametrize("prompts", PROMPTS, ids=["batch1", "batch2"])
def test_adapters_match_onnxruntime_genai(og_ref, lora_model, adapter_files, prompts: list[str]) -> None:
    folder = lora_model
    ref_model, ref_adapters = _loaded(og_ref, folder, adapter_files)
    model, adapters = _loaded(og, folder, adapter_files)
    sequences = set()
    for case, (active, late, mid) in CASES.items():
        want_seq, want_logits = _generate(og_ref, ref_model, ref_adapters, prompts, active, late, mid)
        got_seq, got_logits = _generate(og, model, adapters, prompts, active, late, mid)
        assert got_seq == want_seq, case
        assert len(got_logits) == len(want_logits)
        for step, (g, w) in enumerate(zip(got_logits, want_logits)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"{case}, step {step}")
        sequences.add(str(got_seq))
    assert len(sequences) >= 4  # the adapters change what is generated


def test_adapters_on_the_static_run_ahead_path(lora_model, adapter_files) -> None:
    """The GPU's decode path (fixed-address buffers, steps run ahead), forced on the CPU: an adapter set after the
    prompt or after a token reaches the step that already ran ahead, and buffer sets lent to later generators carry the right
    values (or none)."""
    folder = lora_model
    plain, plain_adapters = _loaded(og, folder, adapter_files)
    model, adapters = _loaded(og, folder, adapter_files)
    model._static_decode = model._run_ahead = True
    for case in ("late", "mid", "lora", "none", "both", "mid_second", "late_second", "none"):
        want = _generate(og, plain, plain_adapters, PROMPTS[0], *CASES[case])
        got = _generate(og, model, adapters, PROMPTS[0], *CASES[case])
        assert got[0] == want[0], case
        for g, w in zip(got[1], want[1]):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=case)


def test_adapter_lifetime_and_errors(lora_model, adapter_files) -> None:
    folder = lora_model
    model, adapters = _loaded(og, folder, adapter_files)
    with pytest.raises(og.GenAIError, match="Adapter already loaded: lora"):
        adapters.load(adapter_files["bias"], "lora")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        adapters.load(adapter_files["lora"] + ".missing", "x")
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    gen = og.Generator(model, params)
    with pytest.raises(og.GenAIError, match="Adapter not found: nope"):
        gen.set_active_adapter(adapters, "nope")
    with pytest.raises(TypeError, match="og.Adapters"):
        gen.set_active_adapter("lora", "lora")
    adapters.load(adapter_files["stray"], "stray")
    with pytest.raises(og.GenAIError, match="'not_an_input'.*lora_A, lora_B, adapter_bias"):
        gen.set_active_adapter(adapters, "stray")
    adapters.load(adapter_files["half"], "half")
    with pytest.raises(og.GenAIError, match=r"tensor\(float16\).*tensor\(float\)"):
        gen.set_active_adapter(adapters, "half")
    other = og.Adapters(og.Model(folder))
    other.load(adapter_files["lora"], "lora")
    with pytest.raises(og.GenAIError, match="another og.Model"):
        gen.set_active_adapter(other, "lora")
    gen.set_active_adapter(adapters, "lora")
    gen.set_active_adapter(adapters, "lora")  # again: nothing changes
    with pytest.raises(og.GenAIError, match="Adapter still in use: lora"):
        adapters.unload("lora")
    adapters.unload("stray")  # never activated
    with pytest.raises(og.GenAIError, match="Adapter not found: stray"):
        adapters.unload("stray")
    del gen
    gc.collect()
    adapters.unload("lora")  # its generator is gone
    with pytest.raises(TypeError, match="og.Model"):
        og.Adapters(folder)


@pytest.fixture(scope="module")
def extra_input_models(genai_models, tmp_path_factory) -> dict[str, str]:
    """Builder models with one more int64 scalar input added to the logits (as onnxruntime-genai's preset-input
    test): ``num_logits_to_keep`` (a preset) and ``abcde`` (the caller must give it)."""
    out = {}
    for name in ("num_logits_to_keep", "abcde"):
        def edit(m: onnx.ModelProto, name: str = name) -> None:
            node, _, _ = _logits_node(m)
            node.output[0] = "logits_base"
            m.graph.input.append(h.make_tensor_value_info(name, T.INT64, []))
            m.graph.node.extend([h.make_node("Cast", [name], ["extra_f"], to=T.FLOAT),
                                 h.make_node("Add", ["logits_base", "extra_f"], ["logits"])])

        out[name] = _rewrite(genai_models[("qwen2", "fp32")], tmp_path_factory.mktemp("extra") / name, edit)
    return out


def _steps(mod: Any, folder: str, inputs: dict[str, Any]) -> list[np.ndarray]:
    model = mod.Model(folder)
    params = mod.GeneratorParams(model)
    params.set_search_options(max_length=12)
    gen = mod.Generator(model, params)
    for k, v in inputs.items():
        gen.set_model_input(k, v)
    gen.append_tokens([[1, 2, 3, 4]])
    out = [gen.get_logits().copy()]
    for _ in range(3):
        gen.generate_next_token()
        out.append(gen.get_logits().copy())
    return out


def test_preset_and_model_inputs_match_onnxruntime_genai(og_ref, extra_input_models) -> None:
    nk = extra_input_models["num_logits_to_keep"]
    for inputs in ({}, {"num_logits_to_keep": np.array(100, np.int64)}):
        want, got = _steps(og_ref, nk, inputs), _steps(og, nk, inputs)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    base = _steps(og, nk, {})
    given = _steps(og, extra_input_models["abcde"], {"abcde": np.array(7, np.int64)})
    for g, b in zip(given, base):  # abcde = 7 adds 7 to every logit (the preset adds 0)
        np.testing.assert_allclose(g, b + 7, rtol=1e-5, atol=1e-4)


def test_model_input_errors(extra_input_models) -> None:
    folder = extra_input_models["abcde"]
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=12)
    gen = og.Generator(model, params)
    with pytest.raises(og.GenAIError, match="Missing Input: abcde.*set_model_input"):
        gen.append_tokens([[1, 2, 3]])
    with pytest.raises(og.GenAIError, match=r"Actual: \(tensor\(float\)\), expected: \(tensor\(int64\)\)"):
        gen.set_model_input("abcde", np.array(1.0, np.float32))
    with pytest.raises(og.NameNotFoundError, match="'input_ids' is fed by the generator"):
        gen.set_model_input("input_ids", np.array([[1]], np.int64))
    with pytest.raises(og.NameNotFoundError, match="'zz' is not an input.*abcde"):
        gen.set_model_input("zz", np.array(1, np.int64))
    with pytest.raises(og.GenAIError, match="append_tokens for qwen2"):
        gen.set_inputs(og.NamedTensors())
    gen.set_model_input("abcde", og.Tensor(np.array(2, np.int64)))
    gen.append_tokens([[1, 2, 3]])
    np.testing.assert_array_equal(gen.get_input("abcde"), np.array(2, np.int64))


def test_named_tensors() -> None:
    t = og.NamedTensors()
    t["x"] = np.arange(3, dtype=np.int64)
    assert "x" in t and len(t) == 1 and t.keys() == ["x"]
    np.testing.assert_array_equal(t["x"].as_numpy(), np.arange(3))
    del t["x"]
    assert len(t) == 0
    with pytest.raises(KeyError, match="no tensor named 'y'"):
        t["y"]


def test_provider_queries_and_plugin_libraries() -> None:
    assert (og.is_openvino_available(), og.is_qnn_available(), og.is_webgpu_available()) == (False, False, False)
    og.enable_telemetry_events()
    og.disable_telemetry_events()
    with pytest.raises(og.GenAIError, match="plug-in execution-provider libraries"):
        og.register_execution_provider_library("MyEP", "/opt/libmyep.so")
    with pytest.raises(og.GenAIError, match="no execution-provider library"):
        og.unregister_execution_provider_library("MyEP")


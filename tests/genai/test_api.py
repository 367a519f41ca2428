"""crossml.genai API behaviour and errors (no onnxruntime-genai needed beyond the model builder)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import onnx
import pytest

import crossml.genai as og
from crossml.genai.config import translate_gpu_options
from tests.genai._generation import run_steps

PROMPT = "Hello world! How are you"


@pytest.fixture(scope="module")
def folder(genai_models) -> str:
    return genai_models[("llama", "fp32")]


@pytest.fixture(scope="module")
def model(folder) -> og.Model:
    return og.Model(folder)


def _copy(folder: str, tmp_path, edit=None) -> str:
    dst = tmp_path / "m"
    shutil.copytree(folder, dst)
    if edit is not None:
        path = dst / "genai_config.json"
        cfg = json.loads(path.read_text())
        edit(cfg)
        path.write_text(json.dumps(cfg))
    return str(dst)


def _greedy(model: og.Model, n: int = 8, **options) -> og.Generator:
    return run_steps(og, model, n, 64, PROMPT, **options)


_FREEZE_SCRIPT = """
import gc, json, sys, weakref
import crossml.genai as og
before = gc.get_freeze_count()
model = og.Model(sys.argv[1])
frozen = gc.get_freeze_count()
gen = og.Generator(model, og.GeneratorParams(model))
gen.append_tokens([1, 2, 3])
gen.generate_next_token()
alive = weakref.ref(model)
del model, gen
gc.collect()
again = og.Model(sys.argv[1])
print(json.dumps({"before": before, "frozen": frozen, "dropped": alive() is None,
                  "second": gc.get_freeze_count()}))
"""


@pytest.mark.parametrize("setting", ["1", "0"])
def test_first_model_freezes_the_objects_before_it(folder, setting) -> None:
    """The first Model() of a process freezes the objects that exist before its own (gc.freeze: the imports, which
    full collections need not walk); a dropped model is still collected, a second Model() freezes nothing more, and
    CROSSML_GC_FREEZE=0 leaves the collector alone."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, CROSSML_GC_FREEZE=setting)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath("src"), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", _FREEZE_SCRIPT, folder], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["before"] == 0 and got["dropped"]
    if setting == "1":
        assert got["frozen"] > 10_000 and got["second"] <= got["frozen"], got  # (frozen objects freed by refcount leave)
    else:
        assert got["frozen"] == 0 and got["second"] == 0, got


# -- errors -------------------------------------------------------------------------------------
def test_missing_folder_and_config(tmp_path) -> None:
    with pytest.raises(og.ModelFileNotFound, match="does not exist"):
        og.Model(str(tmp_path / "nope"))
    with pytest.raises(og.ModelFileNotFound, match="genai_config.json"):
        og.Config(str(tmp_path))


def test_missing_model_file(folder, tmp_path) -> None:
    path = _copy(folder, tmp_path)
    (tmp_path / "m" / "model.onnx").unlink()
    with pytest.raises(og.ModelFileNotFound, match=r"model\.onnx.*model\.decoder\.filename"):
        og.Model(path)


def test_unsupported_model_type(folder, tmp_path) -> None:
    path = _copy(folder, tmp_path, lambda c: c["model"].update(type="bert"))
    with pytest.raises(og.UnsupportedModelError, match="'bert'.*supported decoder-only types: .*llama"):
        og.Model(path)


def test_known_but_unsupported_type_is_refused_with_the_reason(folder, tmp_path) -> None:
    path = _copy(folder, tmp_path, lambda c: c["model"].update(type="phi3v"))
    with pytest.raises(og.UnsupportedModelError, match="'phi3v'.*not supported.*multimodal pipeline.*vision encoder"):
        og.Model(path)


def test_unknown_search_option(model) -> None:
    params = og.GeneratorParams(model)
    with pytest.raises(og.SearchOptionError, match="unknown search option 'bogus'.*Accepted options: .*max_length"):
        params.set_search_options(bogus=1)
    with pytest.raises(og.SearchOptionError, match="'do_sample' takes true or false"):
        params.set_search_options(do_sample="yes")
    params.set_search_options(num_beams=2, num_return_sequences=3)
    with pytest.raises(og.SearchOptionError, match="num_return_sequences=3.*1 .. num_beams"):
        og.Generator(model, params)


def test_unknown_provider(folder) -> None:
    config = og.Config(folder)
    with pytest.raises(og.ConfigError, match="unknown execution provider 'webgpu'.*cpu, gpu, cuda, dml"):
        config.append_provider("webgpu")


def test_prompt_longer_than_max_length(model) -> None:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=4)
    gen = og.Generator(model, params)
    with pytest.raises(og.GeneratorStateError, match=r"5 tokens \+ current sequence length 0 exceed max_length \(4\)"):
        gen.append_tokens(np.arange(10, 15))
    params.set_search_options(max_length=10_000)
    with pytest.raises(og.SearchOptionError, match="context_length"):
        og.Generator(model, params)


def test_all_pad_row_and_batch_mismatch(model) -> None:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16, batch_size=2)
    gen = og.Generator(model, params)
    with pytest.raises(ValueError, match="batch_size is 2"):
        gen.append_tokens(np.array([[5, 6, 7]]))
    with pytest.raises(ValueError, match="only pad tokens"):
        gen.append_tokens(np.array([[5, 6, 7], [2, 2, 2]]))
    with pytest.raises(og.GeneratorStateError, match="append_tokens"):
        og.Generator(model, params).generate_next_token()


def test_token_ids_outside_the_vocabulary_and_empty_prompts(model) -> None:
    """Prompt ids are checked on the host before anything runs: an id past vocab_size or negative would otherwise
    reach the embedding Gather (an error on the CPU, zeros from onnxruntime's and crossml's GPU gathers); the pad id
    is exempt (it may be negative in a config, and pad columns are masked). An empty prompt is an error, as in
    onnxruntime-genai ("input_ids is empty"). The generator stays usable after each."""
    vocab = model.config.model.vocab_size
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16, batch_size=2)
    gen = og.Generator(model, params)
    with pytest.raises(ValueError, match=rf"token id {vocab} \(sequence 1, position 2\) is outside the vocabulary: "
                                         rf"ids must be within \[0, {vocab}\)"):
        gen.append_tokens(np.array([[5, 6, 7], [5, 6, vocab]]))
    with pytest.raises(ValueError, match=r"token id -1 \(sequence 0, position 0\)"):
        gen.append_tokens(np.array([[-1, 6, 7], [5, 6, 7]]))
    with pytest.raises(ValueError, match="input_ids is empty"):
        gen.append_tokens(np.zeros((2, 0), dtype=np.int64))
    gen.append_tokens(np.array([[5, 6, vocab - 1], [5, 6, 7]]))
    gen.generate_next_token()
    assert gen.get_next_tokens().shape == (2,)


# -- config -------------------------------------------------------------------------------------
def test_overlay_and_search_defaults(folder) -> None:
    config = og.Config(folder)
    config.overlay('{"search": {"max_length": 32, "top_k": 5}}')
    params = og.GeneratorParams(og.Model(config))
    opts = params.get_search_options()
    assert opts["max_length"] == 32.0 and opts["top_k"] == 5.0 and opts["do_sample"] is False
    with pytest.raises(og.ConfigError, match="unknown search option 'bogus'"):
        config.overlay('{"search": {"bogus": 1}}')
    assert config.search.max_length == 32  # a refused overlay leaves the config as it was


def test_provider_options(folder) -> None:
    config = og.Config(folder)
    config.clear_providers()
    assert config.providers() == [("CPUExecutionProvider", {})]
    config.append_provider("dml")
    config.set_provider_option("dml", "performance_preference", "high_performance")
    config.set_provider_option("dml", "disable_metacommands", True)
    config.set_decoder_provider_options_hardware_device_type("dml", "GPU")
    config.set_decoder_provider_options_hardware_vendor_id("dml", 4318)
    assert config.providers() == [
        ("DmlExecutionProvider", {"performance_preference": "high_performance", "disable_metacommands": "true",
                                  "device_filter": "gpu", "hardware_vendor_id": "4318"}),
        ("CPUExecutionProvider", {}),
    ]
    assert translate_gpu_options("cuda", {"device_id": 0, "enable_cuda_graph": "0"}) == \
        {"device_id": "0", "enable_cuda_graph": "0"}
    with pytest.raises(og.ConfigError, match="device_filtering_options key 'bogus'"):
        translate_gpu_options("dml", {"device_filtering_options": {"bogus": 1}})


def test_availability_flags() -> None:
    assert isinstance(og.is_cuda_available(), bool)
    assert og.is_dml_available() == og.is_cuda_available()


# -- generation ---------------------------------------------------------------------------------
def test_static_cache_written_in_place(model) -> None:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=32)
    gen = og.Generator(model, params)
    buffers = [t.data_ptr() for t in gen._cache.tensors]
    gen.append_tokens(og.Tokenizer(model).encode(PROMPT))
    for _ in range(4):
        gen.generate_next_token()
    assert [t.data_ptr() for t in gen._cache.tensors] == buffers
    assert tuple(gen._cache.tensors[0].shape) == (1, 2, 32, 16)
    assert float(gen._cache.tensors[0][:, :, : gen.token_count() - 1].abs().sum()) > 0
    assert gen.get_output("present.0.key").shape == (1, 2, 32, 16)


def test_kv_cache_shapes_come_from_the_decoder_inputs(folder, tmp_path) -> None:
    """Each layer's KV buffers take the heads and head size of its past inputs (Gemma 4's layers differ: see
    tests/genai/test_architectures.py), and genai_config.json's num_key_value_heads / head_size where those dims are
    symbolic."""
    model = og.Model(folder)
    dec = model.config.model.decoder
    assert set(model.io.kv_dims) == {(dec.num_key_value_heads, dec.head_size)}
    path = _copy(folder, tmp_path)
    m = onnx.load(os.path.join(path, "model.onnx"), load_external_data=False)
    for i in m.graph.input:
        if i.name.startswith("past_key_values"):
            dims = i.type.tensor_type.shape.dim
            dims[1].dim_param, dims[3].dim_param = "kv_heads", "head_size"
    onnx.save(m, os.path.join(path, "model.onnx"))
    symbolic = og.Model(path)
    assert symbolic.io.kv_dims == model.io.kv_dims
    assert symbolic.kv_shapes(40) == [(dec.num_key_value_heads, 40, dec.head_size)] * len(model.io.past_names)


def test_growing_cache_matches_static(model) -> None:
    a = _greedy(model, 10).get_sequence(0)
    b = _greedy(model, 10, past_present_share_buffer=False).get_sequence(0)
    assert a.tolist() == b.tolist()


def test_rewind_and_continue(model) -> None:
    gen = _greedy(model, 8)
    full = gen.get_sequence(0).tolist()
    keep = len(full) - 5
    gen.rewind_to(keep)
    assert gen.token_count() == keep and gen.get_sequence(0).tolist() == full[:keep]
    for _ in range(5):
        gen.generate_next_token()
    assert gen.get_sequence(0).tolist() == full
    gen.rewind_to(0)
    gen.append_tokens(np.array(full[:keep]))
    gen.generate_next_token()
    assert gen.get_sequence(0).tolist() == full[: keep + 1]
    with pytest.raises(og.GeneratorStateError, match=f"the sequence has {keep + 1} tokens"):
        gen.rewind_to(keep + 2)


def test_append_after_generating_feeds_the_generated_token(model) -> None:
    """Tokens appended after generate_next_token follow the generated token, which the model has not yet seen: the
    next logits are those of the whole sequence fed as one prompt. (onnxruntime-genai 0.18's CPU build gives other
    logits there, matching neither that prompt nor the one without the generated token.)"""
    gen = _greedy(model, 3)
    gen.append_tokens(np.array([8, 9]))
    after = gen.get_logits().reshape(-1)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64)
    whole = og.Generator(model, params)
    whole.append_tokens(gen.get_sequence(0))
    np.testing.assert_allclose(after, whole.get_logits().reshape(-1), atol=1e-4, rtol=0)
    gen.generate_next_token()
    whole.generate_next_token()
    assert gen.get_sequence(0).tolist() == whole.get_sequence(0).tolist()


def test_set_logits_and_get_logits(model) -> None:
    gen = _greedy(model, 1)
    logits = gen.get_logits()
    assert logits.shape == (1, 1, 366) and logits.dtype == np.float32
    forced = np.zeros_like(logits)
    forced[..., 42] = 10.0
    gen.set_logits(forced)
    gen.generate_next_token()
    assert gen.get_next_tokens().tolist() == [42]


def test_sampling(model) -> None:
    greedy = _greedy(model, 6).get_sequence(0).tolist()
    assert _greedy(model, 6, do_sample=True, top_k=1).get_sequence(0).tolist() == greedy
    assert _greedy(model, 6, do_sample=True, top_p=1e-6, top_k=0).get_sequence(0).tolist() == greedy
    a = _greedy(model, 12, do_sample=True, top_k=50, temperature=2.0, random_seed=7).get_sequence(0).tolist()
    b = _greedy(model, 12, do_sample=True, top_k=50, temperature=2.0, random_seed=7).get_sequence(0).tolist()
    c = _greedy(model, 12, do_sample=True, top_k=50, temperature=2.0, random_seed=8).get_sequence(0).tolist()
    assert a == b and a != c
    gen = _greedy(model, 0, do_sample=True, top_k=3, random_seed=1)
    for _ in range(20):  # only the 3 best tokens are ever drawn
        logits = gen.get_logits()[0, 0]
        gen.generate_next_token()
        assert gen.get_next_tokens()[0] in np.argsort(logits)[-3:]


def test_tokenizer_stream_multibyte(model) -> None:
    tok = og.Tokenizer(model)
    text = "Grüße 你好 🙂 café naïve"
    ids = tok.encode(text)
    stream = tok.create_stream()
    pieces = [stream.decode(int(i)) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert tok.decode_batch(tok.encode_batch([text, "Hello"])) == [text, "Hello"]


def test_decoding_bad_token_ids(model) -> None:
    """Negative or non-integer ids are errors naming the value (the tokenizer cannot represent them; they raised
    OverflowError from the tokenizers library), and a stream given one is not poisoned: the id is not kept."""
    tok = og.Tokenizer(model)
    ids = tok.encode("Grüße café")
    with pytest.raises(ValueError, match=r"Tokenizer.decode: token id -2 is negative"):
        tok.decode(np.array([5, -2]))
    with pytest.raises(ValueError, match=r"Tokenizer.decode_batch: token id -1 is negative"):
        tok.decode_batch(np.array([[5, 6], [-1, 6]]))
    with pytest.raises(ValueError, match="Tokenizer.decode takes integer token ids, got float64"):
        tok.decode(np.array([5.0]))
    stream = tok.create_stream()
    first = stream.decode(int(ids[0]))
    with pytest.raises(ValueError, match=r"TokenizerStream.decode: token id -5 is negative"):
        stream.decode(-5)
    with pytest.raises(ValueError, match="TokenizerStream.decode takes one token id, got 2 values"):
        stream.decode(np.array([1, 2]))
    assert first + "".join(stream.decode(int(i)) for i in ids[1:]) == "Grüße café"


def test_tokenizer_options_errors(model) -> None:
    tok = og.Tokenizer(model)
    with pytest.raises(og.ConfigError, match="unknown option 'padding'; accepted: add_special_tokens, "
                                             "skip_special_tokens"):
        tok.update_options(padding="true")
    with pytest.raises(og.ConfigError, match="option 'add_special_tokens' takes true or false.*'maybe'"):
        tok.update_options(add_special_tokens="maybe")
    with pytest.raises(og.ConfigError, match="no options given"):
        tok.update_options()
    plain = tok.encode(PROMPT).tolist()
    with pytest.raises(og.ConfigError):  # one bad value: nothing changes
        tok.update_options(skip_special_tokens="false", add_special_tokens="yes please")
    assert tok.decode([0, 5]) == "" and tok.encode(PROMPT).tolist() == plain
    with pytest.raises(og.GenAIError, match="bot_token_id is not defined for this model: set model.bot_token_id"):
        _ = tok.bot_token_id


def test_marker_ids_from_config(folder, tmp_path) -> None:
    path = _copy(folder, tmp_path, lambda c: c["model"].update(eot_token_id=5))
    assert og.Tokenizer(og.Model(path)).eot_token_id == 5
    path = _copy(folder, tmp_path / "b", lambda c: c["model"].update(bor_token_id="3"))
    with pytest.raises(og.ConfigError, match=r"model.bor_token_id takes a whole number, got '3'"):
        og.Config(path)


def test_config_key_errors(folder, tmp_path) -> None:
    """Each refused genai_config.json key names the file, the key path, what is accepted and the likely fix."""
    def refused(i: int, edit) -> str:
        with pytest.raises(og.ConfigError) as info:
            og.Config(_copy(folder, tmp_path / str(i), edit))
        assert "genai_config.json'" in str(info.value)
        return str(info.value)

    msg = refused(0, lambda c: c["model"].update(context_lenght=64))
    assert "model: unknown key 'context_lenght' (did you mean 'context_length'?). Accepted: type, " in msg
    msg = refused(1, lambda c: c["model"]["decoder"]["inputs"].update(pask_key_names="p.%d"))
    assert "model.decoder.inputs: unknown key 'pask_key_names' (did you mean 'past_key_names'?)" in msg
    assert "model.vocab_size takes a whole number, got 'many'" in refused(2, lambda c: c["model"].update(
        vocab_size="many"))
    assert "model.eos_token_id takes a token id or a list of them, got [1, 'x']" in refused(
        3, lambda c: c["model"].update(eos_token_id=[1, "x"]))
    msg = refused(4, lambda c: c["model"]["decoder"].update(pipeline=[]))
    assert "model.decoder.pipeline is not supported: crossml.genai runs decoder-only models from one ONNX file" in msg
    assert "model.vision is not supported" in refused(5, lambda c: c["model"].update(vision={}))
    msg = refused(6, lambda c: c["model"]["decoder"]["session_options"].update(graph_optimization_level="fast"))
    assert "graph_optimization_level: unknown level 'fast'. Accepted: ORT_DISABLE_ALL, " in msg
    msg = refused(7, lambda c: c["model"]["decoder"]["session_options"].update({"session.x": True}))
    assert "model.decoder.session_options.session.x takes a string, got True" in msg
    assert "model.decoder.sliding_window.alignment takes a string, got 1" in refused(
        8, lambda c: c["model"]["decoder"].update(sliding_window={"window_size": 8, "alignment": 1}))
    with pytest.raises(og.ConfigError, match="provider 'cpu' takes no options, got a: the CPU is the fallback"):
        config = og.Config(folder)
        config.set_provider_option("cpu", "a", "1")
        og.Model(config)
    config = og.Config(folder)
    with pytest.raises(og.ConfigError, match="model: unknown key 'max_length'"):
        config.overlay('{"model": {"max_length": 64}}')  # belongs to "search"
    assert "max_length" not in config.raw["model"]  # a refused overlay changes nothing


def test_session_config_entries_reach_the_session(folder, tmp_path) -> None:
    """session_options keys other than onnxruntime-genai's named ones are session config entries."""
    path = _copy(folder, tmp_path, lambda c: c["model"]["decoder"]["session_options"].update(
        {"session.intra_op.allow_spinning": "0", "graph_optimization_level": "ORT_ENABLE_BASIC",
         "log_verbosity_level": 1, "config_entries": {"session.use_env_allocators": "1"}}))
    so = og.Model(path)._session_options()
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert so.get_session_config_entry("session.use_env_allocators") == "1"  # crossml's object of entries
    assert so.log_verbosity_level == 1 and int(so.graph_optimization_level) == 1


def test_get_input_and_runtime_option_errors(model) -> None:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=32)
    gen = og.Generator(model, params)
    with pytest.raises(og.NameNotFoundError, match="none yet: call append_tokens first"):
        gen.get_input("input_ids")
    gen.append_tokens(og.Tokenizer(model).encode(PROMPT))
    with pytest.raises(og.NameNotFoundError, match="'logits' is not an input of the last run; inputs: input_ids, "
                                                    "attention_mask, past_key_values.0.key"):
        gen.get_input("logits")
    with pytest.raises(KeyError):  # also a KeyError (and a RuntimeError, as onnxruntime-genai raises)
        gen.get_output("nope")
    with pytest.raises(og.GenAIError, match="unknown key 'enable_profiling'; accepted: terminate_session"):
        gen.set_runtime_option("enable_profiling", "1")
    with pytest.raises(og.GenAIError, match="terminate_session takes \"0\" or \"1\", got '2'"):
        gen.set_runtime_option("terminate_session", "2")
    gen.set_runtime_option("terminate_session", "1")
    with pytest.raises(og.GeneratorStateError, match="Session in Terminated state"):
        gen.generate_next_token()
    gen.set_runtime_option("terminate_session", "0")
    gen.generate_next_token()
    assert gen.token_count() == len(og.Tokenizer(model).encode(PROMPT)) + 1


def test_terminate_from_another_thread(model) -> None:
    """A loop stopped from another thread raises at its next step; nothing already generated is lost."""
    import threading

    gen = _greedy(model, 2)
    stop = threading.Event()

    def stopper() -> None:
        stop.wait()
        gen.set_runtime_option("terminate_session", "1")

    t = threading.Thread(target=stopper)
    t.start()
    steps = 0
    with pytest.raises(og.GeneratorStateError):
        while not gen.is_done():
            gen.generate_next_token()
            steps += 1
            if steps == 3:
                stop.set()
                t.join()
    assert steps == 3 and gen.token_count() == len(og.Tokenizer(model).encode(PROMPT)) + 5


def test_log_options_errors_and_destinations(model, tmp_path) -> None:
    """set_log_options checks every option before setting any; lines go to the callback, else to the file; the
    end-of-sequence and max_length events are logged."""
    with pytest.raises(og.ConfigError, match="unknown option 'verbose'; accepted: enabled, ansi_tags"):
        og.set_log_options(enabled=True, verbose=True)
    with pytest.raises(og.ConfigError, match="option 'enabled' takes True or False, got 'yes'"):
        og.set_log_options(enabled="yes")
    with pytest.raises(og.ConfigError, match="'model_logits' is not provided by crossml.genai.*enable_profiling"):
        og.set_log_options(model_logits=True)
    with pytest.raises(TypeError, match="takes a callable"):
        og.set_log_callback("print")
    with pytest.raises(og.ConfigError, match="cannot write the log file"):
        og.set_log_options(enabled=True, filename=str(tmp_path / "no" / "such" / "dir" / "log.txt"))
    from crossml.genai import logs

    assert not logs.wants("enabled")  # a refused call changes nothing
    og.set_log_options(model_logits=False)  # accepted: nothing to turn off
    path = tmp_path / "log.txt"
    lines: list[str] = []
    try:
        og.set_log_options(enabled=True, ansi_tags=False, hit_max_length=True, hit_eos=True, filename=str(path))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(og.Tokenizer(model).encode(PROMPT)) + 3)
        gen = og.Generator(model, params)
        gen.append_tokens(og.Tokenizer(model).encode(PROMPT))
        while not gen.is_done():
            gen.generate_next_token()
        og.set_log_callback(lines.append)  # replaces the file
        eos = og.Tokenizer(model).eos_token_ids[0]
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=64)
        gen = og.Generator(model, params)
        gen.append_tokens(og.Tokenizer(model).encode(PROMPT))
        gen.set_logits(np.where(np.arange(gen.get_logits().shape[-1]) == eos, 10.0, -10.0)
                       .astype(np.float32)[None, :])
        gen.generate_next_token()
    finally:
        og.set_log_options(enabled=False, ansi_tags=True, hit_max_length=False, hit_eos=False, filename="")
        og.set_log_callback(None)
    assert path.read_text().splitlines() == ["  hit_max_length   max_length "
                                             f"{len(og.Tokenizer(model).encode(PROMPT)) + 3} reached"]
    assert lines == ["  hit_eos   EOS seen on batch 0\n"]

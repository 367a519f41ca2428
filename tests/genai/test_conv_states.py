"""Models whose layers carry convolution states (LFM2: ``past.i.conv`` / ``present.i.conv`` beside the attention
layers' KV caches), against onnxruntime-genai 0.18 and against themselves.

One prompt (fp32 and int4) is compared with onnxruntime-genai in test_architectures.py. Here: beam search, prompts
of one length in a batch, and the state the decoder is fed, against onnxruntime-genai; where onnxruntime-genai 0.18
goes wrong, against what the model itself gives for the same tokens:

- a batch of prompts of different lengths: onnxruntime-genai runs the right-padded prompt's pad tokens through the
  shorter rows' convolution states (their tokens drift from the prompt's own run after the first one); crossml's
  rows each equal the prompt run alone (test_architectures.py::test_ragged_batch_rows_equal_their_prompts_alone);
- a prompt appended to a started sequence: onnxruntime-genai's next logits differ from those of a fresh prompt of
  the same tokens (by about 0.7 on this model); crossml's equal them;
- rewind_to, which onnxruntime-genai refuses for this model type ("RewindTo is currently not supported for lfm2").
"""

from __future__ import annotations

import numpy as np
import pytest

import crossml.genai as xg
from tests.genai._generation import generate_with

PROMPT = "Hello world! How are you"
BATCH = ["The quick brown fox jumps over", "def f(x):"]
MAX_LENGTH = 40


def _tokens(og, model, prompts: list[str], **options) -> list[list[int]]:
    return generate_with(og, model, prompts, MAX_LENGTH, **options)[0]


@pytest.fixture(scope="module")
def lfm2(more_models) -> str:
    return more_models["lfm2"]


def test_the_model_carries_convolution_states(lfm2, og_ref) -> None:
    model = xg.Model(lfm2)
    assert model.io.state_names == ["past.0.conv"] and model.io.past_names == ["past_key_values.1.key",
                                                                             "past_key_values.1.value"]
    gens = []
    for og in (og_ref, xg):
        m = og.Model(lfm2)
        params = og.GeneratorParams(m)
        params.set_search_options(max_length=MAX_LENGTH)
        gen = og.Generator(m, params)
        gen.append_tokens(og.Tokenizer(m).encode(PROMPT))
        gen.generate_next_token()
        gen.generate_next_token()
        gens.append(gen)
    ref, got = (g.get_output("present.0.conv") for g in gens)
    assert got.shape == ref.shape == (1, 64, 2)
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(gens[1].get_input("past.0.conv"), got)  # what the next step takes in


def test_ragged_batch_shows_the_restated_states(lfm2) -> None:
    """After a batch of prompts of different lengths, present.0.conv shows each row's state after its own prompt: the
    state the prompt alone leaves."""
    model = xg.Model(lfm2)
    tok = xg.Tokenizer(model)

    def state(prompts):
        params = xg.GeneratorParams(model)
        params.set_search_options(max_length=MAX_LENGTH, batch_size=len(prompts))
        gen = xg.Generator(model, params)
        gen.append_tokens(tok.encode_batch(prompts) if len(prompts) > 1 else tok.encode(prompts[0]))
        return gen.get_output("present.0.conv")

    batch = state(BATCH)
    for row, prompt in enumerate(BATCH):
        np.testing.assert_allclose(batch[row], state([prompt])[0], atol=1e-5, rtol=0)


def test_batch_of_one_length_matches_onnxruntime_genai(lfm2, og_ref) -> None:
    prompts = np.array([[5, 6, 7, 8, 9], [9, 10, 11, 12, 13]], dtype=np.int32)
    got = []
    for og in (og_ref, xg):
        m = og.Model(lfm2)
        params = og.GeneratorParams(m)
        params.set_search_options(max_length=MAX_LENGTH, batch_size=2)
        gen = og.Generator(m, params)
        gen.append_tokens(prompts)
        while not gen.is_done():
            gen.generate_next_token()
        got.append([gen.get_sequence(i).tolist() for i in range(2)])
    assert got[1] == got[0]


def test_beam_search_matches_onnxruntime_genai(lfm2, og_ref) -> None:
    for prompt in (PROMPT, "def f(x):"):
        options = {"num_beams": 3, "num_return_sequences": 2}
        ref = generate_with(og_ref, og_ref.Model(lfm2), [prompt], MAX_LENGTH, **options)[0]
        got = generate_with(xg, xg.Model(lfm2), [prompt], MAX_LENGTH, **options)[0]
        assert got == ref


def _continued(og, folder: str):
    model = og.Model(folder)
    tok = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    gen = og.Generator(model, params)
    gen.append_tokens(tok.encode("Hello"))
    for _ in range(5):
        gen.generate_next_token()
    before = gen.get_sequence(0).tolist()
    gen.append_tokens(tok.encode(" world how are you"))
    return before, gen.get_sequence(0).tolist(), gen.get_logits()


def test_appended_prompt_continues_the_states(lfm2, og_ref) -> None:
    before, seq, logits = _continued(xg, lfm2)
    assert before == _continued(og_ref, lfm2)[0]
    model = xg.Model(lfm2)
    params = xg.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    fresh = xg.Generator(model, params)
    fresh.append_tokens(np.array(seq, dtype=np.int32))
    np.testing.assert_allclose(logits, fresh.get_logits(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("share", [True, False], ids=["shared", "growing"])
def test_rewind_runs_the_kept_tokens_again(lfm2, share) -> None:
    model = xg.Model(lfm2)
    tok = xg.Tokenizer(model)

    def generator():
        params = xg.GeneratorParams(model)
        params.set_search_options(max_length=MAX_LENGTH, past_present_share_buffer=share)
        gen = xg.Generator(model, params)
        gen.append_tokens(tok.encode(PROMPT))
        return gen

    fresh = generator()
    while len(fresh.get_sequence(0)) < 30:
        fresh.generate_next_token()
    want = fresh.get_sequence(0).tolist()
    gen = generator()
    while len(gen.get_sequence(0)) < 20:
        gen.generate_next_token()
    gen.rewind_to(12)
    assert gen.get_sequence(0).tolist() == want[:12]
    while len(gen.get_sequence(0)) < 30:
        gen.generate_next_token()
    assert gen.get_sequence(0).tolist() == want
    gen.rewind_to(0)
    gen.append_tokens(tok.encode(PROMPT))
    while len(gen.get_sequence(0)) < 30:
        gen.generate_next_token()
    assert gen.get_sequence(0).tolist() == want


def test_static_decode_path_matches_default(lfm2) -> None:
    """The fixed-address decode path (a GPU's, forced on the CPU, with its recordings' prompt buckets and run-ahead
    asked for): the states stay in the lent buffers, prompts are not padded, nothing runs ahead."""
    ref = generate_with(xg, xg.Model(lfm2), BATCH, MAX_LENGTH)
    model = xg.Model(lfm2)
    model._static_decode = model._prompt_graphs = model._run_ahead = True
    seen = []
    run = model.run

    def spy(feed, names, **kw):
        seen.append(feed[model.io.input_ids].shape)
        return run(feed, names, **kw)

    model.run = spy
    got = generate_with(xg, model, BATCH, MAX_LENGTH)
    assert got[0] == ref[0]
    for a, b in zip(got[1], ref[1]):
        np.testing.assert_array_equal(a, b)
    lens = [len(xg.Tokenizer(model).encode(p)) for p in BATCH]
    assert seen[0] == (2, max(lens))  # the prompt at its own width, then the shorter one alone
    assert seen[1] == (1, min(lens))
    assert all(s == (2, 1) for s in seen[2:])


def test_malformed_layer_types_are_named(lfm2, tmp_path) -> None:
    import json
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(lfm2, folder)
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["decoder"]["conv_cache_size"] = 0
    (folder / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(xg.ConfigError, match="conv_cache_size must be a positive integer"):
        xg.Model(str(folder))
    cfg["model"]["decoder"]["conv_cache_size"] = 2
    cfg["model"]["decoder"]["layer_types"] = ["conv"]
    (folder / "genai_config.json").write_text(json.dumps(cfg))
    with pytest.raises(xg.ConfigError, match="layer_types takes one string per layer"):
        xg.Model(str(folder))

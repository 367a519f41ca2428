"""Constrained decoding (``set_guidance``, crossml.genai.guidance) against onnxruntime-genai's, which runs the same
library (llguidance): the same greedy sequences for a regular expression, a JSON schema and a Lark grammar."""

from __future__ import annotations

import json

import numpy as np
import pytest

import crossml.genai as og

pytest.importorskip("llguidance", reason="guidance needs llguidance (pip install crossml[guidance]; in crossml[test])")

GRAMMARS = [
    ("regex", "a+"),
    ("regex", r"(yes|no|maybe)[.!]"),
    ("json_schema", json.dumps({"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
                                "required": ["name", "n"]})),
    ("lark_grammar", 'start: "hello " NAME\nNAME: /[a-z]+/'),
]


def _generate(lib, folder: str, kind: str, data: str, prompts: list[str], max_length: int = 60) -> list[list[int]]:
    model = lib.Model(folder)
    params = lib.GeneratorParams(model)
    params.set_search_options(max_length=max_length, batch_size=len(prompts))
    params.set_guidance(kind, data)
    gen = lib.Generator(model, params)
    tok = lib.Tokenizer(model)
    gen.append_tokens(tok.encode_batch(prompts) if len(prompts) > 1 else tok.encode(prompts[0]))
    while not gen.is_done():
        gen.generate_next_token()
    return [[int(t) for t in gen.get_sequence(i)] for i in range(len(prompts))]


@pytest.mark.parametrize(("kind", "data"), GRAMMARS, ids=["regex-a", "regex-words", "json", "lark"])
@pytest.mark.parametrize("build", [("qwen2", "fp32"), ("llama", "int4")], ids=["qwen2-fp32", "llama-int4"])
def test_guided_sequences_match_onnxruntime_genai(genai_models, og_ref, build, kind: str, data: str) -> None:
    folder = genai_models[build]
    for prompt in ("Hello", "x y z"):
        assert _generate(og, folder, kind, data, [prompt]) == _generate(og_ref, folder, kind, data, [prompt])


@pytest.mark.parametrize(("kind", "data"), GRAMMARS[1:], ids=["regex-words", "json", "lark"])
def test_a_batch_guides_each_row_as_alone(genai_models, kind: str, data: str) -> None:
    """Each row of a batch has its own matcher (onnxruntime-genai 0.18 fails a batch whose rows end at different
    steps: "compute_mask() called after stop"; here the ended rows take pads)."""
    folder = genai_models[("qwen2", "fp32")]
    prompts = ["Hello there", "x"]
    both = _generate(og, folder, kind, data, prompts)
    mc = og.Model(folder).config.model
    for row, prompt in enumerate(prompts):
        alone = _generate(og, folder, kind, data, [prompt])[0]
        # the batch's row: its prompt right-padded, and after the row's end its end-of-sequence id, then pads (a
        # row that runs to max_length stops earlier than alone, by its pad columns)
        real = [t for t in both[row] if t != mc.pad_token_id]
        n = min(len(real), len(alone))
        assert real[:n] == alone[:n] and n > len(og.Tokenizer(og.Model(folder)).encode(prompt)) + 2
        assert len(real) <= len(alone) or real == alone + [mc.eos_token_id[0]]


def test_guided_text_follows_the_grammar_and_rewinds(genai_models) -> None:
    folder = genai_models[("qwen2", "fp32")]
    model = og.Model(folder)
    tok = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=60)
    params.set_guidance("regex", r"(yes|no|maybe)[.!]")
    gen = og.Generator(model, params)
    prompt = tok.encode("Hello")
    gen.append_tokens(prompt)
    while not gen.is_done():
        gen.generate_next_token()
    seq = gen.get_sequence(0).tolist()
    text = tok.decode(np.array(seq[len(prompt):], dtype=np.int32))
    assert text in {f"{w}{p}" for w in ("yes", "no", "maybe") for p in ".!"}
    # rewound into the generated part, the grammar goes back with it and the same tokens come again
    gen.rewind_to(len(prompt) + 1)
    while not gen.is_done():
        gen.generate_next_token()
    assert gen.get_sequence(0).tolist() == seq


def test_guidance_errors(genai_models) -> None:
    model = og.Model(genai_models[("qwen2", "fp32")])
    params = og.GeneratorParams(model)
    with pytest.raises(ValueError, match="provided together"):
        params.set_guidance("regex", "")
    with pytest.raises(ValueError, match="Unsupported guidance type: xml"):
        params.set_guidance("xml", "a")
    with pytest.raises(ValueError, match="enable_ff_tokens"):
        params.set_guidance("regex", "a", enable_ff_tokens=True)
    params.set_guidance("regex", "(unclosed")
    with pytest.raises(RuntimeError, match=r"Error creating grammar \(regex\)"):
        og.Generator(model, params)
    params.set_guidance("json_schema", "{not json")
    with pytest.raises(RuntimeError, match=r"Error creating grammar \(json_schema\)"):
        og.Generator(model, params)
    params.set_guidance("", "")  # cleared
    og.Generator(model, params)


def _engine_events(lib, folder: str) -> list:
    """A guided turn, then an unguided one on the same request, then a guided turn on a fresh request."""
    model = lib.Model(folder)
    e = lib.Engine(model)
    buf = e.create_event_buffer(8)
    tok = lib.Tokenizer(model)
    out: list = []

    def drain(r):
        while e.has_pending_requests():
            for x in e.run(buf):
                out.append((x.turn_id, x.token, int(x.flags), x.finish_reason.name, x.usage.generated_tokens))

    r = e.create_request()
    o = lib.TurnOptions(r)
    o.set_guidance("regex", r"(yes|no|maybe)[.!]")
    r.begin_turn(tok.encode("Hello"), o)
    drain(r)
    o = lib.TurnOptions(r)
    o.set_max_generated_tokens(5)
    r.begin_turn(tok.encode(" ok"), o)
    drain(r)
    r.close()
    r = e.create_request()
    o = lib.TurnOptions(r)
    o.set_guidance("lark_grammar", 'start: "hello " NAME\nNAME: /[a-z]+/')
    o.set_max_generated_tokens(12)
    r.begin_turn(tok.encode("x y"), o)
    drain(r)
    return out


def test_engine_turn_guidance_matches_onnxruntime_genai(genai_models, og_ref) -> None:
    folder = genai_models[("qwen2", "fp32")]
    ours = _engine_events(og, folder)
    assert ours == _engine_events(og_ref, folder)
    assert next(ev for ev in ours if ev[2] & int(og.EngineEventFlags.TURN_FINISHED))[3] == "EOS"  # grammar done


def test_engine_refuses_a_bad_grammar_at_admission(genai_models) -> None:
    e = og.Engine(og.Model(genai_models[("qwen2", "fp32")]))
    r = e.create_request()
    o = og.TurnOptions(r)
    o.set_guidance("regex", "(unclosed")
    with pytest.raises(RuntimeError, match="Error creating grammar"):
        r.begin_turn(np.array([1, 2], dtype=np.int32), o)
    assert r._turns == [] and not e.has_pending_requests()

"""og.Engine (crossml.genai.engine) against onnxruntime-genai's Engine on the CPU, event for event, and its rules
where onnxruntime-genai's CPU engine (static batching) cannot show them: stop strings, per-turn seeds, turns of
several resident requests, failures."""

from __future__ import annotations

import json

import numpy as np
import pytest

import crossml.genai as og
from crossml.genai import engine as engine_module


def _ids(*tokens: int) -> np.ndarray:
    return np.array(tokens, dtype=np.int32)


def _record(lib, e, buf, reqs, out) -> None:
    """Run ``e`` until it has nothing pending, appending every event as plain values."""
    while e.has_pending_requests():
        for x in e.run(buf):
            u = x.usage
            out.append((reqs.index(x.request), x.turn_id, x.token, int(x.flags), x.finish_reason.name,
                        x.matched_stop_string_index, int(x.error_code),
                        (u.prompt_tokens, u.generated_tokens, u.cached_prompt_tokens)))


def _script(lib, folder: str) -> list:
    """One scenario in the Engine API of ``lib``: three requests admitted together (turn caps 4 / 7 / 10, at least
    2 tokens each); then, on an engine of its own, one request's turns: continuation, rewind to a turn's start, a
    cancel of the running turn, and a last turn up to its session limit."""
    model = lib.Model(folder)
    out: list = []
    e = lib.Engine(model)
    buf = e.create_event_buffer(8)
    reqs = [e.create_request() for _ in range(3)]
    for i, r in enumerate(reqs):
        opts = lib.TurnOptions(r)
        opts.set_max_generated_tokens(4 + 3 * i)
        opts.set_min_generated_tokens(2)
        assert r.begin_turn(_ids(1, 2 + i, 3, 7), opts) == 1
    _record(lib, e, buf, reqs, out)
    e = lib.Engine(model)  # onnxruntime-genai's static batch continues a turn with one resident request only
    buf = e.create_event_buffer(8)
    ro = lib.RequestOptions()
    ro.set_max_session_tokens(40)
    reqs = [e.create_request(options=ro)]
    r = reqs[0]
    opts = lib.TurnOptions(r)
    opts.set_max_generated_tokens(5)
    out.append(("turn", r.begin_turn(_ids(1, 2, 3), opts)))
    _record(lib, e, buf, reqs, out)
    out.append(("turn", r.begin_turn(_ids(9, 10), opts)))
    _record(lib, e, buf, reqs, out)
    r.rewind_to_start_of_turn(2)
    out.append(("turn", r.begin_turn(_ids(9, 11), opts)))
    _record(lib, e, buf, reqs, out)
    out.append(("turn", r.begin_turn(_ids(12))))
    e.run(buf)
    out.append(("cancel", r.cancel_turn(4), r.cancel_turn(4), r.cancel_turn(1)))
    _record(lib, e, buf, reqs, out)
    out.append(("turn", r.begin_turn(_ids(13))))
    _record(lib, e, buf, reqs, out)
    return out


@pytest.mark.parametrize(("arch", "precision"), [("qwen2", "fp32"), ("llama", "int4"), ("gemma", "fp32")])
def test_events_match_onnxruntime_genai(genai_models, og_ref, arch: str, precision: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = genai_models[(arch, precision)]
    steps: list[int] = []
    step = engine_module._Batch.step
    monkeypatch.setattr(engine_module._Batch, "step", lambda self, waiting: (steps.append(len(waiting)),
                                                                            step(self, waiting))[1])
    ours, ref = _script(og, folder), _script(og_ref, folder)
    assert ours == ref
    assert steps and max(steps) == 3  # the three requests' decode steps ran batched (sessions of 256 on the CPU)
    assert ours[-1][4] == "MAX_SESSION_TOKENS" and ("cancel", True, False, False) in ours


def _eos_script(lib, folder: str, eos: int) -> list:
    """A turn that ends on an end-of-sequence id (``eos`` made the model's), and one that bans it for 6 tokens."""
    config = lib.Config(folder)
    config.overlay(json.dumps({"model": {"eos_token_id": [eos]}}))
    model = lib.Model(config)
    e = lib.Engine(model)
    buf = e.create_event_buffer(4)
    out: list = []
    for floor in (0, 6):
        r = e.create_request()
        opts = lib.TurnOptions(r)
        opts.set_min_generated_tokens(floor)
        opts.set_max_generated_tokens(12)
        r.begin_turn(_ids(1, 2, 3, 7), opts)
        _record(lib, e, buf, [r], out)
        r.close()
    return out


def test_end_of_sequence_and_min_generated_tokens(genai_models, og_ref) -> None:
    folder = genai_models[("qwen2", "fp32")]
    tokens = [ev[2] for ev in _script(og, folder)[:9] if ev[0] == 0]  # request 0's first turn
    eos = tokens[2]  # the third token it generates
    ours, ref = _eos_script(og, folder, eos), _eos_script(og_ref, folder, eos)
    assert ours == ref
    ended = [ev for ev in ours if ev[4] == "EOS"]
    assert ended and ended[0][2] is None and ended[0][3] == int(og.EngineEventFlags.TURN_FINISHED)
    assert ended[0][7] == (4, 2, 0)  # the end-of-sequence id is not a generated token


def test_cancel_merges_into_a_token_event_not_handed_out(genai_models, og_ref) -> None:
    def script(lib):
        e = lib.Engine(lib.Model(genai_models[("qwen2", "fp32")]))
        one = e.create_event_buffer(1)
        a, b = e.create_request(), e.create_request()
        a.begin_turn(_ids(1, 2))
        b.begin_turn(_ids(3, 4))
        out = [len(e.run(one)), b.cancel_turn(1)]
        ev = e.run(one)[0]  # b's token event, held back by the one-event buffer, now also finishes its turn
        out.append((ev.request is b, ev.token is not None, int(ev.flags), ev.finish_reason.name,
                    ev.usage.generated_tokens))
        a.cancel_turn(1)
        _record(lib, e, e.create_event_buffer(4), [a, b], out)
        return out

    ours = script(og)
    assert ours == script(og_ref)
    assert ours[2] == (True, True, 3, "CANCELLED", 1)


def _engine_turns(e, reqs, turns, cap, buf) -> list[list[int]]:
    """Each request's tokens over rounds of turns: in round t every request i begins ``turns[i][t]`` capped at
    ``cap(i, t)`` tokens, then the engine runs until nothing is pending."""
    got: list[list[int]] = [[] for _ in reqs]
    for t in range(len(turns[0])):
        for i, r in enumerate(reqs):
            opts = og.TurnOptions(r)
            opts.set_max_generated_tokens(cap(i, t))
            r.begin_turn(turns[i][t], opts)
        while e.has_pending_requests():
            for ev in e.run(buf):
                if ev.flags & og.EngineEventFlags.TOKEN:
                    got[reqs.index(ev.request)].append(ev.token)
    return got


def _generator_turns(model, turns, caps) -> list[int]:
    """The tokens of one Generator fed ``turns`` (chat turns), generating ``caps[t]`` tokens after each."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=model.config.search.max_length)
    gen = og.Generator(model, params)
    want = []
    for tokens, n in zip(turns, caps):
        gen.append_tokens(tokens)
        for _ in range(n):
            gen.generate_next_token()
            want.append(int(gen.get_next_tokens()[0]))
    return want


def test_continuation_turns_of_several_requests_match_one_generator_each(genai_models) -> None:
    """Dynamic batching: turns of three resident requests interleave, and each request's tokens are those of its
    own Generator fed the same turns (chat turns: append_tokens after generating)."""
    model = og.Model(genai_models[("qwen2", "fp32")])
    e = og.Engine(model)
    reqs = [e.create_request() for _ in range(3)]
    turns = [[_ids(1, 2 + i), _ids(9, 3 + i, 4)] for i in range(3)]
    got = _engine_turns(e, reqs, turns, lambda i, t: 3 + i + t, e.create_event_buffer(2))  # a run's events over two
    for i in range(3):
        assert got[i] == _generator_turns(model, turns[i], [3 + i, 4 + i])


def _generated(model, tokens, n, opts=None, engine=None) -> tuple[list[int], og.EngineEvent]:
    e = engine or og.Engine(model)
    r = e.create_request()
    o = og.TurnOptions(r)
    o.set_max_generated_tokens(n)
    if opts:
        opts(o)
    r.begin_turn(tokens, o)
    buf = e.create_event_buffer(1)
    out, last = [], None
    while e.has_pending_requests():
        for ev in e.run(buf):
            if ev.flags & og.EngineEventFlags.TOKEN:
                out.append(ev.token)
            last = ev
    return out, last


def test_stop_strings(genai_models) -> None:
    """A turn ends on the token whose text completes a stop string (kept, counted), with its index; of several, the
    earliest-ending match wins, then the longest, then the lowest index; only the turn's own text is matched."""
    model = og.Model(genai_models[("qwen2", "fp32")])
    tok = og.Tokenizer(model)
    prompt = _ids(1, 2, 3, 7)
    free, _ = _generated(model, prompt, 16)
    stream = tok.create_stream()
    pieces = [stream.decode(t) for t in free]
    text = "".join(pieces)
    ends = np.cumsum([len(p) for p in pieces])
    k = next(i for i in range(3, len(pieces)) if len(pieces[i]) >= 2)  # a token of two characters or more
    stop = text[ends[k] - 3:ends[k] - 1] if ends[k] >= 3 else text[:ends[k] - 1]  # ends inside token k
    first = text.find(stop)
    want = int(np.searchsorted(ends, first + len(stop), side="left"))  # the token completing its first match
    got, last = _generated(model, prompt, 16, lambda o: o.set_stop_strings(["\u2603\u2603", stop]))
    assert got == free[:want + 1]
    assert last.finish_reason == og.FinishReason.STOP_STRING and last.matched_stop_string_index == 1
    assert last.flags == og.EngineEventFlags.TOKEN | og.EngineEventFlags.TURN_FINISHED
    assert last.usage.generated_tokens == want + 1
    # the same string twice: the lower index; a longer string ending at the same place: it starts earlier
    _, last = _generated(model, prompt, 16, lambda o: o.set_stop_strings([stop, stop]))
    assert last.matched_stop_string_index == 0
    longer = text[first - 1:first + len(stop)]
    assert first >= 1 and text.find(longer) == first - 1  # the seeded model's text allows this case
    _, last = _generated(model, prompt, 16, lambda o: o.set_stop_strings([stop, longer]))
    assert last.matched_stop_string_index == 1
    # only the turn's own text is matched: not the prompt's, not an earlier turn's
    prompt_text = tok.decode(prompt)
    assert prompt_text and prompt_text not in text
    got, last = _generated(model, prompt, 6, lambda o: o.set_stop_strings([prompt_text]))
    assert len(got) == 6 and last.finish_reason == og.FinishReason.MAX_GENERATED_TOKENS
    e = og.Engine(model)
    r = e.create_request()
    o = og.TurnOptions(r)
    o.set_max_generated_tokens(k + 1)
    r.begin_turn(prompt, o)  # generates text[:ends[k]], which holds the stop string
    buf = e.create_event_buffer(32)
    while e.has_pending_requests():
        e.run(buf)
    o.set_stop_strings([stop])
    o.set_max_generated_tokens(3)
    r.begin_turn(_ids(5), o)
    while e.has_pending_requests():
        events = list(e.run(buf))
    second = "".join(og.Tokenizer(model).create_stream().decode(t) for t in r._gen.get_sequence(0)[-3:])
    assert stop not in second and events[-1].finish_reason == og.FinishReason.MAX_GENERATED_TOKENS


def test_sampled_turns_with_seeds(genai_models) -> None:
    model = og.Model(genai_models[("qwen2", "fp32")])
    prompt = _ids(1, 2, 3, 7)
    greedy, _ = _generated(model, prompt, 10)

    def sampled(seed):
        return lambda o: (o.set_do_sample(True), o.set_top_k(50), o.set_temperature(1.5), o.set_seed(seed))

    a, _ = _generated(model, prompt, 10, sampled(7))
    assert a == _generated(model, prompt, 10, sampled(7))[0]
    assert any(_generated(model, prompt, 10, sampled(s))[0] != a for s in (8, 9, 10))
    assert a != greedy
    # top_k 1 and temperature 0 select the top logit even with do_sample
    assert _generated(model, prompt, 10, lambda o: (o.set_do_sample(True), o.set_top_k(1)))[0] == greedy
    assert _generated(model, prompt, 10, lambda o: (o.set_do_sample(True), o.set_temperature(0.0)))[0] == greedy


def test_buffer_capacity(genai_models) -> None:
    """Events beyond a buffer's capacity wait; a run that hands them out does no model work; capacity 0 is a no-op;
    a buffer serves only its own engine."""
    model = og.Model(genai_models[("qwen2", "fp32")])
    e = og.Engine(model)
    reqs = [e.create_request() for _ in range(3)]
    for r in reqs:
        r.begin_turn(_ids(1, 2, 3))
    one, zero = e.create_event_buffer(1), e.create_event_buffer(0)
    assert len(e.run(zero)) == 0 and all(r._gen is None for r in reqs)
    assert [ev.request for ev in e.run(one)] == [reqs[0]]
    lengths = [r._gen.token_count() for r in reqs]
    assert [ev.request for ev in e.run(one)] == [reqs[1]]
    assert [ev.request for ev in e.run(one)] == [reqs[2]]
    assert [r._gen.token_count() for r in reqs] == lengths  # handed out what the first run made
    assert len(e.run(e.create_event_buffer(8))) == 3
    with pytest.raises(RuntimeError, match="Engine that created it"):
        og.Engine(model).run(one)
    caps = e.get_capabilities()
    assert caps.configured_max_batch_size == engine_module.MAX_BATCH and caps.max_request_length == 0
    # drafts are verified (tests/genai/test_engine_drafts.py); none were proposed here
    assert e.max_draft_tokens_per_proposal() == 16 and e.get_speculative_stats()["draft_tokens_accepted"] == 0


def test_speculative_stats_have_onnxruntime_genais_keys(genai_models, og_ref) -> None:
    ours = og.Engine(og.Model(genai_models[("qwen2", "fp32")])).get_speculative_stats()
    ref = og_ref.Engine(og_ref.Model(genai_models[("qwen2", "fp32")])).get_speculative_stats()
    assert ours == ref  # no speculative decoding ran in either: every counter at zero, of the same kinds
    assert [type(v) for v in ours.values()] == [type(v) for v in ref.values()]


def test_more_requests_than_one_run_steps(genai_models, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "MAX_BATCH", 2)
    model = og.Model(genai_models[("qwen2", "fp32")])
    e = og.Engine(model)
    reqs = [e.create_request() for _ in range(3)]
    for r in reqs:
        opts = og.TurnOptions(r)
        opts.set_max_generated_tokens(2)
        r.begin_turn(_ids(1, 2, 3), opts)
    buf = e.create_event_buffer(8)
    runs = []
    while e.has_pending_requests():
        runs.append([reqs.index(ev.request) for ev in e.run(buf)])
    assert runs == [[0, 1], [0, 1], [2], [2]]


def test_a_failing_step_fails_its_turn_only(genai_models) -> None:
    model = og.Model(genai_models[("qwen2", "fp32")])
    e = og.Engine(model)
    a, b = e.create_request(), e.create_request()
    a.begin_turn(_ids(1, 2))
    b.begin_turn(_ids(3, 4))
    buf = e.create_event_buffer(8)
    e.run(buf)

    def broken():
        raise RuntimeError("device lost")

    b._gen.generate_next_token = broken
    events = list(e.run(buf))
    assert [ev.request for ev in events] == [a, b]
    failed = events[1]
    assert failed.flags == og.EngineEventFlags.TURN_FINISHED | og.EngineEventFlags.FAILED
    assert failed.finish_reason == og.FinishReason.FAILED
    assert failed.error_code == og.EngineErrorCode.ENGINE_EXECUTION_FAILURE and failed.usage.generated_tokens == 1
    with pytest.raises(RuntimeError, match="device lost"):
        b.begin_turn(_ids(5))
    assert a.cancel_turn(1) and len(e.run(buf)) == 1 and not e.has_pending_requests()


def test_admission_errors(genai_models) -> None:
    """Each refusal names what is wrong and leaves the request as it was."""
    model = og.Model(genai_models[("qwen2", "fp32")])
    e = og.Engine(model)
    r = e.create_request()
    vocab, ceiling = model.config.model.vocab_size, model.config.search.max_length

    def opts(**kw):
        o = og.TurnOptions(r)
        for k, v in kw.items():
            getattr(o, f"set_{k}")(v)
        return o

    cases = [
        (lambda: r.begin_turn(np.array([[1, 2]], dtype=np.int32)), ValueError, "one-dimensional"),
        (lambda: r.begin_turn(_ids()), ValueError, "at least one input token"),
        (lambda: r.begin_turn(_ids(1, vocab)), ValueError, f"token id {vocab} .position 1. is outside"),
        (lambda: r.begin_turn(np.arange(ceiling, dtype=np.int32) % vocab), RuntimeError, "leave room"),
        (lambda: r.begin_turn(_ids(1), opts(temperature=0.7)), ValueError, "contradict it: temperature"),
        (lambda: r.begin_turn(_ids(1), opts(do_sample=True, top_k=vocab + 1)), ValueError, "vocab_size"),
        (lambda: r.begin_turn(_ids(1), opts(do_sample=True, top_k=0, top_p=0.0)), ValueError, "both are 0"),
        (lambda: r.begin_turn(_ids(1), opts(min_generated_tokens=5, max_generated_tokens=2)), ValueError,
         "must not exceed"),
        (lambda: r.begin_turn(_ids(1), opts(repetition_penalty=0.0)), ValueError, "greater than zero"),
        (lambda: r.begin_turn(_ids(1), _guided(r)), RuntimeError, r"Error creating grammar \(regex\)"),
        (lambda: r.begin_turn(_ids(1), og.TurnOptions(e.create_request())), RuntimeError, "different"),
        (lambda: r.cancel_turn(1), RuntimeError, "before a turn has begun"),
        (lambda: r.rewind_to_start_of_turn(1), RuntimeError, "after the current turn is complete"),
        (lambda: r.set_draft_tokens(_ids(1)), RuntimeError, "first token event"),
        (lambda: og.TurnOptions(r).set_stop_strings([""]), ValueError, "index 0 is empty"),
        (lambda: og.TurnOptions(r).set_stop_strings(["a"] * 17), ValueError, "Too many stop strings"),
        (lambda: og.TurnOptions(r).set_stop_strings(["a\0b"]), ValueError, "NUL"),
        (lambda: og.TurnOptions(r).set_guidance("xml", "a"), ValueError, "Unsupported guidance type"),
        (lambda: og.TurnOptions(r).set_max_generated_tokens(-1), ValueError, "integer >= 0"),
        (lambda: e.create_request(options=_session(ceiling + 1)), RuntimeError, "no greater than"),
    ]
    for call, kind, message in cases:
        with pytest.raises(kind, match=message):
            call()
    assert r._gen is None and r._turns == []
    assert r.begin_turn(_ids(1, 2)) == 1
    with pytest.raises(RuntimeError, match="only valid for a new request"):
        r.begin_turn(_ids(3))
    buf = e.create_event_buffer(8)
    e.run(buf)
    assert r.cancel_turn(1) and len(e.run(buf)) == 1
    with pytest.raises(RuntimeError, match="no such turn"):
        r.rewind_to_start_of_turn(7)
    r.close()
    r.close()
    with pytest.raises(RuntimeError, match="closed request"):
        r.begin_turn(_ids(1))
    assert not e.has_pending_requests()


def _guided(r):
    o = og.TurnOptions(r)
    o.set_guidance("regex", "(unclosed")
    return o


def _session(n):
    o = og.RequestOptions()
    o.set_max_session_tokens(n)
    return o


def test_engine_refuses_beam_and_session_floor_models(genai_models) -> None:
    folder = genai_models[("qwen2", "fp32")]
    for search, message in (({"num_beams": 2}, "num_beams is 2"), ({"min_length": 3}, "min_length is 3")):
        config = og.Config(folder)
        config.overlay(json.dumps({"search": search}))
        with pytest.raises(RuntimeError, match=message):
            og.Engine(og.Model(config))


def _static(folder: str) -> og.Model:
    """A model on the static decode path (fixed buffers, what GPUs run), forced on the CPU."""
    model = og.Model(folder)
    model._static_decode = model._run_ahead = True
    return model


def test_batched_decode_steps_match_one_generator_each(genai_models, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the static decode path requests that start together share decode buffers and their decode steps run as one
    batched step: tokens equal each request's own Generator's (two turns each, caps of different lengths, a cancel,
    a closed request's row taken by a new request)."""
    folder = genai_models[("qwen2", "fp32")]
    model, ref = _static(folder), og.Model(folder)
    steps: list[int] = []
    step = engine_module._Batch.step
    monkeypatch.setattr(engine_module._Batch, "step", lambda self, waiting: (steps.append(len(waiting)),
                                                                            step(self, waiting))[1])
    e = og.Engine(model)
    reqs = [e.create_request() for _ in range(3)]
    turns = [[_ids(1, 2 + i, 5), _ids(9, 3 + i, 4)] for i in range(3)]
    buf = e.create_event_buffer(8)
    got = _engine_turns(e, reqs, turns, lambda i, t: 5 + 2 * i + t, buf)
    # every decode step of two or more requests batched: turn caps 5 / 7 / 9, then 6 / 8 / 10
    assert steps == [3] * 4 + [2] * 2 + [3] * 5 + [2] * 2 and reqs[0]._batch is reqs[2]._batch is not None
    assert len(reqs[0]._batch.requests) == 4  # three requests: a power of two of rows
    for i in range(3):
        assert got[i] == _generator_turns(ref, turns[i], [5 + 2 * i, 6 + 2 * i]), i
    # a closed request's row goes to the next request; the others' rows are untouched by its steps
    batch = reqs[1]._batch
    reqs[1].close()
    late = e.create_request()
    first, _ = _generated(ref, _ids(4, 4, 4), 6)
    o = og.TurnOptions(late)
    o.set_max_generated_tokens(6)
    late.begin_turn(_ids(4, 4, 4), o)
    o = og.TurnOptions(reqs[0])
    o.set_max_generated_tokens(6)
    reqs[0].begin_turn(_ids(7), o)
    out: dict[int, list[int]] = {0: [], 1: []}
    while e.has_pending_requests():
        for ev in e.run(buf):
            if ev.flags & og.EngineEventFlags.TOKEN:
                out[0 if ev.request is reqs[0] else 1].append(ev.token)
    assert late._batch is batch and late._row == 1 and out[1] == first
    history = np.concatenate([turns[0][0], got[0][:5], turns[0][1], got[0][5:], [7]]).astype(np.int32)
    assert out[0] == _generator_turns(ref, [history], [6])  # its third turn: its whole history as one prompt
    # a later Engine takes the batch back (its recordings with it); the requests of the one gone are closed
    del e
    assert reqs[0]._closed
    e = og.Engine(model)
    three = [e.create_request() for _ in range(3)]
    for r in three:
        r.begin_turn(_ids(1, 2))
    e.run(e.create_event_buffer(4))
    assert three[0]._batch is batch
    # a request joins a batch holding requests; fewer than BATCH_MIN starting together otherwise decode on
    # buffers of their own
    one = e.create_request()
    one.begin_turn(_ids(3))
    e.run(e.create_event_buffer(4))
    assert one._batch is batch and one._row == 3
    for r in (*three, one):
        r.close()
    two = [e.create_request() for _ in range(2)]
    for r in two:
        r.begin_turn(_ids(1, 2))
    e.run(e.create_event_buffer(4))
    assert two[0]._batch is None and two[0]._gen._bufs is not None


def test_batched_rows_end_sample_and_ban_as_alone(genai_models) -> None:
    """In a batched step a row that chooses an end-of-sequence id ends its turn (not appended), a row below its
    minimum has those ids banned, and a sampled row (chosen by its own generator from its logits row) draws what it
    draws alone: each request's events equal those of the same turn run alone on the default path."""
    folder = genai_models[("qwen2", "fp32")]
    eos = [ev[2] for ev in _script(og, folder)[:9] if ev[0] == 0][2]

    def model(static: bool) -> og.Model:
        config = og.Config(folder)
        config.overlay(json.dumps({"model": {"eos_token_id": [eos]}}))
        m = og.Model(config)
        m._static_decode = m._run_ahead = static
        return m

    def setups(o: og.TurnOptions, i: int) -> None:
        o.set_max_generated_tokens(12)
        if i == 1:
            o.set_min_generated_tokens(6)
        if i == 2:
            o.set_do_sample(True)
            o.set_top_k(20)
            o.set_temperature(1.3)
            o.set_seed(5)

    def events(e: og.Engine, reqs: list) -> list[list]:
        out: list[list] = [[] for _ in reqs]
        buf = e.create_event_buffer(8)
        while e.has_pending_requests():
            for x in e.run(buf):
                out[reqs.index(x.request)].append((x.token, int(x.flags), x.finish_reason.name,
                                                   x.usage.generated_tokens))
        return out

    e = og.Engine(model(True))
    reqs = [e.create_request() for _ in range(3)]
    for i, r in enumerate(reqs):
        o = og.TurnOptions(r)
        setups(o, i)
        r.begin_turn(_ids(1, 2, 3, 7), o)
    together = events(e, reqs)
    assert reqs[0]._batch is not None
    alone_model = model(False)
    for i in range(3):
        e = og.Engine(alone_model)
        r = e.create_request()
        o = og.TurnOptions(r)
        setups(o, i)
        r.begin_turn(_ids(1, 2, 3, 7), o)
        assert together[i] == events(e, [r])[0], i
    assert together[0][-1][2] == "EOS" and together[1][-1][2] != "EOS"


def test_cpu_batches_short_sessions_only(genai_models, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU requests are batched when their sessions are at most CPU_BATCH_MAX_LENGTH long (fixed buffers of
    that length); longer sessions keep growing caches, one generator each."""
    model = og.Model(genai_models[("qwen2", "fp32")])
    assert not model._static_decode
    for limit, batched in ((64, True), (128, False)):
        monkeypatch.setattr(engine_module, "CPU_BATCH_MAX_LENGTH", 100)
        e = og.Engine(model)
        session = og.RequestOptions()
        session.set_max_session_tokens(limit)
        reqs = [e.create_request(options=session) for _ in range(3)]
        for r in reqs:
            r.begin_turn(_ids(1, 2, 3))
        e.run(e.create_event_buffer(4))
        assert (reqs[0]._batch is not None) == batched
        assert (reqs[0]._gen._bufs is not None) == batched  # fixed buffers, or the CPU's growing cache

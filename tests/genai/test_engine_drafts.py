"""Caller-supplied drafts in the Engine (``Request.set_draft_tokens``, ``Engine.max_draft_tokens_per_proposal``):
one run verifies a request's drafts and hands out a TOKEN event for each committed token; every request's tokens
stay those of its own greedy Generator (onnxruntime-genai 0.18's CPU build verifies no drafts, so crossml's own
standard decoding is the reference)."""

from __future__ import annotations

import numpy as np
import pytest

import crossml.genai as og
from crossml.genai import engine as engine_module
from crossml.genai.errors import GenAIError, GeneratorStateError

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]


def _alone(model, turns: list[tuple[list[int], int]], limit: int) -> list[list[int]]:
    """Each turn's tokens from a Generator fed the same turns (greedy, ``n`` tokens each)."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=limit)
    gen = og.Generator(model, params)
    out = []
    for prompt, n in turns:
        gen.append_tokens(np.array(prompt, dtype=np.int32))
        got = []
        for _ in range(n):
            gen.generate_next_token()
            got.append(int(gen.get_next_tokens()[0]))
        out.append(got)
    return out


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "alone"])
def test_drafts_verified_in_one_run(genai_models, monkeypatch, batched: bool) -> None:
    model = og.Model(genai_models[("qwen2", "fp32")])
    if not batched:
        monkeypatch.setattr(engine_module, "BATCH_ROWS", 1)
    truth = [_alone(model, [(p, 20)], 64)[0] for p in PROMPTS]
    engine = og.Engine(model)
    assert engine.max_draft_tokens_per_proposal() == 16
    session = og.RequestOptions()
    session.set_max_session_tokens(64)
    reqs = [engine.create_request(options=session) for _ in PROMPTS]
    for r, p in zip(reqs, PROMPTS):
        opts = og.TurnOptions(r)
        opts.set_max_generated_tokens(20)
        r.begin_turn(np.array(p, dtype=np.int32), opts)
    buf = engine.create_event_buffer(64)
    got: list[list[int]] = [[] for _ in reqs]
    per_run: list[list[int]] = []

    def run() -> None:
        counts = [0] * len(reqs)
        for ev in engine.run(buf):
            if ev.flags & og.EngineEventFlags.TOKEN:
                i = reqs.index(ev.request)
                got[i].append(ev.token)
                counts[i] += 1
        per_run.append(counts)

    run()  # the prompts and first tokens
    reqs[0].set_draft_tokens(np.array(truth[0][1:6], dtype=np.int32))  # right: 5 accepted and the bonus token
    wrong = [(t + 1) % 300 for t in truth[1][1:5]]
    reqs[1].set_draft_tokens(np.array(wrong, dtype=np.int32))  # wrong at once: one token
    run()
    assert per_run[-1] == [6, 1, 1]
    reqs[0].set_draft_tokens(np.array(truth[0][7:9] + [(truth[0][9] + 1) % 300], dtype=np.int32))  # 2 of 3 right
    run()
    assert per_run[-1] == [3, 1, 1]
    while engine.has_pending_requests():
        run()
    assert got == truth
    stats = engine.get_speculative_stats()
    assert (stats["rounds"], stats["draft_tokens_proposed"], stats["draft_tokens_accepted"]) == (3, 12, 7)
    assert stats["bonus_tokens"] == 1 and stats["correction_tokens"] == 2


def test_a_turn_limit_inside_a_proposal_and_the_next_turn(genai_models) -> None:
    model = og.Model(genai_models[("qwen2", "fp32")])
    follow = [20, 21, 22]
    truth = _alone(model, [(PROMPTS[0], 4), (follow, 6)], 64)
    longer = _alone(model, [(PROMPTS[0], 12)], 64)[0]
    engine = og.Engine(model)
    session = og.RequestOptions()
    session.set_max_session_tokens(64)
    req = engine.create_request(options=session)
    buf = engine.create_event_buffer(64)
    got: list[list[int]] = [[], []]
    reasons = []
    for t, (prompt, n) in enumerate(((PROMPTS[0], 4), (follow, 6))):
        opts = og.TurnOptions(req)
        opts.set_max_generated_tokens(n)
        req.begin_turn(np.array(prompt, dtype=np.int32), opts)
        first = True
        while engine.has_pending_requests():
            for ev in engine.run(buf):
                if ev.flags & og.EngineEventFlags.TOKEN:
                    got[t].append(ev.token)
                if ev.flags & og.EngineEventFlags.TURN_FINISHED:
                    reasons.append(ev.finish_reason)
            if first and t == 0:  # drafts past the turn's limit: the turn takes what it can
                req.set_draft_tokens(np.array(longer[1:10], dtype=np.int32))
                first = False
    assert got == truth
    assert reasons == [og.FinishReason.MAX_GENERATED_TOKENS] * 2


def test_draft_errors(genai_models, more_models) -> None:
    model = og.Model(genai_models[("qwen2", "fp32")])
    engine = og.Engine(model)
    req = engine.create_request()
    with pytest.raises(GeneratorStateError, match="first token event"):
        req.set_draft_tokens(np.array([1, 2], dtype=np.int32))
    opts = og.TurnOptions(req)
    opts.set_max_generated_tokens(8)
    req.begin_turn(np.array(PROMPTS[0], dtype=np.int32), opts)
    with pytest.raises(GeneratorStateError, match="first token event"):
        req.set_draft_tokens(np.array([1, 2], dtype=np.int32))
    engine.run(engine.create_event_buffer(8))
    with pytest.raises(ValueError, match="at most max_draft_tokens_per_proposal"):
        req.set_draft_tokens(np.arange(17, dtype=np.int32))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        req.set_draft_tokens(np.array([5, 100000], dtype=np.int32))
    sampled = engine.create_request()
    opts = og.TurnOptions(sampled)
    opts.set_do_sample(True)
    opts.set_max_generated_tokens(8)
    sampled.begin_turn(np.array(PROMPTS[1], dtype=np.int32), opts)
    engine.run(engine.create_event_buffer(8))
    with pytest.raises(GenAIError, match="verified greedily"):
        sampled.set_draft_tokens(np.array([5], dtype=np.int32))
    req.set_draft_tokens(np.array([5, 6], dtype=np.int32))
    assert req.cancel_turn(1) and req._drafts == []  # a proposal belongs to its turn
    assert og.Engine(og.Model(more_models["lfm2"])).max_draft_tokens_per_proposal() == 0


def test_a_turn_without_a_limit_verifies_every_draft(genai_models) -> None:
    model = og.Model(genai_models[("qwen2", "fp32")])
    truth = _alone(model, [(PROMPTS[0], 12)], 32)[0]
    engine = og.Engine(model)
    session = og.RequestOptions()
    session.set_max_session_tokens(32)
    req = engine.create_request(options=session)
    req.begin_turn(np.array(PROMPTS[0], dtype=np.int32))  # no max_generated_tokens: the session limits the turn
    buf = engine.create_event_buffer(64)
    assert len(engine.run(buf)) == 1
    req.set_draft_tokens(np.array(truth[1:6], dtype=np.int32))
    assert [ev.token for ev in engine.run(buf)] == truth[1:7]  # five drafts and the bonus token in one run

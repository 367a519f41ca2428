"""og.MtpGenerator and the generator calls an MTP loop is made of (crossml.genai.mtp).

The tiny Qwen3.5 checkpoint with an MTP head (``_build.QWEN35_MTP``: its head agrees with the model about half the
time) is exported by onnxruntime-genai 0.18's builder. onnxruntime-genai's own MtpGenerator does not run on its CPU
build (its float32 hidden-state hand-off fails: "Cast - input and output types are the same"), so the reference is
the MTP loop of its example (examples/python/qwen-3.6-mtp.py, ``ReferenceMtpGenerator``), written with the public
calls (get_output("hidden_states"), set_hidden_states, snapshot_state, rewind_to) and run with onnxruntime-genai:
crossml runs the same loop with the same tokens and counts, and its MtpGenerator commits the same tokens with the same
accepts and trials. Sampled and penalised generations are checked against crossml's standard decoding."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import crossml.genai as og
from crossml.genai import mtp
from crossml.genai.errors import GenAIError, GeneratorStateError, SearchOptionError
from tests.genai._build import QWEN35_MTP

PROMPT = [0, 5, 9, 33, 47, 12, 80, 81, 7]
MAX = 49  # 40 new tokens


@pytest.fixture(scope="module")
def folder(more_models, tmp_path_factory) -> str:
    """The model folder, with its head's folder written in it (mtp_head)."""
    path = more_models[QWEN35_MTP]
    mtp.head_folder(path)
    return path


def _reference_loop(lib, folder: str, new: int = MAX - len(PROMPT)) -> tuple[list[int], dict[str, int]]:
    """onnxruntime-genai's example MTP loop (greedy, one draft a round) with ``lib``: the head runs over every
    (hidden state, token) pair so far; the model verifies [token, draft] after a snapshot, and rewinds and runs the
    token again when the draft is refused."""
    main, head = lib.Model(folder), lib.Model(os.path.join(folder, mtp.HEAD_FOLDER))

    def new_gen(model):
        params = lib.GeneratorParams(model)
        params.set_search_options(max_length=64, do_sample=False)
        return lib.Generator(model, params)

    def draft(hidden: list[np.ndarray], tokens: list[int]) -> int:
        d = new_gen(head)
        d.set_hidden_states(np.stack(hidden)[None].astype(np.float32))
        d.append_tokens(np.asarray(tokens, dtype=np.int32))
        return int(np.asarray(d.get_output("logits"))[0, -1].argmax())

    gen = new_gen(main)
    gen.append_tokens(np.asarray(PROMPT, dtype=np.int32))
    length = len(PROMPT)
    token = int(gen.get_output("logits")[0, -1].argmax())
    h = gen.get_output("hidden_states")[0, -1]
    out, hidden, tokens = [], [], []
    counts = dict(forwards=0, accepts=0, trials=0)
    while True:
        out.append(token)
        hidden.append(h)
        tokens.append(token)
        if len(out) >= new:
            return out, counts
        d = draft(hidden, tokens)
        gen.snapshot_state()
        gen.append_tokens(np.array([token, d], dtype=np.int32))
        counts["forwards"] += 1
        counts["trials"] += 1
        logits, states = gen.get_output("logits"), gen.get_output("hidden_states")
        if d == int(logits[0, 0].argmax()):
            counts["accepts"] += 1
            out.append(d)
            hidden.append(states[0, 0])
            tokens.append(d)
            token, h = int(logits[0, 1].argmax()), states[0, 1]
            length += 2
        else:
            gen.rewind_to(length)
            gen.append_tokens(np.array([token], dtype=np.int32))
            counts["forwards"] += 1
            token, h = int(gen.get_output("logits")[0, -1].argmax()), gen.get_output("hidden_states")[0, -1]
            length += 1


def _standard(model, max_length: int = MAX, **search) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, **search)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array(PROMPT, dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return gen.get_sequence(0).tolist()


def _mtp(model, head, k: int = 1, max_length: int = MAX, **search) -> tuple[list[int], dict]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, **search)
    params.set_speculative_options(max_draft_tokens=k)
    gen = og.MtpGenerator(model, head, params)
    gen.append_tokens(np.array(PROMPT, dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return gen.get_sequence().tolist(), gen.get_stats()


def test_reference_loop_matches_onnxruntime_genai(folder, og_ref) -> None:
    """The example's loop, on onnxruntime-genai and on crossml: the same tokens, drafts, accepts and runs (crossml's
    rewind_to the snapshot's length puts the Gated DeltaNet states back; the loop refuses about half the drafts)."""
    want, want_counts = _reference_loop(og_ref, folder)
    got, counts = _reference_loop(og, folder)
    assert got == want
    assert counts == want_counts
    assert 0 < counts["accepts"] < counts["trials"]
    # and the tokens are those of greedy decoding
    assert PROMPT + got == _standard(og.Model(folder), do_sample=False)


def test_mtp_generator_matches_the_reference_loop(folder, og_ref) -> None:
    want, want_counts = _reference_loop(og_ref, folder)
    model, head = og.Model(folder), og.Model(os.path.join(folder, mtp.HEAD_FOLDER))
    got, stats = _mtp(model, head, k=1, do_sample=False)
    assert got == PROMPT + want
    assert (stats["accepts"], stats["trials"]) == (want_counts["accepts"], want_counts["trials"])
    # the loop's runs: a verifying run a round, and one more for each refused draft
    assert stats["forwards"] == want_counts["forwards"]
    assert stats["target_reconciliation_forward_passes"] == stats["trials"] - stats["accepts"]
    assert stats["draft_tokens_accepted"] == stats["accepts"] and stats["rounds"] == stats["trials"]
    assert stats["tokens_emitted"] == len(got) - len(PROMPT) - 1  # the first token comes from the prompt's logits


@pytest.mark.parametrize("k", [2, 4])
def test_chained_drafts_give_greedy_tokens(folder, k: int) -> None:
    model, head = og.Model(folder), og.Model(os.path.join(folder, mtp.HEAD_FOLDER))
    got, stats = _mtp(model, head, k=k, do_sample=False)
    assert got == _standard(model, do_sample=False)
    assert k * (stats["rounds"] - 1) < stats["draft_tokens_proposed"] <= k * stats["rounds"]  # fewer at max_length
    assert stats["draft_forward_passes"] == stats["draft_tokens_proposed"]
    assert 0 < stats["accepts"] < stats["trials"] <= stats["draft_tokens_proposed"]
    assert stats["accepts"] / stats["rounds"] > 0.5  # chained drafts are accepted past the first


@pytest.mark.parametrize("search", [dict(do_sample=True, top_k=5, temperature=0.8, random_seed=7),
                                    dict(do_sample=True, top_p=0.9, random_seed=3),
                                    dict(do_sample=False, repetition_penalty=1.3),
                                    dict(do_sample=False, min_length=30)],
                         ids=["top-k", "top-p", "penalty", "min-length"])
def test_sampled_and_penalised_tokens_are_standard_decodings(folder, search: dict) -> None:
    model, head = og.Model(folder), og.Model(os.path.join(folder, mtp.HEAD_FOLDER))
    want = _standard(model, **search)
    for k in (1, 3):
        assert _mtp(model, head, k=k, **search)[0] == want


def test_end_of_sequence_inside_a_round(folder) -> None:
    """An end-of-sequence id among a round's tokens ends the generation there, as in standard decoding."""
    greedy = _standard(og.Model(folder), do_sample=False)
    eos = greedy[len(PROMPT) + 12]
    config = og.Config(folder)
    config.overlay(json.dumps({"model": {"eos_token_id": [eos]}}))
    model, head = og.Model(config), og.Model(os.path.join(folder, mtp.HEAD_FOLDER))
    want = _standard(model, do_sample=False)
    assert len(want) < MAX
    for k in (1, 4):
        assert _mtp(model, head, k=k, do_sample=False)[0] == want


def test_gpu_decode_path_forced_on_the_cpu(folder) -> None:
    """The GPU's static decode buffers and steps run ahead, forced on the CPU: the same tokens (the head's hidden
    states copied into its fixed buffers)."""
    model, head = og.Model(folder), og.Model(os.path.join(folder, mtp.HEAD_FOLDER))
    want = _standard(model, do_sample=False)
    model._static_decode = model._run_ahead = True
    head._static_decode = head._run_ahead = True  # the head's one-token runs on its fixed buffers
    for k in (1, 4):
        assert _mtp(model, head, k=k, do_sample=False)[0] == want


def test_reset_and_call_order(folder) -> None:
    model, head = og.Model(folder), og.Model(os.path.join(folder, mtp.HEAD_FOLDER))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX, do_sample=False)
    gen = og.MtpGenerator(model, head, params)
    assert not gen.is_done()
    with pytest.raises(GeneratorStateError, match="AppendTokens must be called before GenerateNextToken"):
        gen.generate_next_token()
    gen.append_tokens(np.array(PROMPT, dtype=np.int32))
    with pytest.raises(GeneratorStateError, match="AppendTokens can only be called once"):
        gen.append_tokens(np.array(PROMPT, dtype=np.int32))
    for _ in range(5):
        gen.generate_next_token()
    assert len(gen.get_sequence()) == len(PROMPT) + 5
    gen.reset()
    assert gen.get_stats()["rounds"] == 0
    gen.append_tokens(np.array(PROMPT, dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    assert gen.get_sequence().tolist() == _standard(model, do_sample=False)


def test_refusals(folder, more_models) -> None:
    model, head = og.Model(folder), og.Model(os.path.join(folder, mtp.HEAD_FOLDER))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX, batch_size=2)
    with pytest.raises(SearchOptionError, match="batch_size=1, num_beams=1"):
        og.MtpGenerator(model, head, params)
    params = og.GeneratorParams(model)
    params.set_guidance("regex", "[a-z]+")
    with pytest.raises(SearchOptionError, match="guided generation"):
        og.MtpGenerator(model, head, params)
    params = og.GeneratorParams(model)
    with pytest.raises(GenAIError, match="is not an MTP head"):
        og.MtpGenerator(model, model, params)
    plain = og.Model(more_models["qwen35"])
    with pytest.raises(GenAIError, match="vocabulary sizes|did not expose hidden states"):
        og.MtpGenerator(plain, head, og.GeneratorParams(plain))
    with pytest.raises(GenAIError, match="model.mtp is missing"):
        mtp.head_folder(more_models["qwen35"])


def test_hidden_states_and_snapshot(folder) -> None:
    """get_output("hidden_states") gives every position's; set_hidden_states needs one row per token; rewind_to the
    snapshot's length takes its states back (no run again from the first token) and matches a fresh run."""
    model, head = og.Model(folder), og.Model(os.path.join(folder, mtp.HEAD_FOLDER))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array(PROMPT, dtype=np.int32))
    assert gen.get_output("hidden_states").shape == (1, len(PROMPT), 64)
    gen.snapshot_state()
    gen.append_tokens(np.array([3, 4, 5], dtype=np.int32))
    gen.rewind_to(len(PROMPT))
    assert gen._kv_len == len(PROMPT)  # the snapshot's states: no run over the prompt again
    gen.append_tokens(np.array([6], dtype=np.int32))
    fresh = og.Generator(model, params)
    fresh.append_tokens(np.array([*PROMPT, 6], dtype=np.int32))
    np.testing.assert_allclose(gen.get_logits(), fresh.get_logits(), atol=1e-5)
    # a rewind below the snapshot drops it
    gen.rewind_to(4)
    assert gen._snapshot is None
    head_gen = og.Generator(head, og.GeneratorParams(head))
    with pytest.raises(GenAIError, match="set_hidden_states"):
        head_gen.append_tokens(np.array([3, 4], dtype=np.int32))
    head_gen.set_hidden_states(np.zeros((1, 1, 64), np.float32))
    with pytest.raises(GenAIError, match="holds 1 rows of hidden states, and this run feeds 2 tokens"):
        head_gen.append_tokens(np.array([3, 4], dtype=np.int32))
    with pytest.raises(GenAIError, match="Unexpected input data type"):
        head_gen.set_hidden_states(np.zeros((1, 1, 64), np.float64))
    gen.set_hidden_states(np.zeros((1, 1, 64), np.float32))  # a decoder without the input: nothing happens


def test_other_outputs_are_the_decoders_own(folder, more_models) -> None:
    """Every run fetches the decoder's own other outputs (the MTP export's hidden_states), not the lm_head input the
    session gives for runs that select rows."""
    assert og.Model(folder).io.other_outputs == ["hidden_states"]
    assert og.Model(more_models["qwen35"]).io.other_outputs == []


@pytest.mark.parametrize("room", [1, 2, 3, 6])
def test_max_length_close_to_the_prompt(folder, room: int) -> None:
    """A prompt ``room`` tokens short of max_length: the rounds narrow to the room left, and the tokens are standard
    decoding's."""
    model, head = og.Model(folder), og.Model(os.path.join(folder, mtp.HEAD_FOLDER))
    got = _mtp(model, head, k=4, max_length=len(PROMPT) + room, do_sample=False)[0]
    assert got == _standard(model, max_length=len(PROMPT) + room, do_sample=False)
    assert len(got) == len(PROMPT) + room


def test_snapshot_gives_back_the_logits_of_an_ended_step(folder) -> None:
    """A step that ends the sequence (an end-of-sequence id, not appended) after a snapshot of its length: get_logits
    gives the logits it chose from, out of the snapshot (no run over the sequence again), as a fresh run computes
    them; rewind_to(0) drops the snapshot."""
    greedy = _standard(og.Model(folder), do_sample=False)
    n = len(PROMPT) + 5
    config = og.Config(folder)
    config.overlay(json.dumps({"model": {"eos_token_id": [greedy[n]]}}))
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array(PROMPT, dtype=np.int32))
    while gen.token_count() < n:
        gen.generate_next_token()
    gen.snapshot_state()
    want = gen.get_logits().copy()
    gen.generate_next_token()
    assert gen.is_done() and gen.token_count() == n
    np.testing.assert_array_equal(gen.get_logits(), want)
    assert gen._kv_len == n
    fresh = og.Generator(model, params)
    fresh.append_tokens(np.array(greedy[:n], dtype=np.int32))
    np.testing.assert_allclose(fresh.get_logits(), want, atol=1e-5)
    gen.rewind_to(0)
    assert gen._snapshot is None

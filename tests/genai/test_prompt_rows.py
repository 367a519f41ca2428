"""Prompts and chat turns compute logits at each row's last real position only (``crossml.genai.model.SELECT_LOGITS``:
the session entry ``crossml.output_rows`` puts a GatherRows node in front of the lm_head). The tokens, every step's
logits and the full "logits" output of a prompt or turn (computed from the lm_head's inputs when asked) are those of
the same model computing every position, on the default path, the fixed-address path with padded prompt buckets and
chunk buckets (a GPU's, forced on the CPU), for a batch of prompts of different lengths, for Gemma 4's softcap tail
and for a carried-state model's prompt pieces. The parity tests against onnxruntime-genai run with it on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import crossml.genai as og
from crossml.genai import model as genai_model
from tests.genai.conftest import ARCHS, PRECISIONS

PROMPT = "Hello world! How are you"
BATCH = ["The quick brown fox jumps over", "def f(x):"]
TURN = "def f(x): return x"


def _model(folder: str, select: bool, path: str, monkeypatch) -> og.Model:
    monkeypatch.setattr(genai_model, "SELECT_LOGITS", select)
    model = og.Model(folder)
    assert (model.rows_input is not None) == select
    if path == "fixed":  # the recorded paths' buffers and padded buckets, forced on the CPU
        model._static_decode = model._prompt_graphs = model._run_ahead = True
    return model


def _chat(model: og.Model, prompts: list[str], turn: bool) -> tuple[list[list[int]], list[np.ndarray], list[Any]]:
    """Tokens, every step's logits and the "logits" output after the prompt (and after a chat turn)."""
    tok = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=60, batch_size=len(prompts))
    gen = og.Generator(model, params)
    gen.append_tokens(tok.encode(prompts[0]) if len(prompts) == 1 else tok.encode_batch(prompts))
    shown = [gen.get_output("logits")]
    logits = [gen.get_logits().copy()]
    for _ in range(3):
        gen.generate_next_token()
        logits.append(gen.get_logits().copy())
    if turn:
        gen.append_tokens(tok.encode(TURN))
        shown.append(gen.get_output("logits"))
        logits.append(gen.get_logits().copy())
        gen.generate_next_token()
        logits.append(gen.get_logits().copy())
    return [gen.get_sequence(i).tolist() for i in range(len(prompts))], logits, shown


def _spy_prompt_logits(model: og.Model) -> list[tuple[int, tuple[int, ...]]]:
    """(columns fed, logits shape) of every decoder run."""
    seen: list[tuple[int, tuple[int, ...]]] = []
    run = model.run

    def spy(feed, names, **kw):
        outs = run(feed, names, **kw)
        seen.append((feed[model.io.input_ids].shape[1], tuple(outs[0].shape)))
        return outs

    model.run = spy  # type: ignore[method-assign]
    return seen


def _assert_same(got, ref, atol: float) -> None:
    assert got[0] == ref[0]
    assert len(got[1]) == len(ref[1])
    for step, (a, b) in enumerate(zip(got[1], ref[1])):
        np.testing.assert_allclose(a, b, atol=atol, rtol=0, err_msg=f"logits of step {step}")
    for a, b in zip(got[2], ref[2]):
        assert a.shape == b.shape and a.shape[1] > 1
        np.testing.assert_allclose(a, b, atol=atol, rtol=0)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("arch", ARCHS)
def test_builder_models_select_their_logits(genai_models, arch: str, precision: str, monkeypatch) -> None:
    model = _model(genai_models[(arch, precision)], True, "default", monkeypatch)
    assert model.rows_input not in model.io.extra and model.rows_hidden


@pytest.mark.parametrize("path", ["default", "fixed"])
@pytest.mark.parametrize("prompts", [[PROMPT], BATCH], ids=["batch1", "batch2"])
@pytest.mark.parametrize("case", [("qwen2", "fp32"), ("qwen2", "int4"), ("gemma", "int4")], ids="-".join)
def test_selected_logits_match_every_position(genai_models, case, prompts, path, monkeypatch) -> None:
    folder = genai_models[case]
    turn = len(prompts) == 1
    ref = _chat(_model(folder, False, path, monkeypatch), prompts, turn)
    model = _model(folder, True, path, monkeypatch)
    seen = _spy_prompt_logits(model)
    got = _chat(model, prompts, turn)
    _assert_same(got, ref, 1e-5)
    # the prompt's (and turn's) runs computed one position per row
    wide = [shape for columns, shape in seen if columns > 1]
    assert wide and all(shape[:2] == (len(prompts), 1) for shape in wide)


def test_gemma4_softcap_tail(more_models, monkeypatch) -> None:
    """Gemma 4's logits end in a softcap (Div, Tanh, Mul) after a 4-bit lm_head with its norm fused on the CPU; its
    window-sized caches keep chunks eager."""
    folder = more_models["gemma4:int4"]
    ref = _chat(_model(folder, False, "fixed", monkeypatch), [PROMPT], True)
    model = _model(folder, True, "fixed", monkeypatch)
    assert [n.op_type for n in model.session._tail.nodes][1:] == ["Div", "Tanh", "Mul"]
    _assert_same(_chat(model, [PROMPT], True), ref, 1e-5)


@pytest.mark.parametrize("piece_max", [512, 4])
def test_carried_state_pieces(more_models, monkeypatch, piece_max: int) -> None:
    """LFM2's prompts and turns in pieces of exact widths, each piece selecting its last position: the full output is
    put together from the pieces' lm_head inputs."""
    monkeypatch.setattr(genai_model, "STATE_PIECE_MAX", piece_max)
    monkeypatch.setattr(genai_model, "STATE_PIECE_AFTER", 0)
    folder = more_models["lfm2"]
    ref = _chat(_model(folder, False, "fixed", monkeypatch), [PROMPT], True)
    _assert_same(_chat(_model(folder, True, "fixed", monkeypatch), [PROMPT], True), ref, 1e-4)

"""Models whose layers carry states instead of KV caches (LFM2: convolution states ``past.i.conv`` /
``present.i.conv`` beside the attention layers' KV caches; Qwen3.5: a convolution state and a recurrent state
``past.i.recurrent`` per Gated DeltaNet layer), against onnxruntime-genai 0.18 and against themselves.

One prompt (fp32 and int4) is compared with onnxruntime-genai in test_architectures.py. Here: beam search, prompts
of one length in a batch, and the state the decoder is fed, against onnxruntime-genai; where onnxruntime-genai 0.18
goes wrong, against what the model itself gives for the same tokens:

- a batch of prompts of different lengths: onnxruntime-genai runs the right-padded prompt's pad tokens through the
  shorter rows' convolution states (their tokens drift from the prompt's own run after the first one); crossml's
  rows each equal the prompt run alone (test_architectures.py::test_ragged_batch_rows_equal_their_prompts_alone);
- a prompt appended to a started sequence: onnxruntime-genai's next logits differ from those of a fresh prompt of
  the same tokens (by about 0.7 on this model); crossml's equal them;
- rewind_to, which onnxruntime-genai refuses for this model type ("RewindTo is currently not supported for lfm2").

The same holds on Qwen3.5 (a continuation's next logits 1.0 away in onnxruntime-genai), where onnxruntime-genai
0.18 also fails on beam search: its beams are checked against transformers'.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import crossml.genai as xg
from tests.genai._generation import generate_with, run_steps

BUILD = os.path.join(os.path.dirname(__file__), "_build.py")

PROMPT = "Hello world! How are you"
BATCH = ["The quick brown fox jumps over", "def f(x):"]
MAX_LENGTH = 40


def _tokens(og, model, prompts: list[str], **options) -> list[list[int]]:
    return generate_with(og, model, prompts, MAX_LENGTH, **options)[0]


@pytest.fixture(scope="module")
def lfm2(more_models) -> str:
    return more_models["lfm2"]


@pytest.fixture(scope="module", params=["lfm2", "qwen35"])
def stateful(more_models, request) -> str:
    """Each kind of state-carrying model (the tests below that take it hold for both)."""
    return more_models[request.param]


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


def test_qwen35_carries_convolution_and_recurrent_states(more_models, og_ref) -> None:
    """Qwen3.5's genai_config.json has no layer_types: the layers are told apart by the decoder's inputs. Its Gated
    DeltaNet layer 0 carries two states, both as onnxruntime-genai has them after two steps."""
    folder = more_models["qwen35"]
    model = xg.Model(folder)
    assert model.io.state_names == ["past.0.conv", "past.0.recurrent"]
    assert model.io.past_names == ["past_key_values.1.key", "past_key_values.1.value"]
    assert model.io.state_shapes == [(128, 3), (4, 16, 16)] and model.io.position_streams == 3
    gens = []
    for og in (og_ref, xg):
        gen = run_steps(og, og.Model(folder), 2, MAX_LENGTH, PROMPT)
        gens.append(gen)
    for name in ("present.0.conv", "present.0.recurrent"):
        ref, got = (g.get_output(name) for g in gens)
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(gens[1].get_input(name.replace("present", "past")), got)


def test_ragged_batch_shows_the_restated_states(stateful) -> None:
    """After a batch of prompts of different lengths, the present states show each row's state after its own prompt:
    the state the prompt alone leaves."""
    model = xg.Model(stateful)
    tok = xg.Tokenizer(model)

    def states(prompts):
        params = xg.GeneratorParams(model)
        params.set_search_options(max_length=MAX_LENGTH, batch_size=len(prompts))
        gen = xg.Generator(model, params)
        gen.append_tokens(tok.encode_batch(prompts) if len(prompts) > 1 else tok.encode(prompts[0]))
        return [gen.get_output(name) for name in model.io.state_present_names]

    batch = states(BATCH)
    for row, prompt in enumerate(BATCH):
        for got, want in zip(batch, states([prompt])):
            np.testing.assert_allclose(got[row], want[0], atol=1e-5, rtol=0)


def test_batch_of_one_length_matches_onnxruntime_genai(stateful, og_ref) -> None:
    prompts = np.array([[5, 6, 7, 8, 9], [9, 10, 11, 12, 13]], dtype=np.int32)
    got = []
    for og in (og_ref, xg):
        m = og.Model(stateful)
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


def test_qwen35_beam_search_matches_transformers(more_models) -> None:
    """onnxruntime-genai 0.18 fails on beam search over Qwen3.5 (it feeds [3, batch, sequence] position ids of
    batch x beams entries where the model takes [3, ...]: "Got: 9 Expected: 3"), so the beams are checked against
    transformers' beam search on the checkpoint the folder was built from (float32, its own RoPE and recurrence)."""
    folder = more_models["qwen35"]
    model = xg.Model(folder)
    tok = xg.Tokenizer(model)
    hf_dir = os.path.join(os.path.dirname(folder), "hf_qwen35")
    options = {"num_beams": 3, "num_return_sequences": 2}
    for prompt in (PROMPT, "def f(x):"):
        got = generate_with(xg, model, [prompt], MAX_LENGTH, **options)[0]
        args = [json.dumps(tok.encode(prompt).tolist()),
                json.dumps({**options, "max_length": MAX_LENGTH, "length_penalty": 1.0, "early_stopping": True})]
        proc = subprocess.run([sys.executable, BUILD, "--generate", hf_dir, *args], capture_output=True, text=True,
                              env=dict(os.environ, TRANSFORMERS_VERBOSITY="error"), timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert got == json.loads(proc.stdout.strip().splitlines()[-1])

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


def test_appended_prompt_continues_the_states(stateful, og_ref) -> None:
    before, seq, logits = _continued(xg, stateful)
    assert before == _continued(og_ref, stateful)[0]
    model = xg.Model(stateful)
    params = xg.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    fresh = xg.Generator(model, params)
    fresh.append_tokens(np.array(seq, dtype=np.int32))
    # qwen35: 1.4e-4 apart, each within 1.2e-4 of the model run in float64 by transformers (float32 rounding)
    np.testing.assert_allclose(logits, fresh.get_logits(), atol=2e-4, rtol=0)


@pytest.mark.parametrize("share", [True, False], ids=["shared", "growing"])
def test_rewind_runs_the_kept_tokens_again(stateful, share) -> None:
    model = xg.Model(stateful)
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


def test_static_decode_path_matches_default(stateful) -> None:
    """The fixed-address decode path (a GPU's, forced on the CPU, with its recordings' prompt buckets and run-ahead
    asked for): the states stay in the lent buffers, prompts are not padded (the first prompt takes the recorded path
    at its own width), decode steps run ahead."""
    ref = generate_with(xg, xg.Model(stateful), BATCH, MAX_LENGTH)
    model = xg.Model(stateful)
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
    assert [list(b.prompts) for sets in model._buffers.values() for b in sets] == [[max(lens)]]


def test_state_pieces(monkeypatch) -> None:
    from crossml.genai import model as genai_model

    assert genai_model.state_pieces(300) == [256, 32, 8, 4]
    assert genai_model.state_pieces(1300) == [512, 512, 256, 16, 4]
    assert genai_model.state_pieces(512) == [512] and genai_model.state_pieces(1) == [1]
    monkeypatch.setattr(genai_model, "STATE_PIECE_MAX", 4)
    assert genai_model.state_pieces(11) == [4, 4, 2, 1]
    for n in range(1, 70):
        assert sum(genai_model.state_pieces(n)) == n


@pytest.mark.parametrize("piece_max", [512, 4])
def test_prompts_and_turns_in_pieces_match_default(stateful, monkeypatch, piece_max) -> None:
    """The fixed-address path (a GPU's, forced on the CPU) cuts a one-row prompt and each chat turn into pieces of
    exact widths: the tokens, every step's logits and the prompt's "logits" output (all its columns) are the default
    path's. Without recordings (the CPU records none) each prompt runs one piece on its buffers and the rest in one
    eager run, on a max-length mask whose columns are set up to each piece's end."""
    from crossml.genai import model as genai_model

    monkeypatch.setattr(genai_model, "STATE_PIECE_MAX", piece_max)
    monkeypatch.setattr(genai_model, "STATE_PIECE_AFTER", 0)
    turn = "def f(x): return x"

    def chat(model):
        tok = xg.Tokenizer(model)
        params = xg.GeneratorParams(model)
        params.set_search_options(max_length=MAX_LENGTH)
        gen = xg.Generator(model, params)
        gen.append_tokens(tok.encode(PROMPT))
        shown = gen.get_output("logits")
        logits = [gen.get_logits().copy()]
        for _ in range(3):
            gen.generate_next_token()
            logits.append(gen.get_logits().copy())
        gen.append_tokens(tok.encode(turn))
        logits.append(gen.get_logits().copy())
        for _ in range(3):
            gen.generate_next_token()
            logits.append(gen.get_logits().copy())
        return gen.get_sequence(0).tolist(), logits, shown

    ref = chat(xg.Model(stateful))
    model = xg.Model(stateful)
    model._static_decode = model._prompt_graphs = model._run_ahead = True
    seen = []
    run = model.run

    def spy(feed, names, **kw):
        seen.append((feed[model.io.input_ids].shape[1], int(feed[model.io.attention_mask].sum()), bool(kw.get("eager"))))
        return run(feed, names, **kw)

    model.run = spy
    got = chat(model)
    assert got[0] == ref[0]
    for a, b in zip(got[1], ref[1]):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
    assert got[2].shape == ref[2].shape
    np.testing.assert_allclose(got[2], ref[2], atol=1e-4, rtol=0)
    tok = xg.Tokenizer(model)
    n, m = len(tok.encode(PROMPT)), len(tok.encode(turn))
    for start, width in ((0, n), (n + 3, m)):
        widths = genai_model.state_pieces(width)
        at = next(i for i, (_, total, _) in enumerate(seen) if total > start)
        runs = seen[at:at + min(len(widths), 2)]
        # one piece on its buffers (the mask set up to its end), the rest eagerly
        assert runs[0][0] in widths and [eager for _, _, eager in runs] == [False, True][:len(runs)]
        assert [total for _, total, _ in runs] == list(start + np.cumsum([w for w, _, _ in runs]))
        assert all(w == 1 for w, _, _ in seen[at + len(runs):][:3])  # then decode steps
    bufs = next(b for sets in model._buffers.values() for b in sets)
    assert {w for w, _, eager in seen if not eager and w > 1} <= set(bufs.pieces)
    assert all(w & (w - 1) == 0 for w in bufs.pieces)  # powers of two
    assert not bufs.prompts and not bufs.chunks


@pytest.mark.parametrize("case", ["beams", "batch"])
def test_several_rows_take_no_pieces(stateful, monkeypatch, case) -> None:
    """Several rows (beam search's rows of one prompt; a batch of two prompts of one length) take no pieces, even
    where one row would (STATE_PIECE_AFTER 0, STATE_PIECE_MAX 4): GroupQueryAttention refuses a prompt on a past
    context for a batch of more than one ("batch_size must be 1 when sequence_length > 1 and past context is given",
    as onnxruntime), so the prompt runs whole at its own width as before, with the default path's sequences."""
    from crossml.genai import model as genai_model

    monkeypatch.setattr(genai_model, "STATE_PIECE_MAX", 4)
    monkeypatch.setattr(genai_model, "STATE_PIECE_AFTER", 0)
    tok = xg.Tokenizer(xg.Model(stateful))
    if case == "beams":
        prompts, options = [PROMPT], {"num_beams": 3, "num_return_sequences": 2}
    else:
        ids = tok.encode(PROMPT)
        prompts, options = [PROMPT, tok.decode(ids[::-1])], {}
        assert len(tok.encode(prompts[1])) == len(ids)  # one length: no ragged batch
    ref = generate_with(xg, xg.Model(stateful), prompts, MAX_LENGTH, **options)
    model = xg.Model(stateful)
    model._static_decode = model._prompt_graphs = True
    got = generate_with(xg, model, prompts, MAX_LENGTH, **options)
    assert got[0] == ref[0]
    if case == "batch":
        for a, b in zip(got[1], ref[1]):
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
    bufs = next(b for sets in model._buffers.values() for b in sets)
    assert not bufs.pieces and list(bufs.prompts) == [len(tok.encode(PROMPT))]  # whole, at its own width


def test_pieces_after_a_number_of_prompts(stateful, monkeypatch) -> None:
    """A model takes pieces once it has run STATE_PIECE_AFTER prompts and turns: before, its first prompts take the
    buffers of their own width and its turns run eagerly."""
    from crossml.genai import model as genai_model

    monkeypatch.setattr(genai_model, "STATE_PIECE_AFTER", 2)
    model = xg.Model(stateful)
    model._static_decode = model._prompt_graphs = True
    tok = xg.Tokenizer(model)
    params = xg.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    gen = xg.Generator(model, params)
    gen.append_tokens(tok.encode(PROMPT))  # 1
    gen.generate_next_token()
    gen.append_tokens(tok.encode("def f"))  # 2
    bufs = gen._bufs
    n = len(tok.encode(PROMPT))
    assert list(bufs.prompts) == [n] and not bufs.pieces
    gen.generate_next_token()
    gen.append_tokens(tok.encode("def f"))  # 3: pieces
    assert bufs.pieces and model._state_prompts == 3


def test_pieces_with_recordings_run_first(stateful) -> None:
    """The order of a prompt's pieces: those whose widths have recordings, then the widest one whose plan a first
    run warmed (else the widest), then the rest in one eager run."""
    model = xg.Model(stateful)
    model._static_decode = model._prompt_graphs = True
    params = xg.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    gen = xg.Generator(model, params)
    bufs = gen._bufs
    plan = gen._plan_pieces(29)  # 16 + 8 + 4 + 1, nothing recorded yet: the widest, the rest eagerly
    assert [w for w, _ in plan] == [16, 13] and plan[0][1] is bufs.pieces[16] and plan[1][1] is None
    bufs.piece(1).replay = lambda: None
    bufs.piece(4).warmed = True
    plan = gen._plan_pieces(29)  # the warmed 4 (its run records it) before the wider ones
    assert [w for w, _ in plan] == [1, 4, 24] and plan[1][1] is bufs.pieces[4] and plan[2][1] is None
    bufs.piece(8).replay = bufs.piece(4).replay = lambda: None
    plan = gen._plan_pieces(29)  # one without a recording: on its buffers, no eager run
    assert [w for w, _ in plan] == [8, 4, 1, 16] and all(s is bufs.pieces[w] for w, s in plan)
    bufs.piece(16).replay = lambda: None
    assert [w for w, _ in gen._plan_pieces(29)] == [16, 8, 4, 1]  # all recorded: no eager run


def test_malformed_layer_types_are_named(lfm2, tmp_path) -> None:
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


def test_a_dropped_step_run_ahead_puts_the_states_back(stateful, tmp_path) -> None:
    """On the run-ahead path (a GPU's, forced on the CPU) the step fed by the token that ends the generation has run
    before the host learns that it ended; it is dropped, and the layer states it advanced are put back from the copy
    taken before it ran: a prompt appended after the end gives the logits of the whole sequence as one prompt."""
    import json
    import shutil

    from crossml.genai.kv_cache import LayerStates

    plain = generate_with(xg, xg.Model(stateful), [PROMPT], MAX_LENGTH)[0][0]
    n = len(xg.Tokenizer(xg.Model(stateful)).encode(PROMPT))
    eos = plain[n + 5]  # the generation ends at this token's first appearance
    folder = tmp_path / "eos"
    shutil.copytree(stateful, folder)
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["eos_token_id"] = eos
    (folder / "genai_config.json").write_text(json.dumps(cfg))
    model = xg.Model(str(folder))
    model._static_decode = model._prompt_graphs = model._run_ahead = True
    tok = xg.Tokenizer(model)
    params = xg.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    gen = xg.Generator(model, params)
    restored = []
    restore = LayerStates.restore
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LayerStates, "restore", lambda self: restored.append(1) or restore(self))
        gen.append_tokens(tok.encode(PROMPT))
        while not gen.is_done():
            gen.generate_next_token()
    seq = gen.get_sequence(0).tolist()
    assert restored == [1] and seq == plain[:plain.index(eos, n)]
    more = tok.encode(" world how are you")
    gen.append_tokens(more)
    fresh = xg.Generator(xg.Model(stateful), params)
    fresh.append_tokens(np.array(seq + more.tolist(), dtype=np.int32))
    np.testing.assert_allclose(gen.get_logits(), fresh.get_logits(), atol=2e-4, rtol=0)


@pytest.mark.parametrize("lent", [True, False], ids=["lent", "own"])
def test_saved_states_of_two_types_are_copied_in_one_group_each(monkeypatch, lent: bool) -> None:
    """save() / restore() of states of two element types (the Gated DeltaNet export's fp16 convolution and float32
    recurrent states): one grouped copy per type (torch's grouped copy copies one tensor at a time across types), and
    restore() gives back exactly what save() saw."""
    import torch

    from crossml.genai.kv_cache import LayerStates

    shapes, dtypes = [(6, 3), (2, 4, 4)] * 3, [torch.float16, torch.float32] * 3
    tensors = [torch.randn(2, *s).to(d) for s, d in zip(shapes, dtypes)] if lent else None
    states = LayerStates([f"p{i}" for i in range(6)], [f"q{i}" for i in range(6)], 2, shapes, dtypes,
                         torch.device("cpu"), tensors)
    for t in states.tensors:
        t.copy_(torch.randn(t.shape))
    want = [t.clone() for t in states.tensors]
    groups = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda d, s: groups.append({t.dtype for t in d}) or real(d, s))
    states.save()
    assert sorted(groups, key=str) == [{torch.float16}, {torch.float32}]
    for t in states.tensors:
        t.zero_()
    states.restore()
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(states.tensors, want))

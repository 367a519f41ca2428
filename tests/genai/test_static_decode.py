"""The static-shape decode path (GPU graph capture's) gives exactly the tokens and logits of the default path.

On a GPU the generator feeds every decode step a max-length attention mask (and [rows, 1] ids /
positions, the static KV buffers), so one recorded graph replays all decode steps. Here the path is
forced on the CPU through the model's internal flag and compared with the default path on the same
models: the builder's decoders take ``seqlens_k`` from the mask's sum and ``total_sequence_length``
from its width, and GroupQueryAttention must give the same results for a total of max_length.
"""

from __future__ import annotations

import gc
import types
from typing import Any

import numpy as np
import pytest
import torch

import crossml.genai as og
from crossml.genai.model import MAX_PROMPT_GRAPHS, chunk_bucket, prompt_bucket
from tests.genai._generation import generate_with
from tests.genai.conftest import ARCHS, PRECISIONS

PROMPT = "Hello world! How are you"
BATCH = ["The quick brown fox jumps over", "def f(x):"]
MAX_LENGTH = 40


def _model(folder: str, static: bool, ahead: bool = False) -> og.Model:
    model = og.Model(folder)
    assert not model._static_decode and not model._run_ahead  # the CPU: today's path unless forced
    model._static_decode = static
    model._run_ahead = ahead
    return model


def _spy(model: og.Model) -> list[dict[str, tuple[int, ...]]]:
    """Record the input shapes of every decoder run."""
    seen: list[dict[str, tuple[int, ...]]] = []
    run = model.run

    def spy(feed: dict[str, Any], names: list[str], **kw: Any) -> Any:
        seen.append({k: tuple(v.shape) for k, v in feed.items()})
        return run(feed, names, **kw)

    model.run = spy  # type: ignore[method-assign]
    return seen


def _generate(model: og.Model, prompts: list[str], max_length: int = MAX_LENGTH,
              **options: Any) -> tuple[list[list[int]], list[np.ndarray]]:
    return generate_with(og, model, prompts, max_length, **options)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prompts", [[PROMPT], BATCH], ids=["batch1", "batch2"])
def test_static_decode_matches_default(genai_models, arch: str, precision: str, prompts: list[str]) -> None:
    folder = genai_models[(arch, precision)]
    ref_seq, ref_logits = _generate(_model(folder, False), prompts)
    model = _model(folder, True)
    shapes = _spy(model)
    seq, logits = _generate(model, prompts)
    assert seq == ref_seq
    assert len(logits) == len(ref_logits)
    for step, (a, b) in enumerate(zip(logits, ref_logits)):
        np.testing.assert_array_equal(a, b, err_msg=f"logits of step {step}")
    # prefill: the prompt's own width; every decode step: one signature with a max-length mask
    rows = len(prompts)
    io = model.io
    assert shapes[0][io.attention_mask][1] < MAX_LENGTH
    decode = shapes[1:]
    assert len(decode) == len(logits) - 1 and decode
    assert all(s == decode[0] for s in decode)
    assert decode[0][io.input_ids] == (rows, 1)
    assert decode[0][io.attention_mask] == (rows, MAX_LENGTH)
    if io.position_ids is not None:
        assert decode[0][io.position_ids] == (rows, 1)


@pytest.mark.parametrize("options", [{"num_beams": 3, "num_return_sequences": 2},
                                     {"do_sample": True, "top_k": 5, "random_seed": 7},
                                     {"repetition_penalty": 1.3, "min_length": 30}],
                         ids=["beams", "sample", "processors"])
def test_static_decode_search_options(genai_models, options: dict[str, Any]) -> None:
    folder = genai_models[("qwen2", "fp32")]
    ref_seq, ref_logits = _generate(_model(folder, False), [PROMPT], max_length=30, **options)
    seq, logits = _generate(_model(folder, True), [PROMPT], max_length=30, **options)
    assert seq == ref_seq
    for a, b in zip(logits, ref_logits):
        np.testing.assert_array_equal(a, b)


def test_static_decode_rewind_and_chunks(genai_models) -> None:
    """A later prompt chunk runs eagerly; a one-token chunk and the steps after a rewind take the static path."""
    folder = genai_models[("llama", "fp32")]

    def run(static: bool) -> tuple[list[int], np.ndarray]:
        model = _model(folder, static)
        tok = og.Tokenizer(model)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=48)
        gen = og.Generator(model, params)
        gen.append_tokens(tok.encode(PROMPT))
        for _ in range(5):
            gen.generate_next_token()
        gen.append_tokens(tok.encode(" the fox")[1:])  # a chunk (without BOS)
        gen.append_tokens(np.array([7]))  # a one-token chunk
        for _ in range(4):
            gen.generate_next_token()
        gen.rewind_to(12)
        for _ in range(6):
            gen.generate_next_token()
        return gen.get_sequence(0).tolist(), gen.get_logits()

    (ref_seq, ref_logits), (seq, logits) = run(False), run(True)
    assert seq == ref_seq
    np.testing.assert_array_equal(logits, ref_logits)


def test_growing_cache_runs_eagerly(genai_models) -> None:
    """With past_present_share_buffer=false every step has new shapes: each run asks the session not to record
    it (gpu_graph_id=-1), so a capturing GPU session does not record a graph per token."""
    model = _model(genai_models[("llama", "fp32")], True)
    calls = []
    run = model.run

    def spy(feed, names, **kw):
        calls.append(kw.get("eager", False))
        return run(feed, names, **kw)

    model.run = spy
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16, past_present_share_buffer=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([1, 5, 9]))
    for _ in range(3):
        gen.generate_next_token()
    assert calls and all(calls)


def test_decode_buffers_are_lent_and_reused(genai_models) -> None:
    """Static decode feeds the model's fixed buffers: a later generator of the same shape gets the same set
    (so a recorded decode graph replays for it), zeroed; two live generators get different sets."""
    model = _model(genai_models[("llama", "fp32")], True)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16)
    a = og.Generator(model, params)
    b = og.Generator(model, params)
    assert a._bufs is not b._bufs
    a.append_tokens(np.array([1, 5, 9]))
    a.generate_next_token()
    a.generate_next_token()
    # the next decode step's input, staged when the last token was appended
    assert torch.equal(a._bufs.ids, a._seq[:, a._len - 1:a._len])
    kept = a._bufs
    del a
    gc.collect()
    c = og.Generator(model, params)
    assert c._bufs is kept
    assert not kept.mask.any() and all(not t.any() for t in kept.kv)


def test_capture_entries(genai_models) -> None:
    """The decoder session records decode steps unless the config turns capture off, and binds I/O in place."""
    model = og.Model(genai_models[("llama", "fp32")])
    so = model.session.get_session_options()
    assert so.get_session_config_entry("crossml.graph_capture_bind_io") == "1"
    assert so.get_session_config_entry("ep.dml.enable_graph_capture") == "1"
    assert not model._capture  # the CPU does not record


def _bucketed(folder: str) -> og.Model:
    """A model whose first prompts take the recorded-prompt path (padded to a bucket width), forced on the CPU."""
    model = _model(folder, True)
    assert not model._prompt_graphs  # the CPU records nothing
    model._prompt_graphs = True
    return model


def test_prompt_bucket_widths() -> None:
    assert [prompt_bucket(n, 4096) for n in (1, 7, 64, 65, 100, 512, 513, 1000, 1025)] == \
        [64, 64, 64, 80, 112, 512, 640, 1024, 1280]
    assert prompt_bucket(300, 320) == 320 and prompt_bucket(30, 40) == 40  # never past max_length
    for n in range(1, 3000, 7):
        w = prompt_bucket(n, 10 ** 6)
        assert n <= w and (n <= 64 or w < n * 1.25 + 1)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prompts", [[PROMPT], BATCH], ids=["batch1", "batch2"])
def test_bucketed_prompt_matches_default(genai_models, arch: str, prompts: list[str]) -> None:
    """A first prompt right-padded to its bucket width gives the default path's tokens and logits (the padded
    GEMMs may round differently in the last bits)."""
    folder = genai_models[(arch, "fp32")]
    ref_seq, ref_logits = _generate(_model(folder, False), prompts, max_length=100)
    model = _bucketed(folder)
    shapes = _spy(model)
    io = model.io
    # a bucket's first prompt runs its plan eagerly, the second records it (a GPU's): both padded to the bucket
    for _ in range(2):
        shapes.clear()
        seq, logits = _generate(model, prompts, max_length=100)
        assert seq == ref_seq
        assert len(logits) == len(ref_logits)
        for step, (a, b) in enumerate(zip(logits, ref_logits)):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(np.abs(b).max()),
                                       err_msg=f"logits of step {step}")
        assert shapes[0][io.input_ids] == (len(prompts), 64)  # the prompts are shorter than 64 tokens
        assert shapes[0][io.attention_mask] == (len(prompts), 64)
        assert all(s[io.input_ids] == (len(prompts), 1) for s in shapes[1:])


def test_bucketed_prompt_outputs_and_rewind(genai_models) -> None:
    """First prompts are padded to their buckets; get_output('logits') after a padded prompt has the prompt's own
    width; rewinding to one token re-runs a one-token first prompt; a set keeps MAX_PROMPT_GRAPHS buckets."""
    folder = genai_models[("qwen2", "fp32")]

    def run(model: og.Model) -> tuple[np.ndarray, list[int], np.ndarray]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=200)
        gen = og.Generator(model, params)
        prompt = np.arange(3, 3 + 70)
        gen.append_tokens(prompt)
        out = gen.get_output("logits")
        gen.generate_next_token()
        gen.rewind_to(1)
        for _ in range(3):
            gen.generate_next_token()
        return out, gen.get_sequence(0).tolist(), gen.get_logits()

    model = _bucketed(folder)
    ref_out, ref_seq, ref_logits = run(_model(folder, False))
    for _ in range(2):  # a bucket's first prompts (80, then 64 after the rewind), then its second ones
        out, seq, logits = run(model)
        assert out.shape == ref_out.shape == (1, 70, ref_out.shape[-1])
        np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-5 * float(np.abs(ref_out).max()))
        assert seq == ref_seq and len(seq) == 4
        np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-5 * float(np.abs(ref_logits).max()))
        bufs = model._buffers[(1, 200)][0]
        assert list(bufs.prompts) == [80, 64]  # the 70-token prompt, then the one-token first prompt
        assert all(slot.warmed for slot in bufs.prompts.values())
    kept = bufs.prompts[64]
    assert bufs.prompt(64) is kept
    for width in (128, 160, 192, 200):
        bufs.prompt(width)
    assert list(bufs.prompts) == [128, 160, 192, 200] and len(bufs.prompts) == MAX_PROMPT_GRAPHS


def test_chunk_bucket_widths() -> None:
    assert [chunk_bucket(n) for n in (2, 31, 32, 33, 64, 65, 100, 513)] == [32, 32, 32, 64, 64, 128, 128, 1024]


#: continuation prompts of the chunk tests: buckets 32, 64, 64 (the second one's first run, then its recording)
CHUNKS = (np.arange(5, 12), np.arange(20, 60), np.arange(7, 40))


def _chunked(model: og.Model, max_length: int = 160) -> dict[str, Any]:
    """A first prompt, then CHUNKS each followed by two tokens, then a 40-token chunk (its bucket of 64 would pass
    max_length: eager) and two tokens; what the API shows after each chunk, the logits after each pair of tokens,
    and the sequence after a rewind into the last chunk and three more tokens."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    gen = og.Generator(model, params)
    gen.append_tokens(np.arange(3, 13))
    for _ in range(3):
        gen.generate_next_token()
    seen: dict[str, Any] = {"outputs": [], "logits": [], "mask_past_end": []}
    for chunk in (*CHUNKS, np.arange(30, 70)):
        gen.append_tokens(chunk)
        seen["outputs"].append(gen.get_output("logits"))
        seen["mask_past_end"].append(bool(gen._mask[:, gen.token_count():].any()))
        for _ in range(2):
            gen.generate_next_token()
        seen["logits"].append(gen.get_logits())
    seen["length"] = gen.token_count()
    gen.rewind_to(gen.token_count() - 10)
    for _ in range(3):
        gen.generate_next_token()
    seen["logits"].append(gen.get_logits())
    seen["sequence"] = gen.get_sequence(0).tolist()
    return seen


@pytest.mark.parametrize("arch", ARCHS)
def test_recorded_chunks_match_eager(genai_models, arch: str) -> None:
    """Continuation prompts right-padded to their chunk buckets, the pad columns fed as tokens over the whole
    max-length mask, give the eager path's tokens, shown logits and logits (the padded GEMMs may round differently
    in the last bits); a chunk whose bucket would pass max_length runs eagerly, unpadded. With window-sized caches
    (gemma's) every chunk runs eagerly: the pads would evict real positions."""
    folder = genai_models[(arch, "fp32")]
    ref = _chunked(_model(folder, False))
    model = _bucketed(folder)
    shapes = _spy(model)
    io = model.io
    for _ in range(2):  # the buckets' first chunks, then their second ones (recorded on a GPU)
        shapes.clear()
        got = _chunked(model)
        assert got["sequence"] == ref["sequence"] and got["length"] == ref["length"] == 141
        assert not any(got["mask_past_end"])  # the pad columns' mask is cleared behind each chunk
        for what in ("outputs", "logits"):
            assert len(got[what]) == len(ref[what])
            for i, (a, b) in enumerate(zip(got[what], ref[what])):
                assert a.shape == b.shape
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(np.abs(b).max()), err_msg=f"{what} {i}")
        fed = [(s[io.input_ids], s[io.attention_mask]) for s in shapes if s[io.input_ids][1] > 1]
        chunks = [(1, len(c)) for c in (*CHUNKS, range(40))]
        if model.window_layers:
            assert [ids for ids, _ in fed[1:]] == chunks
        else:
            assert fed[1:] == [((1, 32), (1, 160)), ((1, 64), (1, 160)), ((1, 64), (1, 160)), ((1, 40), (1, 139))]
            bufs = model._buffers[(1, 160)][0]
            assert list(bufs.chunks) == [32, 64] and all(slot.warmed for slot in bufs.chunks.values())


def test_chunk_slots_are_kept_apart_from_prompt_slots(genai_models) -> None:
    """A set keeps MAX_PROMPT_GRAPHS chunk buckets beside its first-prompt buckets (another mask width, another
    recording), the least recently used dropped first; new extra inputs drop both."""
    model = _bucketed(genai_models[("qwen2", "fp32")])
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=200)
    bufs = og.Generator(model, params)._bufs
    first, chunk = bufs.prompt(64), bufs.chunk(64)
    assert first is not chunk and bufs.prompt(64) is first and bufs.chunk(64) is chunk
    for width in (128, 256, 512, 1024):
        bufs.chunk(width)
    assert list(bufs.chunks) == [128, 256, 512, 1024] and list(bufs.prompts) == [64]
    bufs.bind_extras({"x": torch.zeros(1)})
    assert not bufs.chunks and not bufs.prompts


def _greedy_module() -> Any:
    """The greedy step the generator calls on a GPU: the Triton kernel where Triton interprets (CPU tensors), else
    its torch reference (the kernel tests check the two are equal). Imported here, not at module level: triton
    must not be imported before the kernel tests ask for its interpreter."""
    from crossml.kernels import _launch, greedy

    return types.SimpleNamespace(greedy_step=greedy.greedy_step if _launch.INTERPRET else greedy.greedy_step_reference)


def force_eos(gen: og.Generator, model: og.Model, rows: int) -> None:
    """Make the next token of every row the first end-of-sequence id (set_logits)."""
    forced = np.full((rows, gen.get_logits().shape[-1]), -1e4, np.float32)
    forced[:, model.config.model.eos_token_id[0]] = 0.0
    gen.set_logits(forced)


def _steps(model: og.Model, prompts: list[str], max_length: int, eos_at: int | None = None,
           greedy_step: bool = False, **options: Any) -> dict[str, Any]:
    """Generate step by step, reading everything the API shows after each step: the tokens, get_output("logits"),
    token_count; ``eos_at``: force an end-of-sequence token (set_logits) at that step, then append a chunk and go
    on; finally rewind and generate again."""
    tok = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, batch_size=len(prompts), **options)
    gen = og.Generator(model, params)
    assert gen._greedy is None  # the CPU: the torch path unless forced
    if greedy_step:
        gen._greedy = _greedy_module()
    gen.append_tokens(tok.encode(prompts[0]) if len(prompts) == 1 else tok.encode_batch(prompts))
    seen: dict[str, Any] = {"tokens": [], "outputs": [], "counts": [], "logits": [], "inputs": []}
    step = 0
    while not gen.is_done():
        if step == eos_at:
            force_eos(gen, model, len(prompts))
        gen.generate_next_token()
        seen["tokens"].append(gen.get_next_tokens().tolist())
        seen["outputs"].append(gen.get_output("logits"))
        seen["counts"].append(gen.token_count())
        seen["inputs"].append([gen.get_input(n).tolist() for n in ("input_ids", "attention_mask")])
        step += 1
    if eos_at is not None and len(prompts) == 1:
        seen["done_len"] = gen.token_count()
        gen.append_tokens(tok.encode(" the fox")[1:])  # goes on after the end-of-sequence step
        for _ in range(3):
            gen.generate_next_token()
        seen["logits"].append(gen.get_logits())
    if len(prompts) == 1:
        gen.rewind_to(gen.token_count() - 3)
        for _ in range(2):
            gen.generate_next_token()
        seen["logits"].append(gen.get_logits())
    seen["sequences"] = [gen.get_sequence(i).tolist() for i in range(len(prompts))]
    return seen


@pytest.mark.parametrize("case", ["batch1", "batch2", "eos", "sample", "greedy-step", "greedy-step-batch2"])
def test_run_ahead_shows_what_the_default_path_shows(genai_models, case: str) -> None:
    """Running the next decode step before the host reads the token changes nothing the API shows: tokens,
    get_output("logits") of the step that chose them, token counts, get_input of the last shown run, logits after an end-of-sequence step
    (whose ahead step is dropped), a chunk appended after it, and a rewind."""
    folder = genai_models[("qwen2", "fp32")]
    prompts = BATCH if case.endswith("batch2") else [PROMPT]
    options: dict[str, Any] = {"do_sample": True, "top_k": 5, "random_seed": 3} if case == "sample" else {}
    eos_at = 4 if case in ("eos", "greedy-step") else None
    if case.startswith("greedy-step"):
        options["min_length"] = 10  # the end-of-sequence ban for the first steps too
    ref_model = _model(folder, True)
    ref_shapes = _spy(ref_model)
    ref = _steps(ref_model, prompts, 30, eos_at, **options)
    model = _model(folder, True, ahead=True)
    shapes = _spy(model)
    got = _steps(model, prompts, 30, eos_at, case.startswith("greedy-step"), **options)
    assert got["tokens"] == ref["tokens"] and got["counts"] == ref["counts"]
    assert got["inputs"] == ref["inputs"]
    assert got["sequences"] == ref["sequences"] and got.get("done_len") == ref.get("done_len")
    for step, (a, b) in enumerate(zip(got["outputs"], ref["outputs"], strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"step {step}"
        np.testing.assert_array_equal(a, b, err_msg=f"get_output('logits') after step {step}")
    for a, b in zip(got["logits"], ref["logits"], strict=True):
        np.testing.assert_array_equal(a, b)
    # the same runs, one more with an end-of-sequence token (its step ran ahead, then was dropped)
    assert shapes == ref_shapes[:len(shapes)] or eos_at is not None
    assert len(shapes) == len(ref_shapes) + (eos_at is not None)
    if "min_length" in options:
        assert ref["counts"][0] <= options["min_length"]  # the first step was under the ban
    if eos_at is not None:
        assert ref["tokens"][4] == [model.config.model.eos_token_id[0]] and len(ref["tokens"]) == 5


def test_run_ahead_queues_the_step_before_the_host_reads_the_token(genai_models) -> None:
    """After generate_next_token the next step has already run (its logits are there) and the token is on its way
    to the host; beam search does not run ahead."""
    model = _model(genai_models[("llama", "fp32")], True, ahead=True)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([1, 5, 9]))
    gen.generate_next_token()
    assert gen._pending is not None and gen._logits is not None and gen._kv_len == gen._len
    token = gen.get_next_tokens()
    assert gen._pending is None and token.tolist() == [int(gen._seq[0, 3])]
    params.set_search_options(num_beams=2)
    beams = og.Generator(model, params)
    assert not beams._ahead


def _launch_kind(kwargs: dict[str, Any], logits: torch.Tensor) -> tuple:
    """What of a greedy step's arguments Triton specializes its kernels on (the column's value aside: it is not
    specialized): each tensor's dtype, shape, strides and 16-byte alignment, the other values themselves."""
    def kind(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return (v.dtype, tuple(v.shape), v.stride(), v.data_ptr() % 16 == 0)
        return v

    return (kind(logits), tuple(sorted((k, kind(v)) for k, v in kwargs.items() if k != "col")))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_step_compiled_ahead_as_the_first_steps_launch_it(genai_models, arch: str, monkeypatch) -> None:
    """The first prompt's compile-ahead (forced active on the CPU, its launches run) makes the greedy step's launches
    with the arguments the first two real steps give it (the prompt's float32 logits, then a step's logits with a
    float32 copy), and the first real greedy step waits for the dry decode step's compiles first (their wait puts
    the kernels in Triton's in-memory cache), so that step compiles nothing."""
    from crossml import kernels
    from crossml.genai import generator

    calls: list[tuple[str, Any]] = []

    class Active:
        active = True

        def __init__(self, device: Any) -> None:
            pass

        def collect(self) -> Any:
            import contextlib

            return contextlib.nullcontext()

        def wait(self) -> None:
            calls.append(("wait", self))

    monkeypatch.setattr(kernels, "CompileAhead", Active)
    model = _model(genai_models[(arch, "fp32")], True, ahead=True)
    model._compile_ahead = True
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    gen = og.Generator(model, params)
    phase = ["step"]
    module = _greedy_module()

    def greedy_step(logits: torch.Tensor, **kw: Any) -> None:
        calls.append((phase[0], _launch_kind(kw, logits)))
        module.greedy_step(logits, **kw)

    gen._greedy = types.SimpleNamespace(greedy_step=greedy_step)
    real_ahead = generator.Generator._greedy_ahead

    def ahead(self: Any, logits: torch.Tensor, col: int) -> None:
        phase[0] = "ahead"
        try:
            real_ahead(self, logits, col)
        finally:
            phase[0] = "step"

    monkeypatch.setattr(generator.Generator, "_greedy_ahead", ahead)
    gen.append_tokens(og.Tokenizer(model).encode(PROMPT))
    decode_compiles = model._decode_compiles
    assert isinstance(decode_compiles, Active)  # handed over, not yet waited for
    for _ in range(3):
        gen.generate_next_token()
    first_step = next(i for i, (p, _) in enumerate(calls) if p == "step")
    assert ("wait", decode_compiles) in calls[:first_step] and model._decode_compiles is None
    ahead_calls = [k for p, k in calls if p == "ahead"]
    steps = [k for p, k in calls if p == "step"]
    assert len(ahead_calls) == 2 and len(steps) == 3
    assert ahead_calls == steps[:2]
    assert steps[2] == steps[1]  # later steps launch what the second did


@pytest.mark.parametrize("path", ["default", "static", "ahead"])
@pytest.mark.parametrize("arch", ["qwen2", "lfm2"])
def test_logits_after_the_generation_ends_on_eos(genai_models, more_models, arch: str, path: str) -> None:
    """After every row ended on an end-of-sequence token (which is not appended), get_logits gives the logits of the
    sequence's last token, those the ending token was chosen from (it raised from GroupQueryAttention on an empty run
    before; onnxruntime-genai 0.18 gives other values there). lfm2 carries convolution states, which cannot run a
    token twice: its last token runs again from the first."""
    folder = genai_models[("qwen2", "fp32")] if arch == "qwen2" else more_models["lfm2"]
    model = _model(folder, path != "default", ahead=path == "ahead")
    tok = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    gen = og.Generator(model, params)
    gen.append_tokens(tok.encode(PROMPT))
    for _ in range(3):
        gen.generate_next_token()
    before = gen.get_logits().copy()
    forced = np.full_like(before, -1e4)
    forced[..., model.config.model.eos_token_id[0]] = 0.0
    gen.set_logits(forced)
    gen.generate_next_token()
    assert gen.is_done() and gen.token_count() == len(tok.encode(PROMPT)) + 3
    np.testing.assert_allclose(gen.get_logits(), before, atol=1e-5, rtol=0)
    np.testing.assert_allclose(gen.get_output("logits")[:, -1:], before, atol=1e-5, rtol=0)

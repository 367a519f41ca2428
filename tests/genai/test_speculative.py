"""N-gram speculative decoding (``set_speculative_options``, crossml.genai.speculative).

Against onnxruntime-genai 0.18's CPU build: the same tokens and the same round counters. Against crossml's own
standard decoding: the same tokens for int4, sampling, penalties, a grammar and interruptions in the middle of a
round; rounds with many accepted drafts are driven by a proposer that knows the standard continuation."""

from __future__ import annotations

import json

import numpy as np
import pytest

import crossml.genai as og
from crossml.genai import speculative
from crossml.genai.errors import ConfigError, GenAIError, SearchOptionError

#: counters that follow from the lookup and the verification alone (not from how the target runs are arranged)
PARITY = ("rounds", "completed_rounds", "interrupted_rounds", "draft_tokens_proposed", "draft_tokens_evaluated",
          "draft_tokens_accepted", "correction_tokens", "bonus_tokens", "tokens_queued", "tokens_emitted",
          "tokens_discarded", "standard_fallback_steps", "full_accept_rounds", "partial_accept_rounds",
          "zero_accept_rounds", "ngram_lookup_hits", "ngram_lookup_misses", "ngram_lookup_tokens_proposed",
          "ngram_chained_tokens_proposed", "ngram_history_syncs", "ngram_history_tokens_synced", "effective_k",
          "cooldown_entries", "cooldown_steps")
REPEATING = [5, 6, 7, 5, 6, 7, 5, 6, 9, 5, 6, 7]


def _run(lib, folder: str, prompt: list[int], spec: dict | None, max_length: int = 120, overlay: str | None = None,
         propose=None, **search) -> tuple[list[int], dict, object]:
    """Generate to the end with ``lib`` (crossml.genai or onnxruntime_genai); ``overlay``: JSON over the folder's
    config; ``propose(gen, prompt_length)``: the proposer crossml's rounds use instead of their own."""
    if not isinstance(folder, str):  # a model already made
        model = folder
    elif overlay:
        config = lib.Config(folder)
        config.overlay(overlay)
        model = lib.Model(config)
    else:
        model = lib.Model(folder)
    params = lib.GeneratorParams(model)
    params.set_search_options(max_length=max_length, **search)
    if spec:
        params.set_speculative_options(**spec)
    gen = lib.Generator(model, params)
    if propose is not None:
        gen._spec.propose = propose(gen, len(prompt))
    gen.append_tokens(np.array(prompt, dtype=np.int32))
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out, gen.get_speculative_stats(), gen


@pytest.mark.parametrize("spec", [dict(ngram_size=3), dict(ngram_size=2, max_draft_tokens=8, ngram_chained_lookup=True),
                                  dict(ngram_size=2, max_draft_tokens=1), dict(ngram_size=2, cooldown=True)],
                         ids=["n3-k4", "n2-k8-chained", "n2-k1", "n2-cooldown"])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma"])
def test_ngram_matches_onnxruntime_genai(genai_models, og_ref, arch: str, spec: dict) -> None:
    folder = genai_models[(arch, "fp32")]
    for prompt in (REPEATING, list(range(3, 30))):
        ours, ours_stats, gen = _run(og, folder, prompt, spec, max_length=200)
        ref, ref_stats, ref_gen = _run(og_ref, folder, prompt, spec, max_length=200)
        assert ours == ref
        assert list(gen.get_sequence(0)) == list(ref_gen.get_sequence(0))
        assert {k: ours_stats[k] for k in PARITY} == {k: ref_stats[k] for k in PARITY}
        assert list(ours_stats) == list(ref_stats)  # onnxruntime-genai's keys, in its order
        assert all(type(ours_stats[k]) is type(ref_stats[k]) for k in ref_stats)
    assert ours_stats["rounds"] > 0  # the scenario has lookups that hit


def test_stats_without_speculation_have_onnxruntime_genais_keys(genai_models, og_ref) -> None:
    folder = genai_models[("qwen2", "fp32")]
    _, ours, _ = _run(og, folder, [5, 6], None, max_length=12)
    _, ref, _ = _run(og_ref, folder, [5, 6], None, max_length=12)
    assert ours == ref


def test_options_and_their_errors(genai_models, og_ref) -> None:
    model = og.Model(genai_models[("qwen2", "fp32")])
    params = og.GeneratorParams(model)
    ref = og_ref.GeneratorParams(og_ref.Model(genai_models[("qwen2", "fp32")]))
    assert params.get_speculative_options() == ref.get_speculative_options()
    good = dict(ngram_size=4, max_draft_tokens=8, ngram_chained_lookup=True, min_adaptive_k=2, cooldown=True)
    params.set_speculative_options(**good)
    ref.set_speculative_options(**good)
    assert params.get_speculative_options() == ref.get_speculative_options()
    for bad in (dict(max_draft_tokens=0), dict(max_draft_tokens=17), dict(max_draft_tokens=2.5), dict(ngram_size=1),
                dict(ngram_size=17), dict(ngram_chained_lookup=1), dict(ngram_size=True), dict(min_adaptive_k=17),
                dict(draft_model=1)):
        with pytest.raises(SearchOptionError) as err:
            params.set_speculative_options(**bad)
        assert next(iter(bad)) in str(err.value)
        with pytest.raises(RuntimeError):
            ref.set_speculative_options(**bad)


@pytest.mark.parametrize(("search", "message"), [(dict(batch_size=2), "batch_size=1"),
                                                 (dict(num_beams=2), "beam search")])
def test_what_ngram_decoding_refuses(genai_models, search: dict, message: str) -> None:
    model = og.Model(genai_models[("qwen2", "fp32")])
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=32, **search)
    params.set_speculative_options(ngram_size=3)
    with pytest.raises(SearchOptionError, match=message):
        og.Generator(model, params)
    params = og.GeneratorParams(model)
    params.set_speculative_options(ngram_chained_lookup=True)
    with pytest.raises(SearchOptionError, match="requires speculative.ngram_size"):
        og.Generator(model, params)


def test_carried_state_models_are_refused(more_models) -> None:
    model = og.Model(more_models["lfm2"])
    params = og.GeneratorParams(model)
    params.set_speculative_options(ngram_size=3)
    with pytest.raises(GenAIError, match="carries layer states"):
        og.Generator(model, params)


def test_config_section(genai_models, tmp_path) -> None:
    folder = genai_models[("qwen2", "fp32")]
    config = og.Config(folder)
    config.overlay(json.dumps({"speculative": {"ngram_size": 3, "max_draft_tokens": 6}}))
    model = og.Model(config)
    assert og.GeneratorParams(model).get_speculative_options()["max_draft_tokens"] == 6.0
    out, stats, _ = _run(og, folder, REPEATING, None, max_length=100,
                         overlay=json.dumps({"speculative": {"ngram_size": 3}}))
    assert stats["ngram_lookup_hits"] + stats["ngram_lookup_misses"] > 0
    assert out == _run(og, folder, REPEATING, None, max_length=100)[0]
    for section, message in (({"ngram_size": 1}, "out of range"), ({"cooldown": 1}, "true or false"),
                             ({"bogus": 2}, "unknown speculative option"), ([], "must be an object")):
        config = og.Config(folder)
        with pytest.raises(ConfigError, match=message):
            config.overlay(json.dumps({"speculative": section}))
            og.Model(config)
    raw = json.loads(open(f"{folder}/genai_config.json").read())
    raw["model"]["draft"] = {"head_size": 16}
    (tmp_path / "genai_config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="model.draft.filename is not set"):
        og.Config(str(tmp_path))


class _Oracle:
    """A proposer that drafts the standard continuation, with every ``wrong``-th round's draft ``at`` corrupted."""

    def __init__(self, gen, truth: list[int], prompt_length: int, wrong: int = 3, at: int = 2) -> None:
        self.gen, self.truth, self.base = gen, truth, prompt_length
        self.wrong, self.at, self.calls = wrong, at, 0

    def __call__(self, k: int) -> list[int]:
        self.calls += 1
        done = self.gen._len - self.base  # tokens generated so far
        out = list(self.truth[done:done + k])
        if self.calls % self.wrong == 0 and len(out) > self.at:
            out[self.at] = (out[self.at] + 1) % 300
        return out


def _oracle_run(folder: str, prompt: list[int], truth: list[int], spec: dict, wrong: int = 3, at: int = 2,
                overlay: str | None = None, max_length: int = 120, **search) -> tuple[list[int], dict]:
    out, stats, _ = _run(og, folder, prompt, spec, max_length, overlay,
                         propose=lambda gen, n: _Oracle(gen, truth, n, wrong, at), **search)
    return out, stats


SEARCHES = [dict(), dict(do_sample=True, random_seed=7, top_k=20, top_p=0.9, temperature=0.8),
            dict(repetition_penalty=1.3), dict(min_length=40)]


@pytest.mark.parametrize("search", SEARCHES, ids=["greedy", "sampling", "repetition-penalty", "min-length"])
@pytest.mark.parametrize("build", [("qwen2", "fp32"), ("llama", "int4")], ids=["qwen2-fp32", "llama-int4"])
def test_rounds_commit_the_tokens_of_standard_decoding(genai_models, build, search: dict) -> None:
    folder = genai_models[build]
    prompt = [5, 6, 7, 8]
    truth, _, _ = _run(og, folder, prompt, None, max_length=90, **search)
    for k, at, mixed in ((5, 2, "partial_accept_rounds"), (1, 0, "zero_accept_rounds")):
        out, stats = _oracle_run(folder, prompt, truth, dict(ngram_size=2, max_draft_tokens=k), at=at, max_length=90,
                                 **search)
        assert out == truth
        assert stats["full_accept_rounds"] > 0 and stats[mixed] > 0
        assert stats["draft_tokens_accepted"] > len(truth) // 3
        assert stats["target_forward_passes"] < len(truth)
        # an end-of-sequence id is not appended: onnxruntime-genai counts it discarded
        ended = len(prompt) + len(truth) < 90
        assert stats["tokens_emitted"] + stats["standard_fallback_steps"] == len(truth) - ended
    ngram, _, _ = _run(og, folder, REPEATING, dict(ngram_size=2, max_draft_tokens=6), max_length=90, **search)
    assert ngram == _run(og, folder, REPEATING, None, max_length=90, **search)[0]


def test_an_end_of_sequence_id_inside_a_round_ends_it(genai_models) -> None:
    folder = genai_models[("qwen2", "fp32")]
    prompt = [5, 6, 7, 8]
    free, _, _ = _run(og, folder, prompt, None, max_length=80)
    eos = free[20]
    overlay = json.dumps({"model": {"eos_token_id": [eos]}})
    truth, _, _ = _run(og, folder, prompt, None, max_length=80, overlay=overlay)
    assert truth[-1] == eos and len(truth) <= 21
    # drafts run past the end-of-sequence id: the round hands out up to it and drops the rest
    for at in (0, 1, 5):
        out, stats = _oracle_run(folder, prompt, free, dict(ngram_size=2, max_draft_tokens=8), wrong=1000, at=at,
                                 overlay=overlay, max_length=80)
        assert out == truth
        assert stats["tokens_discarded"] > 0 and stats["interrupted_rounds"] == 1


def test_max_length_inside_a_round(genai_models) -> None:
    folder = genai_models[("qwen2", "fp32")]
    prompt = [5, 6, 7, 8]
    truth, _, _ = _run(og, folder, prompt, None, max_length=30)
    longer, _, _ = _run(og, folder, prompt, None, max_length=60)
    out, stats = _oracle_run(folder, prompt, longer, dict(ngram_size=2, max_draft_tokens=16), wrong=1000,
                             max_length=30)
    assert out == truth and len(out) == 26


@pytest.mark.parametrize("search", SEARCHES[:2], ids=["greedy", "sampling"])
def test_interrupting_a_round(genai_models, search: dict) -> None:
    """get_logits in the middle of a round, then rewind_to, append_tokens and set_logits: the tokens not handed out
    are dropped (the random stream put back), and everything equals standard decoding doing the same."""
    folder = genai_models[("qwen2", "fp32")]
    prompt = [5, 6, 7, 8]
    model = og.Model(folder)
    truth, _, _ = _run(og, folder, prompt, None, max_length=100, **search)

    def script(spec: bool) -> tuple[list, list]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=100, **search)
        if spec:
            params.set_speculative_options(ngram_size=2, max_draft_tokens=6)
        gen = og.Generator(model, params)
        if spec:
            gen._spec.propose = _Oracle(gen, truth, len(prompt), wrong=1000)
        gen.append_tokens(np.array(prompt, dtype=np.int32))
        seen, logits = [], []
        for _ in range(3):
            gen.generate_next_token()
        logits.append(gen.get_logits())  # in the middle of a round
        gen.rewind_to(len(prompt) + 2)
        for _ in range(4):
            gen.generate_next_token()
        gen.append_tokens(np.array([9, 10], dtype=np.int32))
        for _ in range(3):
            gen.generate_next_token()
        logits.append(gen.get_logits())
        rigged = gen.get_logits()[0, 0].copy()
        rigged[11] = 1e4
        gen.set_logits(rigged)
        for _ in range(6):
            gen.generate_next_token()
        seen.append(list(gen.get_sequence(0)))
        if spec:
            assert gen.get_speculative_stats()["interrupted_rounds"] >= 1
        return seen, logits

    spec_seen, spec_logits = script(True)
    std_seen, std_logits = script(False)
    assert spec_seen == std_seen
    assert spec_seen[0][len(prompt) + 11] == 11
    for a, b in zip(spec_logits, std_logits):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_guided_rounds(genai_models) -> None:
    pytest.importorskip("llguidance", reason="guidance needs llguidance (pip install crossml[guidance])")
    folder = genai_models[("qwen2", "fp32")]
    model = og.Model(folder)
    prompt = og.Tokenizer(model).encode("Hello")

    def guided(spec: dict | None, oracle: list[int] | None = None) -> list[int]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=60)
        params.set_guidance("regex", "(ab|abc)+d")
        if spec:
            params.set_speculative_options(**spec)
        gen = og.Generator(model, params)
        if oracle is not None:
            gen._spec.propose = _Oracle(gen, oracle, len(prompt))
        gen.append_tokens(prompt)
        while not gen.is_done():
            gen.generate_next_token()
        return [int(t) for t in gen.get_sequence(0)]

    truth = guided(None)
    assert guided(dict(ngram_size=2)) == truth
    assert guided(dict(ngram_size=2, max_draft_tokens=4), truth[len(prompt):]) == truth


def test_ngram_lookup() -> None:
    lookup = speculative.NGramLookup(3)
    lookup.reset([1, 2, 3, 1, 2, 4, 5, 1, 2])
    assert lookup.propose(4, chained=False) == [4, 5, 1, 2]  # the most recent earlier (1, 2)
    assert lookup.propose(2, chained=False) == [4, 5]
    lookup.append([9])
    assert lookup.propose(4, chained=False) == []
    chain = speculative.NGramLookup(2)
    chain.reset([7, 8, 9, 8, 7])
    assert chain.propose(5, chained=False) == [8, 9, 8, 7]
    assert chain.propose(5, chained=True) == [8, 7, 8, 7, 8]  # follows key after key through its own context


def test_adaptive_width() -> None:
    k = speculative.AdaptiveK(4, 2)
    assert (k.k, k.min_k, k.max_k) == (2, 2, 16)
    for _ in range(2):
        k.record(2, evaluated=2, accepted=2, committed=3, filled=True, ms=1.0)
    assert k.k == 3 and k.probes == 1  # high acceptance: probe up
    for _ in range(2):
        k.record(3, evaluated=3, accepted=3, committed=4, filled=True, ms=1.0)
    assert k.k == 3 and k.increases == 1  # more tokens per ms: kept
    k.record(3, evaluated=3, accepted=3, committed=4, filled=True, ms=1.0)  # the wait after a kept probe
    k.record(3, evaluated=3, accepted=3, committed=4, filled=True, ms=1.0)
    assert k.k == 4
    k.record(4, evaluated=4, accepted=4, committed=1, filled=True, ms=1.0)  # far slower: back at once
    assert k.k == 3 and k.decreases == 1
    k.record(3, evaluated=3, accepted=3, committed=4, filled=False, ms=1.0)  # short proposals teach nothing
    assert k.observations == 7
    fixed = speculative.AdaptiveK(5, 0)
    fixed.record(5, evaluated=5, accepted=0, committed=1, filled=True, ms=1.0)
    assert fixed.k == 5 and fixed.observations == 0


def test_cooldown() -> None:
    c = speculative.Cooldown(True)
    for _ in range(2):
        c.record(4, 4, evaluated=1, accepted=0)
    c.record(3, 4, evaluated=1, accepted=0)  # not at the minimum width: starts over
    assert c.remaining == 0
    for _ in range(3):
        c.record(4, 4, evaluated=1, accepted=0)
    assert (c.remaining, c.entries) == (1, 1)


composite = speculative.make_folder

DRAFT_PARITY = tuple(k for k in PARITY if not k.startswith("ngram"))


@pytest.mark.parametrize("draft", [("qwen2", "fp32"), ("llama", "fp32")], ids=["self", "llama"])
def test_draft_model_matches_onnxruntime_genai(genai_models, og_ref, tmp_path, draft) -> None:
    """Speculative decoding with a draft model (model.type "speculative", model.draft): the draft decodes K greedy
    tokens past the committed ones; the same tokens and round counters as onnxruntime-genai's (a draft equal to the
    target accepts every draft, a llama draft of the qwen2 target almost none)."""
    folder = composite(tmp_path / "spec", genai_models[("qwen2", "fp32")], genai_models[draft])
    for spec in (None, dict(max_draft_tokens=2), dict(max_draft_tokens=1)):
        ours, ours_stats, _ = _run(og, folder, [5, 6, 7, 8], spec, max_length=100)
        ref, ref_stats, _ = _run(og_ref, folder, [5, 6, 7, 8], spec, max_length=100)
        assert ours == ref
        assert {k: ours_stats[k] for k in DRAFT_PARITY} == {k: ref_stats[k] for k in DRAFT_PARITY}
        assert ours_stats["draft_forward_passes"] > 0
    assert ours == _run(og, genai_models[("qwen2", "fp32")], [5, 6, 7, 8], None, max_length=100)[0]


@pytest.mark.parametrize("search", SEARCHES, ids=["greedy", "sampling", "repetition-penalty", "min-length"])
def test_an_int4_draft_commits_the_targets_tokens(genai_models, tmp_path, search: dict) -> None:
    """An int4 draft of the same weights drafts well; the tokens are the fp32 target's own, sampled ones included
    (onnxruntime-genai verifies a sampled round by the draft's probabilities instead, whose tokens differ from
    standard sampling's)."""
    target = genai_models[("qwen2", "fp32")]
    folder = composite(tmp_path / "spec", target, genai_models[("qwen2", "int4")])
    truth, _, _ = _run(og, target, [5, 6, 7, 8], None, max_length=100, **search)
    out, stats, _ = _run(og, folder, [5, 6, 7, 8], None, max_length=100, **search)
    assert out == truth
    # the greedy draft's tokens are accepted where the target's choice is greedy too; a sampled choice differs more
    assert stats["draft_tokens_accepted"] > (stats["rounds"] // 4 if search.get("do_sample") else stats["rounds"] // 2)


def test_draft_model_errors(genai_models, tmp_path) -> None:
    folder = composite(tmp_path / "spec", genai_models[("qwen2", "fp32")], genai_models[("llama", "fp32")])
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_speculative_options(ngram_size=3)
    with pytest.raises(SearchOptionError, match="cannot be combined with the draft model"):
        og.Generator(model, params)
    params = og.GeneratorParams(model)
    params.set_search_options(batch_size=2)
    with pytest.raises(SearchOptionError, match="batch_size=1"):
        og.Generator(model, params)
    raw = json.loads(open(f"{folder}/genai_config.json").read())
    del raw["model"]["draft"]
    (tmp_path / "nodraft").mkdir()
    (tmp_path / "nodraft" / "genai_config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="model.draft.filename is not set"):
        og.Config(str(tmp_path / "nodraft"))


def _static(folder: str):
    """A model on the GPU's decode path (fixed-address buffers, standard steps run ahead), forced on the CPU."""
    model = og.Model(folder)
    model._static_decode = model._run_ahead = True
    return model


@pytest.mark.parametrize("k", [1, 4])
def test_rounds_on_the_static_run_ahead_path(genai_models, k: int) -> None:
    """The GPU's path forced on the CPU: a round that follows a step that ran ahead takes that step's logits as its
    first (a one-draft round runs one column on the decode path), and the final token's step runs ahead again."""
    folder = genai_models[("qwen2", "fp32")]
    prompt = [5, 6, 7, 8]
    truth, _, _ = _run(og, folder, prompt, None, max_length=90)
    model = _static(folder)
    for propose in (lambda gen, n: _Oracle(gen, truth, n), None):
        out, stats, gen = _run(og, model, prompt, dict(ngram_size=2, max_draft_tokens=k), max_length=90,
                               propose=propose)
        assert gen._ahead and gen._bufs is not None
        assert out == truth
        assert stats["rounds"] > 0 or propose is None


@pytest.mark.parametrize("static", [False, True], ids=["default", "static"])
def test_an_adapter_set_in_the_middle_of_a_round(genai_models, tmp_path_factory, static: bool) -> None:
    """An adapter set after a token applies from the next step: the round's tokens not handed out yet were chosen
    without it and are dropped, and the last token's step runs again with it, as standard decoding does."""
    from tests.genai.test_adapters import _loaded, _rewrite, add_lora, write_adapters

    folder = _rewrite(genai_models[("qwen2", "fp32")], tmp_path_factory.mktemp("lora") / "qwen2_lora", add_lora)
    files = write_adapters(folder, tmp_path_factory.mktemp("adapters"))
    prompt = np.array([5, 6, 7, 8], dtype=np.int32)

    def generate(spec: bool, truth: list[int] | None = None) -> list[int]:
        model, adapters = _loaded(og, folder, files, _static(folder) if static else None)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=60)
        if spec:
            params.set_speculative_options(ngram_size=2, max_draft_tokens=6)
        gen = og.Generator(model, params)
        if spec:
            gen._spec.propose = _Oracle(gen, truth, len(prompt), wrong=1000)
        gen.append_tokens(prompt)
        for _ in range(3):
            gen.generate_next_token()
        gen.set_active_adapter(adapters, "lora")  # in the middle of a round: 4 of its 7 tokens not handed out
        while not gen.is_done():
            gen.generate_next_token()
        return gen.get_sequence(0).tolist()

    plain = _run(og, folder, list(prompt), None, max_length=60)[0]
    want = generate(False)
    assert want[len(prompt):] != plain  # the adapter changes what follows
    assert generate(True, plain) == want


@pytest.mark.parametrize("regex", ["(yes|no|maybe)( (yes|no|maybe))*[.]", "[a-z ]+[.]"], ids=["words", "letters"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_guided_rounds_match_onnxruntime_genai(genai_models, og_ref, arch: str, regex: str) -> None:
    """N-gram decoding under a grammar, as onnxruntime-genai's guided rounds: proposals cut at the first token the
    grammar refuses (or after an end-of-sequence id), no bonus token, and a greedy round keeps the target's
    differing choice at its first position only; the same tokens and counters."""
    pytest.importorskip("llguidance", reason="guidance needs llguidance (pip install crossml[guidance])")
    folder = genai_models[(arch, "fp32")]
    runs = []
    for lib in (og, og_ref):
        model = lib.Model(folder)
        params = lib.GeneratorParams(model)
        params.set_search_options(max_length=80)
        params.set_guidance("regex", regex)
        params.set_speculative_options(ngram_size=2, max_draft_tokens=4)
        gen = lib.Generator(model, params)
        gen.append_tokens(lib.Tokenizer(model).encode("Hello"))
        while not gen.is_done():
            gen.generate_next_token()
        stats = gen.get_speculative_stats()
        runs.append((gen.get_sequence(0).tolist(), {k: stats[k] for k in (*PARITY, "ngram_grammar_candidate_rejections")}))
    assert runs[0] == runs[1]


def test_guided_sampled_rounds_commit_standard_tokens(genai_models) -> None:
    pytest.importorskip("llguidance", reason="guidance needs llguidance (pip install crossml[guidance])")
    folder = genai_models[("qwen2", "fp32")]
    model = og.Model(folder)
    prompt = og.Tokenizer(model).encode("Hello")

    def sampled(spec: dict | None) -> list[int]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=80, do_sample=True, random_seed=5, top_k=8)
        params.set_guidance("regex", "(yes|no|maybe)( (yes|no|maybe))*[.]")
        if spec:
            params.set_speculative_options(**spec)
        gen = og.Generator(model, params)
        gen.append_tokens(prompt)
        while not gen.is_done():
            gen.generate_next_token()
        return gen.get_sequence(0).tolist()

    assert sampled(dict(ngram_size=2, max_draft_tokens=4)) == sampled(None)

"""Speculative decoding of the classic Generator: n-gram or draft-model proposals, verified in one run.

onnxruntime-genai 0.18's two proposers. N-gram decoding (``GeneratorParams.set_speculative_options(ngram_size=N,
...)`` or the ``"speculative"`` section of genai_config.json): the last ``N - 1`` committed tokens are looked up in
the sequence so far (the most recent earlier occurrence), and the tokens that followed it are proposed as a draft of
up to ``K`` tokens. A draft model (a folder of model.type "speculative" whose model.draft names a second decoder
with the target's vocabulary): its own greedy generator holds the committed tokens and decodes ``K`` past them. One decoder run takes the drafts (and the last committed token, whose step had not run yet) and gives the
logits after each of them. The target model chooses each position's token exactly as a standard step would (the
same logits processors, the same random draws, the same grammar); drafts are accepted while they equal those
choices, and the first choice that differs (or the one after the last draft) is committed too. So the tokens are
those of standard decoding, sampled ones included: a round draws once per token it commits, as standard steps do.

A round's tokens are handed out one per ``generate_next_token``. After each the generator is in a standard state
(its sequence, KV length and next logits those of a standard step), so ``get_logits``, ``get_sequence`` and the
rest need nothing special; ``append_tokens``, ``rewind_to`` and ``set_logits`` drop the tokens not handed out yet,
with the random stream and the grammar put back to where the handed-out tokens left them.

Lookup misses run a standard step. ``min_adaptive_k`` adapts the draft width to measured throughput and
``cooldown`` runs one standard step after three rounds at the minimum width accepted nothing, both as
onnxruntime-genai's controllers do; ``get_speculative_stats`` gives its counters, by its names and kinds.

Refused as onnxruntime-genai refuses them: batches, beams, carried layer states, window-sized KV caches, n-gram
decoding beside a draft model. Where onnxruntime-genai verifies a sampled round against a draft model's
probabilities (its tokens then differ from standard sampling's), crossml compares the draft with the target's own
sampled choice, so sampled tokens stay those of standard decoding. An Engine's requests decode without speculation.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
import os
import shutil
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from crossml.genai.errors import ConfigError, GenAIError, SearchOptionError

if TYPE_CHECKING:
    from crossml.genai.generator import Generator

#: the widest draft (onnxruntime-genai's kMaxK)
MAX_K = 16


@dataclass
class SpeculativeOptions:
    """The "speculative" section / ``set_speculative_options``: onnxruntime-genai 0.18's names and defaults."""

    max_draft_tokens: int = 4
    ngram_size: int = 0
    ngram_chained_lookup: bool = False
    min_adaptive_k: int = 0
    cooldown: bool = False


_KINDS: dict[str, type] = {"max_draft_tokens": int, "ngram_size": int, "ngram_chained_lookup": bool,
                           "min_adaptive_k": int, "cooldown": bool}


def coerce(key: str, value: Any, where: str, error: type[GenAIError] = SearchOptionError) -> Any:
    """Check one speculative option (name, kind, range) and return its value; ``error`` names the fix."""
    kind = _KINDS.get(key)
    if kind is None:
        raise error(f"{where}: unknown speculative option '{key}'. Accepted: {', '.join(_KINDS)}")
    if kind is bool:
        if not isinstance(value, (bool, np.bool_)):
            raise error(f"{where}: speculative option '{key}' takes true or false, got {value!r}")
        return bool(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise error(f"{where}: speculative option '{key}' takes a number, got {value!r}")
    if float(value) != int(value):
        raise error(f"{where}: speculative option '{key}' takes a whole number, got {value!r}")
    v = int(value)
    ok = {"max_draft_tokens": 1 <= v <= MAX_K, "ngram_size": v == 0 or 2 <= v <= MAX_K,
          "min_adaptive_k": 0 <= v <= MAX_K}[key]
    if not ok:
        accepted = {"max_draft_tokens": f"1 to {MAX_K}", "ngram_size": f"0 (off) or 2 to {MAX_K}",
                    "min_adaptive_k": f"0 (off) or 1 to {MAX_K}"}[key]
        raise error(f"{where}: speculative option {key}={v} is out of range; accepted: {accepted}")
    return v


def parse_section(section: Any, file: str) -> SpeculativeOptions:
    """genai_config.json's "speculative" object."""
    if not isinstance(section, dict):
        raise ConfigError(f"'{file}': \"speculative\" must be an object, got {section!r}")
    return SpeculativeOptions(**{k: coerce(k, v, f"'{file}' speculative", ConfigError) for k, v in section.items()})


def options_dict(o: SpeculativeOptions) -> dict[str, Any]:
    """``get_speculative_options()``: numbers as floats, as onnxruntime-genai returns them."""
    return {k: (bool(v) if _KINDS[k] is bool else float(v)) for k, v in dataclasses.asdict(o).items()}


#: onnxruntime-genai 0.18's speculative-decoding counters (``get_speculative_stats``), in its order
COUNTS = (
    "rounds completed_rounds interrupted_rounds active_rounds draft_tokens_proposed draft_tokens_evaluated "
    "draft_tokens_accepted correction_tokens bonus_tokens tokens_queued tokens_emitted tokens_discarded "
    "tokens_buffered draft_forward_passes target_forward_passes effective_k adaptive_k_increases adaptive_k_decreases "
    "adaptive_k_observations adaptive_k_probes cooldown_entries cooldown_steps cooldown_remaining "
    "standard_fallback_steps mtp_failures dflash2_failures dflash2_disables dflash2_admission_misses "
    "full_accept_rounds partial_accept_rounds zero_accept_rounds target_verify_forward_passes "
    "target_reanchor_forward_passes target_reconciliation_forward_passes ngram_lookup_hits ngram_lookup_misses "
    "ngram_lookup_tokens_proposed ngram_chained_tokens_proposed ngram_grammar_candidate_rejections "
    "ngram_history_syncs ngram_history_tokens_synced").split()
#: ... and its times and ratios
TIMES = (
    "total_draft_ms total_target_ms total_reconciliation_ms total_target_verify_ms total_target_reanchor_ms "
    "total_ngram_history_sync_ms total_ngram_lookup_ms avg_draft_ms_per_token acceptance_rate "
    "avg_draft_tokens_per_round mean_emitted_tokens_per_round expected_tokens_per_round avg_target_ms_per_round "
    "target_baseline_ms_per_token target_overhead_ratio estimated_speedup observed_speedup "
    "adaptive_k_throughput").split()
#: bins of acceptance_length_histogram (the last takes longer runs)
HISTOGRAM_BINS = 8


def zero_stats() -> dict[str, Any]:
    """The stats of a generator (or Engine) that does no speculative decoding."""
    return {**{k: 0 for k in COUNTS}, "formula_supported": False, **{k: 0.0 for k in TIMES},
            "acceptance_length_histogram": [0] * HISTOGRAM_BINS}


class NGramLookup:
    """Exact lookup over committed tokens: each (N-1)-token key maps to its most recent start; a proposal copies what
    followed the last key's latest earlier occurrence, or (chained) follows key after key through a local context."""

    def __init__(self, ngram_size: int) -> None:
        self.key = ngram_size - 1
        self.history: list[int] = []
        self._at: dict[tuple[int, ...], int] = {}

    def append(self, tokens: list[int]) -> None:
        h, k = self.history, self.key
        for t in tokens:
            h.append(t)
            if len(h) > k:
                start = len(h) - k - 1
                self._at[tuple(h[start:start + k])] = start

    def reset(self, tokens: list[int]) -> None:
        self.history, self._at = [], {}
        self.append(tokens)

    def propose(self, count: int, chained: bool) -> list[int]:
        h, k = self.history, self.key
        if count <= 0 or len(h) < k:
            return []
        context = tuple(h[len(h) - k:])
        start = self._at.get(context)
        if start is None:
            return []
        if not chained:
            follow = start + k
            return h[follow:follow + count]
        out: list[int] = []
        while start is not None and len(out) < count:
            token = h[start + k]
            out.append(token)
            context = context[1:] + (token,)
            start = self._at.get(context)
        return out


class AdaptiveK:
    """onnxruntime-genai's adaptive draft width: smoothed committed tokens per ms and acceptance per width; probes the
    adjacent width when acceptance is low (down) or high (up), keeps a probe that holds throughput and acceptance."""

    ALPHA, HIGH, LOW, KEEP, SEVERE = 0.25, 0.75, 0.50, 0.97, 0.80
    MIN_SAMPLES, PROBE_SAMPLES, AFTER_KEPT, AFTER_REJECTED = 2, 2, 1, 6

    def __init__(self, fixed_k: int, min_adaptive_k: int) -> None:
        self.enabled = min_adaptive_k > 0
        self.min_k = min_adaptive_k if self.enabled else fixed_k
        self.max_k = MAX_K if self.enabled else fixed_k
        self.k = self.min_k
        self.increases = self.decreases = self.observations = self.probes = 0
        self.reset()

    def reset(self) -> None:
        self.k = self.min_k
        self._est: dict[int, list[float]] = {}  # width -> [tokens, ms, acceptance, samples]
        self._origin = 0
        self._probe_obs = self._stable_obs = self._wait = 0

    def _rate(self, k: int) -> float:
        e = self._est.get(k)
        return e[0] / e[1] if e and e[1] > 0 else 0.0

    def throughput(self) -> float:
        """The smoothed committed tokens per ms of the current width (or of the width a probe left)."""
        return self._rate(self.k if self.k in self._est else self._origin)

    def record(self, k: int, evaluated: int, accepted: int, committed: int, filled: bool, ms: float) -> None:
        if not self.enabled or k != self.k or evaluated <= 0 or committed == 0 or not filled or not ms > 0:
            return
        acc = accepted / evaluated
        e = self._est.get(k)
        if e is None:
            e = self._est[k] = [float(committed), ms, acc, 1]
        else:
            e[0] += self.ALPHA * (committed - e[0])
            e[1] += self.ALPHA * (ms - e[1])
            e[2] += self.ALPHA * (acc - e[2])
            e[3] += 1
        self.observations += 1
        if self._origin:
            self._probe_obs += 1
            origin, rate = self._rate(self._origin), self._rate(k)
            if origin > 0 and rate < origin * self.SEVERE:
                self._finish_probe(False)
            elif self._probe_obs >= self.PROBE_SAMPLES:
                self._finish_probe((origin <= 0 or rate >= origin * self.KEEP)
                                   and (self.k < self._origin or e[2] >= self.HIGH))
            return
        self._stable_obs += 1
        if self._wait > 0:
            self._wait -= 1
            return
        if e[3] < self.MIN_SAMPLES:
            return
        if e[2] < self.LOW and self.k > self.min_k:
            self._start_probe(self.k - 1)
        elif e[2] >= self.HIGH and self.k < self.max_k and self._stable_obs >= self.MIN_SAMPLES:
            self._start_probe(self.k + 1)

    def _move(self, k: int) -> None:
        if k > self.k:
            self.increases += 1
        elif k < self.k:
            self.decreases += 1
        self.k = k

    def _start_probe(self, k: int) -> None:
        self._origin, self._probe_obs, self._stable_obs = self.k, 0, 0
        self.probes += 1
        self._move(k)

    def _finish_probe(self, keep: bool) -> None:
        if not keep:
            self._move(self._origin)
        self._origin = self._probe_obs = self._stable_obs = 0
        self._wait = self.AFTER_KEPT if keep else self.AFTER_REJECTED


class Cooldown:
    """onnxruntime-genai's cooldown: three completed rounds in a row at the minimum width that accepted nothing make
    the next step a standard one."""

    THRESHOLD = 3

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.zero_rounds = self.remaining = self.entries = self.steps = 0

    def record(self, k: int, minimum_k: int, evaluated: int, accepted: int) -> None:
        if not self.enabled or evaluated <= 0:
            return
        if accepted > 0 or k != minimum_k:
            self.zero_rounds = 0
            return
        self.zero_rounds += 1
        if self.zero_rounds == self.THRESHOLD:
            self.remaining, self.zero_rounds = 1, 0
            self.entries += 1

    def reset(self) -> None:
        self.zero_rounds = self.remaining = 0


@dataclass
class _Round:
    """A verified round whose tokens are being handed out."""

    start: int  # the sequence length before it
    tokens: collections.deque[int]  # committed tokens not handed out yet
    rows: torch.Tensor  # [k + 1, vocab] float32: the logits before each of its positions
    accepted: int  # drafts accepted (the tokens after them: one correction or bonus)
    evaluated: int
    k: int  # drafts proposed
    filled: bool  # the proposal filled the width asked for (adaptive K learns from those only)
    ms: float  # its proposal + verification time
    emitted: int = 0
    undo: list[Any] = dataclasses.field(default_factory=list)  # per token: the random stream's state before its draw
    guided: int = 0  # tokens committed to the grammar by the round
    interrupted: bool = False  # a token was not appended (an end-of-sequence id)


def check(gen: Generator, o: SpeculativeOptions) -> None:
    """Refuse what n-gram decoding does not cover, naming the option or model field and the fix."""
    s, model = gen._s, gen._model
    if o.ngram_chained_lookup and o.ngram_size == 0:
        raise SearchOptionError("speculative.ngram_chained_lookup requires speculative.ngram_size to enable n-gram "
                                "decoding; set ngram_size (2 to 16) or leave ngram_chained_lookup false")
    where = model.config._file
    if o.ngram_size and model.draft is not None:
        raise SearchOptionError(f"N-gram decoding cannot be combined with the draft model {where} configures "
                                "(model.draft); set ngram_size to 0, or use a model folder without a draft")
    if o.ngram_size == 0 and model.draft is None:
        return
    what = "N-gram decoding" if o.ngram_size else "Speculative decoding with a draft model"
    off = "set_speculative_options(ngram_size=0)" if o.ngram_size else "the target model's own folder"
    if s.batch_size != 1:
        raise SearchOptionError(f"{what} requires batch_size=1 (got {s.batch_size}); run the sequences one by one, "
                                f"or use {off}")
    if s.num_beams != 1:
        raise SearchOptionError(f"{what} does not support beam search (num_beams={s.num_beams}); set num_beams=1 "
                                f"or use {off}")
    if model.draft is not None:
        draft = model.draft
        if draft.config.model.vocab_size != model.config.model.vocab_size or draft.io.state_names:
            raise GenAIError(f"{where}: the draft decoder (model.draft) must be a plain decoder with the target's "
                             f"vocabulary ({model.config.model.vocab_size}), without carried layer states")
        if s.no_repeat_ngram_size:
            raise SearchOptionError("Speculative decoding with a draft model does not support no_repeat_ngram_size "
                                    f"(got {s.no_repeat_ngram_size}); set it to 0")
    why = cannot_verify(model)
    if why:
        raise GenAIError(f"{where}: {what} cannot run on this model: {why}. Use {off}")


def cannot_verify(model: Any, replays: bool = False) -> str:
    """Why ``model``'s decoder cannot verify drafts ('' where it can): a verifying run needs one logits row per
    token, and a KV cache that can be cut back to the committed tokens. ``replays``: carried layer states are put
    back and the accepted tokens run again (``Speculator._replay``; an MTP generator's rounds), not refused."""
    if model.io.state_names and not replays:
        return (f"its decoder carries layer states ({', '.join(model.io.state_names[:2])}, ...), which cannot be "
                "cut back")
    if model.window_layers:
        return "its decoder keeps window-sized KV caches (model.decoder.sliding_window.layers)"
    if not model._logits_per_position:
        return f"its decoder's '{model.io.logits}' output keeps the last position's logits only"
    return ""


class Speculator:
    """The speculative rounds of one Generator, drafted by the n-gram lookup, a draft model or a caller (an Engine
    request's ``set_draft_tokens``); ``Generator.generate_next_token`` calls ``step``."""

    def __init__(self, gen: Generator, options: SpeculativeOptions, given: bool = False) -> None:
        """``given``: the drafts are a caller's (``given``, set per round), not the n-gram lookup's or a draft model's."""
        self.gen = weakref.proxy(gen)  # no cycle: the generator's lent buffers go back to the model when it dies
        self.options = options
        self.ngram = options.ngram_size > 0
        self.lookup = NGramLookup(max(options.ngram_size, 2))
        self.chained = options.ngram_chained_lookup
        self.history: list[int] = []  # the committed tokens, on the host (_sync)
        #: the proposer: (K) -> draft tokens; replaceable (tests drive rounds with known drafts through it)
        self.propose: Callable[[int], list[int]] = (self._given if given or not (self.ngram or gen._model.draft)
                                                     else self._ngram if self.ngram else _Draft(self))
        self.given: list[int] = []  # drafts a caller supplied (an Engine request's set_draft_tokens): one round
        self.adaptive = AdaptiveK(options.max_draft_tokens, options.min_adaptive_k)
        self.cool = Cooldown(options.cooldown)
        self.round: _Round | None = None
        self.synced = 0  # sequence columns the lookup holds
        self.known: list[int] = []  # tokens appended after those, as the host knows them (_sync)
        self.standard = False  # ... followed by the token of a standard step
        self.c = collections.Counter()  # counters named as in COUNTS
        self.t = collections.Counter()  # times (ms)
        self.k_rounds = collections.Counter()  # rounds per width (expected_tokens_per_round)
        self.histogram = [0] * HISTOGRAM_BINS

    # -- the lookup ------------------------------------------------------------------------------
    def _sync(self) -> None:
        g = self.gen
        t0 = time.perf_counter()
        if self.synced > g._len or len(self.history) != self.synced:
            self.synced, self.known, self.standard = 0, [], False
        if self.synced == g._len:
            return
        # the new tokens, from the host where it holds them: a round's handed-out tokens and the token of the
        # standard step since (the copy get_next_tokens waits for anyway); else read from the device
        if self.synced + len(self.known) + self.standard == g._len:
            new = self.known + ([int(g._settle()[0][0])] if self.standard else [])
        else:
            new = g._seq[0, self.synced:g._len].tolist()
        self.known, self.standard = [], False
        if self.synced == 0:
            self.history = list(new)
            if self.ngram:
                self.lookup.reset(new)
        else:
            self.history += new
            if self.ngram:
                self.lookup.append(new)
        self.synced = g._len
        if self.ngram:
            self.c["ngram_history_syncs"] += 1
            self.c["ngram_history_tokens_synced"] += len(new)
            self.t["total_ngram_history_sync_ms"] += (time.perf_counter() - t0) * 1e3

    def _ngram(self, k: int) -> list[int]:
        self._sync()
        t0 = time.perf_counter()
        candidates = self.lookup.propose(k, self.chained)
        out = candidates
        guide = self.gen._guide
        if guide is not None and candidates:  # as onnxruntime-genai: up to the first the grammar refuses, or an end
            n = guide.valid_prefix(candidates)
            eos = next((i for i, t in enumerate(candidates[:n]) if t in self.gen._eos_list), None)
            if eos is not None:
                n = eos + 1
            elif n < len(candidates):
                self.c["ngram_grammar_candidate_rejections"] += 1
            out = candidates[:n]
        self.t["total_ngram_lookup_ms"] += (time.perf_counter() - t0) * 1e3
        self.c["ngram_lookup_hits" if candidates else "ngram_lookup_misses"] += 1
        self.c["ngram_lookup_tokens_proposed"] += len(out)
        if self.chained and len(out) > 1:
            self.c["ngram_chained_tokens_proposed"] += len(out) - 1
        return out

    def _given(self, k: int) -> list[int]:
        out, self.given = self.given[:k], []
        return out

    def forget(self, length: int) -> None:
        """The sequence was cut back to ``length`` columns (rewind_to): the lookup holds no later ones."""
        if self.synced > length:
            self.synced = 0
        self.known, self.standard = [], False

    def _standard(self) -> None:
        """A standard step (a lookup miss, or cooldown)."""
        g = self.gen
        if self.standard:  # two in a row (cooldown): the host holds the first's token
            self.known.append(int(g._settle()[0][0]))
        g._standard_step()
        self.standard = True
        self.c["standard_fallback_steps"] += 1
        self.c["target_forward_passes"] += 1

    # -- a step ---------------------------------------------------------------------------------
    def step(self) -> None:
        """One ``generate_next_token``: the next token of the round being handed out, or a new round (or a
        standard step on a lookup miss, or on cooldown)."""
        g = self.gen
        if self.round is not None:
            self._emit()
            return
        if self.cool.remaining:
            self._standard()
            self.cool.remaining -= 1
            self.cool.steps += 1
            return
        t0 = time.perf_counter()
        budget = self.adaptive.k
        k = min(budget, g._s.max_length - g._len)
        drafts = [int(t) for t in self.propose(k)][:k]
        propose_ms = (time.perf_counter() - t0) * 1e3
        self.t["total_draft_ms"] += propose_ms
        if not drafts:
            self._standard()
            return
        if self.standard:  # a proposer that did not sync (tests' own): the lookup reads the device next time
            self.synced, self.known, self.standard = 0, [], False
        self._verify(drafts, filled=k == budget and len(drafts) == k, propose_ms=propose_ms)
        self._emit()

    def _verify(self, drafts: list[int], filled: bool, propose_ms: float) -> None:
        """Run the drafts (after the pending last token, if its step has not run) in one decoder run, choose each
        position's token as a standard step would, and queue the committed ones."""
        g = self.gen
        L, k = g._len, len(drafts)
        vocab = g._model.config.model.vocab_size
        if g._logits is None and g._kv_len >= L:  # an ended step's logits are gone (see Generator._ready)
            g._ready()
        # the logits before the first draft, when its step already ran (it may have run ahead: a copy, the buffer
        # may be a recorded graph's)
        pos0 = None if g._logits is None else g._logits.float().clone()
        g._live = False
        t0 = time.perf_counter()
        # carried layer states (an MTP generator's Qwen3.5) take every draft in: copied first, put back if one is refused
        first = g._kv_len
        saved = g._states.keep() if g._states.tensors else []
        g._seq[0, L:L + k] = torch.tensor(drafts, dtype=g._seq.dtype).to(g._dev, non_blocking=True)
        g._mask[0, L:L + k] = 1
        g._len = L + k
        g._logits, g._host, g._staged = None, None, None
        g._verifying = g._exact_pieces = True
        try:
            g._forward()
        finally:
            g._verifying = g._exact_pieces = False
        out = g._outputs[g._names[0]]
        # one column on the decode path shows its logits as the float32 copy; a carried-state model's run in pieces
        # selecting rows computes every column's from the lm_head's inputs
        out = out.value() if hasattr(out, "value") else getattr(out, "logits", out)
        width = k + 1 if pos0 is None else k
        rows = out.reshape(-1, out.shape[-1])[-width:].float()
        if pos0 is not None:
            rows = torch.cat([pos0.reshape(1, -1).float(), rows])
        if vocab > 0 and rows.shape[-1] != vocab:
            raise GenAIError(f"speculative decoding: the decoder gives {rows.shape[-1]} logits per row, "
                             f"model.vocab_size is {vocab}")
        self.c["target_forward_passes"] += 1
        self.c["target_verify_forward_passes"] += 1
        # columns past the first draft are the round's to hand out one by one: not in the sequence until then
        g._seq[0, L + 1:L + k] = g._pad
        g._mask[0, L + 1:L + k] = 0
        g._len = L + 1
        tokens, judged, undo, guided = self._choose(rows, drafts, L)
        accepted = next((i for i, (t, d) in enumerate(zip(tokens, drafts)) if t != d), min(len(tokens), k))
        if saved and accepted < k:
            self._replay(saved, first, drafts[:accepted])
        # the token after the accepted drafts: the model's bonus after all of them, else its correction (a guided
        # round has no bonus, and may end on its accepted drafts)
        last = None if len(tokens) == accepted else "bonus_tokens" if accepted == k else "correction_tokens"
        evaluated = min(judged, k)
        verify_ms = (time.perf_counter() - t0) * 1e3
        self.t["total_target_verify_ms"] += verify_ms
        self.t["total_target_ms"] += verify_ms
        c = self.c
        c["rounds"] += 1
        c["draft_tokens_proposed"] += k
        c["draft_tokens_evaluated"] += evaluated
        c["draft_tokens_accepted"] += accepted
        if last:
            c[last] += 1
        c["tokens_queued"] += len(tokens)
        self.k_rounds[k] += 1
        self.round = _Round(L, collections.deque(tokens), rows, accepted, evaluated, k, filled,
                            propose_ms + verify_ms, undo=undo, guided=guided)

    def _replay(self, saved: list[torch.Tensor], first: int, accepted: list[int]) -> None:
        """A draft was refused after a verifying run over columns ``first``.. of a model with carried layer states:
        put back the states of before it and run the committed columns it took in again (the pending token, if it was
        among them, and the ``accepted`` drafts), onnxruntime-genai's snapshot and replay. Their hidden states are
        given again too (an MTP head reads them)."""
        g = self.gen
        L = g._len - 1  # the column of the first draft (the verifying run left the sequence there)
        g._states.put(saved)
        g._cache.rewind(first)
        g._kv_len = first
        stop = L + len(accepted)
        if stop > first:
            g._seq[0, L:stop] = torch.tensor(accepted, dtype=g._seq.dtype).to(g._dev, non_blocking=True)
            g._mask[0, L:stop] = 1
            g._len, g._logits = stop, None
            g._exact_pieces = True
            try:
                g._forward()
            finally:
                g._exact_pieces = False
            self.c["target_forward_passes"] += 1
            self.c["target_reconciliation_forward_passes"] += 1
            g._mask[0, L + 1:stop] = 0
            g._seq[0, L + 1:stop] = g._pad
        g._len, g._logits = L + 1, None

    def _choose(self, rows: torch.Tensor, drafts: list[int], L: int) -> tuple[list[int], int, list[Any], int]:
        """The round's tokens from ``rows`` (position j after drafts[:j]), each chosen as a standard step chooses it:
        the drafts up to the first the model's choice differs from, then its choice there (or its bonus token after
        all of them). Returns (those tokens, positions judged, the random stream's state before each draw, tokens
        committed to the grammar). Plain greedy search: one argmax and one host copy. Otherwise position by
        position through the generator's own selection (penalties, sampling, grammar), the random stream's state
        kept before each draw (``discard`` puts it back) and each token committed to the grammar (up to an
        end-of-sequence id). A guided round is onnxruntime-genai's: no bonus position, and a greedy one keeps the
        model's differing choice at its first position only."""
        g = self.gen
        s = g._s
        k = len(drafts)
        if g._plain():
            if L < s.min_length:
                rows = rows.clone()
                rows[:max(0, min(k + 1, s.min_length - L)), g._eos] = float("-inf")
            best = rows.argmax(-1).tolist()
            n = next((j for j in range(k) if best[j] != drafts[j]), k)
            return drafts[:n] + best[n:n + 1], n + 1, [], 0
        tokens: list[int] = []
        undo: list[Any] = []
        judged = guided = 0
        saved = g._len, g._logits
        eos = set(g._eos_list)
        guide = g._guide
        try:
            for j in range(k if guide is not None else k + 1):
                g._len = L + j
                if j:
                    g._seq[0, L + j - 1] = drafts[j - 1]  # the context a standard step would see
                g._logits = rows[j:j + 1]
                if g._rng is not None:
                    undo.append(g._rng.get_state())
                token = int(g._select()[0])
                judged += 1
                match = j < k and token == drafts[j]
                if guide is not None:
                    if not match and j and not s.do_sample:
                        break
                    tokens.append(token)
                    if token in eos:
                        break
                    guide.commit(np.array([token]), np.array([0]))
                    g._guide_cols.append(L + j)
                    guided += 1
                else:
                    tokens.append(token)
                if not match:
                    break
        finally:
            g._seq[0, L + 1:L + k] = g._pad
            g._len, g._logits = saved
        return tokens, judged, undo, guided

    def _emit(self) -> None:
        """Hand out the round's next token: the generator ends in the state a standard step leaves."""
        g, r = self.gen, self.round
        i = r.emitted
        col = r.start + i
        token = r.tokens.popleft()
        r.emitted += 1
        g._seq[0, col] = token  # columns after the first were cleared after the verifying run
        g._mask[0, col] = 1
        g._len = col + 1
        g._next = torch.tensor([token], dtype=torch.long, device=g._dev)
        g._staged = None
        g._finished_step = False
        ended = token in g._eos_list
        g._host = (np.array([token], dtype=np.int32), ended)
        if i < r.accepted and not ended:  # a draft: its step ran in the round, its logits are the next row
            g._kv_len = col + 1
            g._logits = r.rows[i + 1:i + 2]
        else:  # the round's last token, or an end-of-sequence id: its step runs later (folded into the next round)
            g._kv_len = col
            g._logits = None
        if ended:  # not appended to the sequence: onnxruntime-genai counts it discarded, its round interrupted
            g._done.fill_(True)
            g._unappend()
            self.c["tokens_discarded"] += 1
            r.interrupted = True
        else:
            self.c["tokens_emitted"] += 1
            self.known.append(token)
        if ended or g._len >= g._s.max_length or not r.tokens:
            self._finish()
            if not ended and g._ahead and g._len < g._s.max_length and g._logits is None:
                g._stage(g._kv_len)
                g._forward(ahead=True)  # the last token's step runs ahead, as after a standard step

    def _finish(self) -> None:
        """The round is over: tokens it did not hand out are dropped (an interrupted round), the KV cache is cut to
        the committed columns, and the controllers learn from it."""
        g, r = self.gen, self.round
        self.round = None
        g._cache.rewind(g._kv_len)
        dropped = len(r.tokens)
        if dropped or r.interrupted:
            self.c["tokens_discarded"] += dropped
            self.c["interrupted_rounds"] += 1
            if r.undo and len(r.undo) > r.emitted:
                g._rng.set_state(r.undo[r.emitted])
            if r.guided > r.emitted:
                keep = len(g._guide_cols) - (r.guided - r.emitted)
                g._guide.rewind(keep)
                g._guide_cols = g._guide_cols[:keep]
            return
        self.c["completed_rounds"] += 1
        if r.evaluated > 0:
            key = ("zero_accept_rounds" if r.accepted == 0 else
                   "full_accept_rounds" if r.accepted == r.evaluated else "partial_accept_rounds")
            self.c[key] += 1
        self.histogram[min(r.accepted, HISTOGRAM_BINS - 1)] += 1
        self.cool.record(r.k, self.adaptive.min_k, r.evaluated, r.accepted)
        if g._len < g._s.max_length and self.propose == self._ngram:  # noqa: PLR1714 - a bound method
            self._sync()  # the round's tokens into the lookup now, as onnxruntime-genai's finalization does
        self.adaptive.record(r.k, r.evaluated, r.accepted, r.emitted, r.filled, r.ms)

    def discard(self) -> None:
        """Drop the tokens not handed out yet (before append_tokens, rewind_to, set_logits)."""
        if self.round is not None:
            self._finish()

    def extras_changed(self) -> None:
        """An adapter or model input changed (it applies from the next step): the tokens not handed out yet are
        dropped, and the last handed-out token's step, which the round ran with the old values, runs again (as a
        step that ran ahead does)."""
        g, r = self.gen, self.round
        if r is None:
            return
        self._finish()
        if g._logits is not None and g._kv_len == g._len:
            g._kv_len = g._len - 1
            g._logits, g._staged = None, None
            g._cache.rewind(g._kv_len)

    def reset(self) -> None:
        """rewind_to(0): a new sequence."""
        self.discard()
        self.adaptive.reset()
        self.cool.reset()
        self.synced = 0

    # -- stats ------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        out = zero_stats()
        c, t = self.c, self.t
        out.update({k: int(v) for k, v in c.items()})
        out.update({k: float(v) for k, v in t.items()})
        r = self.round
        out["active_rounds"] = int(r is not None)
        out["tokens_buffered"] = len(r.tokens) if r is not None else 0
        out["effective_k"] = self.adaptive.k
        out["adaptive_k_increases"] = self.adaptive.increases
        out["adaptive_k_decreases"] = self.adaptive.decreases
        out["adaptive_k_observations"] = self.adaptive.observations
        out["adaptive_k_probes"] = self.adaptive.probes
        out["adaptive_k_throughput"] = self.adaptive.throughput()
        out["cooldown_entries"], out["cooldown_steps"] = self.cool.entries, self.cool.steps
        out["cooldown_remaining"] = self.cool.remaining
        out["acceptance_length_histogram"] = list(self.histogram)
        rounds = c["rounds"]
        evaluated = c["draft_tokens_evaluated"]
        a = c["draft_tokens_accepted"] / evaluated if evaluated else 0.0
        out["acceptance_rate"] = a
        if rounds:
            out["formula_supported"] = self.gen._guide is None
            out["avg_draft_ms_per_token"] = (t["total_draft_ms"] / c["draft_tokens_proposed"]
                                             if c["draft_tokens_proposed"] else 0.0)
            out["avg_draft_tokens_per_round"] = c["draft_tokens_proposed"] / rounds
            out["mean_emitted_tokens_per_round"] = c["tokens_emitted"] / rounds
            out["expected_tokens_per_round"] = sum(n * sum(a ** i for i in range(k + 1))
                                                   for k, n in self.k_rounds.items()) / rounds
            out["avg_target_ms_per_round"] = t["total_target_ms"] / rounds
        return out


class _Draft:
    """Drafts from the draft model (model.draft): a greedy generator of its own that holds the committed tokens
    (appended as they come, cut back where they differ), decodes K tokens past them and is rewound to them."""

    def __init__(self, spec: Speculator) -> None:
        from crossml.genai.generator import Generator, GeneratorParams

        self.spec = weakref.proxy(spec)
        g = spec.gen
        params = GeneratorParams(g._model.draft)
        params.set_search_options(max_length=g._s.max_length, do_sample=False, min_length=0, repetition_penalty=1.0,
                                  past_present_share_buffer=g._s.past_present_share_buffer)
        self.gen = Generator(g._model.draft, params, _speculate=False)
        self.gen._short_chunks = True  # its catch-ups are one or two tokens a round
        self.tokens: list[int] = []  # what the draft generator's sequence holds

    def __call__(self, k: int) -> list[int]:
        spec, d = self.spec, self.gen
        spec._sync()
        committed = spec.history
        n = len(self.tokens)
        if committed[:n] != self.tokens:
            n = next(i for i, (a, b) in enumerate(zip(self.tokens, committed)) if a != b)
        if n < d._len:
            d.rewind_to(n)
            self.tokens = self.tokens[:n]
        if len(committed) > n:
            d.append_tokens(np.array(committed[n:], dtype=np.int64))
            self.tokens = list(committed)
            spec.c["draft_forward_passes"] += 1
        out: list[int] = []
        while len(out) < k:
            if d.is_done():  # an end-of-sequence id drafted (not appended): drafting goes on past it
                d.append_tokens(np.array(out[-1:], dtype=np.int64))
            d.generate_next_token()
            out.append(int(d.get_next_tokens()[0]))
            spec.c["draft_forward_passes"] += 1
        d.rewind_to(len(self.tokens))
        return out


def make_folder(dest: str | os.PathLike[str], target: str | os.PathLike[str], draft: str | os.PathLike[str],
                speculative: dict[str, Any] | None = None) -> str:
    """Write a speculative model folder at ``dest``: model.type "speculative", ``target``'s decoder, tokenizer and
    search section, ``draft``'s decoder as model.draft, and ``speculative`` (options) if given. Both folders are
    linked in as ``dest/target`` and ``dest/draft`` (onnxruntime-genai takes no path outside the folder), so the
    result runs on crossml.genai and on onnxruntime-genai alike. Returns ``dest``."""
    dest = os.fspath(dest)
    os.makedirs(dest, exist_ok=True)
    raw = {}
    for name, folder in (("target", target), ("draft", draft)):
        os.symlink(os.path.abspath(folder), os.path.join(dest, name))
        with open(os.path.join(folder, "genai_config.json")) as f:
            raw[name] = json.load(f)
    model = dict(raw["target"]["model"], type="speculative")
    for key, name in (("decoder", "target"), ("draft", "draft")):
        block = copy.deepcopy(raw[name]["model"]["decoder"])
        model[key] = dict(block, filename=f"{name}/{block['filename']}")
    out: dict[str, Any] = {"model": model, "search": raw["target"].get("search", {})}
    if speculative:
        out["speculative"] = speculative
    with open(os.path.join(dest, "genai_config.json"), "w") as f:
        json.dump(out, f, indent=2)
    for name in os.listdir(target):
        if name.startswith("tokenizer") or (name.endswith(".json") and name != "genai_config.json"):
            shutil.copy(os.path.join(target, name), dest)
    return dest

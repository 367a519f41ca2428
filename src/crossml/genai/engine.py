"""og.Engine: onnxruntime-genai 0.18's request engine (Engine, Request, TurnOptions, events) on crossml.

    engine = og.Engine(model)
    request = engine.create_request()                    # one resident conversation
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(64)
    turn = request.begin_turn(tokenizer.encode(prompt), options)
    events = engine.create_event_buffer(16)
    while engine.has_pending_requests():
        for event in engine.run(events):                 # one step of every active request
            if event.flags & og.EngineEventFlags.TOKEN:
                print(event.request is request, event.token)
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                print(event.finish_reason, event.usage.generated_tokens)
    turn = request.begin_turn(tokenizer.encode(next_message))  # the next turn continues the same KV cache

A Request owns a batch-1 ``Generator`` (its KV cache stays resident between turns, every request, however many
there are); a Turn appends its input tokens and generates under its own policy (``TurnOptions``: unset options
take the model's ``search`` defaults, never the previous turn's). ``Engine.run`` either hands out events a
previous run left (the buffer was full) or runs one step of each active request, in the order their turns were
admitted, and hands out one event per request: TOKEN, TOKEN | TURN_FINISHED for a turn's last token, or
TURN_FINISHED alone when the model chose an end-of-sequence id (never appended, as there). The rules follow
onnxruntime-genai's Engine specification: the admission checks of a turn's policy, stop strings (matched on the
text the turn generates, decoded by a fresh TokenizerStream: earliest-ending match first, then the longest, then the
lowest index), the precedence STOP_STRING > MAX_GENERATED_TOKENS > MAX_SESSION_TOKENS, cancellation merged into a
token event not yet handed out, turn ids from 1 per request. Differences: requests run on dynamic batching (a turn
joins the next run, a continuation turn works with any number of requests), so stop strings and per-turn seeds are
accepted (onnxruntime-genai's CPU engine, on static batching, refuses them); a token id outside the vocabulary is
refused by ``begin_turn`` (there it fails the step and the engine); caller-supplied drafts (``set_draft_tokens``)
are verified on the request's own generator (``crossml.genai.speculative``), which steps alone that run; guidance
runs on llguidance (``crossml.genai.guidance``).

On the static decode path (GPUs) requests that get their generators in the same run, three or more, share one set
of decode buffers (``_Batch``): each generator works on its own row, and whenever two or more of them wait for a
decode step the engine runs one batched step for them (``Engine.run``).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import math
import weakref
from typing import Any

import numpy as np
import torch

from crossml.genai import guidance, speculative
from crossml.genai.errors import GenAIError, GeneratorStateError, SearchOptionError
from crossml.genai.generator import Generator, GeneratorParams
from crossml.genai.model import Model

log = logging.getLogger("crossml.genai")

__all__ = ["Engine", "EngineCapabilities", "EngineErrorCode", "EngineEvent", "EngineEventBuffer", "EngineEventFlags",
           "FinishReason", "Request", "RequestOptions", "TurnOptions", "TurnUsage"]

#: requests one ``Engine.run`` steps at most (EngineCapabilities.configured_max_batch_size); the others wait, in
#: admission order, for one of them to finish its turn
MAX_BATCH = 16
#: requests that get their generators in the same run share one set of decode buffers of up to this many rows
#: (a power of two at least their count) on the static decode path (GPUs), so the decode steps of those in the
#: middle of a turn run as one batched step; 1 turns batching off
BATCH_ROWS = 16
#: the fewest requests a new batch is made for (requests joining a batch that holds requests need no minimum); two
#: rows batched gave 1,919 / 1,547 generated tokens/s in all against 1,912 / 2,138 for one request decoding alone,
#: running ahead (H200, Qwen2.5-0.5B-shaped fp16 / int4, results/genai_engine.md)
BATCH_MIN = 3
#: on the CPU (no static decode path of its own) requests are batched too when their session length is at most
#: this (their generators then decode on fixed buffers of that length, as on a GPU, instead of growing KV caches);
#: 0 turns CPU batching off. Qwen2.5-0.5B-shaped int4 on a 2-core host, sessions of 1,024 tokens: 4 / 8 requests
#: 22.0-22.7 / 23.4-23.8 -> 32.9-39.1 / 37.1-40.9 generated tokens/s in all (results/genai_engine_cpu.md)
CPU_BATCH_MAX_LENGTH = 4096
#: stop strings of a turn: at most this many, of at most STOP_BYTES UTF-8 bytes together (as onnxruntime-genai)
MAX_STOP_STRINGS, STOP_BYTES = 16, 16 * 1024


class FinishReason(enum.IntEnum):
    NONE = 0
    EOS = 1
    STOP_STRING = 2
    MAX_GENERATED_TOKENS = 3
    MAX_SESSION_TOKENS = 4
    CANCELLED = 5
    FAILED = 6


class EngineEventFlags(enum.IntFlag):
    NONE = 0
    TOKEN = 1
    TURN_FINISHED = 2
    CAPACITY_BLOCKED = 4
    FAILED = 8
    RETRYABLE = 16


class EngineErrorCode(enum.IntEnum):
    NONE = 0
    CAPACITY_DEFERRED = 1
    EXECUTION_CAPACITY_EXCEEDED = 2
    RETRYABLE_EXECUTION = 3
    REQUEST_UNSERVICEABLE = 4
    ENGINE_CONTRACT_FAILURE = 5
    ENGINE_EXECUTION_FAILURE = 6


@dataclasses.dataclass(frozen=True)
class TurnUsage:
    """A finished turn's counts (zeros on events that do not finish a turn): the input ids its begin_turn took,
    the tokens it generated (an end-of-sequence id is not one), and cached prompt tokens (always 0)."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_prompt_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class EngineCapabilities:
    """``configured_max_batch_size``: requests one run steps; ``max_request_length`` and ``max_scheduled_tokens``:
    0, no limit beyond each request's session length."""

    configured_max_batch_size: int
    max_request_length: int = 0
    max_scheduled_tokens: int = 0


@dataclasses.dataclass
class EngineEvent:
    """One event of ``Engine.run``: read ``token`` only when ``flags`` has TOKEN (it is None otherwise), the
    terminal fields when it has TURN_FINISHED. ``request`` is the Request object itself (compare with ``is``)."""

    flags: EngineEventFlags
    request: Request | None
    turn_id: int
    token: int | None = None
    finish_reason: FinishReason = FinishReason.NONE
    matched_stop_string_index: int | None = None
    error_code: EngineErrorCode = EngineErrorCode.NONE
    usage: TurnUsage = TurnUsage()


class EngineEventBuffer:
    """Reusable storage for up to ``capacity`` events of one Engine; after ``Engine.run`` a sequence over them."""

    def __init__(self, engine: Engine, capacity: int) -> None:
        self._engine = weakref.ref(engine)
        self.capacity = capacity
        self._events: list[EngineEvent] = []

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, index: int) -> EngineEvent:
        return self._events[index]

    def __iter__(self):
        return iter(self._events)


def _count(value: Any, what: str) -> int:
    """A non-negative integer option (onnxruntime-genai takes these as unsigned)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise SearchOptionError(f"{what} takes an integer >= 0, got {value!r}")
    return int(value)


class RequestOptions:
    """og.RequestOptions(): ``set_max_session_tokens(n)``, the request's whole length (every turn's input and
    generated tokens); 0 (the default) is the model's search.max_length, which is also the ceiling."""

    def __init__(self) -> None:
        self.max_session_tokens = 0

    def set_max_session_tokens(self, value: int) -> None:
        self.max_session_tokens = _count(value, "RequestOptions.set_max_session_tokens")


class TurnOptions:
    """og.TurnOptions(request): one turn's generation policy, bound to ``request``. Every option starts unset, and
    unset means the model's ``search`` default for that turn (``min_generated_tokens``: none;
    ``max_generated_tokens``: only the session limit; seed: the request's stream goes on; no stop strings)."""

    def __init__(self, request: Request) -> None:
        if not isinstance(request, Request):
            raise TypeError(f"TurnOptions takes the Request it is for, got {type(request).__name__}")
        request._check_open()
        self._request = weakref.ref(request)
        self.reset()

    def reset(self) -> None:
        """Every option back to unset."""
        self._values: dict[str, Any] = {}
        self._seed: int | None = None
        self._stop: list[str] = []
        self._guidance: tuple[str, str] | None = None

    def set_max_generated_tokens(self, value: int) -> None:
        """Cap on the tokens this turn generates; 0 unsets it."""
        self._values["max_generated_tokens"] = _count(value, "set_max_generated_tokens")

    def set_min_generated_tokens(self, value: int) -> None:
        """End-of-sequence ids are banned until the turn has generated this many tokens; 0 unsets it."""
        self._values["min_generated_tokens"] = _count(value, "set_min_generated_tokens")

    def set_do_sample(self, value: bool) -> None:
        self._values["do_sample"] = bool(value)

    def set_temperature(self, value: float) -> None:
        self._values["temperature"] = float(value)

    def set_top_p(self, value: float) -> None:
        self._values["top_p"] = float(value)

    def set_top_k(self, value: int) -> None:
        self._values["top_k"] = int(value)

    def set_repetition_penalty(self, value: float) -> None:
        self._values["repetition_penalty"] = float(value)

    def set_no_repeat_ngram_size(self, value: int) -> None:
        """0 turns n-gram blocking off for this turn (it does not unset the option)."""
        self._values["no_repeat_ngram_size"] = int(value)

    def set_seed(self, value: int) -> None:
        """Reseed the request's random stream at the start of this turn (0 is a seed; ``clear_seed`` unsets)."""
        value = _count(value, "set_seed")
        if value >= 1 << 64:
            raise SearchOptionError(f"set_seed takes a 64-bit unsigned seed, got {value}")
        self._seed = value

    def clear_seed(self) -> None:
        self._seed = None

    def set_stop_strings(self, strings: list[str]) -> None:
        """Decoded text that ends the turn once the generated text contains it (FinishReason.STOP_STRING); an empty
        list clears them. At most 16 non-empty strings of 16 KiB in all; the token that completes a match is kept."""
        strings = list(strings)
        for i, s in enumerate(strings):
            if not isinstance(s, str):
                raise TypeError(f"Stop string at index {i} is {type(s).__name__}, not str.")
            if "\0" in s:
                raise ValueError("Stop strings must not contain an embedded NUL byte.")
            if not s:
                raise SearchOptionError(f"Stop string at index {i} is empty.")
        if len(strings) > MAX_STOP_STRINGS:
            raise SearchOptionError(f"Too many stop strings: {len(strings)}, the maximum is {MAX_STOP_STRINGS}.")
        size = sum(len(s.encode("utf-8")) for s in strings)
        if size > STOP_BYTES:
            raise SearchOptionError(f"Stop strings total {size} bytes, the maximum is {STOP_BYTES}.")
        self._stop = strings

    def set_guidance(self, guidance_type: str, guidance_data: str) -> None:
        """Constrain this turn's tokens to a grammar (json_schema, regex or lark_grammar; ``crossml.genai.guidance``,
        needs llguidance), compiled when the turn is admitted. Never inherited by the next turn."""
        if not guidance.check_request(guidance_type, guidance_data):
            raise SearchOptionError("Guidance type and data must be provided together.")
        self._guidance = (str(guidance_type), str(guidance_data))

    def clear_guidance(self) -> None:
        self._guidance = None


@dataclasses.dataclass
class _Policy:
    """A turn's resolved generation policy."""

    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    no_repeat_ngram_size: int
    max_generated: int  # 0: no cap
    min_generated: int
    seed: int | None
    stop: list[str]
    guide: Any = None  # crossml.genai.guidance.Guide of the turn's grammar


def _resolve(options: TurnOptions | None, model: Model) -> _Policy:
    """The turn's policy from its options over the model's search defaults, checked as onnxruntime-genai's
    admission checks it (nothing about the request changes before this passes)."""
    d = model.config.search
    v = options._values if options is not None else {}
    get = lambda key: v.get(key, getattr(d, key))  # noqa: E731
    temperature, top_k, top_p = get("temperature"), get("top_k"), get("top_p")
    rep, ngram = get("repetition_penalty"), get("no_repeat_ngram_size")
    if not math.isfinite(temperature) or temperature < 0:
        raise SearchOptionError(f"temperature ({temperature}) must be finite and >= 0 (0 selects the top logit)")
    if not 0.0 <= top_p <= 1.0:
        raise SearchOptionError(f"top_p ({top_p}) must be between 0.0 and 1.0")
    if top_k < 0:
        raise SearchOptionError(f"top_k ({top_k}) must be >= 0 (0: no top-k filter)")
    if not math.isfinite(rep) or rep <= 0:
        raise SearchOptionError(f"repetition_penalty ({rep}) must be finite and greater than zero")
    if ngram < 0:
        raise SearchOptionError(f"no_repeat_ngram_size ({ngram}) must be >= 0 (0: no n-gram blocking)")
    do_sample = get("do_sample")
    if not do_sample:
        against = [k for k, bad in (("temperature", "temperature" in v and temperature not in (0.0, 1.0)),
                                    ("top_p", "top_p" in v and 0.0 < top_p < 1.0),
                                    ("top_k", "top_k" in v and top_k > 1)) if bad]
        if against:
            raise SearchOptionError(
                "The resolved turn policy selects the top logit (do_sample is false), so these explicitly set "
                f"sampling options contradict it: {', '.join(against)}. Either remove them or request sampling with "
                "do_sample=true, top_k != 1, and a nonzero temperature.")
    else:
        if v.get("do_sample") and "top_k" not in v and "temperature" not in v and (top_k == 1 or temperature == 0):
            cause = f"search.top_k={top_k}" if top_k == 1 else f"search.temperature={temperature:g}"
            raise SearchOptionError(f"do_sample=true is overridden by the model's {cause}, which selects the top "
                                    "logit; set a top_k above 1 or a nonzero temperature on the TurnOptions to sample")
        if top_k == 0 and top_p == 0.0:
            raise SearchOptionError("A sampled turn requires a positive top_k or a positive top_p; both are 0.")
        vocab = model.config.model.vocab_size
        if vocab and top_k > vocab:
            origin = "" if "top_k" in v else " (the model's search.top_k; set top_k on the TurnOptions)"
            raise SearchOptionError(f"top_k ({top_k}) must be less than or equal to vocab_size ({vocab}){origin}.")
    greedy = not do_sample or top_k == 1 or temperature == 0
    mx, mn = v.get("max_generated_tokens", 0), v.get("min_generated_tokens", 0)
    if mx and mn > mx:
        raise SearchOptionError(f"min_generated_tokens ({mn}) must not exceed max_generated_tokens ({mx}).")
    guide = None
    if options is not None and options._guidance is not None:  # compiled now: a bad grammar changes nothing
        guide = guidance.Guide(model, *options._guidance, 1)
    return _Policy(do_sample=not greedy, temperature=temperature if not greedy else 1.0, top_k=top_k,
                   top_p=0.0 if top_p == 1.0 else top_p, repetition_penalty=rep, no_repeat_ngram_size=ngram,
                   max_generated=mx, min_generated=mn, seed=options._seed if options is not None else None,
                   stop=list(options._stop) if options is not None else [], guide=guide)


class _StopMatcher:
    """Matches a turn's stop strings on the text it generates (a fresh TokenizerStream from its first token)."""

    def __init__(self, strings: list[str], tokenizer: Any) -> None:
        self._strings, self._stream, self._text = strings, tokenizer.create_stream(), ""

    def push(self, token: int) -> int | None:
        """The index of the stop string the token completes, or None: of those ending in its text the
        earliest-ending, then the earliest-starting (longest), then the lowest index."""
        before = len(self._text)
        self._text += self._stream.decode(token)
        best = None
        for i, s in enumerate(self._strings):
            at = self._text.find(s, max(0, before - len(s) + 1))
            if at >= 0:
                key = (at + len(s), at, i)
                best = key if best is None or key < best else best
        return None if best is None else best[2]


class _Turn:
    def __init__(self, turn_id: int, start: int, tokens: np.ndarray, policy: _Policy) -> None:
        self.id, self.start, self.tokens, self.policy = turn_id, start, tokens, policy
        self.generated = 0
        self.fed = False  # its input tokens are in the generator
        self.stop: _StopMatcher | None = None


class _Batch:
    """Decode buffers of ``rows`` rows shared by up to that many requests (each request's generator decodes on its
    row, ``DecodeBuffers.row_view``), and the batched decode step over the rows whose last token is not in their KV
    cache yet: one run of the decoder over every row (a recorded graph on a GPU), each waiting row fed its last token
    and position, then each of them handed its logits row (``Generator._decoded``). A row not in the step gets a
    scratch mask cell at its sequence's end for the run, so the key and value the run writes for it land where its
    sequence has nothing yet."""

    def __init__(self, model: Model, rows: int, max_length: int) -> None:
        from crossml.genai.kv_cache import StaticKVCache
        from crossml.genai.model import DecodeBuffers

        self.model, self.max_length = model, max_length
        io = model.io
        self.bufs = DecodeBuffers(io, rows, max_length, model.kv_shapes(max_length), model.device)
        self.bufs.seq = torch.zeros((rows, max_length), dtype=torch.long, device=model.device)
        #: each row as a set of one row, kept with its recordings (decode step, prompt buckets) for the row's next
        #: request
        self.views = [self.bufs.row_view(r) for r in range(rows)]
        self.requests: list[Request | None] = [None] * rows
        self._cache = StaticKVCache(io.past_names, io.present_names, rows, [], io.kv_dtype, model.device,
                                    self.bufs.kv)
        self._names = [io.logits, *io.present_names]

    def place(self, request: Request) -> int | None:
        """A free row for ``request`` (its mask zeroed), or None."""
        for row, held in enumerate(self.requests):
            if held is None:
                self.requests[row] = request
                self.bufs.mask[row].zero_()
                return row
        return None

    def release(self, request: Request) -> None:
        self.requests = [None if r is request else r for r in self.requests]

    def step(self, waiting: list[Request]) -> set[int]:
        """One decoder run over every row; ``waiting``: the requests (of this batch) whose last token it feeds.
        Rows on plain greedy search take their tokens here, in a few batched operations and one copy to the host
        (``Generator._chosen``); the others get their logits row (``Generator._decoded``) and choose as their
        generators do. Returns the ids of the requests whose tokens were chosen."""
        bufs, io = self.bufs, self.model.io
        rows = len(self.requests)
        fed = {id(r) for r in waiting}
        ids, pos = [0] * rows, [0] * rows
        scratch_rows, scratch_cols = [], []
        for row, request in enumerate(self.requests):
            gen = request._gen if request is not None else None
            length = gen._len if gen is not None else 0
            if id(request) in fed:
                ids[row], pos[row] = request._last, length - 1
            elif length < self.max_length:
                scratch_rows.append(row)
                scratch_cols.append(length)
                pos[row] = length
        device = bufs.ids.device
        bufs.ids.copy_(torch.tensor(ids, dtype=bufs.ids.dtype).view(rows, 1).to(device, non_blocking=True))
        if bufs.pos is not None:
            bufs.pos.copy_(torch.tensor(pos, dtype=bufs.pos.dtype).view(rows, 1).expand(bufs.pos.shape)
                           .to(device, non_blocking=True))
        cells = (torch.tensor(scratch_rows, device=device), torch.tensor(scratch_cols, device=device))
        if scratch_rows:
            bufs.mask[cells] = 1
        feed = {io.input_ids: bufs.ids}
        if io.attention_mask is not None:
            feed[io.attention_mask] = bufs.mask
        if io.position_ids is not None:
            feed[io.position_ids] = bufs.pos
        feed.update(self._cache.feed())
        outs = self.model.run_bound(bufs, feed, self._names)
        self._cache.update(outs[1:])
        if scratch_rows:
            bufs.mask[cells] = 0
        logits = outs[0].reshape(rows, -1)
        fast: list[tuple[int, Request]] = []
        for row, request in enumerate(self.requests):
            if id(request) in fed:
                if request._gen._plain():
                    fast.append((row, request))
                else:
                    request._gen._decoded(logits[row:row + 1])
        if fast:
            self._choose(logits, fast)
        return {id(r) for _, r in fast}

    def _choose(self, logits: torch.Tensor, fast: list[tuple[int, Request]]) -> None:
        """Greedy tokens of the ``fast`` rows: their end-of-sequence ids banned below each one's min_length, the
        argmax, the tokens written into the rows' sequences and masks, one copy of tokens and ended flags to the
        host, then each generator told (``Generator._chosen``)."""
        gen0 = fast[0][1]._gen
        device = logits.device
        rows = torch.tensor([row for row, _ in fast], device=device)
        cols = torch.tensor([r._gen._len for _, r in fast], device=device)
        scores = logits.index_select(0, rows).float()
        banned = [i for i, (_, r) in enumerate(fast) if r._gen._len < r._gen._s.min_length]
        if banned:
            scores[torch.tensor(banned, device=device)[:, None], gen0._eos[None, :]] = float("-inf")
        tokens = scores.argmax(-1)
        self.bufs.seq[rows, cols] = tokens
        self.bufs.mask[rows, cols] = 1
        both = torch.cat([tokens, torch.isin(tokens, gen0._eos).long()]).cpu().numpy()
        n = len(fast)
        for i, (_, request) in enumerate(fast):
            request._gen._chosen(int(both[i]), bool(both[n + i]), tokens[i:i + 1])


def _acquire_batch(model: Model, rows: int, max_length: int) -> _Batch:
    """A free ``_Batch`` of the model's with at least ``rows`` rows (the fewest; an earlier Engine's, with its
    recordings) or a new one of ``rows`` rows."""
    pool = model.__dict__.setdefault("_engine_batches", [])
    fits = [b for b in pool if b.max_length == max_length and len(b.requests) >= rows]
    if fits:
        batch = min(fits, key=lambda b: len(b.requests))
        pool.remove(batch)
        return batch
    return _Batch(model, rows, max_length)


def _release_engine(model: Model, batches: list[_Batch], requests: weakref.WeakSet) -> None:
    """An Engine is gone: its requests are closed, its batches go back to the model for the next Engine."""
    for request in list(requests):
        request._closed, request._turn, request._gen, request._batch = True, None, None, None
    for batch in batches:
        batch.requests = [None] * len(batch.requests)
        model.__dict__.setdefault("_engine_batches", []).append(batch)


def _batchable(model: Model) -> bool:
    """Whether an Engine batches this model's decode steps (``_Batch``): the static decode path (or the CPU, for
    sessions up to CPU_BATCH_MAX_LENGTH), and KV caches alone
    (no carried layer states, which a run advances for every row; no window-sized caches; no inputs beside ids, mask,
    positions and KV)."""
    io = model.io
    return (BATCH_ROWS > 1 and (model._static_decode or CPU_BATCH_MAX_LENGTH > 0)
            and model.config.search.past_present_share_buffer
            and not model.window_layers and not io.state_names and not io.required)


class Request:
    """One resident conversation of an Engine (``Engine.create_request``): turns begin with ``begin_turn`` once
    the previous one finished; ``close`` releases it."""

    def __init__(self, engine: Engine, options: RequestOptions | None) -> None:
        self._engine = weakref.ref(engine)
        ceiling = engine._ceiling
        limit = options.max_session_tokens if options is not None else 0
        if limit > ceiling:
            raise GenAIError(f"max_session_tokens ({limit}) must be greater than zero and no greater than the "
                             f"model-configured search.max_length ({ceiling}).")
        self._limit = limit or ceiling
        self._gen: Generator | None = None
        self._turns: list[_Turn] = []  # completed turns and the current one, in order
        self._turn: _Turn | None = None  # the active turn
        self._next_id = 1
        self._closed = False
        self._failed: str | None = None
        self._batch: _Batch | None = None  # the shared decode buffers its generator decodes on, if any
        self._row = 0
        self._last = 0  # the last token it generated (what a batched step feeds)
        self._drafts: list[int] = []  # set_draft_tokens' proposal for the next step

    # -- state --------------------------------------------------------------------------------
    def _check_open(self) -> Engine:
        engine = self._engine()
        if self._closed or engine is None:
            raise GeneratorStateError("Cannot use a closed request." if self._closed else
                                      "Cannot use a request whose engine has been destroyed.")
        return engine

    def _length(self) -> int:
        return self._gen.token_count() if self._gen is not None else 0

    # -- turns --------------------------------------------------------------------------------
    def begin_turn(self, tokens: Any, turn_options: TurnOptions | None = None) -> int:
        """Admit a turn: ``tokens`` (one-dimensional ids) are appended to the conversation and the turn generates
        under ``turn_options``' policy from the next ``Engine.run``. Returns the turn id (1, 2, ... per request)."""
        engine = self._check_open()
        if self._failed is not None:
            raise GeneratorStateError(f"Cannot continue a request whose turn failed ({self._failed}); close it and "
                                      "create a new request")
        if self._turn is not None:
            raise GeneratorStateError("BeginTurn is only valid for a new request or after the current turn is "
                                      f"complete (turn {self._turn.id} is still active; cancel_turn({self._turn.id}) "
                                      "ends it).")
        if any(e.request is self for e in engine._retained):
            raise GeneratorStateError("BeginTurn: this request still has events to hand out; drain them with "
                                      "Engine.run first.")
        if turn_options is not None and (not isinstance(turn_options, TurnOptions)
                                         or turn_options._request() is not self):
            raise GenAIError("Turn options belong to a different or destroyed Request.")
        arr = np.asarray(tokens.as_numpy() if hasattr(tokens, "as_numpy") else tokens)
        if arr.ndim != 1:
            raise ValueError(f"tokens must be a one-dimensional array, got shape {arr.shape}.")
        if arr.size == 0:
            raise ValueError("Expected at least one input token for generation. Received 0.")
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"tokens must be integer token ids, got {arr.dtype}")
        vocab = engine._model.config.model.vocab_size
        if vocab > 0 and ((arr < 0) | (arr >= vocab)).any():
            at = int(np.flatnonzero((arr < 0) | (arr >= vocab))[0])
            raise ValueError(f"begin_turn: token id {int(arr[at])} (position {at}) is outside the vocabulary: ids "
                             f"must be within [0, {vocab}) (model.vocab_size in genai_config.json)")
        policy = _resolve(turn_options, engine._model)
        length = self._length()
        if length + arr.size >= self._limit:
            raise GeneratorStateError(
                f"Appending input_tokens_count ({arr.size}) to current_sequence_length ({length}) must leave room for "
                f"at least one generated token before max_session_tokens ({self._limit}).")
        turn = _Turn(self._next_id, length, arr.astype(np.int32), policy)
        if policy.stop:
            turn.stop = _StopMatcher(policy.stop, engine._tokenizer())
        self._next_id += 1
        self._turn = turn
        self._turns.append(turn)
        engine._queue.append(self)
        return turn.id

    def cancel_turn(self, turn_id: int) -> bool:
        """End turn ``turn_id`` if it is the active one (its tokens so far stay; a TURN_FINISHED event with reason
        CANCELLED follows, merged into this turn's last token event if that is not handed out yet): True;
        False for a finished, stale or unknown id."""
        engine = self._check_open()
        if not self._turns:
            raise GeneratorStateError("Cannot cancel a request before a turn has begun.")
        turn = self._turn
        if turn is None or turn.id != int(turn_id):
            return False
        engine._finish(self, turn, FinishReason.CANCELLED, merge=True)
        return True

    def rewind_to_start_of_turn(self, turn_id: int) -> None:
        """Rewind a completed request to where it stood before turn ``turn_id`` began (that turn's input and
        everything after it are dropped; the next turn continues from there)."""
        self._check_open()
        if self._turn is not None or not self._turns:
            raise GeneratorStateError("Request rewind is only valid after the current turn is complete.")
        at = next((i for i, t in enumerate(self._turns) if t.id == int(turn_id)), None)
        if at is None:
            ids = ", ".join(str(t.id) for t in self._turns)
            raise GeneratorStateError(f"rewind_to_start_of_turn({turn_id}): the request has no such turn; its turns "
                                      f"are {ids}")
        start = self._turns[at].start
        if self._gen is not None and start < self._gen.token_count():
            self._gen.rewind_to(start)
        del self._turns[at:]

    def set_draft_tokens(self, tokens: Any) -> None:
        """Propose the continuation ``tokens`` (int32 ids, at most ``Engine.max_draft_tokens_per_proposal()``) for
        this request's next step: one decoder run verifies them, and the drafts that equal the model's greedy
        choices are committed, then the model's own next token; the run hands out one TOKEN event for each. For a
        turn in progress whose first token event is out (its prompt has run), with greedy choice and no
        penalties or grammar. The proposal belongs to the current turn: a turn limit or stop string inside it
        ends the turn there, and cancelling the turn drops it."""
        engine = self._check_open()
        turn = self._turn
        if turn is None or turn.generated == 0:
            raise GeneratorStateError("set_draft_tokens: the request has no turn whose prompt has run; propose drafts "
                                      "after run has handed out the turn's first token event")
        arr = np.asarray(tokens)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"set_draft_tokens takes a 1-D array of integer token ids, got {arr.dtype} {arr.shape}")
        cap = engine.max_draft_tokens_per_proposal()
        if cap == 0:
            raise GenAIError(f"set_draft_tokens: this model cannot verify drafts (max_draft_tokens_per_proposal() is 0: "
                             f"{speculative.cannot_verify(engine._model)})")
        if arr.size > cap:
            raise ValueError(f"set_draft_tokens: {arr.size} drafts; at most max_draft_tokens_per_proposal() = {cap}")
        vocab = engine._model.config.model.vocab_size
        if arr.size and vocab > 0 and ((arr < 0) | (arr >= vocab)).any():
            bad = int(arr[(arr < 0) | (arr >= vocab)][0])
            raise ValueError(f"set_draft_tokens: token id {bad} is outside the vocabulary [0, {vocab})")
        p = turn.policy
        if p.do_sample or p.repetition_penalty != 1.0 or p.no_repeat_ngram_size or p.guide is not None:
            raise GenAIError("set_draft_tokens: drafts are verified greedily; this turn samples or has a repetition "
                             "penalty, no_repeat_ngram_size or a grammar (TurnOptions), which a proposal does not take")
        self._drafts = [int(t) for t in arr]

    def _speculate(self) -> None:
        """The step verifies this request's drafts: a one-round speculator on its generator (kept until the round's
        tokens are handed out), the drafts cut to what the turn and session can still take."""
        drafts, self._drafts = self._drafts, []
        gen, turn = self._gen, self._turn
        room = min(turn.policy.max_generated - turn.generated if turn.policy.max_generated else len(drafts) + 1,
                   self._limit - gen.token_count()) - 1  # the round commits one token past its drafts
        drafts = drafts[:max(room, 0)]
        if drafts:
            spec = speculative.Speculator(gen, speculative.SpeculativeOptions(max_draft_tokens=speculative.MAX_K),
                                          given=True)
            spec.given = drafts
            gen._spec = spec

    def close(self) -> None:
        """Remove the request from scheduling, drop its events not handed out yet and release its KV cache."""
        if self._closed:
            return
        engine = self._engine()
        if engine is not None:
            engine._forget(self)
        if self._batch is not None:
            self._batch.release(self)
        self._closed, self._turn, self._gen, self._batch = True, None, None, None

    # -- one step (Engine.run) ------------------------------------------------------------------
    def _generator(self, engine: Engine) -> Generator:
        if self._gen is None:
            params = GeneratorParams(engine._model)
            params.set_search_options(max_length=self._limit, min_length=0, batch_size=1, num_beams=1,
                                      do_sample=False)
            if self._batch is not None:  # its row of shared buffers; the batched steps replace running ahead
                self._gen = Generator(engine._model, params, _buffers=self._batch.views[self._row], _run_ahead=False,
                                      _speculate=False)
            else:
                self._gen = Generator(engine._model, params, _speculate=False)
            if engine._seed >= 0:  # the model's search.random_seed starts every request's stream
                self._gen._reseed(engine._seed)
        return self._gen

    def _launch(self, engine: Engine) -> None:
        """Start this request's step: the turn's input on its first step, then the token choice (on a GPU the
        device works on while the other requests' steps are launched)."""
        turn = self._turn
        gen = self._generator(engine)
        p = turn.policy
        if not turn.fed:
            gen._set_policy(do_sample=p.do_sample, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                            repetition_penalty=p.repetition_penalty, no_repeat_ngram_size=p.no_repeat_ngram_size,
                            min_length=turn.start + turn.tokens.size + p.min_generated, seed=p.seed)
            gen._set_guide(p.guide)  # a turn's grammar or none: never the previous turn's
            gen.append_tokens(turn.tokens)
            turn.fed = True
        if self._drafts:
            self._speculate()
        gen.generate_next_token()

    def _collect(self, engine: Engine) -> None:
        """Read the step's token (the host waits for it here) and retain its event."""
        turn, gen = self._turn, self._gen
        tokens, ended = gen._settle()
        if ended:  # the row chose an end-of-sequence id, which is not appended
            engine._finish(self, turn, FinishReason.EOS)
            self._end_round(engine)
            return
        token = int(tokens[0])
        self._last = token
        turn.generated += 1
        reason, matched = FinishReason.NONE, None
        if turn.stop is not None and (matched := turn.stop.push(token)) is not None:
            reason = FinishReason.STOP_STRING
        elif turn.policy.max_generated and turn.generated >= turn.policy.max_generated:
            reason = FinishReason.MAX_GENERATED_TOKENS
        elif gen.token_count() >= self._limit:
            reason = FinishReason.MAX_SESSION_TOKENS
        engine._retained.append(EngineEvent(EngineEventFlags.TOKEN, self, turn.id, token=token))
        if reason != FinishReason.NONE:
            engine._finish(self, turn, reason, matched=matched, merge=True)
        elif gen._spec is not None and gen._spec.round is not None:  # a verified round: its next token
            gen.generate_next_token()
            self._collect(engine)
            return
        self._end_round(engine)

    def _end_round(self, engine: Engine) -> None:
        """After a step: a round's tokens the turn did not take are dropped, and its speculator's counters go to
        the engine's stats."""
        gen = self._gen
        spec = gen._spec if gen is not None else None
        if spec is None:
            return
        spec.discard()
        engine._spec_counts.update(spec.c)
        gen._spec = None


def _attempt(part: Any, engine: Engine) -> Exception | None:
    try:
        part(engine)
    except Exception as exc:  # noqa: BLE001 - a request's failure is its turn's event
        return exc
    return None


class Engine:
    """og.Engine(model): runs the turns of any number of Requests, one step of each active one per ``run``."""

    def __init__(self, model: Model) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"Engine takes an og.Model, got {type(model).__name__}")
        s = model.config.search
        where = f"{model.config._file}"
        overlay = "overlay it on the Config before creating the Model, e.g. config.overlay('{{\"search\": {{{}}}}}')"
        if s.num_beams != 1:
            raise GenAIError(f"{where}: search.num_beams is {s.num_beams}; the Engine decodes one beam per request: "
                             + overlay.format('"num_beams": 1'))
        if s.min_length != 0:
            raise GenAIError(f"{where}: search.min_length is {s.min_length}, a whole-session floor; the Engine's "
                             "minimum is per turn (TurnOptions.set_min_generated_tokens): "
                             + overlay.format('"min_length": 0'))
        self._model = model
        self._ceiling = s.max_length or model.config.model.context_length
        if self._ceiling <= 0:
            raise GenAIError(f"{where}: search.max_length must be greater than zero")
        self._seed = s.random_seed
        self._queue: list[Request] = []  # requests with an active turn, in admission order
        self._retained: list[EngineEvent] = []  # events not handed out yet, in order
        self._spec_counts: collections.Counter[str] = collections.Counter()  # verified drafts' rounds
        self._tok: Any = None
        self._batches: list[_Batch] = []
        self._requests: weakref.WeakSet = weakref.WeakSet()
        weakref.finalize(self, _release_engine, model, self._batches, self._requests)

    def _tokenizer(self) -> Any:
        if self._tok is None:
            from crossml.genai.tokenizer import Tokenizer

            self._tok = Tokenizer(self._model)
        return self._tok

    def get_capabilities(self) -> EngineCapabilities:
        return EngineCapabilities(configured_max_batch_size=MAX_BATCH)

    def max_draft_tokens_per_proposal(self) -> int:
        """How many drafts ``Request.set_draft_tokens`` takes: 16 where the decoder gives every position's logits
        and its caches can be cut back; 0 otherwise (carried layer states, window-sized caches)."""
        return 0 if speculative.cannot_verify(self._model) else speculative.MAX_K

    def get_speculative_stats(self) -> dict[str, Any]:
        """onnxruntime-genai's speculative counters over the rounds that verified requests' drafts."""
        out = speculative.zero_stats()
        out.update({k: int(v) for k, v in self._spec_counts.items() if k in out})
        evaluated = out["draft_tokens_evaluated"]
        out["acceptance_rate"] = out["draft_tokens_accepted"] / evaluated if evaluated else 0.0
        return out

    def create_request(self, *, options: RequestOptions | None = None) -> Request:
        request = Request(self, options)
        self._requests.add(request)
        return request

    def create_event_buffer(self, capacity: int) -> EngineEventBuffer:
        return EngineEventBuffer(self, _count(capacity, "create_event_buffer"))

    def has_pending_requests(self) -> bool:
        """Whether ``run`` has events to hand out or an active turn to step."""
        return bool(self._retained or self._queue)

    def run(self, buffer: EngineEventBuffer) -> EngineEventBuffer:
        """Hand out events into ``buffer``: those a previous run left, if any (no model work then); else one
        step of each active request (the first MAX_BATCH in admission order), whose events beyond the buffer's
        capacity wait for the next run. Returns ``buffer``."""
        if not isinstance(buffer, EngineEventBuffer) or buffer._engine() is not self:
            raise GenAIError("buffer must be used with the Engine that created it.")
        buffer._events = []
        if buffer.capacity == 0:
            return buffer
        if not self._retained:
            active = list(self._queue[:MAX_BATCH])
            chosen: set[int] = set()  # requests whose batched step chose their tokens
            if _batchable(self._model):
                self._place([r for r in active if r._gen is None and r._batch is None and r._failed is None])
                for batch in self._batches:
                    waiting = [r for r in active if r._batch is batch and r._turn.fed and r._gen is not None
                               and r._gen._logits is None and r._gen._kv_len == r._gen._len - 1 and not r._drafts]
                    if len(waiting) > 1:
                        try:
                            chosen |= batch.step(waiting)
                        except Exception as exc:  # noqa: BLE001 - the batched step's requests fail their turns
                            for r in waiting:
                                self._fail(r, exc)
                            active = [r for r in active if r not in waiting]
            # every step launched, then every token read (and its event made), in admission order
            failed = {id(r): exc for r in active if id(r) not in chosen and (exc := _attempt(r._launch, self)) is not None}
            for request in active:
                exc = failed.get(id(request)) or _attempt(request._collect, self)
                if exc is not None:
                    self._fail(request, exc)
        buffer._events, self._retained = self._retained[:buffer.capacity], self._retained[buffer.capacity:]
        return buffer

    def _place(self, new: list[Request]) -> None:
        """Rows of shared decode buffers (``_Batch``) for requests about to get their generators: free rows of
        batches of their session length that hold requests already, then new batches for BATCH_MIN or more of them
        (rows: the next power of two, at most BATCH_ROWS; from the model's pool first). Fewer decode on buffers of
        their own, where each runs ahead (measured faster than two rows batched without running ahead)."""
        for limit in dict.fromkeys(r._limit for r in new):
            if not self._model._static_decode and limit > CPU_BATCH_MAX_LENGTH:
                continue  # CPU requests of longer sessions keep growing caches
            group = [r for r in new if r._limit == limit]
            for batch in self._batches:
                if batch.max_length == limit and any(r is not None for r in batch.requests):
                    while group and (row := batch.place(group[0])) is not None:
                        group[0]._batch, group[0]._row = batch, row
                        group.pop(0)
            while len(group) >= BATCH_MIN:
                take, group = group[:BATCH_ROWS], group[BATCH_ROWS:]
                batch = _acquire_batch(self._model, min(BATCH_ROWS, 1 << (len(take) - 1).bit_length()), limit)
                self._batches.append(batch)
                for request in take:
                    request._batch, request._row = batch, batch.place(request)

    def _fail(self, request: Request, exc: Exception) -> None:
        """A request's step raised: its turn fails (TURN_FINISHED | FAILED, the cause logged and kept for its next
        begin_turn) and its generator is dropped; the other requests go on."""
        turn = request._turn
        log.error("Engine: turn %d of a request failed: %s: %s", turn.id, type(exc).__name__, exc)
        request._failed = f"{type(exc).__name__}: {exc}"
        request._gen = None
        if request._batch is not None:
            request._batch.release(request)
            request._batch = None
        self._finish(request, turn, FinishReason.FAILED, error=EngineErrorCode.ENGINE_EXECUTION_FAILURE)

    def _finish(self, request: Request, turn: _Turn, reason: FinishReason, *, matched: int | None = None,
                merge: bool = False, error: EngineErrorCode = EngineErrorCode.NONE) -> None:
        """End ``turn``: its TURN_FINISHED event (merged into its last token event still retained when ``merge``)."""
        flags = EngineEventFlags.TURN_FINISHED | (EngineEventFlags.FAILED if reason == FinishReason.FAILED else 0)
        usage = TurnUsage(int(turn.tokens.size), turn.generated, 0)
        last = next((e for e in reversed(self._retained) if e.request is request), None)
        fields = dict(finish_reason=reason, usage=usage, error_code=error,
                      matched_stop_string_index=matched if reason == FinishReason.STOP_STRING else None)
        if merge and last is not None and last.turn_id == turn.id and last.flags == EngineEventFlags.TOKEN:
            last.flags |= flags
            for k, v in fields.items():
                setattr(last, k, v)
        else:
            self._retained.append(EngineEvent(flags, request, turn.id, **fields))
        request._turn = None
        request._drafts = []  # a proposal belongs to its turn
        if request in self._queue:
            self._queue.remove(request)

    def _forget(self, request: Request) -> None:
        if request in self._queue:
            self._queue.remove(request)
        self._retained = [e for e in self._retained if e.request is not request]

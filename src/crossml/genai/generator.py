"""og.GeneratorParams and og.Generator: the generation loop over a Model.

The loop is three small functions, as in gpt-fast:

* ``_forward`` runs the decoder on the tokens not yet in the KV cache (the prompt: prefill; one
  token per row: decode) and keeps the logits of each row's last real token;
* ``_select`` turns those logits into the next token per row (processors, then greedy / sampling /
  beam search), all on the device;
* ``generate_next_token`` = ``_forward`` if needed, then ``_select``, then append.

The host learns the new tokens and the finished flags with one copy per step (plain greedy steps on a GPU:
the greedy kernel writes them into page-locked host memory itself); nothing in a greedy or sampled decode
step waits on the device. On a GPU with the static KV cache every decode step has
the same input shapes (the attention mask spans max_length), so the session replays one recorded
graph per step, whose inputs (the new token's id and position) are staged as soon as the token is
chosen; a first prompt replays the graph of its bucket width once the bucket has come twice (see
crossml.genai.model).

There the generator also runs ahead: once a token is appended, its copy to the host is queued and
then the decoder step that token feeds, before the host has the token. The device goes from one
step to the next without waiting for the host (which reads the token while the next step runs),
so the per-token time is the device's. That step is the one the next ``generate_next_token`` (or
``get_logits``) would run anyway; when the generation ends instead, it was spare work whose KV row
lies past the sequence, where rows are never read. ``get_output`` still shows the outputs of the
run that chose the last token until the next token is chosen. Sequences
keep onnxruntime-genai's layout: prompts of a batch are right-padded with the pad id, a finished row
continues with pad tokens, and the step on which every row has finished is not appended.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from types import ModuleType
from typing import Any

import numpy as np
import torch

import crossml.genai.model as genai_model
from crossml import dtypes
from crossml.device.queue import Fence, Queue
from crossml.device.tensor import DeviceTensor
from crossml.genai import guidance, logs, search, speculative
from crossml.genai.adapters import Adapters
from crossml.genai.config import SEARCH_OPTIONS, SearchConfig, coerce_search_option
from crossml.genai.errors import ConfigError, GenAIError, GeneratorStateError, NameNotFoundError, SearchOptionError
from crossml.genai.kv_cache import GrowingKVCache, KVCache, LayerStates, StaticKVCache
from crossml.genai.model import Model, PromptBuffers, chunk_bucket, prompt_bucket, state_pieces
from crossml.genai.tokenizer import Tensor
from crossml.kernels import TRITON_DEVICES, load_compiled
from crossml.runtime.adapters import active_feed

log = logging.getLogger("crossml.genai")


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a [rows, columns] attention mask: each column's count of real tokens so far, minus one
    (left padding and the columns before the first real token get 0)."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def _streams(pos: torch.Tensor, streams: int) -> torch.Tensor:
    """[rows, columns] positions as the decoder takes them: the same, or [3, rows, columns] (multimodal RoPE's
    temporal, height and width streams, equal for text tokens) where ``streams`` is 3 and they are not already."""
    if streams and pos.dim() == 2:
        return pos.unsqueeze(0).expand(streams, *pos.shape).contiguous()
    return pos


def _plain_greedy(s: SearchConfig) -> bool:
    """Search options under which a step is argmax plus the end-of-sequence ban (what the greedy kernel does)."""
    return not s.do_sample and s.num_beams == 1 and s.repetition_penalty == 1.0 and s.no_repeat_ngram_size <= 0


def _greedy_kernels(device: torch.device, eos_ids: int) -> ModuleType | None:
    """``crossml.kernels.greedy`` on a Triton device (compiled, not interpreted) for up to its MAX_EOS
    end-of-sequence ids, else None."""
    module = load_compiled("greedy") if device.type in TRITON_DEVICES else None
    return module if module is not None and eos_ids <= module.MAX_EOS else None


@dataclasses.dataclass
class _Shown:
    """A one-token step's "logits" output kept as the float32 copy of its values (the recorded graph's buffer
    is overwritten by the step that runs ahead). Until the greedy kernel makes that copy as it reads the logits,
    ``logits`` is the graph's buffer itself (``live``)."""

    logits: torch.Tensor
    dtype: torch.dtype
    shape: tuple[int, ...]
    live: bool = False

    def keep(self) -> None:
        """Copy a live buffer before a replay overwrites it."""
        if self.live:
            self.logits, self.live = self.logits.to(torch.float32, copy=True), False


class _Tail:
    """The "logits" output of a run that computed them at each row's last real column only (``Model.rows_input``):
    every column's, computed from the lm_head's per-position inputs the run gave when get_output asks for them."""

    def __init__(self, model: Model, hidden: list[torch.Tensor], shape: tuple[int, ...]) -> None:
        self._model, self._hidden, self.shape = model, hidden, shape
        self._value: torch.Tensor | None = None

    def value(self) -> torch.Tensor:
        if self._value is None:
            self._value = self._model.logits_at_every([h.contiguous() for h in self._hidden])
        return self._value


class GeneratorParams:
    """og.GeneratorParams(model): search options for one Generator."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self.search = dataclasses.replace(model.config.search)
        self.guidance: tuple[str, str] | None = None  # (type, data): set_guidance
        self.speculative = dataclasses.replace(model.config.speculative)  # n-gram decoding (crossml.genai.speculative)

    def set_search_options(self, **options: Any) -> None:
        values = {}
        for key, value in options.items():
            try:
                values[key] = coerce_search_option(key, value, "set_search_options")
            except ConfigError as exc:
                raise SearchOptionError(str(exc)) from None
        for key, value in values.items():
            setattr(self.search, key, value)

    def get_search_options(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, kind in SEARCH_OPTIONS.items():
            v = getattr(self.search, key)
            out[key] = bool(v) if kind is bool else float(v)
        return out

    def set_speculative_options(self, **options: Any) -> None:
        """Speculative decoding options (onnxruntime-genai's): ``ngram_size`` (0: off, or 2-16: n-gram decoding,
        matching the last ngram_size - 1 tokens), ``max_draft_tokens`` (1-16), ``ngram_chained_lookup``,
        ``min_adaptive_k`` (0: a fixed width) and ``cooldown``; see ``crossml.genai.speculative``."""
        values = {k: speculative.coerce(k, v, "set_speculative_options") for k, v in options.items()}
        for key, value in values.items():
            setattr(self.speculative, key, value)

    def get_speculative_options(self) -> dict[str, Any]:
        return speculative.options_dict(self.speculative)

    def set_guidance(self, type: str, data: str, enable_ff_tokens: bool = False) -> None:  # noqa: A002 - og's name
        """Constrain the generated tokens to a grammar: ``type`` json_schema, regex or lark_grammar, ``data`` the
        schema / expression / grammar (``crossml.genai.guidance``; needs llguidance). Both empty: no guidance.
        ``enable_ff_tokens`` (tokens the grammar forces appended without a model step) is not provided."""
        if guidance.check_request(type, data):
            if enable_ff_tokens:
                raise SearchOptionError("set_guidance: enable_ff_tokens=True (forced tokens appended without a model "
                                        "step) is not supported by crossml.genai; leave it False")
            self.guidance = (str(type), str(data))
        else:
            self.guidance = None


def _check(s: SearchConfig, context_length: int) -> None:
    def bad(key: str, accepted: str) -> SearchOptionError:
        return SearchOptionError(f"search option {key}={getattr(s, key)!r} is not valid; accepted: {accepted}")

    if s.batch_size < 1:
        raise bad("batch_size", "an integer >= 1")
    if s.num_beams < 1:
        raise bad("num_beams", "an integer >= 1")
    if not 1 <= s.num_return_sequences <= s.num_beams:
        raise bad("num_return_sequences", f"1 .. num_beams ({s.num_beams})")
    if not 1 <= s.max_length <= context_length:
        raise bad("max_length", f"1 .. the model's context_length ({context_length})")
    if s.min_length < 0:
        raise bad("min_length", "an integer >= 0")
    if s.top_k < 0:
        raise bad("top_k", "an integer >= 0 (0: no top-k filter)")
    if not 0.0 <= s.top_p <= 1.0:
        raise bad("top_p", "0 .. 1")
    if s.temperature <= 0.0:
        raise bad("temperature", "a number > 0")
    if s.repetition_penalty <= 0.0:
        raise bad("repetition_penalty", "a number > 0 (1: no penalty)")
    if s.num_beams > 1 and s.do_sample:
        raise SearchOptionError("do_sample=true cannot be combined with num_beams > 1 (beam search is deterministic)")


class Generator:
    """og.Generator(model, params)."""

    def __init__(self, model: Model, params: GeneratorParams, *, _buffers: Any = None,
                 _run_ahead: bool = True, _speculate: bool = True) -> None:
        """(``_buffers``: the fixed decode buffers to use instead of a set lent by the model, ``_run_ahead=False``:
        no step runs ahead; both for an Engine's batched requests, ``crossml.genai.engine``; ``_speculate=False``:
        standard steps even where the model has a draft decoder, an Engine's requests and a draft's own generator.)"""
        s = dataclasses.replace(params.search)
        _check(s, model.config.model.context_length)
        self._model, self._s = model, s
        mc = model.config.model
        dev = model.device
        self._dev = dev
        self._rows = s.batch_size * s.num_beams
        self._pad = mc.pad_token_id
        self._eos = torch.tensor(mc.eos_token_id or [-1], dtype=torch.long, device=dev)
        self._eos_list = list(mc.eos_token_id)
        io = model.io
        if _buffers is not None and _buffers.seq is not None:
            self._seq = _buffers.seq
            self._seq.fill_(self._pad)
        else:
            self._seq = torch.full((self._rows, s.max_length), self._pad, dtype=torch.long, device=dev)
        # decode with fixed shapes at fixed addresses (see crossml.genai.model): one recorded graph for every
        # decode step, reading the model's lent DecodeBuffers in place
        self._static = (model._static_decode or _buffers is not None) and s.past_present_share_buffer
        if _buffers is not None:
            if not self._static or (_buffers.rows, _buffers.max_length) != (self._rows, s.max_length):
                raise GenAIError("Generator: lent decode buffers need the static decode path and rows x max_length "
                                 f"{self._rows} x {s.max_length}")
            self._bufs = _buffers
        else:
            self._bufs = model._acquire_buffers(self._rows, s.max_length) if self._static else None
            if self._bufs is not None:
                weakref.finalize(self, model._release_buffers, self._bufs)
        if self._bufs is not None:
            self._mask = self._bufs.mask
        else:
            self._mask = torch.zeros((self._rows, s.max_length), dtype=io.mask_dtype, device=dev)
        self._len = 0  # columns of _seq in use
        self._kv_len = 0  # columns already in the KV cache
        self._prompt_last: torch.Tensor | None = None  # per row: index of its last real prompt token
        self._logits: torch.Tensor | None = None  # [rows, vocab] float32, None: not computed yet
        self._outputs: dict[str, torch.Tensor] = {}
        self._run: tuple[int, int] | None = None  # columns the last shown run fed (get_input)
        self._ahead_run: tuple[int, int] | None = None  # ... and those of a step run ahead, until it is shown
        self._terminated = False  # set_runtime_option("terminate_session", "1")
        self._done = torch.zeros(self._rows, dtype=torch.bool, device=dev)
        self._next: torch.Tensor | None = None  # tokens chosen by the last step
        self._host: tuple[np.ndarray, bool] | None = None  # (next tokens, all done) copied once per step
        self._finished_step = False
        self._cache = self._make_cache()
        # the carried layer states (LFM2's convolutions, Qwen3.5's Gated DeltaNet layers): at the lent buffers' fixed
        # addresses on the static path
        self._states = LayerStates(io.state_names, io.state_present_names, self._rows, io.state_shapes, io.state_dtypes,
                                   dev, self._bufs.states if self._bufs is not None else None)
        # the decoder outputs every run asks for
        self._names = [io.logits, *self._cache.present_names, *self._states.present_names, *io.other_outputs]
        #: where each run's hidden states go (an MTP generator's: crossml.genai.mtp), called with the run's end column
        #: and the model's hidden-states output ([rows, columns, hidden], the run's last columns)
        self._on_hidden: Any = None
        #: set_hidden_states' value ([rows, columns, hidden], the input's type), fed to the runs to come (copied into the
        #: fixed buffers on the static path, zero past its columns); and the first column of the run being made
        self._hidden: torch.Tensor | None = None
        self._run_start = 0
        #: snapshot_state(): (KV length, the carried states then, the logits then)
        self._snapshot: tuple[int, list[torch.Tensor], torch.Tensor] | None = None
        # ... and a run of several columns, which computes the logits at each row's last real one only (where the
        # model selects rows), asks for the lm_head's per-position inputs too (get_output's full logits: _Tail)
        self._prompt_names = self._names + model.rows_hidden
        self._rng: torch.Generator | None = None
        if s.do_sample:
            self._rng = torch.Generator(device=dev)
            if s.random_seed >= 0:
                self._rng.manual_seed(s.random_seed)
            else:
                self._rng.seed()
        # constrained decoding: one llguidance matcher per row (crossml.genai.guidance); the columns of the tokens
        # committed to row 0's (rewind_to)
        self._guide: guidance.Guide | None = None
        self._guide_cols: list[int] = []
        if params.guidance is not None:
            if s.num_beams > 1:
                raise SearchOptionError("set_guidance cannot be combined with num_beams > 1")
            self._guide = guidance.Guide(model, *params.guidance, self._rows)
        self._beam = (search.BeamSearch(s.batch_size, s.num_beams, self._eos_list, s.length_penalty,
                                        s.early_stopping, dev) if s.num_beams > 1 else None)
        self._final: list[list[int]] | None = None
        self._staged: int | None = None  # column whose decode inputs are already in the fixed buffers
        # run ahead (see the module docstring): the static decode path of a recording session, not beam search
        # (carried layer states are copied before a step runs ahead and put back if it is dropped, _drop_ahead; with
        # window-sized KV caches only steps that evict nothing run ahead, _ahead_keeps: a step dropped after it
        # evicted would have lost positions)
        self._ahead = _run_ahead and model._run_ahead and self._bufs is not None and self._beam is None
        self._pending: tuple[Fence, np.ndarray] | None = None  # the last step's tokens + done flags, on their way
        self._ahead_outputs: dict[str, Any] | None = None  # outputs of a step run ahead, shown once it is consumed
        # plain greedy steps on the run-ahead path: one Triton step (crossml.kernels.greedy) for the ~15 torch kernels
        self._greedy: ModuleType | None = None
        self._pick_greedy()
        self._step_out = torch.empty(2 * self._rows, dtype=torch.long, device=dev)  # [tokens, done flags]
        # ... which the greedy kernel also writes straight into host memory (two slots, used in turn), so the
        # host waits for an event instead of a copy launched behind the kernel
        self._host_slots: list[tuple[torch.Tensor, np.ndarray]] = []  # made by the first greedy step
        self._slot = 0
        self._live = False  # self._logits is the recorded graph's logits buffer itself (greedy run-ahead steps)
        # the decoder's extra inputs (see crossml.genai.model.DecoderIO.extra): active adapters, in the order set,
        # set_model_input values, and the merged feed (in the lent buffers' fixed tensors on the static path)
        self._adapters: list[tuple[str, Any]] = []
        self._model_inputs: dict[str, torch.Tensor] = {}
        self._extra: dict[str, torch.Tensor] = {}
        self._spec: speculative.Speculator | None = None  # speculative rounds (crossml.genai.speculative)
        self._refresh_extras()
        if _speculate:
            speculative.check(self, params.speculative)
        self._verifying = False  # a verifying run computes the logits at every column
        self._short_chunks = False  # a draft model's generator (speculative._Draft): chunks of a few columns
        self._exact_pieces = False  # a speculative round's runs on a carried-state model: pieces of their own width
        if _speculate and (params.speculative.ngram_size or model.draft is not None):
            self._spec = speculative.Speculator(self, dataclasses.replace(params.speculative))

    def _set_policy(self, *, do_sample: bool, temperature: float, top_k: int, top_p: float,
                    repetition_penalty: float, no_repeat_ngram_size: int, min_length: int,
                    seed: int | None = None) -> None:
        """Change the search of the steps to come (an Engine turn's policy, ``crossml.genai.engine``): the
        selection options, ``min_length`` (the sequence length before which end-of-sequence ids are banned) and,
        with ``seed``, a reseeded random stream. The step that already ran ahead only computed logits, which no
        option changes."""
        s = self._s
        s.do_sample, s.temperature, s.top_k, s.top_p = do_sample, temperature, top_k, top_p
        s.repetition_penalty, s.no_repeat_ngram_size, s.min_length = repetition_penalty, no_repeat_ngram_size, min_length
        if self._rng is None and do_sample:
            self._rng = torch.Generator(device=self._dev)
            self._rng.seed()
        if seed is not None:
            self._reseed(seed)
        self._pick_greedy()

    def _reseed(self, seed: int) -> None:
        """The random stream of sampled steps restarts at ``seed``."""
        if self._rng is None:
            self._rng = torch.Generator(device=self._dev)
        self._rng.manual_seed(seed)

    def _pick_greedy(self) -> None:
        """Plain greedy steps on the run-ahead path take the greedy kernel (``_greedy_step``); others, none."""
        self._greedy = _greedy_kernels(self._dev, self._eos.numel()) if self._ahead and self._plain() else None

    def _plain(self) -> bool:
        """Whether a step is argmax plus the end-of-sequence ban alone (the greedy kernel's, an Engine's batched
        choice): plain greedy search without guidance."""
        return _plain_greedy(self._s) and self._guide is None

    def _set_guide(self, guide: guidance.Guide | None) -> None:
        """Constrain the steps to come with ``guide`` (None: unconstrained); an Engine turn's grammar."""
        self._guide, self._guide_cols = guide, []
        self._pick_greedy()

    def _decoded(self, logits: torch.Tensor) -> None:
        """The decode step of the last appended token ran outside this generator, on its buffers (an Engine's
        batched step over several generators' rows, ``crossml.genai.engine``): ``logits`` [1, vocab] are this row's,
        and its KV row holds the token. The next ``generate_next_token`` chooses from them."""
        if self._bufs is None or self._ahead or self._kv_len != self._len - 1 or self._logits is not None:
            raise GeneratorStateError("_decoded: the generator is not waiting for the decode step of its last token")
        self._logits = logits.float() if logits.dtype != torch.float32 else logits.clone()
        self._kv_len = self._len
        self._staged = None

    def _chosen(self, token: int, ended: bool, next_token: torch.Tensor) -> None:
        """The step's token was chosen outside this generator and written into its sequence and mask (an Engine's
        batched greedy step, ``crossml.genai.engine``): ``token`` on the host, ``next_token`` its [1] device tensor,
        ``ended``: it is an end-of-sequence id (the step is then not appended, as ``_settle`` does). The run that
        gave its logits fed the previous token, which is in the KV cache now."""
        self._kv_len = self._len
        self._len += 1
        self._next = next_token
        self._logits = None
        self._finished_step = False
        self._staged = None
        self._host = (np.array([token], dtype=np.int32), ended)
        if ended:
            self._done.fill_(True)
            self._unappend()

    def _unappend(self) -> None:
        """The step on which every row ended is not appended (onnxruntime-genai's layout): its column back to pad."""
        self._len -= 1
        self._seq[:, self._len] = self._pad
        self._mask[:, self._len] = 0
        self._finished_step = True
        self._staged = None

    def _make_cache(self) -> KVCache:
        io = self._model.io
        if self._s.past_present_share_buffer:
            return StaticKVCache(io.past_names, io.present_names, self._rows, self._model.kv_shapes(self._s.max_length),
                                 io.kv_dtype, self._dev, self._bufs.kv if self._bufs is not None else None)
        if self._model.window_layers:
            raise GenAIError(f"{self._model.config._file}: layers {sorted(self._model.window_layers)} "
                             "(model.decoder.sliding_window.layers) keep window-sized KV caches, which need "
                             "past_present_share_buffer=True; set it in the search options or in genai_config.json")
        return GrowingKVCache(io.past_names, io.present_names, self._rows, io.kv_dims, io.kv_dtype, self._dev)

    # -- appending tokens ---------------------------------------------------------------------
    def append_tokens(self, tokens: Any) -> None:
        """Append prompt tokens ([length] for batch 1, or [batch, length]) and run them through the model."""
        self._check_terminated()
        arr = tokens.as_numpy() if isinstance(tokens, Tensor) else np.asarray(tokens)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"append_tokens takes integer token ids shaped [length] or [batch, length], got "
                             f"{arr.dtype} {arr.shape}")
        s = self._s
        missing = sorted(self._model.io.required - self._extra.keys())
        if missing:
            raise GenAIError(f"Missing Input: {', '.join(missing)}: the decoder '{self._model.config.model.decoder.filename}' "
                             f"takes {'these inputs' if len(missing) > 1 else 'this input'} beside the ones "
                             "crossml.genai feeds; give each with generator.set_model_input(name, value) (or an "
                             "active adapter) before append_tokens")
        if self._model.io.hidden_input is not None and self._hidden is None:
            raise GenAIError(f"Missing Input: {self._model.io.hidden_input}: the decoder "
                             f"'{self._model.config.model.decoder.filename}' takes hidden states, one row per token; "
                             "give them with generator.set_hidden_states(value) before append_tokens")
        if arr.shape[0] != s.batch_size:
            raise ValueError(f"append_tokens: got {arr.shape[0]} sequences but search option batch_size is "
                             f"{s.batch_size}; set_search_options(batch_size={arr.shape[0]})")
        n = arr.shape[1]
        if n == 0:
            raise ValueError("append_tokens: input_ids is empty; give at least one token id per sequence")
        vocab = self._model.config.model.vocab_size
        bad = ((arr < 0) | (arr >= vocab)) & (arr != self._pad) if vocab > 0 else None
        if bad is not None and bad.any():
            row, col = (int(i[0]) for i in np.nonzero(bad))
            raise ValueError(f"append_tokens: token id {int(arr[row, col])} (sequence {row}, position {col}) is outside "
                             f"the vocabulary: ids must be within [0, {vocab}) (model.vocab_size in genai_config.json)")
        if n + self._len > s.max_length:
            raise GeneratorStateError(f"append_tokens: {n} tokens + current sequence length {self._len} exceed "
                                      f"max_length ({s.max_length}); raise max_length (at most context_length "
                                      f"{self._model.config.model.context_length}) or shorten the prompt")
        if self._len and (s.batch_size > 1 or self._beam is not None):
            raise GeneratorStateError("append_tokens after the first prompt needs batch_size 1 and num_beams 1")
        if self._spec is not None:
            self._spec.discard()  # a speculative round's tokens not handed out yet
        self._settle()
        if logs.wants("append_next_tokens"):
            for col in range(n):
                logs.emit("append_next_tokens", "".join(f"{t} " for t in arr[:, col]))
        if self._len and self.is_done():
            self._done.zero_()
        rows = torch.as_tensor(arr.astype(np.int64), device=self._dev).repeat_interleave(s.num_beams, dim=0)
        if self._len:
            self._append_device(rows[0])  # a continuation: batch 1, one beam (checked above)
            return
        real = arr != self._pad
        if not real.any(axis=1).all():
            empty = int(np.flatnonzero(~real.any(axis=1))[0])
            raise ValueError(f"append_tokens: sequence {empty} holds only pad tokens ({self._pad})")
        self._seq[:, :n] = rows
        lengths = n - np.argmax(real[:, ::-1], axis=1)  # trailing pad tokens are padding
        lens = torch.as_tensor(lengths, device=self._dev).repeat_interleave(s.num_beams)
        self._mask[:, :n] = (torch.arange(n, device=self._dev)[None, :] < lens[:, None]).to(self._mask.dtype)
        self._prompt_last = lens - 1
        self._len = n
        self._logits, self._host, self._staged = None, None, None
        self._forward()

    # -- the loop -----------------------------------------------------------------------------
    def _ready(self) -> None:
        """Make the logits of the tokens appended so far current: run the decoder, or show the outputs of the step
        that ran ahead."""
        if self._logits is None:
            if self._kv_len >= self._len:
                # every row ended on the last step, whose token is not appended: the logits it chose from are gone
                # (a step run ahead may have written over them). The last token runs again, as after
                # rewind_to(len - 1): over its own KV rows, or with carried layer states from the first token
                if self._evicted(self._len):
                    raise GeneratorStateError(
                        "get_logits: every sequence ended on the last step, and its logits cannot be computed again: "
                        f"the sliding-window KV cache holds only the last "
                        f"{self._model.window_rows(self._s.max_length)} of {self._kv_len} positions. Read the logits "
                        "before generate_next_token, or increase model.decoder.sliding_window.cache_slack")
                self._run_again_from(self._len - 1)
            if self._logits is None:  # (a snapshot_state of this length gives them back)
                self._forward()
        elif self._ahead_outputs is not None:
            self._outputs, self._ahead_outputs = self._ahead_outputs, None
            self._run, self._ahead_run = self._ahead_run, None

    def _forward(self, ahead: bool = False) -> None:
        """Run the decoder on columns kv_len..len and keep each row's last-token logits. ``ahead``: the step runs
        before it is asked for; its outputs are shown by ``_ready``."""
        start, end = self._kv_len, self._len
        bufs = self._bufs
        names = self._names
        hidden_in = self._model.io.hidden_input
        if hidden_in is not None and self._hidden.shape[1] != end - start:
            raise GenAIError(f"'{hidden_in}' holds {self._hidden.shape[1]} rows of hidden states, and this run feeds "
                             f"{end - start} tokens; set_hidden_states with one row per token before append_tokens")
        self._run_start = start
        for shown in (self._outputs.get(names[0]), (self._ahead_outputs or {}).get(names[0])):
            if isinstance(shown, _Shown):
                shown.keep()  # a live logits buffer this run may overwrite
        model = self._model
        width = end - start  # columns fed (a recorded prompt or chunk is padded to its bucket)
        slot = None  # a first prompt's bucket buffers (None where prompts are not recorded)
        chunk = None  # a continuation chunk's bucket buffers (likewise)
        padded = bufs is not None and model._prompt_graphs and model._logits_per_position
        states = bool(self._states.tensors)
        pieces = None  # a carried-state model's prompt cut into exact widths: [(width, buffers or None: eager)]
        if (padded and states and genai_model.STATE_PIECE_MAX > 0 and not model.window_layers and self._rows == 1
                and (start == 0 or end - start > 1)):
            # one row: GroupQueryAttention takes a prompt on top of a past context for a batch of one only
            if self._exact_pieces and start > 0:
                # a speculative round's verifying run or replay (2-17 columns, every round): one piece of its own
                # width, recorded on its second run, rather than power-of-two pieces run one after another
                pieces = [(end - start, bufs.piece(end - start))]
            else:
                model._state_prompts += 1  # pieces once the model has run STATE_PIECE_AFTER such prompts
                if model._state_prompts > genai_model.STATE_PIECE_AFTER:
                    pieces = self._plan_pieces(end - start)
        if pieces is None and padded and start == 0:
            # carried layer states (LFM2's, Qwen3.5's) would take a bucket's pad columns in: such a model's first
            # prompts are recorded at their own width (a batch's shorter rows are run again alone: _restate_short_prompts)
            slot = bufs.prompt(end if states else prompt_bucket(end, self._s.max_length))
        elif padded and not states and end - start > 1 and not model.window_layers:
            # a chunk's pad columns are fed as tokens (the mask is the whole max-length one): not where a window-sized
            # cache would evict real positions for them, nor past the buffers
            w = chunk_bucket(end - start)
            if self._verifying or self._short_chunks:
                # a speculative round's drafts (2-17 columns), a draft generator's catch-up with the committed
                # tokens: a bucket of their own power of two, and near max_length their exact width, rather than a
                # turn's 32 columns or an eager run
                w = max(2, 1 << (end - start - 1).bit_length())
                if start + w > self._s.max_length:
                    w = end - start
            if start + w <= self._s.max_length:
                chunk = bufs.chunk(w)
        if start == 0 and self._model._compile_ahead:
            self._model._compile_ahead = False
            self._compile_ahead(slot.width if slot is not None else pieces[0][0] if pieces else end, end)
        if ahead and self._states.tensors:
            self._states.save()  # what a dropped step put back (_drop_ahead): queued before the step, no host wait
        if bufs is not None and start > 0 and end - start == 1:
            # decode: a max-length mask (zeros after `end`); shapes and addresses the same every step
            self._decode_kernels_ready()
            if self._staged != start:
                self._stage(start)
            self._put_hidden(bufs.hidden, start, end)
            if bufs.replay is not None:  # the recorded step: nothing to convert or check
                outs = bufs.replay()
            else:
                outs = self._model.run_bound(bufs, self._feed(bufs.ids, self._mask, bufs.pos, bufs.hidden), names)
        elif slot is not None:
            # first prompt: right-padded to a bucket width at fixed addresses (the set's mask columns are zero
            # past `end`, and the sequence holds pad ids there); one recording per bucket
            width = slot.width
            slot.ids.copy_(self._seq[:, :width])
            mask = self._mask[:, :width]
            if slot.pos is not None:
                slot.pos.copy_(_positions(mask))
            self._put_hidden(slot.hidden, 0, end)
            feed = self._feed(slot.ids, mask, slot.pos, slot.hidden)
            run_names = names
            if self._selects(start, end):
                slot.rows.copy_(self._last_columns(start, end))
                feed[model.rows_input] = slot.rows
                run_names = self._prompt_names
            outs = self._model.run_bound(slot, feed, run_names)
        elif chunk is not None:
            outs = self._run_chunk(chunk, start, end)
            width = chunk.width
        elif pieces:
            outs = self._run_pieces(pieces, start, end)
        else:  # growing-cache steps, chunks that do not fit a bucket, window-sized caches: eager
            outs = self._run_eager(start, end)
        outs, hidden = outs[:len(names)], outs[len(names):]
        logits = outs[0]
        if width != end - start and logits.dim() == 3 and not hidden:
            logits = logits[:, :end - start]  # the bucket's pad columns are not the user's
        outputs: dict[str, Any] = dict(zip(names, [logits, *outs[1:]]))
        other = len(names) - len(model.io.other_outputs)
        for name, t in zip(model.io.other_outputs, outs[other:]):
            if width != end - start and t.dim() >= 2 and t.shape[1] == width:
                outputs[name] = t[:, :end - start]  # likewise
        if self._on_hidden is not None and model.io.hidden_output is not None:
            self._on_hidden(end, outputs[model.io.hidden_output])
        if hidden:  # logits [rows, 1, vocab] at each row's last real column; get_output computes the others if asked
            outputs[names[0]] = _Tail(model, [h[:, :end - start] for h in hidden],
                                      (self._rows, end - start, logits.shape[-1]))
        kv = len(self._cache.present_names)
        self._cache.update(outs[1:1 + kv])
        self._states.update(outs[1 + kv:])
        if start == 0 and self._states.tensors and self._prompt_last is not None and self._restate_short_prompts(end):
            for name, t in zip(self._states.present_names, self._states.tensors):
                outputs[name] = t.clone()  # get_output shows the states the next step takes in
        if logits.dim() == 2:  # [rows, vocab]: the model already keeps the last position
            last = logits
        elif hidden:
            last = logits[:, 0]
        elif start == 0 and self._prompt_last is not None and logits.shape[1] == end:
            last = logits[torch.arange(self._rows, device=self._dev), self._prompt_last.clamp(max=end - 1)]
        else:
            last = logits[:, -1]
        shown = self._ahead and end - start == 1 and logits.numel() == last.numel()
        self._live = shown and ahead and self._greedy is not None
        if self._live:
            # the greedy kernel of the next step copies these logits to float32 as it reads them, before the step
            # after it overwrites the buffer (see _greedy_step)
            self._logits = last
        else:
            # a copy: the logits may be a recorded graph's output buffer, which the next replay overwrites
            self._logits = last.float() if last.dtype != torch.float32 else last.clone()
        if shown:
            # so is the shown "logits" output when the next step runs ahead: keep it as this copy (exact: float32
            # holds every float16 / bfloat16 value)
            outputs[names[0]] = _Shown(self._logits, logits.dtype, tuple(logits.shape), live=self._live)
        if ahead:
            self._ahead_outputs, self._ahead_run = outputs, (start, end)
        else:
            self._outputs, self._ahead_outputs = outputs, None
            self._run, self._ahead_run = (start, end), None
        self._kv_len = end

    def _restate_short_prompts(self, width: int) -> bool:
        """A batch of prompts of different lengths runs right-padded, ``width`` columns: the pad columns come after
        each shorter prompt's real ones, so its logits and KV rows are those of the prompt alone, but its carried
        layer states took the pad columns in. Each shorter prompt runs alone once more (eager, a batch of one,
        empty KV pasts and zero states), and its present states replace its rows'. Returns whether any did."""
        io = self._model.io
        lengths = (self._prompt_last + 1).tolist()
        beams = self._s.num_beams
        restated = False
        for row in range(0, self._rows, beams):
            n = lengths[row]
            if n == width:
                continue
            restated = True
            mask = self._mask[row:row + 1, :n]
            feed = {io.input_ids: self._seq[row:row + 1, :n].to(io.input_ids_dtype)}
            if io.attention_mask is not None:
                feed[io.attention_mask] = mask
            if io.position_ids is not None:
                feed[io.position_ids] = _streams(_positions(mask), io.position_streams).to(io.position_dtype)
            for name, t in zip(self._cache.past_names, self._cache.tensors):
                feed[name] = t.new_zeros((1, t.shape[1], 0, t.shape[3]))
            for name, t in zip(self._states.past_names, self._states.tensors):
                feed[name] = t.new_zeros((1, *t.shape[1:]))
            feed.update(self._extra)
            if self._model.rows_input is not None:  # its logits are not read: one position spares the lm_head
                feed[self._model.rows_input] = torch.full((1,), n - 1, dtype=torch.long, device=self._dev)
            outs = self._model.run(feed, self._states.present_names, eager=True)
            for t, p in zip(self._states.tensors, outs):
                t[row:row + beams].copy_(p.expand(beams, *p.shape[1:]))
        return restated

    def _plan_pieces(self, n: int) -> list[tuple[int, PromptBuffers | None]]:
        """The order a carried-state model's ``n`` prompt columns run in (``crossml.genai.model.state_pieces``): the
        pieces whose widths have recordings first, then one piece without on its buffers (the widest whose plan a
        first run already warmed, so this run records it, else the widest, whose run warms its plan), then the rest
        in one eager run (None). A width's warm run costs two or more eager runs of host time on a GPU (the plan built
        for its shapes, kernels specialised for them; H200, Qwen3.5-0.8B fp16, 16- and 128-token pieces: 116-134 ms
        against 49-51 for an eager turn, benchmarks/results/state_pieces.md), its recording run about one (56-60
        ms), so a prompt makes one of them at most."""
        bufs = self._bufs
        recorded, rest = [], []
        for w in state_pieces(n):
            have = bufs.pieces.get(w)
            (recorded if have is not None and have.replay is not None else rest).append(w)
        rest.sort(key=lambda w: (w in bufs.pieces and bufs.pieces[w].warmed, w), reverse=True)
        plan: list[tuple[int, PromptBuffers | None]] = [(w, bufs.piece(w)) for w in recorded + rest[:1]]
        if len(rest) > 1:
            plan.append((sum(rest[1:]), None))
        return plan

    def _run_pieces(self, plan: list[tuple[int, PromptBuffers | None]], start: int, end: int) -> list[torch.Tensor]:
        """Columns start..end of a carried-state model in the pieces of ``plan`` (``_plan_pieces``), each on its
        buffers with the set's whole max-length mask (``_run_chunk``), whose columns are set up to the piece's end
        only (GroupQueryAttention reads the sequence's length from them), or eagerly. Returns the last run's
        outputs, with the logits of all the pieces' columns where the decoder gives them per position, or where the
        pieces select rows (each its last column) with the lm_head's inputs of all the columns."""
        mask = self._mask
        kv = len(self._cache.present_names)
        n = len(self._names)
        kept: list[torch.Tensor] = []  # the logits of all columns, or the lm_head inputs of selecting runs
        col = start
        mask[:, start + plan[0][0]:end] = 0
        for i, (w, slot) in enumerate(plan):
            stop = col + w
            mask[:, col:stop] = 1
            select = self._model.rows_input is not None  # every piece alike, one-column ones too
            outs = (self._run_chunk(slot, col, stop, select) if slot is not None
                    else self._run_eager(col, stop, select))
            per_column = outs[n:] if len(outs) > n else outs[:1] if outs[0].dim() == 3 else []
            if len(plan) > 1 and per_column:
                if not kept:
                    kept = [t.new_empty((t.shape[0], end - start, *t.shape[2:])) for t in per_column]
                for into, t in zip(kept, per_column):
                    into[:, col - start:stop - start].copy_(t)  # before the slot's next replay overwrites it
            if i + 1 < len(plan):
                self._cache.update(outs[1:1 + kv])
                self._states.update(outs[1 + kv:n])
            col = stop
        if not kept:
            return outs
        return [*outs[:n], *kept] if len(outs) > n else [kept[0], *outs[1:]]

    def _run_eager(self, start: int, end: int, select: bool | None = None) -> list[torch.Tensor]:
        """Columns start..end run eagerly (not recorded) on the mask's first ``end`` columns."""
        mask = self._mask[:, :end]
        pos = _positions(mask)[:, start:end] if self._model.io.position_ids is not None else None
        feed = self._feed(self._seq[:, start:end], mask, pos, self._hidden_cols(start, end))
        if self._selects(start, end) if select is None else select:
            feed[self._model.rows_input] = self._rows_tensor(start, end)
            return self._model.run(feed, self._prompt_names, eager=True)
        return self._model.run(feed, self._names, eager=True)

    def _selects(self, start: int, end: int) -> bool:
        """Whether a run of columns start..end computes the logits at each row's last real column only: runs of several
        columns, where the model selects rows (``Model.rows_input``)."""
        return self._model.rows_input is not None and end - start > 1 and not self._verifying

    def _last_columns(self, start: int, end: int) -> torch.Tensor | int:
        """Each row's last real column of a run of columns start..end, counted from ``start``: a first prompt's rows
        end where their tokens do (a batch's shorter prompts are right-padded), other runs at their last column."""
        if start == 0 and end == self._len and self._prompt_last is not None:
            return self._prompt_last.clamp(max=end - 1)
        return end - 1 - start

    def _rows_tensor(self, start: int, end: int) -> torch.Tensor:
        last = self._last_columns(start, end)
        if isinstance(last, torch.Tensor):
            return last
        return torch.full((self._rows,), last, dtype=torch.long, device=self._dev)

    def _run_chunk(self, chunk: PromptBuffers, start: int, end: int, select: bool | None = None) -> list[torch.Tensor]:
        """A continuation prompt (columns start..end of a started sequence) right-padded to ``chunk``'s width and run
        on its fixed buffers with the set's whole max-length mask, as a decode step is: recorded on its bucket's
        second run (``Model.run_bound``). The pad columns (pad ids) are fed as tokens: their mask columns are set
        for the run, so GroupQueryAttention places the chunk at rows start.. of the caches, and cleared after it
        (queued behind the run). Causality keeps them out of the real columns, whose logits the caller keeps;
        their keys and values land past the sequence, where the next steps overwrite them before any query
        reaches them."""
        stop = start + chunk.width
        self._mask[:, end:stop] = 1
        chunk.ids.copy_(self._seq[:, start:stop])
        if chunk.pos is not None:
            chunk.pos.copy_(_positions(self._mask)[:, start:stop])
        self._put_hidden(chunk.hidden, start, end)
        feed = self._feed(chunk.ids, self._mask, chunk.pos, chunk.hidden)
        names = self._names
        if self._selects(start, end) if select is None else select:
            chunk.rows.copy_(self._last_columns(start, end))
            feed[self._model.rows_input] = chunk.rows
            names = self._prompt_names
        outs = self._model.run_bound(chunk, feed, names)
        self._mask[:, end:stop] = 0
        return outs

    def _compile_ahead(self, width: int, end: int) -> None:
        """The model's first prompt, on a Triton device: run the prompt (``width`` columns), then a decode step, with
        Triton's launches compiling side by side and running nothing (``crossml.kernels.CompileAhead``), so the
        real runs find their kernels compiled. The prompt's kernels are waited for; the decode step's (and the greedy
        step's, ``_greedy_ahead``) compile in the background while the prompt runs, and the first greedy or decode
        step waits for them (``_decode_kernels_ready``). The dry runs' other ops run on unwritten values, which the
        builder's decoders use only in arithmetic (integers come from the feed or from all-integer kernels, which
        run), and nothing is kept: the KV cache is written by the attention kernel alone. Any failure leaves the real
        runs to compile as they go.

        Measured and dropped: skipping the dry runs in a process whose Triton cache already holds the kernels (a
        marker file per decoder, options, shapes and versions). On the H200 host, three warm-cache processes
        each, first prompt + 8 tokens went 0.83 -> 0.67 s for the Qwen2.5-0.5B-shaped fp16 model and 0.84 -> 0.86
        s for int4: the decode step's kernels then load on the main thread at the first step."""
        from crossml.kernels import CompileAhead

        io = self._model.io
        try:
            prompt = CompileAhead(self._dev)
            if not prompt.active:
                return
            with prompt.collect():
                mask = self._mask[:, :width]
                pos = _positions(mask) if io.position_ids is not None else None
                feed = self._feed(self._seq[:, :width], mask, pos)
                if self._selects(0, end):  # the real run's shapes
                    feed[self._model.rows_input] = self._rows_tensor(0, end)
                self._model.run(feed, self._names, eager=True)
            prompt.wait()
            if self._bufs is not None:
                decode = CompileAhead(self._dev)
                with decode.collect():
                    outs = self._model.run(self._feed(self._bufs.ids, self._mask, self._bufs.pos), self._names,
                                           eager=True)
                    if self._greedy is not None:
                        self._greedy_ahead(outs[0], end)
                self._model._decode_compiles = decode
        except Exception as exc:  # noqa: BLE001 - the real runs compile what is missing and report real errors
            log.debug("compiling the first prompt's kernels ahead failed: %s", exc)

    def _decode_kernels_ready(self) -> None:
        """Wait for the kernels the dry decode step handed over at the first prompt (``Model._decode_compiles``,
        compiling in the background since), which puts them in Triton's in-memory cache: until then a launch of one
        of them compiles it again (from the on-disk cache, if its compile has finished). The first decode step and
        the first greedy step, which runs just before it, call this."""
        compiles = self._model._decode_compiles
        if compiles is not None:
            compiles.wait()
            self._model._decode_compiles = None

    def _greedy_ahead(self, logits: torch.Tensor, col: int) -> None:
        """Inside the decode step's ``CompileAhead.collect``: the greedy step's launches as the first two steps make
        them (``_greedy_step``: the prompt's last logits as their float32 copy, then a recorded step's logits
        buffer, copied to float32 as the kernel reads it; ``ban_eos`` as min_length gives), so their kernels and
        host launchers compile in the pool with the model's rather than on the main thread at the first
        ``generate_next_token``; ``col``: the first step's column (the prompt's end). The launches only compile:
        nothing is written."""
        if logits.dim() == 3:
            logits = logits[:, -1]
        host = self._host_slot(0)[0]
        copy = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        for c, x, into in ((col, copy, None), (col + 1, logits, copy)):
            if c >= self._s.max_length:
                break
            self._launch_greedy(x, c, into, host)

    def _hidden_cols(self, start: int, end: int) -> torch.Tensor | None:
        """set_hidden_states' rows for columns start..end of the run being made (None: the decoder takes none)."""
        if self._model.io.hidden_input is None:
            return None
        return self._hidden[:, start - self._run_start:end - self._run_start]

    def _put_hidden(self, buf: torch.Tensor | None, start: int, end: int) -> None:
        """Copy the hidden states of columns start..end into a fixed buffer, zero past them (its pad columns)."""
        if buf is None:
            return
        n = end - start
        buf[:, :n].copy_(self._hidden_cols(start, end))
        buf[:, n:].zero_()

    def _feed(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor | None,
              hidden: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        io = self._model.io
        feed = {io.input_ids: ids.to(io.input_ids_dtype)}
        if io.hidden_input is not None:  # (zeros for a run made only to compile its kernels)
            feed[io.hidden_input] = (hidden if hidden is not None else
                                     torch.zeros((*ids.shape, io.hidden_size), dtype=io.hidden_dtype, device=ids.device))
        if io.attention_mask is not None:
            feed[io.attention_mask] = mask
        if io.position_ids is not None:
            feed[io.position_ids] = _streams(pos, io.position_streams).to(io.position_dtype)
        feed.update(self._cache.feed())
        feed.update(self._states.feed())
        feed.update(self._extra)
        return feed

    # -- the decoder's extra inputs -----------------------------------------------------------
    def set_active_adapter(self, adapters: Adapters, adapter_name: str) -> None:
        """Feed the LoRA adapter ``adapter_name`` of ``adapters`` to every later run of this generator (a step that
        already ran ahead is run again). Several adapters may be active: the first one set that names a
        parameter gives it."""
        if not isinstance(adapters, Adapters):
            raise TypeError(f"set_active_adapter: expected og.Adapters, got {type(adapters).__name__}")
        if adapters._model is not self._model:
            raise GenAIError("set_active_adapter: these Adapters were made for another og.Model")
        if any(name == adapter_name for name, _ in self._adapters):
            return
        adapter = adapters._find(adapter_name)
        io, where = self._model.io, self._model.config.model.decoder.filename
        for param, arr in adapter._params.items():
            if param not in io.extra:
                raise GenAIError(
                    f"set_active_adapter: adapter '{adapter_name}' has parameter '{param}', which is not an input of "
                    f"'{where}' an adapter may feed; such inputs: {', '.join(io.extra) or 'none'}. Was the adapter "
                    "made for this model?")
            want, got = io.extra[param], dtypes.onnx_type_of_numpy(arr.dtype)
            if want != got:
                raise GenAIError(
                    f"set_active_adapter: adapter '{adapter_name}' parameter '{param}' is {dtypes.tensor_type_string(got)}"
                    f" but '{where}' takes {dtypes.tensor_type_string(want)}")
        adapters._acquire(adapter_name)
        weakref.finalize(self, adapters._release, adapter_name)
        self._adapters.append((adapter_name, adapter))
        self._refresh_extras()

    def set_model_input(self, name: str, value: Any) -> None:
        """Feed ``value`` as the decoder input ``name`` on every later run: an input crossml.genai does not feed
        itself (not input_ids, the mask, positions or the KV cache). Its type must be the input's own."""
        io = self._model.io
        if name not in io.extra:
            managed = [n for n in (io.input_ids, io.attention_mask, io.position_ids) if n is not None]
            fed = managed + io.past_names + io.state_names
            hint = (f"'{name}' is fed by the generator (append_tokens)" if name in fed
                    else f"'{name}' takes hidden states: give them with set_hidden_states" if name == io.hidden_input
                    else f"'{name}' is not an input of '{self._model.config.model.decoder.filename}'")
            raise NameNotFoundError(f"set_model_input: {hint}; inputs it takes from the caller: "
                                    f"{', '.join(io.extra) or 'none'}")
        if isinstance(value, torch.Tensor):
            t, got = value, dtypes.TORCH_TO_ONNX.get(value.dtype, 0)
        else:
            arr = value.as_numpy() if isinstance(value, Tensor) else np.asarray(value)
            got = dtypes.onnx_type_of_numpy(arr.dtype)
            t = dtypes.from_numpy(arr.copy(order="C")) if got != dtypes.TP.STRING else None
        if got != io.extra[name] or t is None:
            raise GenAIError(f"set_model_input: Unexpected input data type for '{name}'. Actual: "
                             f"({dtypes.tensor_type_string(got)}), expected: "
                             f"({dtypes.tensor_type_string(io.extra[name])})")
        self._model_inputs[name] = t.to(self._dev, copy=True)
        self._refresh_extras()

    def set_hidden_states(self, hidden_states: Any) -> None:
        """Feed ``hidden_states`` ([batch, columns, hidden], the decoder input's element type) to the decoder input
        model.decoder.inputs.hidden_states names (an MTP head's: the main model's hidden states, one row per token
        the next append_tokens feeds) on the runs to come. Does nothing for a decoder without that input, as in
        onnxruntime-genai."""
        io = self._model.io
        name = io.hidden_input
        if name is None:
            return
        value = hidden_states.as_numpy() if isinstance(hidden_states, Tensor) else hidden_states
        if not isinstance(value, torch.Tensor):
            value = np.asarray(value)
            value = dtypes.from_numpy(value.copy(order="C")) if value.dtype.kind == "f" else value
        if not isinstance(value, torch.Tensor) or value.dtype != io.hidden_dtype:
            got = value.dtype if isinstance(value, torch.Tensor) else value.dtype
            raise GenAIError(f"set_hidden_states: Unexpected input data type for '{name}'. Actual: ({got}), "
                             f"expected: ({io.hidden_dtype})")
        if value.dim() != 3 or value.shape[0] != self._rows or value.shape[2] != io.hidden_size:
            raise ValueError(f"set_hidden_states: '{name}' takes [batch, columns, hidden] ({self._rows} rows of "
                             f"{io.hidden_size}), got shape {tuple(value.shape)}")
        self._hidden = value.to(self._dev, copy=True)

    def snapshot_state(self) -> None:
        """Keep the carried layer states (Qwen3.5's Gated DeltaNet, LFM2's convolutions) of the tokens run so far, so
        that ``rewind_to`` this length puts them back instead of running the sequence again (speculative decoding
        over such a model). Does nothing for a decoder without carried states, as in onnxruntime-genai."""
        if not self._states.tensors:
            return
        if self._spec is not None:
            self._spec.discard()
        self._settle()
        if not self._len:
            return
        self._ready()  # the pending token's step runs now (it would run next anyway): states and logits of every column
        self._snapshot = (self._kv_len, [t.clone() for t in self._states.tensors], self._logits.float().clone())

    def set_inputs(self, named_tensors: Any) -> None:
        raise GenAIError(f"Please use generator.append_tokens for {self._model.type}. set_inputs is not supported for "
                         "this model type (it takes a multimodal processor's outputs); give other decoder inputs "
                         "with set_model_input(name, value)")

    def _refresh_extras(self) -> None:
        """Merge the extra inputs (adapters first, in the order set; then set_model_input values; then presets) into
        the feed of later runs. A step that already ran ahead read the old values: it runs again."""
        values = {name: v._value for name, v in active_feed([a for _, a in self._adapters], self._dev).items()}
        for name, t in self._model_inputs.items():
            values.setdefault(name, t)
        for name, t in self._model._presets.items():
            values.setdefault(name, t)
        if self._bufs is not None:
            self._bufs.bind_extras(values)
            values = dict(self._bufs.extras)
        self._extra = values
        if self._ahead_outputs is not None:
            self._drop_ahead()
            self._logits, self._live = None, False
        if self._spec is not None:
            self._spec.extras_changed()

    def _stage(self, col: int) -> None:
        """Write the decode inputs for the token in column ``col`` (its id, its position) into the fixed buffers;
        done right after a token is appended, so the device does it before the host waits for the token and the
        next decode step launches its replay at once."""
        bufs = self._bufs
        bufs.ids.copy_(self._seq[:, col:col + 1])
        if bufs.pos is not None:
            bufs.pos.copy_(search.position_of(self._mask, col))
        self._staged = col

    def _scores(self) -> torch.Tensor:
        s = self._s
        scores = self._logits
        seq = self._seq[:, :self._len]
        scores = search.apply_repetition_penalty(scores, seq, s.repetition_penalty)
        scores = search.apply_min_length(scores, self._len, s.min_length, self._eos)
        scores = search.apply_no_repeat_ngram(scores, seq, s.no_repeat_ngram_size)
        if self._guide is not None:  # what the grammar refuses gets the lowest float32, as onnxruntime-genai sets it
            allowed = self._guide.allowed(scores.shape[-1], scores.device)
            scores = scores.float().masked_fill(~allowed, torch.finfo(torch.float32).min)
        return scores

    def _select(self) -> torch.Tensor:
        s = self._s
        scores = self._scores()
        if s.do_sample:
            return search.sample(scores, top_k=s.top_k, top_p=s.top_p, temperature=s.temperature, generator=self._rng)
        return search.greedy(scores)

    def generate_next_token(self) -> None:
        """Choose the next token of every sequence and append it."""
        self._check_terminated()
        if self._len == 0:
            raise GeneratorStateError("generate_next_token: call append_tokens with the prompt first")
        if self.is_done():
            raise GeneratorStateError("generate_next_token: generation is done (every sequence ended or reached "
                                      f"max_length {self._s.max_length}); check is_done() before generating")
        if logs.wants("generate_next_token"):
            s = self._s
            logs.emit("generate_next_token", " ".join([
                logs.field("do_sample", int(s.do_sample)), logs.field("top_k", s.top_k),
                logs.field("top_p", f"{s.top_p:g}"), logs.field("temperature", f"{s.temperature:g}"),
                logs.field("sequence length", self._len, colour=36)]))
        if self._spec is not None:
            self._spec.step()
        else:
            self._standard_step()
        if logs.wants("append_next_tokens") or logs.wants("hit_eos") or logs.wants("hit_max_length"):
            self._log_step()

    def _standard_step(self) -> None:
        """Choose from the logits of the tokens so far (running the decoder if they are not current) and append."""
        self._ready()
        if self._beam is not None:
            self._beam_step()
        elif self._greedy is not None:
            self._greedy_step()
        elif self._guide is not None:
            live = np.flatnonzero(~self._done.cpu().numpy())  # rows still generating: their tokens are committed
            col = self._len
            self._append(search.finish(self._select(), self._done, self._pad, self._eos))
            self._guide.commit(self._settle()[0], live)
            self._guide_cols.append(col)
        else:
            self._append(search.finish(self._select(), self._done, self._pad, self._eos))

    def _log_step(self) -> None:
        """The log of a step (onnxruntime-genai's events): its tokens, the rows that chose an end-of-sequence
        token, and reaching max_length. Reads the tokens on the host."""
        tokens, _ = self._settle()
        if logs.wants("append_next_tokens"):
            logs.emit("append_next_tokens", "".join(f"{t} " for t in tokens))
        if logs.wants("hit_eos"):
            for row in np.flatnonzero(np.isin(tokens, self._model.config.model.eos_token_id)):
                logs.emit("hit_eos", f"EOS seen on batch {row}")
        if logs.wants("hit_max_length") and self._len >= self._s.max_length:
            logs.emit("hit_max_length", f"max_length {self._s.max_length} reached")

    def _append(self, token: torch.Tensor) -> None:
        col = self._len
        self._seq[:, col] = token
        self._mask[:, col] = 1
        if self._bufs is not None and col + 1 < self._s.max_length:
            self._stage(col)
        self._advance(token)

    def _greedy_step(self) -> None:
        """``_select`` + ``_append`` for plain greedy search, in one Triton step (same results)."""
        self._decode_kernels_ready()  # the step's kernels compiled with the decode step's (_greedy_ahead)
        col = self._len
        logits = self._logits
        copy = None
        if self._live:  # the graph's buffer: keep its float32 copy, made as the kernel reads it
            copy = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
            shown = self._outputs.get(self._names[0])
            if isinstance(shown, _Shown) and shown.live and shown.logits is logits:
                shown.logits, shown.live = copy, False
            self._logits, self._live = copy, False
        host, host_np = self._host_slot(self._slot)
        self._slot ^= 1
        self._launch_greedy(logits, col, copy, host)
        # staged even for the last column, whose step never runs: one compiled variant of the kernel for every step
        # (a variant first compiled at the last token cost a benchmark's first run 4-11 ms on an H200)
        self._staged = col
        self._advance(self._step_out[:self._rows], self._step_out, (Queue(self._dev).signal(), host_np))

    def _host_slot(self, i: int) -> tuple[torch.Tensor, np.ndarray]:
        """Host slot ``i`` (of two, used in turn) the greedy step writes each step's [tokens, done flags] to: page-locked
        memory the device writes and its numpy view (made at first use)."""
        if not self._host_slots:
            self._host_slots = [Queue(self._dev).host_visible((2 * self._rows,), torch.long) for _ in range(2)]
        return self._host_slots[i]

    def _launch_greedy(self, logits: torch.Tensor, col: int, copy: torch.Tensor | None, host: torch.Tensor) -> None:
        """The greedy step's launch for column ``col`` (``_greedy_step``, and its dry launches in ``_greedy_ahead``)."""
        self._greedy.greedy_step(logits, seq=self._seq, mask=self._mask, done=self._done, eos=self._eos,
                                 pad=self._pad, col=col, ban_eos=col < self._s.min_length, out=self._step_out,
                                 ids=self._bufs.ids, pos=self._bufs.pos, copy=copy, host=host)

    def _advance(self, token: torch.Tensor, both: torch.Tensor | None = None,
                 pending: tuple[Fence, np.ndarray] | None = None) -> None:
        """The sequence grew by ``token`` (already written); ``both``: [tokens, done flags] if already made;
        ``pending``: their host copy, valid once the fence completes, if already on its way."""
        self._len += 1
        self._next = token
        self._logits = None
        self._host = None
        self._finished_step = False
        if pending is not None:
            self._pending = pending
        if self._ahead and self._len < self._s.max_length and self._ahead_keeps():
            # the host copy first, then the step this token feeds: the host waits only for the copy
            if pending is None:
                if both is None:
                    both = self._tokens_and_flags()
                self._pending = Queue(self._dev).readback(DeviceTensor(both), blocking=False)
            self._forward(ahead=True)

    def _ahead_keeps(self) -> bool:
        """Whether the step the last token feeds evicts nothing from a window-sized KV cache (its ``_len`` rows fit
        the window layers' rows), so it may run ahead and be dropped; True without window layers. Gemma 2/3/4 and
        gpt-oss run ahead until their window caches fill (a benchmark's 1024 tokens on Gemma 4's 1024-row ones: all of
        them), then step by step."""
        return not self._model.window_layers or self._len <= self._model.window_rows(self._s.max_length)

    def _drop_ahead(self) -> None:
        """Forget the step that ran ahead: the next run starts at its first column again, and the carried layer states
        it advanced are put back (from the copy ``_forward`` made before it ran)."""
        self._kv_len = self._ahead_run[0]
        self._ahead_outputs = self._ahead_run = None
        if self._states.tensors:
            self._states.restore()

    def _tokens_and_flags(self) -> torch.Tensor:
        """[the last step's tokens, finished flags] (int64): what the host copies once per step."""
        return torch.cat([self._next, self._done.long()])

    def _beam_step(self) -> None:
        src, token = self._beam.step(self._scores(), self._seq[:, :self._len], self._pad)
        self._seq[:, :self._len] = self._seq[src, :self._len]
        self._mask[:, :self._len] = self._mask[src, :self._len]
        self._cache.reorder(src)
        self._states.reorder(src)
        self._append(token)
        if self._beam.done() or self._len >= self._s.max_length:
            self._final = self._beam.finalize(self._seq[:, :self._len], self._s.num_return_sequences)

    # -- host view ----------------------------------------------------------------------------
    def _settle(self) -> tuple[np.ndarray, bool]:
        """Copy the last step's tokens and finished flags to the host (one copy per step)."""
        if self._host is None:
            if self._next is None:
                self._host = (np.zeros(0, np.int32), False)
            elif self._beam is not None:
                self._host = (self._next.to(torch.int32).cpu().numpy(), self._beam.done())
            else:
                if self._pending is not None:
                    fence, both = self._pending
                    fence.wait()
                    self._pending = None
                else:
                    both = self._tokens_and_flags().cpu().numpy()
                all_done = bool(both[self._rows:].all())
                self._host = (both[: self._rows].astype(np.int32), all_done)
                if all_done and not self._finished_step:
                    self._unappend()
                    if self._kv_len > self._len:  # that token's step ran ahead: drop it
                        self._drop_ahead()
                        self._logits = None
        return self._host

    def is_done(self) -> bool:
        if self._len == 0:
            return False
        if self._final is not None:
            return True
        _, all_done = self._settle()
        return all_done or self._len >= self._s.max_length

    def get_next_tokens(self) -> np.ndarray:
        return self._settle()[0].copy()

    def token_count(self) -> int:
        self._settle()
        return self._len

    def get_sequence(self, index: int) -> np.ndarray:
        self._settle()
        count = self._s.batch_size * (self._s.num_return_sequences if self._beam is not None else 1)
        if not 0 <= index < count:
            raise IndexError(f"get_sequence: index {index} is out of range; there are {count} sequences")
        if self._final is not None:
            return np.asarray(self._final[index], dtype=np.int32)
        row = index * self._s.num_beams // (self._s.num_return_sequences if self._beam is not None else 1)
        return self._seq[row, :self._len].to(torch.int32).cpu().numpy()

    # -- logits and outputs -------------------------------------------------------------------
    def get_logits(self) -> np.ndarray:
        """The last-token logits of every row, [rows, 1, vocab] float32."""
        if self._len == 0:
            raise GeneratorStateError("get_logits: call append_tokens first")
        self._settle()
        self._ready()
        return self._logits[:, None, :].float().cpu().numpy()

    def set_logits(self, logits: Any) -> None:
        """Replace the logits the next generate_next_token chooses from ([rows, vocab] or [rows, 1, vocab])."""
        if self._len == 0:
            raise GeneratorStateError("set_logits: call append_tokens first")
        arr = np.asarray(logits, dtype=np.float32)
        vocab = self._outputs[self._model.io.logits].shape[-1] if self._outputs else arr.shape[-1]
        if arr.size != self._rows * vocab:
            raise ValueError(f"set_logits: expected {self._rows} x {vocab} values, got shape {arr.shape}")
        if self._spec is not None:
            self._spec.discard()  # the tokens queued were chosen from the logits this replaces
        self._settle()
        self._ready()
        self._logits, self._live = torch.as_tensor(arr.reshape(self._rows, vocab), device=self._dev), False

    def get_output(self, name: str) -> np.ndarray:
        """A decoder output of the last run (e.g. "logits", "present.0.key")."""
        if name not in self._outputs:
            known = ", ".join(self._outputs) or "none yet: call append_tokens first"
            raise NameNotFoundError(f"get_output: '{name}' is not an output of the last run; outputs: {known}")
        value = self._outputs[name]
        if isinstance(value, _Shown):
            return value.logits.to(value.dtype).reshape(value.shape).cpu().numpy()
        if isinstance(value, _Tail):
            return value.value().cpu().numpy()
        return value.cpu().numpy()

    def get_input(self, name: str) -> np.ndarray:
        """A decoder input of the last run, as it was fed: "input_ids" (the tokens that run took in),
        "attention_mask", "position_ids" (models that take them) and the past KV inputs (with the shared buffer:
        the max_length buffer itself, as onnxruntime-genai shows it)."""
        io = self._model.io
        run = self._run
        known = [n for n in (io.input_ids, io.attention_mask, io.position_ids) if n is not None]
        known += self._cache.past_names + self._states.past_names + list(self._extra)
        if name not in known or run is None:
            have = ", ".join(known) if run is not None else "none yet: call append_tokens first"
            raise NameNotFoundError(f"get_input: '{name}' is not an input of the last run; inputs: {have}")
        start, end = run
        if name == io.input_ids:
            value = self._seq[:, start:end].to(io.input_ids_dtype)
        elif name == io.attention_mask:
            value = self._mask[:, :end]
        elif name == io.position_ids:
            value = _streams(_positions(self._mask[:, :end])[:, start:end], io.position_streams).to(io.position_dtype)
        elif name in self._extra:
            value = self._extra[name]
        elif name in self._states.past_names:
            value = self._states.feed()[name]  # the state the next run takes in (the last run's present)
        else:
            value = self._cache.feed()[name]
            if not self._s.past_present_share_buffer:
                value = value[:, :, :start]  # the past the run took in (the cache now holds its present)
        return value.cpu().numpy()

    def set_runtime_option(self, key: str, value: str) -> None:
        """onnxruntime-genai's runtime options: ``("terminate_session", "1")`` makes every later append_tokens and
        generate_next_token raise (safe to call from another thread, to stop a generation loop);
        ``("terminate_session", "0")`` lets the generator go on where it stopped."""
        if key != "terminate_session":
            raise GenAIError(f"set_runtime_option: unknown key '{key}'; accepted: terminate_session (\"0\" or "
                             "\"1\"). For profiling, set session_options.enable_profiling in genai_config.json")
        if str(value) not in ("0", "1"):
            raise GenAIError(f"set_runtime_option: terminate_session takes \"0\" or \"1\", got {value!r}")
        self._terminated = str(value) == "1"

    def _check_terminated(self) -> None:
        if self._terminated:
            raise GeneratorStateError("Session in Terminated state, exiting! (set_runtime_option(\"terminate_session\", "
                                      "\"0\") to go on)")

    # -- rewinding ----------------------------------------------------------------------------
    def _evicted(self, new_length: int) -> bool:
        """Whether running again from column ``new_length - 1`` needs positions a window-sized KV cache has evicted."""
        return (bool(self._model.window_layers) and new_length - 1 < self._kv_len
                and self._kv_len > self._model.window_rows(self._s.max_length))

    def _run_again_from(self, column: int) -> None:
        """The next run starts at ``column`` (its KV rows are written again); with carried layer states, which hold no
        positions to cut back to, from the first column on a zero state, or from the snapshot_state taken there."""
        self._kv_len = column
        snap = self._snapshot
        if snap is not None and snap[0] == column + 1 == self._len:
            self._states.put(snap[1])
            self._kv_len = column + 1
            self._logits = snap[2].clone()
        elif self._states.tensors:
            if snap is not None and snap[0] > column:
                self._snapshot = None  # its states hold tokens the sequence no longer has
            self._kv_len = 0
            self._states.reset()
            self._prompt_last = None
        self._cache.rewind(self._kv_len)

    def rewind_to(self, new_length: int) -> None:
        """Drop tokens after ``new_length``; the next step continues from sequence[:new_length]."""
        if self._spec is not None:
            self._spec.discard()
        self._settle()
        if self._s.batch_size != 1 or self._beam is not None:
            raise GeneratorStateError("rewind_to needs batch_size 1 and num_beams 1")
        if not 0 <= new_length <= self._len:
            raise GeneratorStateError(f"rewind_to({new_length}): the sequence has {self._len} tokens")
        capacity = self._model.window_rows(self._s.max_length)
        if 0 < new_length and self._evicted(new_length):
            raise GeneratorStateError(
                f"Cannot rewind to {new_length}: the sliding-window KV cache holds only the last {capacity} of "
                f"{self._kv_len} positions, so the tokens needed at that point have already been evicted. Increase "
                "model.decoder.sliding_window.cache_slack in genai_config.json to keep more positions resident, or "
                "rewind before the cache fills.")
        if self._guide is not None:  # the grammar back to the tokens committed before new_length
            kept = sum(c < new_length for c in self._guide_cols)
            self._guide.rewind(kept)
            self._guide_cols = self._guide_cols[:kept]
        self._seq[:, new_length:] = self._pad
        self._mask[:, new_length:] = 0
        self._len = new_length
        self._staged = None
        self._done.zero_()
        self._next = None
        self._host = None
        self._logits = None
        self._run_again_from(max(new_length - 1, 0))
        self._outputs = {}
        self._ahead_outputs = None
        self._run = self._ahead_run = None
        if new_length == 0:
            self._prompt_last = None
        if self._spec is not None:
            if new_length == 0:
                self._spec.reset()
            else:
                self._spec.forget(new_length)

    def _append_device(self, tokens: torch.Tensor) -> None:
        """Append tokens held on the device ([n]) after the first prompt and run them, without the host reading them
        (append_tokens' continuations; an MTP head's pairs and chained drafts). Batch 1, one beam, within max_length
        (the caller's to check)."""
        col, n = self._len, tokens.numel()
        self._seq[0, col:col + n] = tokens
        self._mask[:, col:col + n] = 1
        self._len = col + n
        self._logits, self._host, self._staged = None, None, None
        self._forward()

    def _cut(self, new_length: int) -> None:
        """Drop the columns from ``new_length`` on, keeping the KV rows of the ones before (no run again: the next
        append_tokens runs its own tokens only). A decoder without carried states; an MTP head's generator."""
        self._seq[:, new_length:] = self._pad
        self._mask[:, new_length:] = 0
        self._len = new_length
        self._kv_len = min(self._kv_len, new_length)
        self._cache.rewind(self._kv_len)
        self._logits, self._next, self._host, self._staged = None, None, None, None
        self._outputs = {}

    def get_speculative_stats(self) -> dict[str, Any]:
        """onnxruntime-genai's speculative-decoding counters, times and ratios (all zero without n-gram decoding;
        ``crossml.genai.speculative``)."""
        return self._spec.stats() if self._spec is not None else speculative.zero_stats()

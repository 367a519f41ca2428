"""og.Model: a model folder's decoder as a crossml.InferenceSession, plus what generation needs to know.

The decoder ONNX file runs through ``crossml.InferenceSession`` on the providers genai_config.json
(or the Config) names: crossml's GPU provider for ``gpu`` / ``cuda`` / ``dml``, the CPU otherwise.
Inputs and outputs stay torch tensors on the session's device between steps.

Static decode (GPUs, ``past_present_share_buffer``): as onnxruntime-genai's CUDA-graph mode, every
decode step feeds the same shapes at the same addresses: input_ids / position_ids [rows, 1],
attention_mask [rows, max_length] with zeros after the real tokens and the max-length KV buffers, all
from a ``DecodeBuffers`` set the model lends to one generator at a time. The session's per-signature
command list (graph capture, on by default; off with the session config entry
``ep.dml.enable_graph_capture=0``) is recorded on the second decode step (the first runs the plan
specialised for these shapes eagerly, which warms it for the capture) and replayed on the others;
with the session entry ``crossml.graph_capture_bind_io`` the replay reads those buffers in place and
GroupQueryAttention writes the new keys and values into the KV buffers in place, so a step copies
nothing. Sets are reused by later generators of the same shape, so their steps replay the same
recording. The builder's decoders derive ``seqlens_k`` from the mask's sum and
``total_sequence_length`` from its width; GroupQueryAttention gives the same result for a total of
max_length (rows past the real length are masked by causality).

Prompts are recorded too: a first prompt (``append_tokens`` on an empty sequence) is right-padded
to a bucket width (``prompt_bucket``: a multiple of a quarter of its power-of-two octave, at least 64,
at most max_length) with attention-mask zeros, fed from ``PromptBuffers`` of that width at fixed
addresses; the first prompt of a bucket runs the bucket's plan eagerly, the second records its graph
(no warm-up run: the first did it) and later ones replay it. A padded prompt computes exactly what the
batch path computes for a row shorter than its batch: the pad columns come after the real tokens, so
causality keeps them out of every real row, their keys and values land past the real length
(overwritten by the next steps, never attended), and the generator takes each row's logits at its
last real token. A set keeps ``MAX_PROMPT_GRAPHS`` buckets' recordings (each holds its activations
and logits).

Continuation prompts (a chat turn: more tokens appended to a started sequence) are recorded the same way
in buckets of their own (``chunk_bucket``: powers of two from 32), fed like a decode step: ids and
positions from ``PromptBuffers`` of the bucket's width, the set's whole max-length mask and the KV
buffers. The pad columns are fed as tokens (their mask columns are set for the run and cleared behind
it), so GroupQueryAttention places the chunk at its rows of the caches; causality keeps the pads out of
the real columns, and their keys and values land past the sequence, overwritten by the next steps before
any query reaches them. Not with window-sized caches (the pads would evict real positions) nor where the
bucket would run past max_length: those chunks, and decode steps with a growing cache, run eagerly (run
config ``gpu_graph_id=-1``).

Models that carry layer states (LFM2's short convolutions, Qwen3.5's Gated DeltaNet layers) cannot be padded: a
pad column would run through the states. Their prompts and chat turns (one row: GroupQueryAttention takes a prompt
on a past context for a batch of one only; no window-sized caches) are cut into pieces of exact widths
(``state_pieces``: STATE_PIECE_MAX columns while more remain, then the powers of two of the rest), each fed like a continuation chunk from ``PromptBuffers`` of its width (a set keeps one per power
of two up to STATE_PIECE_MAX) with the mask's columns set up to the piece's end only. Widths recur across prompts
of any length, so every piece comes to replay a recording. A prompt runs its recorded pieces first, then one
piece without a recording on its buffers (a width's first run warms its plan, its second records it), then the rest
in one eager run. A width's first runs cost several eager runs of host time, repaid over many prompts: a model takes
pieces only once it has run ``STATE_PIECE_AFTER`` such prompts (before that its first prompts are recorded at their
own width, its chat turns run eagerly).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from crossml import dtypes
from crossml.device.recording import capture_supported
from crossml.genai.config import DECODER_ONLY_TYPES, DEFAULT_CACHE_SLACK, UNSUPPORTED_TYPES, Config
from crossml.genai.errors import ModelFileNotFound, UnsupportedModelError
from crossml.genai.kv_cache import zero_kv, zero_states
from crossml.runtime.options import GraphOptimizationLevel, RunOptions, SessionOptions
from crossml.runtime.ortvalue import OrtValue
from crossml.runtime.session import (
    CAPTURE_BIND_IO,
    DEFER_CAPTURE,
    KV_INPLACE,
    OUTPUT_ROWS,
    ROWS_INPUT,
    InferenceSession,
)

log = logging.getLogger("crossml.genai")

CAPTURE = "ep.dml.enable_graph_capture"
#: run config entry (onnxruntime's CUDA provider): -1 runs this call without graph capture / replay
GRAPH_ID = "gpu_graph_id"

_OPT_LEVELS = {"ORT_DISABLE_ALL": GraphOptimizationLevel.ORT_DISABLE_ALL,
               "ORT_ENABLE_BASIC": GraphOptimizationLevel.ORT_ENABLE_BASIC,
               "ORT_ENABLE_EXTENDED": GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
               "ORT_ENABLE_ALL": GraphOptimizationLevel.ORT_ENABLE_ALL}


@dataclass
class DecoderIO:
    """Names and types of the decoder's inputs and outputs, as the session reports them."""

    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    past_names: list[str]
    present_names: list[str]
    logits: str
    kv_dtype: torch.dtype
    mask_dtype: torch.dtype
    position_dtype: torch.dtype
    input_ids_dtype: torch.dtype
    #: the layer of each KV pair of past_names (the layers without a carried state)
    kv_layers: list[int]
    #: each past's (kv_heads, head_size): the decoder input's fixed dimensions 1 and 3, else genai_config.json's
    #: num_key_value_heads / head_size (Gemma 4's global layers have other heads and head sizes than its local ones)
    kv_dims: list[tuple[int, int]]
    #: carried states of the layers without a KV cache (``crossml.genai.kv_cache.LayerStates``): LFM2's "conv"
    #: layers' convolution states, Qwen3.5's "linear_attention" layers' convolution and recurrent states. Past and
    #: present names, and each state's one-row shape and element type
    state_names: list[str]
    state_present_names: list[str]
    state_shapes: list[tuple[int, ...]]
    state_dtypes: list[torch.dtype]
    #: 3 where position_ids is [3, batch, sequence] (multimodal RoPE's temporal, height and width streams, equal for
    #: text tokens: MRotaryEmbedding), else 0 ([batch, sequence])
    position_streams: int
    #: the decoder's other inputs (name -> ONNX element type): fed by LoRA adapters (Adapters), by
    #: Generator.set_model_input, or by a preset (PRESET_INPUTS); ``required`` ones have no default value
    extra: dict[str, int]
    required: set[str]
    #: the decoder's other graph outputs, which every run fetches (get_output shows them): the hidden states a
    #: multi-token-prediction head reads (model.decoder.outputs.hidden_states), any output the builder adds
    other_outputs: list[str] = dataclasses.field(default_factory=list)
    #: the decoder input that takes hidden states (an MTP head's, model.decoder.inputs.hidden_states; fed through
    #: Generator.set_hidden_states, one row per column), and the output that gives them (a main model's); None where
    #: it has none. The input's width, and the element type of the input (else of the output)
    hidden_input: str | None = None
    hidden_output: str | None = None
    hidden_size: int = 0
    hidden_dtype: torch.dtype = torch.float32


#: inputs onnxruntime-genai feeds itself when a decoder has them and nothing else does: name -> value
PRESET_INPUTS = {"num_logits_to_keep": 0}  # 0: logits for every position

#: prompt recordings one DecodeBuffers set keeps (the least recently used bucket is dropped first); as many again
#: for continuation chunks
MAX_PROMPT_GRAPHS = 4
#: narrowest prompt bucket
MIN_PROMPT_BUCKET = 64
#: narrowest continuation-chunk bucket
MIN_CHUNK_BUCKET = 32
#: widest piece of a carried-state model's prompt (``state_pieces``; a power of two); 0 turns pieces off: such a
#: model's first prompt is recorded at its own width only and its chat turns run eagerly. A DecodeBuffers set keeps a
#: recording for every power of two up to it (1 ... 512: ten)
STATE_PIECE_MAX = 512
#: a carried-state model's prompts and chat turns take pieces once the model has run this many of them (its first
#: prompts of a width recorded at their own width, chat turns eager): a width's first runs cost far more host time
#: than an eager run, repaid only over many prompts (see Generator._plan_pieces)
STATE_PIECE_AFTER = 16
#: prompts and chat turns compute logits at each row's last real position only (the session entry
#: ``crossml.output_rows``: a GatherRows node in front of the lm_head product, ``crossml.graph.passes.output_rows``);
#: a full ``get_output("logits")`` of such a run computes the other positions when asked. False: every position, as
#: the decoder gives them (before models are made)
SELECT_LOGITS = True


def prompt_bucket(n: int, max_length: int) -> int:
    """Width a first prompt of ``n`` tokens is right-padded to for a recorded prompt graph: ``n`` rounded up
    to a multiple of a quarter of its power-of-two octave (four buckets from 2**k to 2**(k+1), at most a
    quarter more columns), at least MIN_PROMPT_BUCKET, at most ``max_length``. 512 stays 512; 513 becomes
    640; 100 becomes 112."""
    if n <= MIN_PROMPT_BUCKET:
        width = MIN_PROMPT_BUCKET
    else:
        step = 1 << ((n - 1).bit_length() - 3)
        width = -(-n // step) * step
    return min(max(width, n), max_length)


def chunk_bucket(n: int) -> int:
    """Width a continuation prompt of ``n`` tokens (a chat turn appended to a started sequence) is right-padded
    to for a recorded chunk graph: the power of two at or above ``n``, at least MIN_CHUNK_BUCKET. Coarser than
    first prompts' buckets, so turns of different lengths share recordings: a chunk's pad columns cost the GPU
    little against the host time of an eager run (about 25 ms for a 100-token Qwen2.5-0.5B turn on an H200
    host)."""
    return max(MIN_CHUNK_BUCKET, 1 << (n - 1).bit_length())


def state_pieces(n: int) -> list[int]:
    """Widths ``n`` columns of a carried-state model's prompt are cut into, largest first: STATE_PIECE_MAX while more
    remain, then the powers of two of the rest's binary digits. 300 -> [256, 32, 8, 4]; 1300 -> [512, 512, 256, 16, 4]."""
    top = STATE_PIECE_MAX
    widths = [top] * (n // top)
    rest = n % top
    widths += [1 << b for b in range(rest.bit_length() - 1, -1, -1) if rest >> b & 1]
    return widths


def _hidden_buffer(io: DecoderIO, rows: int, width: int, device: torch.device) -> torch.Tensor | None:
    """Fixed-address hidden states [rows, width, hidden] for a decoder that takes them (an MTP head), else None."""
    if io.hidden_input is None:
        return None
    return torch.zeros((rows, width, io.hidden_size), dtype=io.hidden_dtype, device=device)


def _position_buffer(io: DecoderIO, rows: int, width: int, device: torch.device) -> torch.Tensor | None:
    """Fixed-address position ids: [rows, width], or [3, rows, width] for multimodal RoPE's streams (a [rows, width]
    value copied in fills all three)."""
    if not io.position_ids:
        return None
    shape = (3, rows, width) if io.position_streams else (rows, width)
    return torch.zeros(shape, dtype=io.position_dtype, device=device)


class PromptBuffers:
    """A first prompt's or continuation chunk's input_ids / position_ids, ``width`` columns at fixed addresses, and
    the replay of the graph recorded on them (with the set's mask columns and KV buffers)."""

    def __init__(self, io: DecoderIO, rows: int, width: int, device: torch.device) -> None:
        self.width = width
        self.ids = torch.zeros((rows, width), dtype=io.input_ids_dtype, device=device)
        #: each row's position whose logits the run computes (the model's ``rows_input``)
        self.rows = torch.zeros(rows, dtype=torch.long, device=device)
        self.pos = _position_buffer(io, rows, width, device)
        self.hidden = _hidden_buffer(io, rows, width, device)
        self.replay: Any = None
        self.warmed = False  # a run on these buffers has run the specialised plan eagerly (see Model.run_bound)


class DecodeBuffers:
    """The decode step's inputs at fixed addresses (what a recorded decode graph reads in place), and the
    prompt buckets recorded on the same mask and KV buffers."""

    def __init__(self, io: DecoderIO, rows: int, max_length: int, kv_shapes: list[tuple[int, int, int]],
                 device: torch.device) -> None:
        self.rows, self.max_length = rows, max_length
        self.ids = torch.zeros((rows, 1), dtype=io.input_ids_dtype, device=device)
        self.pos = _position_buffer(io, rows, 1, device)
        self.hidden = _hidden_buffer(io, rows, 1, device)
        self.mask = torch.zeros((rows, max_length), dtype=io.mask_dtype, device=device)
        self.kv = zero_kv(rows, kv_shapes, io.kv_dtype, device)
        #: the carried layer states (``crossml.genai.kv_cache.LayerStates``: LFM2's, Qwen3.5's), one buffer per state
        self.states = zero_states(rows, io.state_shapes, io.state_dtypes, device)
        self._io, self._device = io, device
        self._unrecorded()

    def _unrecorded(self) -> None:
        """The set's bookkeeping as a new set has it: nothing recorded, no prompt buckets, no extra inputs."""
        #: replays the decode graph recorded on these buffers (set after the first recorded decode step)
        self.replay: Any = None
        self.warmed = False  # a decode step on these buffers has run the specialised plan eagerly
        self.prompts: OrderedDict[int, PromptBuffers] = OrderedDict()
        self.chunks: OrderedDict[int, PromptBuffers] = OrderedDict()  # continuation chunks (full-width mask)
        self.pieces: OrderedDict[int, PromptBuffers] = OrderedDict()  # carried-state models' pieces (state_pieces)
        #: the decoder's extra inputs (adapter parameters, set_model_input values) at fixed addresses
        self.extras: dict[str, torch.Tensor] = {}
        #: the sequences of token ids ([rows, max_length] int64) when the set owns them (an Engine's batch, whose
        #: rows' generators keep theirs in it); None: each generator has its own
        self.seq: torch.Tensor | None = None

    def row_view(self, row: int) -> DecodeBuffers:
        """Row ``row`` of this set as a set of one row: its mask, KV and state buffers are views of this set's rows,
        its ids and positions its own. A generator on it writes the row in place, so a run of the whole set
        (``crossml.genai.engine``'s batched decode steps) sees each row's sequence as its own generator left it."""
        view = object.__new__(DecodeBuffers)
        view.rows, view.max_length = 1, self.max_length
        view.ids = torch.zeros((1, 1), dtype=self.ids.dtype, device=self._device)
        view.pos = _position_buffer(self._io, 1, 1, self._device)
        view.hidden = _hidden_buffer(self._io, 1, 1, self._device)
        view.mask = self.mask[row:row + 1]
        view.kv = [t[row:row + 1] for t in self.kv]
        view.states = [t[row:row + 1] for t in self.states]
        view._io, view._device = self._io, self._device
        view._unrecorded()
        view.seq = self.seq[row:row + 1] if self.seq is not None else None
        return view

    def bind_extras(self, values: dict[str, torch.Tensor]) -> None:
        """Copy a generator's extra input values into this set's fixed buffers. A different set of names, shapes
        or types gets new buffers, and the recordings made on the old ones are dropped."""
        old = self.extras
        if old.keys() != values.keys() or any(old[k].shape != v.shape or old[k].dtype != v.dtype
                                              for k, v in values.items()):
            self.extras = {k: torch.empty_like(v, device=self._device) for k, v in values.items()}
            self.replay = None
            self.warmed = False
            self.prompts.clear()
            self.chunks.clear()
            self.pieces.clear()
        for k, v in values.items():
            self.extras[k].copy_(v)

    def prompt(self, width: int) -> PromptBuffers:
        """The first-prompt buffers of one bucket width (a width's first prompt runs its plan eagerly, the second
        records it: see ``Model.run_bound``); the least recently used beyond MAX_PROMPT_GRAPHS are dropped with
        their recordings."""
        return self._slot(self.prompts, width)

    def chunk(self, width: int) -> PromptBuffers:
        """``prompt`` for continuation chunks, which feed the whole max-length mask (another recording)."""
        return self._slot(self.chunks, width)

    def piece(self, width: int) -> PromptBuffers:
        """``chunk`` for a carried-state model's prompt pieces (exact widths, no pad columns)."""
        return self._slot(self.pieces, width, max(1, STATE_PIECE_MAX.bit_length()))

    def _slot(self, slots: OrderedDict[int, PromptBuffers], width: int, keep: int = MAX_PROMPT_GRAPHS) -> PromptBuffers:
        slot = slots.pop(width, None)
        if slot is None:
            slot = PromptBuffers(self._io, self.rows, width, self._device)
        slots[width] = slot
        while len(slots) > keep:
            slots.popitem(last=False)
        return slot


#: the first Model() of a process moves the objects that exist then (the imported modules' functions, classes and
#: tables: torch, Triton, numpy, ...) out of the cyclic collector's reach (``gc.freeze``), so the full collections
#: that generation's allocations bring on do not walk them again (see ``_freeze_imports``); CROSSML_GC_FREEZE=0
#: turns it off
GC_FREEZE = os.environ.get("CROSSML_GC_FREEZE", "1") != "0"
_frozen = False
_freeze_lock = threading.Lock()  # models made on several threads at once: one freeze, before any model's objects


def _freeze_imports() -> None:
    """Once a process, before the first model's own objects exist: collect, then freeze what is left.

    The model's objects are made after it, so a dropped model is collected as before; objects alive at this point
    that later become cyclic garbage are not (gc.freeze's rule), a bounded cost paid once. Without it, a warm
    process's first prompt ran one full collection of 73-95 ms (H200, LFM2-350M and Qwen2.5-0.5B fp16): first
    prompt and 8 tokens 721 -> 618 and 666 -> 542 ms (medians of 3 processes each, results/first_tokens.md)."""
    global _frozen
    if _frozen or not GC_FREEZE:
        return
    with _freeze_lock:
        if not _frozen:
            gc.collect()
            gc.freeze()
            _frozen = True


class Model:
    """og.Model(config_or_path)."""

    def __init__(self, config: Config | str | os.PathLike[str]) -> None:
        _freeze_imports()
        self.config = config if isinstance(config, Config) else Config(config)
        mc = self.config.model
        if mc.type not in DECODER_ONLY_TYPES and mc.type != "speculative":
            why = f" ({UNSUPPORTED_TYPES[mc.type]})" if mc.type in UNSUPPORTED_TYPES else ""
            raise UnsupportedModelError(
                f"model type '{mc.type}' (model.type in {self.config._file}) is not supported by crossml.genai{why}; "
                f"supported decoder-only types: {', '.join(DECODER_ONLY_TYPES)}")
        filename = mc.decoder.filename
        model_path = os.path.join(self.config.path, filename)
        data = self.config._model_data.get(filename)
        if data is None and not os.path.isfile(model_path):
            raise ModelFileNotFound(f"decoder model '{model_path}' (model.decoder.filename in {self.config._file}) "
                                    "not found")
        providers = self.config.providers()
        so = self._session_options()
        self.session = InferenceSession(model_path if data is None else data, so, providers=providers)
        self.device: torch.device = self.session.device
        tail = self.session._tail
        #: the decoder input that selects one position per row for the logits (None: the decoder computes them at every
        #: position), and the lm_head product's per-position inputs a selecting run also gives (``logits_at_every``)
        self.rows_input: str | None = ROWS_INPUT if tail is not None else None
        self.rows_hidden: list[str] = list(tail.inputs) if tail is not None else []
        self.io = self._decoder_io()
        #: the session records decode steps into a device graph (a GPU, capture not turned off)
        self._capture = bool(self.session._capture)
        #: decode steps feed fixed shapes (max-length attention mask) at fixed addresses, so one recorded
        #: graph replays them; on for GPUs. Internal: tests force it on the CPU.
        self._static_decode = capture_supported(self.device) and self.config.search.past_present_share_buffer
        #: first prompts are padded to bucket widths and recorded too (needs the static decode buffers; with carried
        #: layer states at their own width, see Generator._forward); internal: tests force it on the CPU
        self._prompt_graphs = self._capture and self._static_decode
        #: a padded run's logits can be cut to its real columns: the decoder gives logits per position ([batch,
        #: sequence, vocab], as the builder's do). Padded prompts and chunks need it.
        logits_shape = next((a.shape for a in self.session.get_outputs() if a.name == self.io.logits), None)
        self._logits_per_position = logits_shape is not None and len(logits_shape) == 3
        #: generators run the next decode step as soon as a token is appended, before the host reads it (see
        #: crossml.genai.generator); internal: tests force it on the CPU
        self._run_ahead = self._capture and self._static_decode
        # (with carried layer states too: a step run ahead keeps a copy of the states it advances, put back when the
        # step is dropped, Generator._forward)
        #: the first prompt compiles the Triton kernels of its run and of the decode step side by side before
        #: running (see Generator._compile_ahead); CROSSML_COMPILE_AHEAD=0 turns it off
        self._compile_ahead = os.environ.get("CROSSML_COMPILE_AHEAD", "1") != "0"
        self._decode_compiles: Any = None  # a CompileAhead of the decode step's kernels, still compiling
        self._buffers: dict[tuple[int, int], list[DecodeBuffers]] = {}
        self._buffers_lock = threading.Lock()
        #: prompts and chat turns of a carried-state model run on the static path (see STATE_PIECE_AFTER)
        self._state_prompts = 0

        #: layers whose KV caches are window-sized (model.decoder.sliding_window.layers: their GroupQueryAttention
        #: has sliding_window_cache=1) and those caches' capacity: window_size + cache_slack (0: the default)
        sw = mc.decoder.sliding_window or {}
        self.window_layers = frozenset(int(i) for i in sw.get("layers", ()))
        self.window_size = int(sw.get("window_size", 0))
        self.window_capacity = self.window_size + (int(sw.get("cache_slack", 0)) or DEFAULT_CACHE_SLACK)
        #: values of the decoder's preset inputs (PRESET_INPUTS it takes and gives no default for)
        shapes = {a.name: a.shape for a in self.session.get_inputs()}
        self._presets = {name: torch.full([1] * len(shapes[name]), value, device=self.device,
                                          dtype=dtypes.torch_dtype(self.io.extra[name]))
                         for name, value in PRESET_INPUTS.items() if name in self.io.required}

        self._eager = RunOptions()
        self._eager.add_run_config_entry(GRAPH_ID, "-1")
        self._defer = RunOptions()
        self._defer.add_run_config_entry(DEFER_CAPTURE, "1")
        #: the draft decoder of speculative decoding (model.draft: crossml.genai.speculative), on the same providers
        self.draft: Model | None = None
        if mc.draft is not None:
            config = copy.copy(self.config)
            config.model = dataclasses.replace(mc, decoder=mc.draft, draft=None)
            self.draft = Model(config)

    @property
    def type(self) -> str:
        return self.config.model.type

    @property
    def device_type(self) -> str:
        """"CPU", or the GPU provider's onnxruntime-genai name ("DML", "CUDA", "GPU")."""
        if self.device.type == "cpu":
            return "CPU"
        name = self.session.get_providers()[0]
        return {"DmlExecutionProvider": "DML", "CUDAExecutionProvider": "CUDA"}.get(name, "GPU")

    def _session_options(self) -> SessionOptions:
        so = SessionOptions()
        cfg = self.config.session_options()
        for key, value in cfg.items():  # keys and types checked by Config
            if key in ("intra_op_num_threads", "inter_op_num_threads", "log_severity_level", "log_verbosity_level"):
                setattr(so, key, int(value))
            elif key in ("enable_cpu_mem_arena", "enable_mem_pattern"):
                setattr(so, key, value)
            elif key == "enable_profiling":  # onnxruntime-genai: a non-empty string, the profile file prefix
                so.enable_profiling = bool(value)
                if isinstance(value, str) and value:
                    so.profile_file_prefix = value
            elif key == "log_id":
                so.logid = value
            elif key == "graph_optimization_level":
                so.graph_optimization_level = _OPT_LEVELS[value]
            elif key == "custom_ops_library":
                so.register_custom_ops_library(value)
            elif key == "config_entries":
                for k, v in value.items():
                    so.add_session_config_entry(k, v)
            elif key != "provider_options":  # any other key is a session config entry, as in onnxruntime-genai
                so.add_session_config_entry(key, value)
        # the builder's decoders take the total length from attention_mask's shape. With the static KV cache
        # the generator feeds a max-length mask in decode from fixed buffers: one input signature and one set
        # of addresses, recorded once and replayed in place (no input copies, outputs left in the graph's buffers)
        so.add_session_config_entry(CAPTURE_BIND_IO, "1")
        # the decoder has symbolic dimensions, so the provider would not capture by default: ask for it
        # (prompts still run eagerly, see Model.run); a session_options entry in genai_config.json may turn it off
        if not so.has_session_config_entry(CAPTURE):
            so.add_session_config_entry(CAPTURE, "1")
        # GroupQueryAttention writes new keys/values into the static cache buffers in place
        so.add_session_config_entry(KV_INPLACE, "1")
        if SELECT_LOGITS:  # prompts compute the logits the generator reads only
            so.add_session_config_entry(OUTPUT_ROWS, self.config.model.decoder.output_name("logits", "logits"))
        return so

    def logits_at_every(self, hidden: list[torch.Tensor]) -> torch.Tensor:
        """The logits of every position of a run that selected rows, from the lm_head inputs it gave
        (``rows_hidden``)."""
        return self.session._run_tail(hidden)

    def kv_shapes(self, max_length: int) -> list[tuple[int, int, int]]:
        """(kv_heads, rows, head_size) of each past KV buffer (``io.past_names`` order: key and value of layer 0, then
        layer 1, ...) in a static cache for ``max_length`` tokens: max_length rows, or a window-sized layer's
        ``window_rows``."""
        return [(heads, self.window_rows(max_length) if self.io.kv_layers[i // 2] in self.window_layers
                 else max_length, size) for i, (heads, size) in enumerate(self.io.kv_dims)]

    def window_rows(self, max_length: int) -> int:
        """Rows of a window-sized KV cache for ``max_length`` tokens: window_size + cache_slack, at most max_length as
        onnxruntime-genai allocates it, but never fewer than window_size (GroupQueryAttention refuses a window cache
        smaller than its window, which onnxruntime-genai 0.18 then fails on when max_length is shorter than the
        window; such a cache never fills, so nothing is evicted)."""
        return min(self.window_capacity, max(max_length, self.window_size))

    # -- fixed-address decode inputs ----------------------------------------------------------
    def _acquire_buffers(self, rows: int, max_length: int) -> DecodeBuffers:
        """A free set of decode inputs for ``rows`` x ``max_length`` (zeroed mask and KV), made if none is free."""
        with self._buffers_lock:
            free = self._buffers.setdefault((rows, max_length), [])
            bufs = free.pop() if free else None
        if bufs is None:
            bufs = DecodeBuffers(self.io, rows, max_length, self.kv_shapes(max_length), self.device)
        else:
            bufs.mask.zero_()
            for t in bufs.kv + bufs.states:
                t.zero_()
        return bufs

    def _release_buffers(self, bufs: DecodeBuffers) -> None:
        with self._buffers_lock:
            self._buffers.setdefault((bufs.rows, bufs.max_length), []).append(bufs)

    def _decoder_io(self) -> DecoderIO:
        dec = self.config.model.decoder
        inputs = {a.name: a for a in self.session.get_inputs()}
        outputs = {a.name for a in self.session.get_outputs()}
        n = dec.num_hidden_layers
        pk = dec.input_name("past_key_names", "past_key_values.%d.key")
        pv = dec.input_name("past_value_names", "past_key_values.%d.value")
        ok = dec.output_name("present_key_names", "present.%d.key")
        ov = dec.output_name("present_value_names", "present.%d.value")
        # a state kind's past and present name patterns
        state_names = {kind: (dec.input_name(f"past_{kind}_names", f"past.%d.{kind}"),
                              dec.output_name(f"present_{kind}_names", f"present.%d.{kind}"))
                       for kind in ("conv", "recurrent")}
        layer_states = {"conv": ("conv",), "linear_attention": ("conv", "recurrent")}
        state_layers: dict[int, tuple[str, ...]] = {}
        for i in range(n):
            if dec.layer_types:
                if dec.layer_types[i] in layer_states:
                    state_layers[i] = layer_states[dec.layer_types[i]]
            elif pk % i not in inputs:  # no layer_types (Qwen3.5): a layer's states are the inputs it has
                found = tuple(kind for kind, (name, _) in state_names.items() if name % i in inputs)
                if found:
                    state_layers[i] = found
        kv_layers = [i for i in range(n) if i not in state_layers]
        past = [name % i for i in kv_layers for name in (pk, pv)]
        present = [name % i for i in kv_layers for name in (ok, ov)]
        states = [(kind, i) for i, kinds in state_layers.items() for kind in kinds]
        state_past = [state_names[kind][0] % i for kind, i in states]
        state_present = [state_names[kind][1] % i for kind, i in states]
        past_all, present_all = past + state_past, present + state_present
        ids = dec.input_name("input_ids", "input_ids")
        logits = dec.output_name("logits", "logits")
        where = f"{self.config.path}/{dec.filename}"
        missing = ([x for x in [ids, *past_all] if x not in inputs]
                   + [x for x in [logits, *present_all] if x not in outputs])
        if missing:
            raise UnsupportedModelError(
                f"'{where}' lacks {', '.join(missing)} named by genai_config.json (model.decoder.inputs/outputs); "
                f"its inputs are {', '.join(inputs)} and outputs {', '.join(sorted(outputs))}")
        mask = dec.input_name("attention_mask", "attention_mask")
        pos = dec.input_name("position_ids", "position_ids")
        hidden_in = dec.input_name("hidden_states", "hidden_states")
        managed = {ids, *past_all, mask, pos, ROWS_INPUT, hidden_in}
        extra = {a.name: a._tp.tensor_type.elem_type for a in
                 self.session.get_inputs() + self.session.get_overridable_initializers() if a.name not in managed}

        def dtype(name: str | None, default: torch.dtype) -> torch.dtype:
            if name is None or name not in inputs:
                return default
            return _torch_dtype(inputs[name].type)

        streams = 0
        if pos in inputs:
            dims = inputs[pos].shape
            if len(dims) == 3 and dims[0] == 3:
                streams = 3
            elif len(dims) != 2:
                raise UnsupportedModelError(f"'{where}': position input '{pos}' has shape {dims}; expected [batch, "
                                            "sequence], or [3, batch, sequence] for multimodal RoPE")
        def kv_dim(name: str, axis: int, default: int) -> int:
            dims = inputs[name].shape
            return dims[axis] if len(dims) == 4 and isinstance(dims[axis], int) and dims[axis] > 0 else default

        kv_dims = [(kv_dim(name, 1, dec.num_key_value_heads), kv_dim(name, 3, dec.head_size)) for name in past]
        state_shapes = []
        for name, (kind, _) in zip(state_past, states):
            dims = inputs[name].shape[1:]
            if all(isinstance(d, int) and d > 0 for d in dims) and len(dims) == (2 if kind == "conv" else 3):
                state_shapes.append(tuple(dims))
            elif kind == "conv" and len(dims) == 2 and dec.hidden_size > 0 and dec.conv_cache_size > 0:
                state_shapes.append((dec.hidden_size, dec.conv_cache_size))
            elif kind == "conv":
                raise UnsupportedModelError(
                    f"'{where}': the convolution state '{name}' has shape {inputs[name].shape}; expected [batch, "
                    "channels, conv_cache_size] (channels fixed, or model.decoder.hidden_size given)")
            else:
                raise UnsupportedModelError(
                    f"'{where}': the recurrent state '{name}' has shape {inputs[name].shape}; expected [batch, "
                    "heads, value head size, key head size] with fixed sizes")
        hidden_out = dec.output_name("hidden_states", "hidden_states")
        hidden_size = dec.hidden_size
        if hidden_in in inputs:
            dims = inputs[hidden_in].shape
            if len(dims) != 3:
                raise UnsupportedModelError(f"'{where}': the hidden-states input '{hidden_in}' has shape {dims}; "
                                            "expected [batch, sequence, hidden]")
            hidden_size = dims[2] if isinstance(dims[2], int) and dims[2] > 0 else hidden_size
        # (not the lm_head's per-position input the session gives for selecting runs, rows_hidden, unless the decoder
        # has it as its hidden_states output, as the builder's MTP exports do)
        other = list(dict.fromkeys(a.name for a in self.session.get_outputs() if a.name not in {logits, *present_all}
                                   and (a.name not in self.rows_hidden or a.name == hidden_out)))
        return DecoderIO(input_ids=ids, attention_mask=mask if mask in inputs else None,
                         position_ids=pos if pos in inputs else None, past_names=past, present_names=present,
                         kv_layers=kv_layers, kv_dims=kv_dims, state_names=state_past, state_present_names=state_present,
                         state_shapes=state_shapes, position_streams=streams,
                         state_dtypes=[dtype(name, torch.float32) for name in state_past], logits=logits,
                         kv_dtype=dtype(past[0] if past else None, torch.float32), mask_dtype=dtype(mask, torch.int64),
                         position_dtype=dtype(pos, torch.int64), input_ids_dtype=dtype(ids, torch.int64),
                         extra=extra, required={n for n in extra if n in inputs}, other_outputs=other,
                         hidden_input=hidden_in if hidden_in in inputs else None,
                         hidden_output=hidden_out if hidden_out in outputs else None, hidden_size=hidden_size,
                         hidden_dtype=dtype(hidden_in, next((_torch_dtype(a.type) for a in self.session.get_outputs()
                                                             if a.name == hidden_out), torch.float32)))

    def run_bound(self, slot: DecodeBuffers | PromptBuffers, feed: dict[str, torch.Tensor],
                  output_names: list[str]) -> list[torch.Tensor]:
        """A run on ``slot``'s fixed-address buffers (``feed`` holds exactly those tensors). The first run runs
        the plan specialised for these shapes eagerly (the session defers its recording); the second records
        the graph without a warm-up run of its own, the first having set the plan's lazy state (when the
        session captures); later runs replay it directly. Prompt recordings belong to their slot alone (the
        session forgets them), so dropping a bucket frees its memory."""
        if slot.replay is not None:
            return slot.replay()
        first = not slot.warmed
        slot.warmed = True
        outs = self.run(feed, output_names, defer=first)
        if not first:
            slot.replay = self.session._bound_replay(feed, output_names, detach=isinstance(slot, PromptBuffers))
        return outs

    def run(self, feed: dict[str, torch.Tensor], output_names: list[str], *, eager: bool = False,
            defer: bool = False) -> list[torch.Tensor]:
        """Run the decoder on device tensors; returns device tensors.

        ``eager``: a run whose shapes will not come again (a prompt): asks the session not to record it
        (run config entry gpu_graph_id=-1, as onnxruntime's CUDA provider). ``defer``: a new signature runs
        its specialised plan eagerly, to be recorded on the next run (``crossml.graph_capture_defer``)."""
        options = self._eager if eager else self._defer if defer else None
        outs = self.session.run_with_ort_values(output_names, {k: OrtValue.ortvalue_from_torch(v)
                                                               for k, v in feed.items()}, options)
        return [o.as_torch() for o in outs]


def _torch_dtype(type_string: str) -> torch.dtype:
    return _FROM_STRING.get(type_string, torch.float32)


_FROM_STRING = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(bfloat16)": torch.bfloat16,
                "tensor(int64)": torch.int64, "tensor(int32)": torch.int32}

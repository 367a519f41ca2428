"""genai_config.json: parsing, validation, overlays and execution-provider settings (og.Config).

The file is the one the ONNX Runtime GenAI model builder writes::

    {"model": {"type": "llama", "context_length": 4096, "bos_token_id": 1, "eos_token_id": [2, 32000],
               "pad_token_id": 0, "vocab_size": 32064,
               "decoder": {"filename": "model.onnx", "head_size": 96, "hidden_size": 3072,
                           "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
                           "session_options": {"provider_options": [{"dml": {"device_id": 0}}]},
                           "inputs": {...}, "outputs": {...}}},
     "search": {"max_length": 4096, "do_sample": false, "top_k": 50, ...}}

``Config`` keeps the JSON as a dict (so ``overlay`` is a deep merge) and re-validates it after every
change; ``ModelConfig`` / ``SearchConfig`` are the typed views the rest of the package reads.
"""

from __future__ import annotations

import copy
import difflib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from crossml.genai.errors import ConfigError, ModelFileNotFound
from crossml.genai.speculative import SpeculativeOptions, parse_section

log = logging.getLogger("crossml.genai")

CONFIG_FILE = "genai_config.json"

#: model types whose decoder is one ONNX file with input_ids / attention_mask / past_key_values in and
#: logits / present out: the layout the model builder writes for text-only decoder models.
DECODER_ONLY_TYPES = (
    "chatglm", "ernie4_5", "gemma", "gemma2", "gemma3_text", "gemma4_text", "gpt2", "gptoss", "granite", "granitemoehybrid",
    "hunyuandensev1", "internlm2", "lfm2", "lfm2_moe", "llama", "mistral", "mistral3_text", "nemotron", "olmo", "phi",
    "phi3", "phi3small", "phimoe", "qwen2", "qwen2_5_vl_text", "qwen3", "qwen3_5_moe_text", "qwen3_5_text",
    "qwen3_vl_text", "smollm3",
)

#: model types onnxruntime-genai knows that crossml.genai refuses, and why (Model names the reason)
UNSUPPORTED_TYPES = {
    "whisper": "speech recognition: an encoder-decoder model with an audio processor",
    "phi3v": "a multimodal pipeline: a vision encoder and an embedding model beside the decoder",
    "phi4mm": "a multimodal pipeline: vision and speech encoders and an embedding model beside the decoder",
}

#: provider names genai_config.json / Config.append_provider accept, and crossml's provider for each.
PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "gpu": "GPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "dml": "DmlExecutionProvider",
    "rocm": "ROCMExecutionProvider",
}

# DirectML's device_filtering_options keys -> crossml GPU provider options
_DML_FILTER_KEYS = {"hardware_device_type": "device_filter", "hardware_vendor_id": "hardware_vendor_id"}


@dataclass
class SearchConfig:
    """The "search" section: generation defaults, overridable per GeneratorParams."""

    batch_size: int = 1
    chunk_size: int = 0
    diversity_penalty: float = 0.0
    do_sample: bool = False
    early_stopping: bool = True
    length_penalty: float = 1.0
    max_length: int = 0  # 0: the model's context_length
    min_length: int = 0
    no_repeat_ngram_size: int = 0
    num_beams: int = 1
    num_return_sequences: int = 1
    past_present_share_buffer: bool = True
    random_seed: int = -1
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0


#: search option -> its type (bool, int or float)
SEARCH_OPTIONS: dict[str, type] = dict(get_type_hints(SearchConfig))


def coerce_search_option(key: str, value: Any, where: str) -> Any:
    """Check ``key`` is a search option and convert ``value`` to its type (bool / int / float)."""
    kind = SEARCH_OPTIONS.get(key)
    if kind is None:
        raise ConfigError(f"{where}: unknown search option '{key}'. Accepted options: {', '.join(SEARCH_OPTIONS)}")
    if kind is bool:
        if isinstance(value, bool) or (isinstance(value, (int, float)) and value in (0, 1)):
            return bool(value)
        raise ConfigError(f"{where}: search option '{key}' takes true or false, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: search option '{key}' takes a number, got {value!r}")
    if kind is int:
        if float(value) != int(value):
            raise ConfigError(f"{where}: search option '{key}' takes a whole number, got {value!r}")
        return int(value)
    return float(value)


@dataclass
class DecoderConfig:
    filename: str = "model.onnx"
    head_size: int = 0
    hidden_size: int = 0
    num_attention_heads: int = 0
    num_hidden_layers: int = 0
    num_key_value_heads: int = 0
    sliding_window: dict[str, Any] | None = None
    #: each layer's kind where layers differ ("conv": a short-convolution layer with a carried state and no KV
    #: cache, as LFM2's; any other kind has a KV cache); empty: every layer attends
    layer_types: list[str] = field(default_factory=list)
    #: positions a convolution layer's carried state holds (its kernel size - 1)
    conv_cache_size: int = 0
    session_options: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)

    def input_name(self, key: str, default: str) -> str:
        return self.inputs.get(key, default)

    def output_name(self, key: str, default: str) -> str:
        return self.outputs.get(key, default)


@dataclass
class ModelConfig:
    type: str
    context_length: int
    vocab_size: int
    bos_token_id: int
    eos_token_id: list[int]
    pad_token_id: int
    decoder: DecoderConfig
    bot_token_id: int | None = None  # tool call opens (og.Tokenizer.bot_token_id)
    eot_token_id: int | None = None  # tool call closes
    bor_token_id: int | None = None  # reasoning opens
    eor_token_id: int | None = None  # reasoning closes
    draft: DecoderConfig | None = None  # the draft decoder of speculative decoding (model.draft)
    #: the multi-token-prediction head the builder exports beside the decoder (model.mtp: mtp.onnx), as written
    mtp: dict[str, Any] | None = None


_DECODER_FIELDS = {f.name for f in fields(DecoderConfig)}

#: the tool-call / reasoning marker ids genai_config.json's "model" section may name (og.Tokenizer's properties)
MARK_IDS = ("bot_token_id", "eot_token_id", "bor_token_id", "eor_token_id")

#: model type -> default tool-call / reasoning marker ids, where genai_config.json names none (the ids
#: onnxruntime-genai 0.18 reports for these types: Qwen's <tool_call> </tool_call> <think> </think>, Phi-4's
#: <|tool_call|> <|/tool_call|>)
MARK_DEFAULTS: dict[str, dict[str, int]] = {
    "qwen2": {"bot_token_id": 151657, "eot_token_id": 151658},
    "qwen3": {"bot_token_id": 151657, "eot_token_id": 151658, "bor_token_id": 151667, "eor_token_id": 151668},
    "phi3": {"bot_token_id": 200025, "eot_token_id": 200026},
}


#: genai_config.json's sections as onnxruntime-genai reads them: each key and the JSON type it takes
#: (int also takes a whole float, as onnxruntime-genai's parser does). crossml reads some of these and
#: accepts the rest where they only describe the model; a key of no section raises, as in onnxruntime-genai
#: (the top level alone may hold anything). Keys naming parts crossml cannot run are in _UNSUPPORTED.
_TOKEN_IDS = ("bos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "image_token_id",
              "video_token_id", "vision_start_token_id", "audio_token_id", *MARK_IDS)
MODEL_KEYS: dict[str, Any] = {
    "type": str, "context_length": int, "vocab_size": int, "eos_token_id": (int, list), "decoder": dict, "draft": dict,
    "mtp": dict, **dict.fromkeys(_TOKEN_IDS, int),
}
DECODER_KEYS: dict[str, Any] = {
    "filename": str, "hidden_size": int, "num_attention_heads": int, "num_hidden_layers": int,
    "num_key_value_heads": int, "head_size": int, "conv_cache_size": int, "session_options": dict,
    "inputs": dict, "outputs": dict, "sliding_window": dict, "layer_types": list, "shared_initializers": list,
}
#: model.mtp: the builder's multi-token-prediction head (run by og.MtpGenerator from a folder of its own,
#: crossml.genai.mtp.head_folder); its keys as onnxruntime-genai 0.18 reads them
MTP_KEYS: dict[str, Any] = {
    **DECODER_KEYS, "enabled": bool, "main_hidden_states": str, "main_inputs_embeds": str, "shared_kv_layers": list,
}

#: model.decoder.inputs / outputs: the graph names onnxruntime-genai knows (crossml feeds input_ids,
#: attention_mask, position_ids and the past KV; a decoder with other inputs is refused when it loads)
DECODER_INPUTS = (
    "input_ids", "inputs_embeds", "attention_mask", "position_ids", "past_key_names", "past_value_names",
    "past_key_scale_names", "past_value_scale_names", "past_names", "cross_past_key_names",
    "cross_past_value_names", "past_sequence_length", "current_sequence_length", "total_sequence_length",
    "encoder_hidden_states", "encoder_attention_mask", "rnn_states_prev", "past_key_values_length",
    "cache_indirection", "hidden_states", "past_conv_names", "past_recurrent_names",
)
DECODER_OUTPUTS = (
    "logits", "present_key_names", "present_value_names", "present_key_scale_names", "present_value_scale_names",
    "present_names", "output_cross_qk_names", "rnn_states", "hidden_states", "present_conv_names",
    "present_recurrent_names",
)
#: model.mtp.inputs: a head's inputs, and the target's present KV a Gemma 4 assistant head reads
MTP_INPUTS = {**dict.fromkeys(DECODER_INPUTS, str), "shared_key_names": list, "shared_value_names": list}
SLIDING_WINDOW_KEYS: dict[str, Any] = {
    "window_size": int, "pad_value": int, "alignment": str, "slide_key_value_cache": bool, "slide_inputs": bool,
    "layers": list, "cache_slack": int,
}
#: positions a window-sized KV cache keeps beyond the window when genai_config.json's cache_slack is 0 (the
#: capacity onnxruntime-genai 0.18 gives such a cache on the CPU: window_size + 16, at most max_length)
DEFAULT_CACHE_SLACK = 16
#: session_options keys with their own meaning; any other key is a session config entry and takes a string
#: (as onnxruntime-genai's AddConfigEntry). "config_entries" (an object of them) is crossml's spelling too.
SESSION_KEYS: dict[str, Any] = {
    "log_id": str, "enable_profiling": (str, bool), "intra_op_num_threads": int, "inter_op_num_threads": int,
    "log_severity_level": int, "log_verbosity_level": int, "enable_cpu_mem_arena": bool,
    "enable_mem_pattern": bool, "graph_optimization_level": str, "custom_ops_library": str,
    "provider_options": list, "config_entries": dict,
}
GRAPH_OPT_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
#: keys onnxruntime-genai reads that describe what crossml.genai does not run, and why
_UNSUPPORTED = {
    "model.encoder": "encoder-decoder models", "model.embedding": "multimodal pipelines (a separate embedding "
    "model)", "model.vision": "multimodal models (a vision encoder)", "model.speech": "multimodal models (a "
    "speech encoder)", "model.decoder.pipeline": "decoders split over several ONNX files",
    "model.decoder.run_options": "per-run config entries", "model.decoder.state_groups": "recurrent / paged decoder "
    "state",
}

_JSON_NAMES = {int: "a whole number", float: "a number", str: "a string", bool: "true or false", dict: "an object",
               list: "an array"}


def check_keys(section: Any, keys: Mapping[str, Any] | tuple[str, ...], where: str, file: str) -> None:
    """Raise ConfigError for a key of ``section`` (genai_config.json's ``where``) that is unknown, not supported
    by crossml.genai or of the wrong JSON type; ``keys`` maps each key to its type(s), or lists string keys."""
    if not isinstance(section, dict):
        raise ConfigError(f"'{file}': {where} must be an object, got {section!r}")
    types = dict.fromkeys(keys, str) if isinstance(keys, tuple) else keys
    for key, value in section.items():
        path = f"{where}.{key}"
        if path in _UNSUPPORTED:
            raise ConfigError(f"'{file}': {path} is not supported: crossml.genai runs decoder-only models from one "
                              f"ONNX file and does not run {_UNSUPPORTED[path]}")
        kind = types.get(key)
        if kind is None:
            close = difflib.get_close_matches(key, list(types), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"'{file}': {where}: unknown key '{key}'{hint}. Accepted: {', '.join(types)}")
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not any(_is(value, k) for k in kinds):
            expected = " or ".join(dict.fromkeys(_JSON_NAMES[k] for k in kinds))
            raise ConfigError(f"'{file}': {path} takes {expected}, got {value!r}")


def _is(value: Any, kind: type) -> bool:
    if kind is int:  # a JSON number with a whole value
        return not isinstance(value, bool) and isinstance(value, (int, float)) and float(value).is_integer()
    if kind is bool or kind is str or kind is dict or kind is list:
        return isinstance(value, kind)
    return False


class Config:
    """og.Config: a model folder's genai_config.json, editable before the Model is made."""

    def __init__(self, config_path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(config_path)
        file = os.path.join(self.path, CONFIG_FILE)
        if not os.path.isdir(self.path):
            raise ModelFileNotFound(f"model folder '{self.path}' does not exist (it must hold {CONFIG_FILE}, "
                                    "the ONNX model and the tokenizer files the model builder writes)")
        if not os.path.isfile(file):
            raise ModelFileNotFound(f"'{file}' not found: a crossml.genai model folder needs the {CONFIG_FILE} "
                                    "written by the ONNX Runtime GenAI model builder")
        try:
            with open(file, encoding="utf-8") as f:
                raw = json.load(f)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"'{file}' is not valid JSON: {exc}") from None
        self._file = file
        self._raw: dict[str, Any] = raw
        self._model_data: dict[str, bytes] = {}
        self._parse()

    # -- parsing ------------------------------------------------------------------------------
    def _parse(self) -> None:
        raw = self._raw
        if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
            raise ConfigError(f"'{self._file}': the top level must be an object with a \"model\" section")
        m = raw["model"]
        file = self._file
        check_keys(m, MODEL_KEYS, "model", file)
        mtype = m.get("type")
        if not isinstance(mtype, str):
            raise ConfigError(f"'{file}': model.type is missing; expected one of {', '.join(DECODER_ONLY_TYPES)}")
        dec = m.get("decoder")
        if not isinstance(dec, dict):
            raise ConfigError(f"'{file}': model.decoder section is missing")
        self._check_block(dec, "model.decoder")
        if "sliding_window" in dec:
            check_keys(dec["sliding_window"], SLIDING_WINDOW_KEYS, "model.decoder.sliding_window", file)
        self._check_session_options(dec.get("session_options", {}))
        decoder = self._decoder(dec, "model.decoder")
        draft = m.get("draft")
        if mtype == "speculative" and not isinstance(draft, dict):
            raise ConfigError(f"'{file}': model.draft.filename is not set: a model of type \"speculative\" runs a draft "
                              "decoder beside its target (model.decoder); add model.draft with the draft model's decoder "
                              "block")
        if draft is not None:
            self._check_block(draft, "model.draft", what="the draft decoder's ONNX file")
            draft = self._decoder(draft, "model.draft")
        mtp = m.get("mtp")
        if mtp is not None:
            self._check_block(mtp, "model.mtp", MTP_KEYS, MTP_INPUTS, "the MTP head's ONNX file (the builder's mtp.onnx)")
        eos = m.get("eos_token_id", [])
        eos_list = eos if isinstance(eos, list) else [eos]
        if not all(_is(e, int) for e in eos_list):
            raise ConfigError(f"'{file}': model.eos_token_id takes a token id or a list of them, got {eos!r}")
        eos_ids = [int(e) for e in eos_list]
        context = int(m.get("context_length", 0))
        if context <= 0:
            raise ConfigError(f"'{file}': model.context_length must be a positive integer, got {context}")
        self.model = ModelConfig(
            type=mtype, context_length=context, vocab_size=int(m.get("vocab_size", 0)),
            bos_token_id=int(m.get("bos_token_id", -1)), eos_token_id=eos_ids,
            pad_token_id=int(m.get("pad_token_id", eos_ids[0] if eos_ids else 0)), decoder=decoder, draft=draft,
            mtp=mtp, **self._marks(m, mtype),
        )
        search = raw.get("search", {})
        if not isinstance(search, dict):
            raise ConfigError(f"'{self._file}': \"search\" must be an object")
        values = {k: coerce_search_option(k, v, f"'{self._file}' search") for k, v in search.items()}
        self.search = SearchConfig(**values)
        if self.search.max_length <= 0:
            self.search.max_length = context
        spec = raw.get("speculative")
        self.speculative = SpeculativeOptions() if spec is None else parse_section(spec, self._file)
        self._check_providers()

    def _check_block(self, block: Any, where: str, keys: dict[str, Any] = DECODER_KEYS,
                     inputs: Any = DECODER_INPUTS, what: str = "") -> None:
        """A decoder-like section (model.decoder, model.draft, model.mtp): its keys, its inputs' and outputs' names,
        and, where ``what`` says what it names, its filename."""
        check_keys(block, keys, where, self._file)
        check_keys(block.get("inputs", {}), inputs, f"{where}.inputs", self._file)
        check_keys(block.get("outputs", {}), DECODER_OUTPUTS, f"{where}.outputs", self._file)
        if what and not isinstance(block.get("filename"), str):
            raise ConfigError(f"'{self._file}': {where}.filename is not set: give {what}")

    def _decoder(self, dec: dict[str, Any], where: str) -> DecoderConfig:
        """A checked decoder block (model.decoder, model.draft)."""
        decoder = DecoderConfig(**{k: v for k, v in dec.items() if k in _DECODER_FIELDS})
        for k in ("head_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads"):
            v = getattr(decoder, k)
            if v <= 0:
                raise ConfigError(f"'{self._file}': {where}.{k} must be a positive integer, got {v!r}")
            setattr(decoder, k, int(v))
        self._check_window(decoder, self._file)
        self._check_layer_types(decoder, self._file)
        return decoder

    def _marks(self, m: dict[str, Any], mtype: str) -> dict[str, int]:
        marks = dict(MARK_DEFAULTS.get(mtype, {}))
        marks.update({name: int(m[name]) for name in MARK_IDS if name in m})  # types checked by check_keys
        return marks

    @staticmethod
    def _check_layer_types(decoder: DecoderConfig, file: str) -> None:
        """model.decoder.layer_types: one kind (a string) per layer, and conv_cache_size where a layer is "conv"."""
        kinds, n = decoder.layer_types, decoder.num_hidden_layers
        if kinds and (len(kinds) != n or not all(isinstance(k, str) for k in kinds)):
            raise ConfigError(f"'{file}': model.decoder.layer_types takes one string per layer "
                              f"(num_hidden_layers = {n}), got {kinds!r}")
        if "conv" in kinds and int(decoder.conv_cache_size) <= 0:
            raise ConfigError(f"'{file}': model.decoder.conv_cache_size must be a positive integer (the positions a "
                              f"convolution layer's state holds) when layer_types has \"conv\" layers, got "
                              f"{decoder.conv_cache_size!r}")
        decoder.conv_cache_size = int(decoder.conv_cache_size)

    @staticmethod
    def _check_window(decoder: DecoderConfig, file: str) -> None:
        """model.decoder.sliding_window.layers (layers whose KV caches are window-sized) and cache_slack."""
        sw = decoder.sliding_window or {}
        layers = sw.get("layers", [])
        n = decoder.num_hidden_layers
        if not all(_is(i, int) and 0 <= i < n for i in layers):
            raise ConfigError(f"'{file}': model.decoder.sliding_window.layers takes layer indices 0 .. {n - 1}, "
                              f"got {layers!r}")
        if layers and int(sw.get("window_size", 0)) <= 0:
            raise ConfigError(f"'{file}': model.decoder.sliding_window.window_size must be a positive integer when "
                              f"layers is given, got {sw.get('window_size')!r}")
        if int(sw.get("cache_slack", 0)) < 0:
            raise ConfigError(f"'{file}': model.decoder.sliding_window.cache_slack must be 0 or more (0: the "
                              f"default, {DEFAULT_CACHE_SLACK}), got {sw['cache_slack']!r}")

    def _check_session_options(self, so: Any) -> None:
        where = "model.decoder.session_options"
        if not isinstance(so, dict):
            raise ConfigError(f"'{self._file}': {where} must be an object, got {so!r}")
        check_keys({k: v for k, v in so.items() if k in SESSION_KEYS}, SESSION_KEYS, where, self._file)
        entries = {k: v for k, v in so.items() if k not in SESSION_KEYS}
        check_keys(entries, tuple(entries), where, self._file)  # the config entries: strings
        check_keys(so.get("config_entries", {}), tuple(so.get("config_entries", {})), f"{where}.config_entries",
                   self._file)
        level = so.get("graph_optimization_level")
        if level is not None and level not in GRAPH_OPT_LEVELS:
            raise ConfigError(f"'{self._file}': {where}.graph_optimization_level: unknown level {level!r}. "
                              f"Accepted: {', '.join(GRAPH_OPT_LEVELS)}")

    def _provider_list(self) -> list[dict[str, Any]]:
        so = self._raw["model"]["decoder"].setdefault("session_options", {})
        po = so.setdefault("provider_options", [])
        if not isinstance(po, list):
            raise ConfigError(f"'{self._file}': model.decoder.session_options.provider_options must be a list of "
                              "{provider: {option: value}} objects")
        return po

    def _check_providers(self) -> None:
        for entry in self._provider_list():
            if not isinstance(entry, dict) or len(entry) != 1:
                raise ConfigError(f"'{self._file}': each provider_options entry is one {{provider: {{options}}}} "
                                  f"object, got {entry!r}")
            (name, opts), = entry.items()
            check_provider_name(name)
            if not isinstance(opts, dict):
                raise ConfigError(f"'{self._file}': options of provider '{name}' must be an object, got {opts!r}")

    # -- og.Config API ------------------------------------------------------------------------
    def clear_providers(self) -> None:
        """Remove every provider: the model runs on the CPU."""
        self._provider_list().clear()

    def append_provider(self, provider: str) -> None:
        """Add ``provider`` (cpu, gpu, cuda, dml, rocm) after those already set."""
        check_provider_name(provider)
        if self._find(provider) is None:
            self._provider_list().append({provider: {}})

    def set_provider_option(self, provider: str, key: str, value: str) -> None:
        """Set one option of ``provider`` (appending the provider if it is not set)."""
        self.append_provider(provider)
        self._find(provider)[key] = value

    def _find(self, provider: str) -> dict[str, Any] | None:
        for entry in self._provider_list():
            if provider in entry:
                return entry[provider]
        return None

    def _filter(self, provider: str) -> dict[str, Any]:
        self.append_provider(provider)
        return self._find(provider).setdefault("device_filtering_options", {})

    def set_decoder_provider_options_hardware_device_type(self, provider: str, hardware_device_type: str) -> None:
        self._filter(provider)["hardware_device_type"] = hardware_device_type

    def set_decoder_provider_options_hardware_device_id(self, provider: str, hardware_device_id: int) -> None:
        self._filter(provider)["hardware_device_id"] = int(hardware_device_id)

    def set_decoder_provider_options_hardware_vendor_id(self, provider: str, hardware_vendor_id: int) -> None:
        self._filter(provider)["hardware_vendor_id"] = int(hardware_vendor_id)

    def clear_decoder_provider_options_hardware_device_type(self, provider: str) -> None:
        self._filter(provider).pop("hardware_device_type", None)

    def clear_decoder_provider_options_hardware_device_id(self, provider: str) -> None:
        self._filter(provider).pop("hardware_device_id", None)

    def clear_decoder_provider_options_hardware_vendor_id(self, provider: str) -> None:
        self._filter(provider).pop("hardware_vendor_id", None)

    def overlay(self, json_str: str) -> None:
        """Deep-merge a JSON object into the configuration, e.g. ``'{"search": {"max_length": 64}}'``."""
        try:
            patch = json.loads(json_str)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"Config.overlay: not valid JSON: {exc}") from None
        if not isinstance(patch, dict):
            raise ConfigError("Config.overlay: expects a JSON object")
        saved = copy.deepcopy(self._raw)
        _merge(self._raw, patch)
        try:
            self._parse()
        except ConfigError:
            self._raw = saved
            raise

    def add_model_data(self, model_filename: str, model_data: bytes) -> None:
        """Use these bytes as ``model_filename`` instead of reading the file."""
        self._model_data[model_filename] = bytes(model_data)

    def remove_model_data(self, model_filename: str) -> None:
        if model_filename not in self._model_data:
            raise ConfigError(f"Config.remove_model_data: no data was added for '{model_filename}'")
        del self._model_data[model_filename]

    # -- what the Model reads -----------------------------------------------------------------
    @property
    def raw(self) -> dict[str, Any]:
        return self._raw

    def providers(self) -> list[tuple[str, dict[str, str]]]:
        """crossml provider names and options, in priority order (CPU last)."""
        out: list[tuple[str, dict[str, str]]] = []
        for entry in self._provider_list():
            (name, opts), = entry.items()
            ep = PROVIDERS[check_provider_name(name)]
            if ep == "CPUExecutionProvider" and opts:
                raise ConfigError(f"provider 'cpu' takes no options, got {', '.join(map(str, opts))}: the CPU is the "
                                  "fallback of every configuration; remove its options (or the entry)")
            out.append((ep, {} if ep == "CPUExecutionProvider" else translate_gpu_options(name, opts)))
        if not any(ep == "CPUExecutionProvider" for ep, _ in out):
            out.append(("CPUExecutionProvider", {}))
        return out

    def session_options(self) -> dict[str, Any]:
        return dict(self._raw["model"]["decoder"].get("session_options", {}))


def check_provider_name(name: str) -> str:
    key = name.lower() if isinstance(name, str) else name
    if key not in PROVIDERS:
        raise ConfigError(f"unknown execution provider '{name}'. crossml.genai accepts: {', '.join(PROVIDERS)} "
                          "(gpu, cuda, dml and rocm all run on crossml's GPU provider)")
    return key


def translate_gpu_options(provider: str, opts: Mapping[str, Any]) -> dict[str, str]:
    """genai_config provider options (DirectML / CUDA spellings) -> crossml GPU provider options."""
    out: dict[str, str] = {}
    for key, value in opts.items():
        if key == "device_filtering_options":
            if not isinstance(value, Mapping):
                raise ConfigError(f"provider '{provider}': device_filtering_options must be an object, got {value!r}")
            for fk, fv in value.items():
                if fk in _DML_FILTER_KEYS:
                    out[_DML_FILTER_KEYS[fk]] = _option_string(fv).lower()
                elif fk == "hardware_device_id":
                    log.warning("provider '%s': device_filtering_options.hardware_device_id=%s is not supported by "
                                "crossml (adapters are chosen by device_id / vendor); ignored", provider, fv)
                else:
                    raise ConfigError(f"provider '{provider}': unknown device_filtering_options key '{fk}'. Accepted: "
                                      "hardware_device_type, hardware_device_id, hardware_vendor_id")
        else:
            out[key] = _option_string(value)
    return out


def _option_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _merge(dst: dict[str, Any], src: Mapping[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, Mapping) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)

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
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from crossml.genai.errors import ConfigError, ModelFileNotFound

log = logging.getLogger("crossml.genai")

CONFIG_FILE = "genai_config.json"

#: model types whose decoder is one ONNX file with input_ids / attention_mask / past_key_values in and
#: logits / present out: the layout the model builder writes for text-only decoder models.
DECODER_ONLY_TYPES = (
    "chatglm", "ernie4_5", "gemma", "gemma2", "gemma3_text", "granite", "gpt2", "internlm2", "llama", "mistral",
    "nemotron", "olmo", "phi", "phi3", "phi3small", "phimoe", "qwen2", "qwen3", "smollm3",
)

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
        mtype = m.get("type")
        if not isinstance(mtype, str):
            raise ConfigError(f"'{self._file}': model.type is missing; expected one of {', '.join(DECODER_ONLY_TYPES)}")
        dec = m.get("decoder")
        if not isinstance(dec, dict):
            raise ConfigError(f"'{self._file}': model.decoder section is missing")
        known = {f.name for f in fields(DecoderConfig)}
        decoder = DecoderConfig(**{k: v for k, v in dec.items() if k in known})
        for k in ("head_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads"):
            v = getattr(decoder, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"'{self._file}': model.decoder.{k} must be a positive integer, got {v!r}")
        eos = m.get("eos_token_id", [])
        eos_ids = [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]
        context = int(m.get("context_length", 0))
        if context <= 0:
            raise ConfigError(f"'{self._file}': model.context_length must be a positive integer, got {context}")
        self.model = ModelConfig(
            type=mtype, context_length=context, vocab_size=int(m.get("vocab_size", 0)),
            bos_token_id=int(m.get("bos_token_id", -1)), eos_token_id=eos_ids,
            pad_token_id=int(m.get("pad_token_id", eos_ids[0] if eos_ids else 0)), decoder=decoder,
            **self._marks(m, mtype),
        )
        search = raw.get("search", {})
        if not isinstance(search, dict):
            raise ConfigError(f"'{self._file}': \"search\" must be an object")
        values = {k: coerce_search_option(k, v, f"'{self._file}' search") for k, v in search.items()}
        self.search = SearchConfig(**values)
        if self.search.max_length <= 0:
            self.search.max_length = context
        self._check_providers()

    def _marks(self, m: dict[str, Any], mtype: str) -> dict[str, int]:
        marks = dict(MARK_DEFAULTS.get(mtype, {}))
        for name in MARK_IDS:
            if name in m:
                v = m[name]
                if not isinstance(v, int) or isinstance(v, bool):
                    raise ConfigError(f"'{self._file}': model.{name} must be a token id (an integer), got {v!r}")
                marks[name] = v
        return marks

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

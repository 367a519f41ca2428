"""og.Tokenizer / og.TokenizerStream over Hugging Face ``tokenizers`` and a jinja2 chat template.

Reads the tokenizer files the model builder copies into the model folder: ``tokenizer.json``,
``tokenizer_config.json`` (special tokens, ``add_bos_token``, ``chat_template``) and
``chat_template.jinja``. Like onnxruntime-genai, ``encode`` adds no special tokens except a BOS for
SentencePiece-style (Llama / Gemma) tokenizers that ask for one, and ``decode`` skips special tokens;
``update_options(add_special_tokens=..., skip_special_tokens=...)`` changes both, as there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np

from crossml.genai.config import MARK_IDS
from crossml.genai.errors import ConfigError, GenAIError, ModelFileNotFound

#: tokenizer classes whose ``add_bos_token`` makes ``encode`` prepend the BOS token.
_BOS_CLASSES = ("LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
                "GemmaTokenizer", "GemmaTokenizerFast")


#: update_options keys (onnxruntime-genai 0.18 accepts these two)
_TOKENIZER_OPTIONS = ("add_special_tokens", "skip_special_tokens")


class Tensor:
    """og.Tensor: what ``encode_batch`` returns (a padded [batch, length] int32 array)."""

    def __init__(self, array: np.ndarray) -> None:
        array = np.asarray(array)
        self._array = array if array.flags.c_contiguous else array.copy(order="C")  # 0-d stays 0-d

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def type(self) -> str:
        return str(self._array.dtype)

    def data(self) -> memoryview:
        return memoryview(self._array)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        return self._array if dtype is None else self._array.astype(dtype)


class Tokenizer:
    """og.Tokenizer(model)."""

    def __init__(self, model: Any) -> None:
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise GenAIError("crossml.genai.Tokenizer needs the 'tokenizers' package: pip install tokenizers") from exc
        folder = model.config.path
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(path):
            raise ModelFileNotFound(f"'{path}' not found: crossml.genai reads Hugging Face fast-tokenizer files "
                                    "(tokenizer.json and tokenizer_config.json) from the model folder")
        self._tok = HFTokenizer.from_file(path)
        self._config = _read_json(os.path.join(folder, "tokenizer_config.json"))
        jinja = os.path.join(folder, "chat_template.jinja")
        self._template_file = jinja if os.path.isfile(jinja) else None
        mc = model.config.model
        self._bos = mc.bos_token_id
        self._eos = list(mc.eos_token_id)
        self._pad = mc.pad_token_id
        cls = self._config.get("tokenizer_class", "")
        self._add_bos = bool(self._config.get("add_bos_token", False)) and cls in _BOS_CLASSES and self._bos >= 0
        self._add_eos = bool(self._config.get("add_eos_token", False)) and cls in _BOS_CLASSES and bool(self._eos)
        self._special: bool | None = None  # add_special_tokens; None: the default above
        self._skip = True  # skip_special_tokens (decode and streams)
        self._marks = {name: getattr(mc, name) for name in MARK_IDS}

    def update_options(self, **options: Any) -> None:
        """Set tokenizer options, as onnxruntime-genai: ``add_special_tokens`` (encode adds the tokenizer's
        special tokens, e.g. BOS; default: only the BOS a Llama / Gemma tokenizer asks for) and
        ``skip_special_tokens`` (decode and streams leave special tokens out; default true). Values: true / false,
        1 / 0 (strings or Python values)."""
        if not options:
            raise ConfigError("Tokenizer.update_options: no options given; accepted: "
                              f"{', '.join(_TOKENIZER_OPTIONS)}")
        values = {}
        for key, value in options.items():
            if key not in _TOKENIZER_OPTIONS:
                raise ConfigError(f"Tokenizer.update_options: unknown option '{key}'; accepted: "
                                  f"{', '.join(_TOKENIZER_OPTIONS)}")
            values[key] = _flag(key, value)
        if "add_special_tokens" in values:
            self._special = values["add_special_tokens"]
        if "skip_special_tokens" in values:
            self._skip = values["skip_special_tokens"]

    # -- ids ------------------------------------------------------------------------------------
    @property
    def bos_token_id(self) -> int:
        return self._bos

    @property
    def eos_token_ids(self) -> np.ndarray:
        return np.asarray(self._eos, dtype=np.int32)

    @property
    def pad_token_id(self) -> int:
        return self._pad

    def _mark(self, name: str) -> int:
        tid = self._marks[name]
        if tid is None:
            raise GenAIError(f"{name} is not defined for this model: set model.{name} in genai_config.json")
        return tid

    @property
    def bot_token_id(self) -> int:
        """Token that opens a tool call (model.bot_token_id; Qwen and Phi-4-style defaults as onnxruntime-genai)."""
        return self._mark("bot_token_id")

    @property
    def eot_token_id(self) -> int:
        """Token that closes a tool call (model.eot_token_id)."""
        return self._mark("eot_token_id")

    @property
    def bor_token_id(self) -> int:
        """Token that opens reasoning (model.bor_token_id; Qwen3's <think> by default)."""
        return self._mark("bor_token_id")

    @property
    def eor_token_id(self) -> int:
        """Token that closes reasoning (model.eor_token_id)."""
        return self._mark("eor_token_id")

    def to_token_id(self, token: str) -> int:
        """The id of one vocabulary entry (-1 when it is not in the vocabulary)."""
        tid = self._tok.token_to_id(token)
        return -1 if tid is None else int(tid)

    # -- encode / decode ------------------------------------------------------------------------
    def encode(self, text: str) -> np.ndarray:
        if not isinstance(text, str):
            raise TypeError(f"Tokenizer.encode takes a str, got {type(text).__name__}")
        return np.asarray(self._ids(self._tok.encode(text, add_special_tokens=bool(self._special)).ids),
                          dtype=np.int32)

    def _ids(self, ids: list[int]) -> list[int]:
        if self._special is False:
            return ids
        if self._add_bos and (not ids or ids[0] != self._bos):
            ids = [self._bos, *ids]
        if self._add_eos and not (self._special and ids and ids[-1] == self._eos[0]):
            ids = [*ids, self._eos[0]]
        return ids

    def encode_batch(self, texts: Sequence[str]) -> Tensor:
        """Encode several strings into one [batch, longest] int32 array, right-padded with the pad id."""
        if isinstance(texts, str):
            raise TypeError("Tokenizer.encode_batch takes a list of strings; use encode for one string")
        rows = [self._ids(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=bool(self._special))]
        width = max((len(r) for r in rows), default=0)
        out = np.full((len(rows), width), self._pad, dtype=np.int32)
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        return Tensor(out)

    def decode(self, tokens: Any) -> str:
        ids = _token_ids(tokens, "Tokenizer.decode").reshape(-1).tolist()
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def decode_batch(self, tokens: Any) -> list[str]:
        arr = _token_ids(tokens.as_numpy() if isinstance(tokens, Tensor) else tokens, "Tokenizer.decode_batch")
        if arr.ndim != 2:
            raise ValueError(f"Tokenizer.decode_batch takes a [batch, length] array, got shape {arr.shape}")
        return self._tok.decode_batch(arr.tolist(), skip_special_tokens=self._skip)

    def create_stream(self) -> TokenizerStream:
        return TokenizerStream(self)

    # -- chat template --------------------------------------------------------------------------
    def apply_chat_template(self, messages: str | Sequence[dict[str, Any]], template_str: str | None = None,
                            tools: str | Sequence[Any] | None = None, add_generation_prompt: bool = True) -> str:
        """Render ``messages`` (a JSON list of {"role", "content"} objects) with the chat template."""
        template = template_str or self._chat_template()
        msgs = _json_arg(messages, "messages")
        if not isinstance(msgs, list):
            raise ValueError("apply_chat_template: messages must be a JSON list of {\"role\": ..., \"content\": ...}")
        tool_list = _json_arg(tools, "tools") if tools else None
        return _render(template, messages=msgs, tools=tool_list, add_generation_prompt=bool(add_generation_prompt),
                       bos_token=_token_str(self._config.get("bos_token")),
                       eos_token=_token_str(self._config.get("eos_token")),
                       pad_token=_token_str(self._config.get("pad_token")))

    def _chat_template(self) -> str:
        t = self._config.get("chat_template")
        if isinstance(t, list):  # [{"name": "default", "template": ...}, ...]
            named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
            t = named.get("default") or next(iter(named.values()), None)
        if isinstance(t, str) and t:
            return t
        if self._template_file:
            with open(self._template_file, encoding="utf-8") as f:
                return f.read()
        raise ConfigError("apply_chat_template: the model folder has no chat template (tokenizer_config.json "
                          "'chat_template' or chat_template.jinja); pass template_str")


class TokenizerStream:
    """og.TokenizerStream: decode one token at a time, holding back incomplete UTF-8 sequences.

    Keeps the text of a short window of recent tokens and hands back only what the new token adds
    (the offsets algorithm of text-generation-inference), so spaces that depend on the previous
    token and characters split across byte-level tokens come out right.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._owner = tokenizer  # its skip_special_tokens option, as it is when each token comes
        self._tok = tokenizer._tok
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def decode(self, token: int) -> str:
        arr = _token_ids(token, "TokenizerStream.decode")
        if arr.size != 1:
            raise ValueError(f"TokenizerStream.decode takes one token id, got {arr.size} values")
        self._ids.append(int(arr.reshape(-1)[0]))
        skip = self._owner._skip
        prefix_text = self._tok.decode(self._ids[self._prefix:self._read], skip_special_tokens=skip)
        text = self._tok.decode(self._ids[self._prefix:], skip_special_tokens=skip)
        if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
            new = text[len(prefix_text):]
            self._prefix, self._read = self._read, len(self._ids)
            if self._prefix > 64:  # keep the window short
                del self._ids[: self._prefix]
                self._read -= self._prefix
                self._prefix = 0
            return new
        return ""


def _token_ids(tokens: Any, what: str) -> np.ndarray:
    """``tokens`` as an integer array, or the error naming ``what`` and the offending value: token ids are
    non-negative integers (the tokenizer cannot represent others; an id past the vocabulary decodes to nothing)."""
    arr = np.asarray(tokens)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} takes integer token ids, got {arr.dtype} values")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{what}: token id {int(arr.min())} is negative; token ids are integers >= 0")
    return arr


def _flag(key: str, value: Any) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise ConfigError(f"Tokenizer.update_options: option '{key}' takes true or false (or 1 / 0), got {value!r}")


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _token_str(tok: Any) -> str:
    if isinstance(tok, dict):
        return str(tok.get("content", ""))
    return "" if tok is None else str(tok)


def _json_arg(value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"apply_chat_template: {what} is not valid JSON: {exc}") from None
    return list(value) if isinstance(value, (list, tuple)) else value


def _render(template: str, **context: Any) -> str:
    try:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise GenAIError("apply_chat_template needs the 'jinja2' package: pip install jinja2") from exc

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent,
                                                                                  ensure_ascii=ensure_ascii)
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    try:
        return env.from_string(template).render(**context)
    except TemplateError as exc:
        raise GenAIError(f"apply_chat_template: the chat template failed: {exc}") from None

"""Constrained decoding (``GeneratorParams.set_guidance``, ``TurnOptions.set_guidance``) on llguidance, the library
onnxruntime-genai builds its guidance on.

A grammar (a JSON schema, a regular expression or a Lark grammar) allows, at each step, a set of tokens: every other
token's score is set to the lowest float32 before the token is chosen (after the repetition penalty and the
minimum-length ban, as onnxruntime-genai orders them), and the chosen token is committed to the grammar's matcher.
Once the grammar is complete only the end-of-sequence id (the model's first) is allowed, so the generation ends
there. The prompt is not matched. One matcher per row; the tokenizer is built once per model from its
``tokenizer.json``. llguidance is an optional dependency (``pip install crossml[guidance]``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from crossml.genai.errors import GenAIError, SearchOptionError

TYPES = ("json_schema", "regex", "lark_grammar")


def check_request(kind: str, data: str) -> bool:
    """Whether ``(kind, data)`` asks for guidance (both empty: no), raising for half a request or an unknown kind."""
    if not kind and not data:
        return False
    if not kind or not data:
        raise SearchOptionError("Guidance type and data must be provided together.")
    if kind not in TYPES:
        raise SearchOptionError(f"Unsupported guidance type: {kind} (only json_schema, regex, and lark_grammar are "
                                "supported).")
    return True


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:
        raise GenAIError("guidance (constrained decoding) needs the llguidance package: pip install crossml[guidance] "
                         "(or pip install llguidance)") from exc
    return llguidance


def _tokenizer(model: Any) -> Any:
    """The model's llguidance tokenizer (made once): its tokenizer.json, end-of-sequence id the model's first."""
    cached = model.__dict__.get("_llg_tokenizer")
    if cached is None:
        llg = _llguidance()
        path = os.path.join(model.config.path, "tokenizer.json")
        if not os.path.isfile(path):
            raise GenAIError(f"guidance needs the model's tokenizer: '{path}' not found")
        with open(path, encoding="utf-8") as f:
            eos = list(model.config.model.eos_token_id)
            cached = llg.LLTokenizer(f.read(), eos_token=eos[0] if eos else None)
        model.__dict__["_llg_tokenizer"] = cached
    return cached


class Guide:
    """The matchers of ``rows`` rows for one grammar, and each row's committed tokens (for rewinding)."""

    def __init__(self, model: Any, kind: str, data: str, rows: int) -> None:
        llg = _llguidance()
        tok = _tokenizer(model)
        make = {"json_schema": llg.LLMatcher.grammar_from_json_schema, "regex": llg.LLMatcher.grammar_from_regex,
                "lark_grammar": llg.LLMatcher.grammar_from_lark}[kind]
        try:
            grammar = make(data)
        except Exception as exc:  # noqa: BLE001 - llguidance's own parse errors
            raise GenAIError(f"Error creating grammar ({kind}): {exc}") from None
        first = llg.LLMatcher(tok, grammar)
        if first.is_error():
            raise GenAIError(f"Error creating grammar ({kind}): {first.get_error()}")
        self.kind = kind
        self._eos = int(tok.eos_token)
        self._initial = first.deep_copy()
        self._matchers = [first] + [first.deep_copy() for _ in range(rows - 1)]
        self._history: list[list[int]] = [[] for _ in range(rows)]

    def allowed(self, vocab: int, device: torch.device) -> torch.Tensor:
        """[rows, vocab] bool: the tokens each row's grammar allows now."""
        out = np.zeros((len(self._matchers), vocab), dtype=bool)
        for row, m in enumerate(self._matchers):
            if m.is_stopped():  # the grammar is complete: the end-of-sequence id alone
                out[row, self._eos] = True
                continue
            words = np.frombuffer(m.compute_bitmask(), dtype="<u4")
            bits = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
            n = min(vocab, bits.size)
            out[row, :n] = bits[:n]
        return torch.from_numpy(out).to(device)

    def commit(self, tokens: np.ndarray, rows: np.ndarray) -> None:
        """Commit ``tokens[row]`` for each row in ``rows``; a token the grammar refuses is an error naming it."""
        for row in rows:
            t = int(tokens[row])
            m = self._matchers[row]
            if m.is_stopped() and t == self._eos:  # the end a complete grammar asks for: nothing to match
                continue
            if not m.consume_token(t):
                raise GenAIError(f"guidance ({self.kind}): row {row}'s grammar refuses token {t} "
                                 f"({m.get_error() or 'not allowed at this point'}); a token chosen outside the mask "
                                 "(set_logits?) cannot be committed")
            self._history[row].append(t)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` row 0's grammar would take in turn, an end-of-sequence id counted where the
        grammar allows it (onnxruntime-genai's check of n-gram proposals)."""
        m = self._matchers[0]
        if m.is_stopped():
            return int(bool(tokens) and tokens[0] == self._eos)
        return int(m.validate_tokens(list(tokens)))

    def rewind(self, keep: int) -> None:
        """Every row back to its first ``keep`` committed tokens."""
        for row in range(len(self._matchers)):
            kept = self._history[row][:max(keep, 0)]
            fresh = self._initial.deep_copy()
            if kept and not fresh.consume_tokens(kept):
                raise GenAIError(f"guidance ({self.kind}): replaying {len(kept)} tokens after a rewind failed")
            self._matchers[row], self._history[row] = fresh, kept


"""onnxruntime-genai's generation log: ``og.set_log_options`` and ``og.set_log_callback``.

The log is off until ``set_log_options(enabled=True)``. Then each option names an event logged as
onnxruntime-genai logs it: a label, then its text, one line each, with ANSI colour tags unless
``ansi_tags=False``::

    append_next_tokens   a column of tokens appended (a prompt's, one line per column; then each chosen one)
    generate_next_token  the search settings and the sequence length, as each step starts
    hit_eos              a sequence chose an end-of-sequence token
    hit_max_length       the sequences reached max_length (in crossml's words: onnxruntime-genai's text names
                         its search implementation)

Lines go to the callback of ``set_log_callback``, else to the file of ``set_log_options(filename=...)``, else
to stderr. Logging these events reads each step's tokens on the host, so the GPU no longer runs ahead.
onnxruntime-genai's dumps of model inputs, outputs and logits (``model_input_values``, ``model_logits``, ...)
are not provided: setting one of them to True raises, and session profiling
(``session_options.enable_profiling``) gives per-op timings instead.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

from crossml.genai.errors import ConfigError

#: the options onnxruntime-genai 0.18 accepts, each True or False, and their defaults
BOOL_OPTIONS = {
    "enabled": False, "ansi_tags": True, "warning": True, "generate_next_token": False, "append_next_tokens": False,
    "hit_eos": False, "hit_max_length": False, "model_input_values": False, "model_output_shapes": False,
    "model_output_values": False, "model_logits": False, "ort_lib": False, "value_stats": False,
}
#: options crossml.genai accepts only as False (it logs no model tensors)
NOT_LOGGED = ("model_input_values", "model_output_shapes", "model_output_values", "model_logits", "ort_lib",
              "value_stats")

_options = dict(BOOL_OPTIONS)
_lock = threading.RLock()  # a callback may set options
_callback: Callable[[str], Any] | None = None
_file: TextIO | None = None


def set_log_options(**options: Any) -> None:
    """og.set_log_options(enabled=True, generate_next_token=True, ..., filename="log.txt"): each option is
    checked before any is set. ``enabled`` also turns crossml.genai's Python log on at INFO level."""
    for key, value in options.items():
        if key == "filename":
            if not isinstance(value, str):
                raise ConfigError(f"set_log_options: filename takes a path (a string; \"\" closes the file), got "
                                  f"{value!r}")
        elif key not in BOOL_OPTIONS:
            raise ConfigError(f"set_log_options: unknown option '{key}'; accepted: {', '.join(BOOL_OPTIONS)}, "
                              "filename")
        elif not isinstance(value, bool):
            raise ConfigError(f"set_log_options: option '{key}' takes True or False, got {value!r}")
        elif key in NOT_LOGGED and value:
            raise ConfigError(f"set_log_options: '{key}' is not provided by crossml.genai (it logs no model "
                              "tensors); set session_options.enable_profiling in genai_config.json for per-op "
                              "timings")
    global _file, _callback
    new_file = None
    if options.get("filename"):  # opened first: a path that cannot be written changes nothing
        try:
            new_file = open(options["filename"], "w", encoding="utf-8")  # noqa: SIM115 - kept open for the log
        except OSError as e:
            raise ConfigError(f"set_log_options: cannot write the log file {options['filename']!r}: {e}") from None
    with _lock:
        for key, value in options.items():
            if key == "filename":
                if _file is not None:
                    _file.close()
                _file = new_file
                if _file is not None:
                    _callback = None  # as onnxruntime-genai: a file replaces the callback
            else:
                _options[key] = value
    if "enabled" in options:
        logging.getLogger("crossml.genai").setLevel(logging.INFO if options["enabled"] else logging.WARNING)


def set_log_callback(callback: Callable[[str], Any] | None) -> None:
    """og.set_log_callback(fn): every log line goes to ``fn(line)`` (None: back to the file or stderr)."""
    if callback is not None and not callable(callback):
        raise TypeError(f"set_log_callback takes a callable(str) or None, got {type(callback).__name__}")
    global _callback, _file
    with _lock:
        _callback = callback
        if callback is not None and _file is not None:  # as onnxruntime-genai: a callback replaces the file
            _file.close()
            _file = None


def wants(event: str) -> bool:
    """Whether ``event`` (an option name) is logged now."""
    return _options["enabled"] and _options[event]


def _sgr(code: int) -> str:
    return f"\x1b[{code}m" if _options["ansi_tags"] else ""


def field(name: str, value: Any, colour: int = 32) -> str:
    """``name: value`` with the name coloured (green, or ``colour``), as in onnxruntime-genai's lines."""
    return f"{_sgr(colour)}{name}: {_sgr(0)}{value}"


def emit(label: str, text: str) -> None:
    """One line: the label on a blue (warnings: yellow) tag, then ``text``."""
    line = f"{_sgr(1)}{_sgr(43 if label == 'warning' else 44)}  {label}  {_sgr(0)} {text}\n"
    with _lock:
        if _callback is not None:
            _callback(line)
        elif _file is not None:
            _file.write(line)
            _file.flush()
        else:
            sys.stderr.write(line)

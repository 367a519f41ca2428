"""Exceptions raised by crossml.genai.

onnxruntime-genai raises ``RuntimeError`` for everything; each class here is a ``RuntimeError`` too
(so ``except RuntimeError`` code keeps working) and also subclasses the built-in that says what went
wrong (a missing file is a ``FileNotFoundError``, a bad option a ``ValueError``).
"""

from __future__ import annotations


class GenAIError(RuntimeError):
    """Base class of crossml.genai's errors."""


class ConfigError(GenAIError, ValueError):
    """genai_config.json (or an overlay / provider option) has a key or value crossml does not accept."""


class ModelFileNotFound(GenAIError, FileNotFoundError):
    """The model folder, its genai_config.json, or a file it names is missing."""


class UnsupportedModelError(GenAIError, NotImplementedError):
    """The folder holds a model type crossml.genai cannot run."""


class SearchOptionError(GenAIError, ValueError):
    """An unknown search option, or a value out of range."""


class GeneratorStateError(GenAIError):
    """A Generator method called at a time it cannot run (nothing appended yet, done, too long)."""


class NameNotFoundError(GenAIError, KeyError):
    """get_input / get_output asked for a name the last run did not have."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""

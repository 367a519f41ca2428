"""examples/genai_engine.py: four requests served together, one of them constrained to a JSON schema."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytest.importorskip("llguidance", reason="the example's JSON turn needs llguidance (pip install crossml[guidance])")

HERE = os.path.dirname(__file__)
spec = importlib.util.spec_from_file_location("genai_engine", os.path.join(HERE, "..", "..", "examples", "genai_engine.py"))
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


def test_example_serves_four_requests(genai_models) -> None:
    done = example.main(genai_models[("qwen2", "fp32")])
    assert sorted(done) == [0, 1, 2, 3]
    for reason, _ in done.values():
        assert reason in ("EOS", "STOP_STRING", "MAX_GENERATED_TOKENS")
    reason, text = done[3]
    assert text.lstrip().startswith("{")  # the schema's object, as far as 64 tokens of a random model go
    if reason == "EOS":  # the grammar completed
        import json

        assert set(json.loads(text)) == {"name", "age"}

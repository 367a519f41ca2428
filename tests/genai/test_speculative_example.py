"""examples/genai_speculative.py: a code edit with n-gram decoding and with a draft model, against standard
decoding."""

from __future__ import annotations

import importlib.util
import os

HERE = os.path.dirname(__file__)
spec = importlib.util.spec_from_file_location("genai_speculative",
                                              os.path.join(HERE, "..", "..", "examples", "genai_speculative.py"))
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


def test_example_runs_each_way(genai_models) -> None:
    results = example.main(genai_models[("qwen2", "fp32")], genai_models[("qwen2", "int4")])
    standard = results["standard"][0]
    assert standard and results["n-gram"][0] == standard and results["draft model"][0] == standard
    assert results["n-gram"][1]["ngram_lookup_hits"] + results["n-gram"][1]["ngram_lookup_misses"] > 0
    assert results["draft model"][1]["rounds"] > 0

"""examples/genai_mtp.py: MtpGenerator against standard decoding on the tiny Qwen3.5 with an MTP head."""

from __future__ import annotations

import importlib.util
import os

from tests.genai._build import QWEN35_MTP

HERE = os.path.dirname(__file__)
spec = importlib.util.spec_from_file_location("genai_mtp", os.path.join(HERE, "..", "..", "examples", "genai_mtp.py"))
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


def test_example_gives_standard_tokens(more_models) -> None:
    results = example.main(more_models[QWEN35_MTP], drafts=3, new=24)
    assert results["mtp"][0] == results["standard"][0] and len(results["standard"][0]) == 24
    assert results["mtp"][1]["rounds"] > 0

"""The generation loop the GenAI tests share: works with crossml.genai and onnxruntime_genai alike."""

from __future__ import annotations

from typing import Any

import numpy as np


def generate_with(og: Any, model: Any, prompts: list[str], max_length: int,
                  **options: Any) -> tuple[list[list[int]], list[np.ndarray]]:
    """Generate with module ``og`` on a loaded ``model``; returns the sequences and every step's logits."""
    tok = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, batch_size=len(prompts), **options)
    gen = og.Generator(model, params)
    gen.append_tokens(tok.encode(prompts[0]) if len(prompts) == 1 else tok.encode_batch(prompts))
    logits = [gen.get_logits().copy()]
    while not gen.is_done():
        gen.generate_next_token()
        if not gen.is_done():
            logits.append(gen.get_logits().copy())
    count = len(prompts) * int(options.get("num_return_sequences", 1))
    return [gen.get_sequence(i).tolist() for i in range(count)], logits


def run_steps(og: Any, model: Any, steps: int, max_length: int, prompt: str, **options: Any) -> Any:
    """A generator of module ``og`` on ``model`` after ``prompt`` and ``steps`` generate_next_token calls."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, **options)
    gen = og.Generator(model, params)
    gen.append_tokens(og.Tokenizer(model).encode(prompt))
    for _ in range(steps):
        gen.generate_next_token()
    return gen

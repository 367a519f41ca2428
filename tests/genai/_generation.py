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


def assert_greedy_match(got: tuple[list[list[int]], list[np.ndarray]],
                        ref: tuple[list[list[int]], list[np.ndarray]], atol: float) -> None:
    """Greedy sequences and per-step logits of two runtimes (``generate_with``'s results) agree.

    Every step's logits must agree within ``atol``, and without a fork the sequences must be identical. A fork is
    a step where the two runtimes' argmax differ although their logits agree within ``atol``: the reference's best
    two tokens are then at most 2 * atol apart, and which one wins is decided by rounding (the same function,
    summed in another order). It is accepted when the tokens before it are the same and each runtime took its own
    argmax there; nothing after it is compared, since the two continue from different histories.
    """
    (seq, logits), (ref_seq, ref_logits) = got, ref
    fork = None
    for step, (a, b) in enumerate(zip(logits, ref_logits)):
        np.testing.assert_allclose(a, b, atol=atol, rtol=0, err_msg=f"logits of step {step}")
        if not np.array_equal(a.reshape(a.shape[0], -1).argmax(-1), b.reshape(b.shape[0], -1).argmax(-1)):
            fork = step
            break
    if fork is None:
        assert seq == ref_seq
        assert len(logits) == len(ref_logits)
        return
    a, b = (x.reshape(x.shape[0], -1) for x in (logits[fork], ref_logits[fork]))
    for row, (s, r) in enumerate(zip(seq, ref_seq)):
        at = len(r) - len(ref_logits) + fork  # the index of the token chosen at step ``fork``
        assert s[:at] == r[:at], f"row {row} differs before the fork at step {fork}"
        assert (s[at], r[at]) == (a[row].argmax(), b[row].argmax()), f"row {row} at the fork, step {fork}"

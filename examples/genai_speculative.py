"""Edit a piece of code with n-gram speculative decoding, and compare with standard decoding.

    python examples/genai_speculative.py MODEL_FOLDER [DRAFT_FOLDER]

MODEL_FOLDER is a folder made by the ONNX Runtime GenAI model builder. The request asks the model to repeat a
function with one change, text that copies most of its prompt: the n-gram lookup drafts what followed the last two
tokens earlier in the sequence, and one decoder run verifies up to four drafts. The tokens are those of standard
decoding; the stats say how many drafts were accepted. With DRAFT_FOLDER (a smaller model with the same tokenizer),
the same request runs with it as a draft model, through a folder ``crossml.genai.speculative.make_folder`` writes.
The calls are onnxruntime-genai 0.18's.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import crossml.genai as og
from crossml.genai import speculative

CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax
'''


def generate(model, prompt_ids, options: dict | None) -> tuple[list[int], float, dict]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt_ids) + 48)
    if options:
        params.set_speculative_options(**options)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt_ids)
    start = time.perf_counter()
    while not generator.is_done():
        generator.generate_next_token()
    seconds = time.perf_counter() - start
    return generator.get_sequence(0)[len(prompt_ids):].tolist(), seconds, generator.get_speculative_stats()


def main(folder: str, draft: str | None = None) -> dict[str, tuple[list[int], dict]]:
    """Runs the request each way; returns way -> (generated tokens, speculative stats)."""
    model = og.Model(folder)
    tokenizer = og.Tokenizer(model)
    message = f"Rename the variable subtotal to net in this function:\n\n{CODE}"
    prompt = tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": message}]))
    ids = tokenizer.encode(prompt)
    ways = {"standard": (model, None), "n-gram": (model, {"ngram_size": 3, "max_draft_tokens": 4})}
    if draft is not None:
        paired = speculative.make_folder(tempfile.mkdtemp(prefix="crossml_draft_"), folder, draft)
        ways["draft model"] = (og.Model(paired), {"max_draft_tokens": 4})
    results = {}
    for way, (m, options) in ways.items():
        tokens, seconds, stats = generate(m, ids, options)
        results[way] = (tokens, stats)
        print(f"{way}: {len(tokens)} tokens in {seconds * 1e3:.0f} ms; rounds {stats['rounds']}, drafts accepted "
              f"{stats['draft_tokens_accepted']} of {stats['draft_tokens_proposed']}")
    print(tokenizer.decode(results["standard"][0]))
    return results


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)

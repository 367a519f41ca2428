"""Generate with a model's own multi-token-prediction head (og.MtpGenerator), and compare with standard decoding.

    python examples/genai_mtp.py MODEL_FOLDER [DRAFTS]

MODEL_FOLDER is made by the ONNX Runtime GenAI model builder from a checkpoint with MTP layers (Qwen3.5 / Qwen3.6:
``mtp_num_hidden_layers`` in its config), so it holds mtp.onnx and a ``model.mtp`` section in genai_config.json.
``crossml.genai.mtp.head_folder`` writes the head's own folder (MODEL_FOLDER/mtp_head), which loads as an og.Model;
the head drafts DRAFTS tokens a round (default 4) and one model run verifies them. The tokens are those of standard
greedy decoding; the stats say how many drafts were accepted. The calls are onnxruntime-genai 0.18's.
"""

from __future__ import annotations

import json
import sys
import time

import crossml.genai as og
from crossml.genai import mtp


def main(folder: str, drafts: int = 4, new: int = 64) -> dict[str, tuple[list[int], dict]]:
    """Runs the request each way; returns way -> (generated tokens, stats)."""
    model = og.Model(folder)
    head = og.Model(mtp.head_folder(folder))
    tokenizer = og.Tokenizer(model)
    message = "Explain how a bicycle stays upright, step by step."
    ids = tokenizer.encode(tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": message}])))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new, do_sample=False)
    params.set_speculative_options(max_draft_tokens=drafts)
    results = {}
    for way in ("standard", "mtp"):
        generator = og.MtpGenerator(model, head, params) if way == "mtp" else og.Generator(model, params)
        generator.append_tokens(ids)
        start = time.perf_counter()
        while not generator.is_done():
            generator.generate_next_token()
        seconds = time.perf_counter() - start
        sequence = generator.get_sequence() if way == "mtp" else generator.get_sequence(0)
        tokens = sequence[len(ids):].tolist()
        stats = generator.get_stats() if way == "mtp" else {}
        results[way] = (tokens, stats)
        line = f"{way}: {len(tokens)} tokens in {seconds * 1e3:.0f} ms"
        if stats:
            line += (f"; {stats['accepts']} of {stats['trials']} drafts accepted in {stats['rounds']} rounds, "
                     f"{stats['forwards']} model runs")
        print(line)
    print(tokenizer.decode(results["mtp"][0]))
    print("same tokens as standard decoding:", results["mtp"][0] == results["standard"][0])
    return results


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4)

"""Serve several conversations at once with the Engine API, one of them constrained to JSON.

    python examples/genai_engine.py MODEL_FOLDER

MODEL_FOLDER is a folder made by the ONNX Runtime GenAI model builder. The calls are onnxruntime-genai 0.18's (its
CPU engine, on static batching, refuses the stop strings). On a GPU, three or more requests that start together decode in
batched steps (crossml.genai.engine); the JSON turn needs llguidance (pip install crossml[guidance]).
"""

from __future__ import annotations

import json
import sys

import crossml.genai as og


def main(folder: str) -> dict[int, tuple[str, str]]:
    """Runs the four requests; returns request index -> (finish reason, text)."""
    model = og.Model(folder)
    tokenizer = og.Tokenizer(model)
    engine = og.Engine(model)
    questions = ["What is the capital of France?", "Name three prime numbers.", "Describe a cat in one sentence."]
    requests, streams, texts = [], {}, {}
    for question in questions:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(64)
        options.set_stop_strings(["\n\n"])
        prompt = tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": question}]))
        request.begin_turn(tokenizer.encode(prompt), options)
        requests.append(request)
    # a fourth request whose answer must be a JSON object with a name and an age
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(64)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    options.set_guidance("json_schema", json.dumps(schema))
    prompt = tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": "Invent a person as JSON."}]))
    request.begin_turn(tokenizer.encode(prompt), options)
    requests.append(request)
    for request in requests:
        streams[id(request)], texts[id(request)] = tokenizer.create_stream(), ""

    done: dict[int, tuple[str, str]] = {}
    events = engine.create_event_buffer(16)
    while engine.has_pending_requests():
        for event in engine.run(events):
            key = id(event.request)
            if event.flags & og.EngineEventFlags.TOKEN:
                texts[key] += streams[key].decode(event.token)
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                print(f"--- request {requests.index(event.request)}: {event.finish_reason.name}, "
                      f"{event.usage.generated_tokens} tokens")
                print(texts[key])
                done[requests.index(event.request)] = (event.finish_reason.name, texts[key])
    for request in requests:
        request.close()
    return done


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

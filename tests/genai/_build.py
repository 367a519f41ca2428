"""Make tiny random-weight Hugging Face models and convert them with the onnxruntime-genai model builder.

Run as a script (the tests run it once per session, in a subprocess, so transformers and the builder
stay out of the test process)::

    python tests/genai/_build.py OUT_DIR llama:fp32 llama:int4 qwen2:fp32 llama:fp16:cuda ...

Writes OUT_DIR/hf_<arch> (config, safetensors, tokenizer) and OUT_DIR/<arch>_<precision> (the
builder's genai_config.json, model.onnx, tokenizer files) for the CPU, or
OUT_DIR/<arch>_<precision>_<ep> for another execution provider (``-e cuda``). Weights are seeded: the same on every run.
"""

from __future__ import annotations

import json
import os
import sys

#: the chat template written into tokenizer_config.json
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
SPECIALS = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|end|>"]
CORPUS = ["The quick brown fox jumps over the lazy dog. " * 3,
          "Hello world! How are you today? Grüße, 你好, café naïve — emoji 🙂",
          "def f(x):\n    return x * 2\n"] * 20


def make_tokenizer(out: str, vocab: int = 400) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 0)])
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": True,
           "add_eos_token": False, "model_max_length": 256, "tokenizer_class": "PreTrainedTokenizerFast",
           "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return tok.get_vocab_size()


def make_hf_model(arch: str, out: str) -> None:
    import torch
    import transformers

    os.makedirs(out, exist_ok=True)
    vocab = make_tokenizer(out)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
    extra = {"gemma": dict(head_dim=16), "mistral": dict(sliding_window=None),
             "phi3": dict(original_max_position_embeddings=256)}.get(arch, {})
    classes = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
               "phi3": ("Phi3Config", "Phi3ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
               "gemma": ("GemmaConfig", "GemmaForCausalLM")}[arch]
    torch.manual_seed(0)
    config = getattr(transformers, classes[0])(**common, **extra)
    model = getattr(transformers, classes[1])(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)


def main(out_dir: str, specs: list[str]) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    for spec in specs:
        arch, precision, *rest = spec.split(":")
        ep = rest[0] if rest else "cpu"
        hf = os.path.join(out_dir, f"hf_{arch}")
        if not os.path.isfile(os.path.join(hf, "config.json")):
            make_hf_model(arch, hf)
        dst = os.path.join(out_dir, f"{arch}_{precision}" + ("" if ep == "cpu" else f"_{ep}"))
        args = (None, hf, dst, precision, ep, os.path.join(out_dir, "cache"))
        create_model(*args, **parse_extra_options(*args, None))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

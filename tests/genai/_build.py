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


#: arch -> (transformers config class, model class, config values beyond the common ones)
CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(original_max_position_embeddings=256)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16)),
}
#: more architectures the builder converts (the variants: gemma2's local layers get window-sized KV caches,
#: sliding_window.layers; phi3 with LongRoPE; llama with llama3 rope scaling). Partial rotary needs rotary
#: dimensions that are multiples of 16 in onnxruntime.
MORE_CLASSES = {
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16, attn_logit_softcapping=50.0,
                    final_logit_softcapping=30.0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    # local (window-sized cache, its own rope base) and global layers, q/k norms (the builder reads its rope settings through crossml.genai.builder)
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                    layer_types=["sliding_attention", "full_attention"])),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625,
                     logits_scaling=8.0)),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", {}),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", dict(head_dim=32, partial_rotary_factor=0.5)),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(hidden_size=128, partial_rotary_factor=0.5)),
    "ernie": ("Ernie4_5Config", "Ernie4_5ForCausalLM", dict(head_dim=16)),
    "hunyuan": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", dict(head_dim=16)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
    # Granite 4.0's class (model type granitemoehybrid) with attention layers only: the builder converts no Mamba layer
    "granite4": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                 dict(layer_types=["attention", "attention"], num_local_experts=0, num_experts_per_tok=0,
                      position_embedding_type="rope", shared_intermediate_size=128, embedding_multiplier=12.0,
                      residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=8.0)),
    # a short-convolution layer (com.microsoft CausalConvWithState, a carried past.0.conv state) and an attention one
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM",
             dict(layer_types=["conv", "full_attention"], block_ff_dim=128, conv_L_cache=3)),
    # LFM2's mixture-of-experts variant: model type lfm2_moe, a dense first layer, then MoE nodes
    "lfm2moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM",
                dict(layer_types=["conv", "full_attention"], moe_intermediate_size=64, num_experts=4,
                     num_experts_per_tok=2, num_dense_layers=1, conv_L_cache=3)),
    "phi3long": ("Phi3Config", "Phi3ForCausalLM",
                 dict(max_position_embeddings=512, original_max_position_embeddings=128,
                      rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                                    "long_factor": [2.0 + 0.2 * i for i in range(8)]})),
    "llama3rope": ("LlamaConfig", "LlamaForCausalLM",
                   dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    # mixture of experts (MoE / QMoE nodes), attention sinks, window-sized caches on the even layers, YaRN
    # (gpt-oss' own rope settings: the builder's YaRN needs a long original context for head size 16)
    "gptoss": ("GptOssConfig", "GptOssForCausalLM",
               dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"])),
}
#: vision-language checkpoints whose text decoder the builder exports alone (model types mistral3_text, ...):
#: arch -> (transformers config class, model class, text config values beyond the common ones, vision config)
VLM_CLASSES = {
    "mistral3": ("Mistral3Config", "Mistral3ForConditionalGeneration", dict(model_type="mistral", sliding_window=None),
                 dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, head_dim=16, image_size=32, patch_size=16)),
    # multimodal RoPE (MRotaryEmbedding, [3, batch, sequence] position ids)
    "qwen25vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration",
                 dict(rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}),
                 dict(depth=1, hidden_size=32, num_heads=2, out_hidden_size=64, intermediate_size=64)),
    # the same with interleaved streams (MRotaryEmbedding mrope_layout 1)
    "qwen3vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration",
                dict(head_dim=16, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                                   "mrope_interleaved": True, "rope_theta": 10000.0}),
                dict(depth=1, hidden_size=32, num_heads=2, out_hidden_size=64, intermediate_size=64,
                     deepstack_visual_indexes=[0])),
}
#: Qwen3.5's text decoder (model type qwen3_5_text): Gated DeltaNet layers (com.microsoft CausalConvWithState and
#: LinearAttention, carried past.i.conv and past.i.recurrent states; key heads shared by two value heads) beside gated
#: full-attention layers (partial, interleaved multimodal RoPE; q/k norms; a sigmoid output gate)
_QWEN35_TEXT = dict(head_dim=64, layer_types=["linear_attention", "full_attention"], linear_key_head_dim=16,
                    linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_conv_kernel_dim=4,
                    rope_parameters={"rope_type": "default", "mrope_section": [3, 3, 2], "mrope_interleaved": True,
                                     "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
_QWEN35_VISION = dict(depth=1, hidden_size=32, num_heads=2, out_hidden_size=64, intermediate_size=64)
VLM_CLASSES["qwen35"] = ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration", _QWEN35_TEXT, _QWEN35_VISION)
# and its mixture-of-experts variant (qwen3_5_moe_text: MoE nodes and a gated shared expert, com.microsoft GatedAdd)
VLM_CLASSES["qwen35moe"] = ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration",
                            dict(_QWEN35_TEXT, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                 num_experts=4, num_experts_per_tok=2), _QWEN35_VISION)
#: Qwen3.5 with a multi-token-prediction head (text_config.mtp_num_hidden_layers = 1, ``mtp.*`` weights): the builder
#: writes mtp.onnx and the decoder's hidden_states output (crossml.genai.mtp). Its layers' output projections are
#: scaled down (MTP_RESIDUAL), so each token's logits are mostly its embedding's through the lm_head, and the head
#: passes the embedding of the token it is given through: its drafts agree with the model often, not always
QWEN35_MTP = "qwen35mtp"
MTP_RESIDUAL = 0.01
VLM_CLASSES[QWEN35_MTP] = ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration",
                           dict(_QWEN35_TEXT, layer_types=["full_attention", "linear_attention"]), _QWEN35_VISION)
MORE_CLASSES.update(VLM_CLASSES)
#: Gemma 4's text decoder (model type gemma4_text; the builder exports it from a multimodal checkpoint whose text weights
#: sit under ``model.language_model.``): window-sized local layers of head size 16 and global layers of head size 32 with
#: proportional partial RoPE (RotaryEmbedding nodes fed position_ids), q / k norms and a scaleless v norm, attention
#: scale 1, per-layer residual multipliers (``layer_scalar``), tied embeddings and a final logit softcap.
#: ``gemma4kv``: the global layers read their values from the key projection with one KV head
#: (``attention_k_eq_v``), so the layers' KV caches differ in heads too. The embedding is drawn small (std 0.02): with
#: tied embeddings at the other weights' scale the tiny model only repeats its last token.
_GEMMA4_TEXT = dict(head_dim=16, global_head_dim=32, layer_types=["sliding_attention", "full_attention"],
                    sliding_window=8, tie_word_embeddings=True, final_logit_softcapping=30.0)
#: arch -> (multimodal config class, the builder's architecture name, text config class, text model class, text values,
#: each layer's layer_scalar)
TEXT_TOWER_CLASSES = {
    "gemma4": ("Gemma4UnifiedConfig", "Gemma4UnifiedForConditionalGeneration", "Gemma4UnifiedTextConfig",
               "Gemma4UnifiedForCausalLM", _GEMMA4_TEXT, [0.9, 1.2]),
    "gemma4kv": ("Gemma4UnifiedConfig", "Gemma4UnifiedForConditionalGeneration", "Gemma4UnifiedTextConfig",
                 "Gemma4UnifiedForCausalLM", dict(_GEMMA4_TEXT, attention_k_eq_v=True, num_global_key_value_heads=1),
                 [1.1, 0.8]),
    "gemma4moe": ("Gemma4Config", "Gemma4ForConditionalGeneration", "Gemma4TextConfig", "Gemma4ForCausalLM",
                  dict(_GEMMA4_TEXT, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
                       hidden_size_per_layer_input=0), [1.0, 0.7]),
}
MORE_CLASSES.update({a: (c[2], c[3], c[4]) for a, c in TEXT_TOWER_CLASSES.items()})
#: architectures of MORE_CLASSES also tested at int4 (gpt-oss and qwen35moe: their experts become QMoE nodes)
MORE_INT4 = ("gemma4", "gptoss", "lfm2", "qwen35", "qwen35moe")
#: architectures of MORE_CLASSES that onnxruntime-genai 0.18 cannot run on the CPU, checked against transformers instead
#: (``hf_logits``): gemma4moe's experts take MoE's geglu activation, which onnxruntime 1.31's CPU MoE refuses
HF_REFERENCE = ("gemma4moe",)
#: architectures of MORE_CLASSES whose layers carry states instead of KV caches (tests/genai/test_conv_states.py)
CONV_STATE_ARCHS = ("lfm2", "lfm2moe", "qwen35", "qwen35moe")
#: architectures whose tokenizer_config.json the builder (under transformers 5) writes with tokenizer class
#: "Qwen3_5Tokenizer", which onnxruntime-genai 0.18 refuses ("Unsupported tokenizer class"): the test folders name
#: "Qwen2Tokenizer" (the same tokenizer.json), and keep the builder's file as BUILDER_TOKENIZER_CONFIG
QWEN35_TOKENIZER = ("qwen35", "qwen35moe", "qwen35mtp")
BUILDER_TOKENIZER_CONFIG = "tokenizer_config.builder.json"
#: architectures whose batches of prompts of different lengths onnxruntime-genai 0.18 gets wrong (a shorter prompt's
#: row drifts from the prompt's own run): checked against the prompts run alone instead
#: (tests/genai/test_architectures.py::test_ragged_batch_rows_equal_their_prompts_alone)
OWN_RAGGED_BATCH = (*CONV_STATE_ARCHS, "qwen25vl", "qwen3vl", QWEN35_MTP)
#: builder options per (arch, precision, ep): CUDA int4 MoE models get raw QMoE experts ([E, N, K/2]); by default
#: the builder writes onnxruntime CUDA's CUTLASS-prepacked layout, which only that provider reads (and which refuses
#: the tiny models' 32-row experts)
EXTRA_OPTIONS = {("gptoss", "int4", "cuda"): ["qmoe_weights_prepacked=0"],
                 ("qwen35moe", "int4", "cuda"): ["qmoe_weights_prepacked=0"],
                 ("gemma4moe", "int4", "cuda"): ["qmoe_weights_prepacked=0"]}
#: builder variants of another architecture's checkpoint: name -> (architecture, builder options). qwen35gdn: Qwen3.5's
#: Gated DeltaNet export (com.microsoft GatedDeltaNet over V-major float32 recurrent states; the builder makes it for
#: ``-e cuda`` only, and at fp32 its attention-mask subgraph reads a past_key_values.0.key the model lacks, so fp16 and
#: int4)
VARIANTS = {"qwen35gdn": ("qwen35", ["linear_attn_op=gated_delta_net"])}


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
    classes = {**CLASSES, **MORE_CLASSES}[arch]
    torch.manual_seed(0)
    if arch in TEXT_TOWER_CLASSES:
        make_text_tower(arch, out, {**common, **classes[2]})
        return
    if arch in VLM_CLASSES:
        text = {**common, **classes[2]}
        config = getattr(transformers, classes[0])(text_config=text, vision_config=classes[3],
                                                   tie_word_embeddings=False)
    else:
        config = getattr(transformers, classes[0])(**{**common, **classes[2]})
    model = getattr(transformers, classes[1])(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    if arch == QWEN35_MTP:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                    p.mul_(MTP_RESIDUAL)
    model.save_pretrained(out)
    if arch == "gptoss":
        add_mxfp4_experts(out, config)
    if arch == QWEN35_MTP:
        add_mtp_head(out, config.text_config)


def make_text_tower(arch: str, out: str, text: dict) -> None:
    """A multimodal checkpoint (config and architecture name of ``TEXT_TOWER_CLASSES[arch]``) holding only its text
    decoder's weights, under ``model.language_model.``, as the builder reads them; the text model alone is saved in
    ``out + "_causal"`` for transformers' runs."""
    import torch
    import transformers
    from safetensors.torch import save_file

    config_class, architecture, text_class, model_class, _, scalars = TEXT_TOWER_CLASSES[arch]
    config = getattr(transformers, text_class)(**text)
    model = getattr(transformers, model_class)(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02 if "embed_tokens" in name else 0.2)
            else:
                p.add_(torch.randn_like(p) * 0.1)
        for layer, scalar in zip(model.model.layers, scalars):
            layer.layer_scalar.fill_(scalar)
    tensors = {name.replace("model.", "model.language_model.", 1): t.contiguous()
               for name, t in model.state_dict().items() if name != "lm_head.weight"}
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    outer = getattr(transformers, config_class)(text_config=config.to_dict())
    outer.architectures = [architecture]
    outer.save_pretrained(out)
    model.save_pretrained(out + "_causal")


def add_mtp_head(out: str, text) -> None:
    """The ``mtp.*`` weights of a Qwen3.5 checkpoint (transformers drops them on load; the builder reads them from the
    safetensors) and ``text_config.mtp_num_hidden_layers = 1``: one full-attention decoder layer (its output
    projections scaled by MTP_RESIDUAL), ``fc`` [hidden, 2 * hidden] passing the normed embedding half through, zero
    offset norms before it (scale 1) and the model's final norm after it."""
    import copy

    import torch
    from safetensors.torch import load_file, save_file
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    layer_config = copy.deepcopy(text)
    layer_config.layer_types, layer_config.num_hidden_layers = ["full_attention"], 1
    gen = torch.Generator().manual_seed(3)
    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    for name, v in Qwen3_5DecoderLayer(layer_config, layer_idx=0).state_dict().items():
        t = torch.randn(v.shape, generator=gen) * (0.2 if v.dim() > 1 else 0.1)
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            t *= MTP_RESIDUAL
        tensors[f"mtp.layers.0.{name}"] = t.contiguous()
    H = text.hidden_size
    tensors["mtp.fc.weight"] = torch.cat([torch.eye(H), torch.randn(H, H, generator=gen) * 0.02], dim=1)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        tensors[f"mtp.{name}.weight"] = torch.zeros(H)
    tensors["mtp.norm.weight"] = tensors["model.language_model.norm.weight"].clone()  # the model's final norm
    save_file(tensors, path, metadata={"format": "pt"})
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    config["text_config"]["mtp_num_hidden_layers"] = 1
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def drop_shared_initializers(folder: str) -> None:
    """Remove the builder's shared_initializers lists from model.decoder and model.mtp: onnxruntime-genai 0.18's CPU
    build cannot load a folder that has them ("GetMemoryInfo for CPU should not be used"). The ONNX files still
    reference the shared tensors where the builder put them (mtp.onnx reads the embedding from model.onnx.data)."""
    path = os.path.join(folder, "genai_config.json")
    with open(path) as f:
        config = json.load(f)
    for section in ("decoder", "mtp"):
        config["model"].get(section, {}).pop("shared_initializers", None)
    with open(path, "w") as f:
        json.dump(config, f, indent=4)


def add_mxfp4_experts(out: str, config) -> None:
    """Random MXFP4 expert tensors beside the float ones, as the published gpt-oss checkpoints hold them: the
    builder's int4 export reads its experts from these (``*_blocks`` [E, N, K/32, 16] fp4 codes, ``*_scales``
    [E, N, K/32] power-of-two exponents)."""
    import torch
    from safetensors.torch import load_file, save_file

    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    gen = torch.Generator().manual_seed(1)
    E, H, inter = config.num_local_experts, config.hidden_size, config.intermediate_size
    for layer in range(config.num_hidden_layers):
        for name, N, K in (("gate_up_proj", 2 * inter, H), ("down_proj", H, inter)):
            pre = f"model.layers.{layer}.mlp.experts.{name}"
            tensors[f"{pre}_blocks"] = torch.randint(0, 256, (E, N, K // 32, 16), generator=gen, dtype=torch.uint8)
            tensors[f"{pre}_scales"] = torch.randint(123, 127, (E, N, K // 32), generator=gen, dtype=torch.uint8)
    save_file(tensors, path, metadata={"format": "pt"})


def hf_logits(hf_dir: str, ids: list[int]) -> list[list[float]]:
    """The float32 logits of every position of ``ids`` (one sequence) from the Hugging Face checkpoint ``hf_dir``."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].tolist()


def hf_generate(hf_dir: str, ids: list[int], options: dict) -> list[list[int]]:
    """``generate`` of the Hugging Face checkpoint ``hf_dir`` (a vision-language one's text path) in float32 on the
    prompt ``ids``, with ``options`` (num_beams, ...): the returned sequences. A reference where onnxruntime-genai 0.18
    cannot run a search (Qwen3.5's beams)."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(hf_dir)
    arch = config.architectures[0]
    model = getattr(transformers, arch).from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, eos_token_id=config.text_config.eos_token_id
                             if hasattr(config, "text_config") else config.eos_token_id, pad_token_id=2, **options)
    return out.tolist()


def main(out_dir: str, specs: list[str]) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from onnxruntime_genai.models.builder import create_model, parse_extra_options

    from crossml.genai.builder import patch_transformers_configs

    patch_transformers_configs()

    for spec in specs:
        name, precision, *rest = spec.split(":")
        ep = rest[0] if rest else "cpu"
        arch, variant_options = VARIANTS.get(name, (name, []))
        hf = os.path.join(out_dir, f"hf_{arch}")
        if not os.path.isfile(os.path.join(hf, "config.json")):
            make_hf_model(arch, hf)
        dst = os.path.join(out_dir, f"{name}_{precision}" + ("" if ep == "cpu" else f"_{ep}"))
        args = (None, hf, dst, precision, ep, os.path.join(out_dir, "cache"))
        options = [*EXTRA_OPTIONS.get((arch, precision, ep), []), *variant_options]
        create_model(*args, **parse_extra_options(*args, options or None))
        if arch == QWEN35_MTP:
            drop_shared_initializers(dst)
        if arch in QWEN35_TOKENIZER:
            path = os.path.join(dst, "tokenizer_config.json")
            with open(path) as f:
                text = f.read()
            with open(os.path.join(dst, BUILDER_TOKENIZER_CONFIG), "w") as f:
                f.write(text)
            with open(path, "w") as f:
                f.write(text.replace('"Qwen3_5Tokenizer"', '"Qwen2Tokenizer"'))


if __name__ == "__main__":
    if sys.argv[1] == "--logits":  # --logits HF_DIR JSON_IDS: prints every position's logits as JSON
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        print(json.dumps(hf_logits(sys.argv[2], json.loads(sys.argv[3]))))
    elif sys.argv[1] == "--generate":  # --generate HF_DIR JSON_IDS JSON_OPTIONS: prints the sequences as JSON
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        print(json.dumps(hf_generate(sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]))))
    else:
        main(sys.argv[1], sys.argv[2:])

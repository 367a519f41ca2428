"""LLM generation on one GPU: crossml.genai vs onnxruntime-genai (CUDA, with / without its CUDA graph)
vs Hugging Face transformers with a static cache.

Models are Qwen2.5-0.5B- and Llama-3.2-1B-shaped with random weights (no downloads): the Hugging Face
config is written from the published shapes, a random-weight model and a small trained BPE tokenizer
are saved, and onnxruntime-genai's model builder converts them (``-p fp16 -e cuda`` and
``-p int4 -e cuda``). Everything built is kept under --workdir and reused by later runs.

Measured per (model, precision, runtime), batch 1, greedy:

* prefill tokens/s: a --prompt-token prompt (median of --repeats runs after a warm-up of two prompts);
  the warm-up's first prompt is reported too ("first prefill ms": the first run of the model, kernel
  compilation included; crossml runs a bucket's first prompt eagerly and records the bucket's graph on
  its second, which later prompts of that width replay), and its first 8 tokens ("first 8 tokens ms":
  the first decode steps, the decode graph's recording and any kernel compilation left included);
* decode tokens/s: --new tokens after each timed prompt (median of the --repeats runs; the JSON lists
  each run), the host reading each token as it comes (EOS is held off with min_length so every
  runtime makes the same number of steps);
* bandwidth fraction: decode tokens/s x bytes read per token (the weights every token reads, plus the
  KV cache at the average context) / a measured device-to-device copy bandwidth (bytes read + written).

A precision ``P-gdn`` (``--precisions fp16,fp16-gdn``) is the builder's Gated DeltaNet export of Qwen3.5 at P
(``--extra_options linear_attn_op=gated_delta_net``: com.microsoft GatedDeltaNet over float32 recurrent states),
beside the default export (LinearAttention).

Run (about 8 minutes on an H200 with a cold --workdir, far less once models are built)::

    PYTHONPATH=src:$ORT_GENAI_CUDA python benchmarks/genai_bench.py --out benchmarks/results

Each runtime runs in its own try/except; a failure is reported in its row and the table goes on.
Writes OUT/genai_bench.json and OUT/genai_bench.md.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

#: published shapes (config.json of Qwen/Qwen2.5-0.5B, meta-llama/Llama-3.2-1B and LiquidAI/LFM2-350M; LFM2's
#: feed-forward width is its block_ff_dim after the checkpoint's auto-adjustment: 2/3 of 6656, rounded up to 256s)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(arch="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "llama-3.2-1b": dict(arch="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
                         max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, head_dim=64,
                         rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
    "lfm2-350m": dict(arch="lfm2", hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
                      num_key_value_heads=8, block_ff_dim=4608, block_auto_adjust_ff_dim=False, vocab_size=65536,
                      tie_word_embeddings=True, max_position_embeddings=128000, conv_L_cache=3, norm_eps=1e-5,
                      layer_types=["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)]),
    # Qwen3.5-0.8B's text decoder (24 layers: a full-attention layer after every three Gated DeltaNet layers; 16 key
    # and 16 value heads of 128 in those, 8 query and 2 KV heads of 256 in the others; tied 248320-row embeddings),
    # built from a Qwen3_5ForConditionalGeneration checkpoint with a one-layer vision tower the builder leaves out
    "qwen3.5-0.8b": dict(arch="qwen35", hidden_size=1024, num_hidden_layers=24, num_attention_heads=8,
                         num_key_value_heads=2, head_dim=256, intermediate_size=3584, vocab_size=248320,
                         tie_word_embeddings=True, max_position_embeddings=262144, rms_norm_eps=1e-6,
                         linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                         linear_value_head_dim=128, linear_conv_kernel_dim=4,
                         layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(24)],
                         rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                          "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                                          "mrope_interleaved": True}),
    # Gemma 4's text decoder in transformers' default Gemma4UnifiedTextConfig shape (local layers of 8 query and 4 KV
    # heads of 256 with a 1024-token window, every sixth layer global with heads of 512 and proportional partial
    # RoPE; q / k / v norms, layer scalars, tied 262144-row embeddings), 12 of its 30 layers, built from a
    # Gemma4UnifiedForConditionalGeneration checkpoint holding only the text weights (crossml.genai.builder runs the
    # builder with the config layout it reads)
    "gemma4-12l": dict(arch="gemma4", hidden_size=2304, num_hidden_layers=12, num_attention_heads=8,
                       num_key_value_heads=4, head_dim=256, global_head_dim=512, intermediate_size=9216,
                       vocab_size=262144, tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-6,
                       sliding_window=1024, final_logit_softcapping=30.0,
                       layer_types=["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(12)]),
}
RUNTIMES = ("crossml", "ortgenai", "ortgenai-graph", "hf-static", "crossml-eager", "crossml-torch", "crossml-allrows")
#: crossml records each decode step into a device graph by default; crossml-eager turns that off
#: (session entry ep.dml.enable_graph_capture=0) to show what the capture is worth; crossml-allrows computes a
#: prompt's logits at every position as the decoder gives them (crossml.genai.model.SELECT_LOGITS off)
DEFAULT_RUNTIMES = RUNTIMES[:4]
#: crossml runtimes that set a module constant for their run: (module, name, value, the row's note)
FLAGGED = {"crossml-torch": ("crossml.ops._util", "GPU_KERNELS", False,
                             "the Gated DeltaNet ops and MRotaryEmbedding on their torch paths"),
           "crossml-allrows": ("crossml.genai.model", "SELECT_LOGITS", False, "prompt logits at every position")}
CORPUS = ["The quick brown fox jumps over the lazy dog. " * 4, "def f(x):\n    return x * 2\n",
          "Hello world! How are you today? It is a fine day for a benchmark."] * 30


# -- models ----------------------------------------------------------------------------------------
def make_hf(name: str, dst: str) -> None:
    """A random-weight Hugging Face model of the named shape, with a small trained tokenizer (fp16 safetensors)."""
    if os.path.isfile(os.path.join(dst, "config.json")):
        return
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(dst, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=1000, special_tokens=["<s>", "</s>", "<pad>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(dst, "tokenizer.json"))
    with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "model_max_length": 131072,
                   "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}, f)
    shape = dict(SHAPES[name])
    arch = shape.pop("arch")
    cls = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
           "lfm2": ("Lfm2Config", "Lfm2ForCausalLM"),
           "qwen35": ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration"),
           "gemma4": ("Gemma4UnifiedTextConfig", "Gemma4UnifiedForCausalLM")}[arch]
    ids = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    if arch == "gemma4":  # the text weights under model.language_model., as a multimodal checkpoint holds them
        _save_text_tower(dst, getattr(transformers, cls[0])(**shape, **ids), cls[1], "Gemma4UnifiedConfig",
                         "Gemma4UnifiedForConditionalGeneration")
        return
    if arch == "qwen35":  # the text decoder's shape; a one-layer vision tower, which the builder does not export
        vision = dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=shape["hidden_size"])
        config = getattr(transformers, cls[0])(text_config={**shape, **ids}, vision_config=vision,
                                               tie_word_embeddings=shape["tie_word_embeddings"], torch_dtype="float16")
    else:
        config = getattr(transformers, cls[0])(**shape, **ids, torch_dtype="float16")
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(dev):
        model = getattr(transformers, cls[1])(config).to(torch.float16)
    model.save_pretrained(dst)
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()


def _save_text_tower(dst: str, text_config: Any, model_class: str, config_class: str, architecture: str) -> None:
    """A random-weight text decoder (fp16) saved as the multimodal checkpoint ``architecture`` whose text weights
    sit under ``model.language_model.`` (no vision or audio weights: the builder exports the text decoder alone)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(dev):
        model = getattr(transformers, model_class)(text_config).to(torch.float16)
    tensors = {name.replace("model.", "model.language_model.", 1): t.contiguous().cpu()
               for name, t in model.state_dict().items() if name != "lm_head.weight"}
    del model
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    outer = getattr(transformers, config_class)(text_config=text_config.to_dict(), torch_dtype="float16")
    outer.architectures = [architecture]
    outer.save_pretrained(dst)


#: builder options of a precision's variant suffix (``fp16-gdn``)
VARIANTS = {"gdn": ["--extra_options", "linear_attn_op=gated_delta_net"]}


def build_cmd(hf: str, dst: str, precision: str, cache: str) -> list[str]:
    base, _, variant = precision.partition("-")
    return [sys.executable, "-m", "crossml.genai.builder", "-i", hf, "-o", dst, "-p", base,
            "-e", "cuda", "-c", cache, *(VARIANTS[variant] if variant else [])]


def build_all(work: str, names: list[str], precisions: list[str], log: Callable[[str], None]) -> dict[tuple, str]:
    """Build every (model, precision) missing under ``work``, the builder runs in parallel subprocesses."""
    folders, procs = {}, []
    for name in names:
        hf = os.path.join(work, f"hf_{name}")
        make_hf(name, hf)
        for p in precisions:
            dst = os.path.join(work, f"{name}_{p}_cuda")
            folders[(name, p)] = dst
            if os.path.isfile(os.path.join(dst, "genai_config.json")):
                continue
            logf = open(os.path.join(work, f"build_{name}_{p}.log"), "w")  # noqa: SIM115 - closed below
            env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
            cmd = build_cmd(hf, dst, p, os.path.join(work, f"cache_{name}_{p}"))
            log(f"building {name} {p}: {' '.join(cmd)}")
            procs.append((name, p, subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env), logf))
    for name, p, proc, logf in procs:
        rc = proc.wait()
        logf.close()
        if rc:
            log(f"builder failed for {name} {p} (exit {rc}); see {logf.name}")
            folders.pop((name, p))
    return folders


def bytes_per_token(folder: str, shape: dict[str, Any], context: float) -> dict[str, float]:
    """Bytes a decode token reads: every initializer except the embedding table (one row of it), plus the
    KV cache at ``context`` positions."""
    import onnx

    m = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
    g = m.graph
    sizes = {}
    for t in g.initializer:
        ext = {e.key: e.value for e in t.external_data}
        if "length" in ext:
            sizes[t.name] = int(ext["length"])
        else:
            n = 1
            for d in t.dims:
                n *= d
            sizes[t.name] = n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize if n else len(t.raw_data)
    ids = {i.name for i in g.input if "input_ids" in i.name}
    embed = {n.input[0] for n in g.node if n.op_type.startswith("Gather") and len(n.input) > 1 and n.input[1] in ids}
    weights = sum(v for k, v in sizes.items() if k not in embed)
    head = shape.get("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    kinds = shape.get("layer_types") or ["full_attention"] * shape["num_hidden_layers"]
    kv = 0.0
    for k in kinds:  # keys and values, fp16; Gemma 4's global layers have heads of global_head_dim, its local ones
        if k in ("conv", "linear_attention"):  # keep a window of sliding_window positions
            continue
        size = shape.get("global_head_dim", head) if k == "full_attention" else head
        rows = min(context, shape["sliding_window"]) if k == "sliding_attention" else context
        kv += 2 * shape["num_key_value_heads"] * size * 2 * rows
    # states the state-carrying layers read and write whole every token: LFM2's convolution state; Qwen3.5's
    # convolution state (q | k | v channels) and recurrent state (fp16; float32 in the Gated DeltaNet export)
    recurrent = {i.type.tensor_type.elem_type for i in g.input if i.name.endswith(".recurrent")}
    state_bytes = 4 if onnx.TensorProto.FLOAT in recurrent else 2
    states = 0
    for k in kinds:
        if k == "conv":
            states += 2 * shape["hidden_size"] * shape["conv_L_cache"] * 2
        elif k == "linear_attention":
            dk, dv = shape["linear_key_head_dim"], shape["linear_value_head_dim"]
            channels = 2 * shape["linear_num_key_heads"] * dk + shape["linear_num_value_heads"] * dv
            states += 2 * (2 * channels * (shape["linear_conv_kernel_dim"] - 1)
                           + state_bytes * shape["linear_num_value_heads"] * dk * dv)
    return {"weights": float(weights), "kv": float(kv), "states": float(states),
            "total": float(weights + kv + states)}


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read and written."""
    import torch

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    reps = 20
    for _ in range(reps):
        b.copy_(a)
    torch.cuda.synchronize()
    bw = 2 * n * reps / (time.perf_counter() - t0)
    del a, b
    torch.cuda.empty_cache()
    return bw


# -- runtimes --------------------------------------------------------------------------------------
def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_runs(generator: Callable[[], Any], tokens: Any, new: int, repeats: int, *, rows: int = 1,
               total: int) -> tuple[list[float], list[float]]:
    """Seconds of each of ``repeats`` generations, each from a fresh ``generator()``: appending ``tokens`` (the
    prompt), then ``new`` tokens, the host getting each one as a streaming caller does. Each run's ``rows``
    sequences must end ``total`` tokens long. Returns (prompt seconds, decode seconds) per run."""
    prefill, decode, gen = [], [], None
    for _ in range(repeats):
        gen = None  # released first: each generator reuses the warm-up's decode buffers (and recorded graph)
        gen = generator()
        _sync()
        t0 = time.perf_counter()
        gen.append_tokens(tokens)
        _sync()
        prefill.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(new):
            gen.generate_next_token()
            gen.get_next_tokens()
        _sync()
        decode.append(time.perf_counter() - t0)
        got = [len(gen.get_sequence(r)) for r in range(rows)]
        if got != [total] * rows:
            raise RuntimeError(f"sequence lengths {got}, expected {total} in every row")
    return prefill, decode


@contextlib.contextmanager
def _constant(module: str, name: str, value: Any) -> Iterator[None]:
    """``module.name`` set to ``value`` inside the block, put back after it."""
    import importlib

    mod = importlib.import_module(module)
    old = getattr(mod, name)
    setattr(mod, name, value)
    try:
        yield
    finally:
        setattr(mod, name, old)


@contextlib.contextmanager
def _released() -> Iterator[None]:
    try:
        yield
    finally:
        gc.collect()
        with contextlib.suppress(Exception):
            import torch

            torch.cuda.empty_cache()


def _genai_loop(og: Any, model: Any, prompt: list[int], new: int, repeats: int) -> dict[str, float]:
    """Prefill and decode timings through the onnxruntime_genai API (crossml.genai or onnxruntime_genai)."""
    import numpy as np

    total = len(prompt) + new
    ids = np.asarray(prompt, dtype=np.int32)

    def generator() -> Any:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
        return og.Generator(model, params)

    warm = generator()  # captures the decode graph (crossml: runs the prompt's bucket eagerly the first time)
    _sync()
    t0 = time.perf_counter()
    warm.append_tokens(ids)
    _sync()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(8):
        warm.generate_next_token()
        warm.get_next_tokens()
    first_tokens = time.perf_counter() - t0
    del warm
    warm = generator()  # a second prompt of the same width (crossml records the bucket's prompt graph here)
    warm.append_tokens(ids)
    del warm
    _sync()
    prefill, decode = timed_runs(generator, ids, new, repeats, total=total)  # medians of both
    dt = statistics.median(decode)
    return {"prefill_tok_s": len(prompt) / statistics.median(prefill), "prefill_first_ms": first * 1e3,
            "first_tokens_ms": first_tokens * 1e3,
            "decode_tok_s": new / dt, "decode_ms_per_token": dt / new * 1e3,
            "decode_runs_ms_per_token": [round(d / new * 1e3, 4) for d in decode]}


def run_crossml(folder: str, prompt: list[int], new: int, repeats: int, graph: bool = True) -> dict[str, Any]:
    import crossml.genai as xg

    with _released():
        config = xg.Config(folder)
        if not graph:
            config.overlay('{"model": {"decoder": {"session_options": {"ep.dml.enable_graph_capture": "0"}}}}')
        t0 = time.perf_counter()
        model = xg.Model(config)
        load = time.perf_counter() - t0
        out = _genai_loop(xg, model, prompt, new, repeats)
        out["load_s"] = load
        out["device"] = model.device_type
        out["static_decode"] = bool(model._static_decode)
        del model
    return out


def _import_ortgenai() -> Any:
    import ctypes
    import glob
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is not None:  # the wheel's libonnxruntime, if a separate package
        import onnxruntime

        for lib in glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so*")):
            with contextlib.suppress(OSError):
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
                break
    import onnxruntime_genai

    return onnxruntime_genai


def run_ortgenai(folder: str, prompt: list[int], new: int, repeats: int, graph: bool) -> dict[str, Any]:
    og = _import_ortgenai()
    with _released():
        config = og.Config(folder)
        config.clear_providers()
        config.append_provider("cuda")
        config.set_provider_option("cuda", "enable_cuda_graph", "1" if graph else "0")
        t0 = time.perf_counter()
        model = og.Model(config)
        load = time.perf_counter() - t0
        out = _genai_loop(og, model, prompt, new, repeats)
        out["load_s"] = load
        out["device"] = getattr(model, "device_type", "cuda")
        del model
    return out


def run_hf(hf: str, prompt: list[int], new: int, repeats: int, compile_: bool) -> dict[str, Any]:
    import torch
    import transformers

    with _released():
        model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float16).to("cuda").eval()
        ids = torch.tensor([prompt], device="cuda")
        kw = dict(do_sample=False, cache_implementation="static", pad_token_id=2, disable_compile=not compile_)

        def gen(n: int) -> float:
            _sync()
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                     **kw)
            _sync()
            assert out.shape[1] == len(prompt) + n
            return time.perf_counter() - t0

        gen(8)  # warm-up (and compilation with --hf-compile)
        one = statistics.median(gen(1) for _ in range(repeats))
        full = gen(new)
    return {"prefill_tok_s": len(prompt) / one, "decode_tok_s": (new - 1) / (full - one),
            "decode_ms_per_token": (full - one) / (new - 1) * 1e3, "device": "cuda", "compiled": compile_}


# -- report ----------------------------------------------------------------------------------------
def _note(r: dict[str, Any]) -> str:
    runs = r.get("decode_runs_ms_per_token")
    spread = f"decode runs {' / '.join(f'{x:.3f}' for x in runs)} ms/token" if runs and len(runs) > 1 else ""
    return "; ".join(x for x in (r.get("note", ""), spread) if x)


def markdown(payload: dict[str, Any]) -> str:
    m = payload["machine"]
    lines = [
        "# LLM generation on one GPU: crossml.genai vs onnxruntime-genai vs transformers", "",
        f"GPU: {m.get('gpu')}; torch {m.get('torch')}; onnxruntime-genai {payload.get('ortgenai_version')}; "
        f"transformers {payload.get('transformers_version')}.",
        f"Batch 1, greedy, prompt {payload['prompt']} tokens, {payload['new']} new tokens; random weights. "
        f"Copy bandwidth (read + write): {payload['copy_bandwidth_gbs']:.0f} GB/s. "
        "BW fraction = decode tok/s x bytes read per token / copy bandwidth.", "",
        "Model load s: the `Model(config)` call (the model files were just written, so they are in the page cache).",
        "",
        "| model | precision | runtime | model load s | prefill tok/s | first prefill ms | first 8 tokens ms "
        "| decode tok/s | ms/token | MB read/token | BW fraction | note |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in payload["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['precision']} | {r['runtime']} | - | - | - | - | - | - | - | - | "
                         f"error: {r['error'].replace('|', '/')[:160]} |")
            continue
        mb = r.get("bytes_per_token", {}).get("total", 0) / 1e6
        frac = r.get("bandwidth_fraction")
        first, tokens, load = r.get("prefill_first_ms"), r.get("first_tokens_ms"), r.get("load_s")
        lines.append(f"| {r['model']} | {r['precision']} | {r['runtime']} | {'' if load is None else f'{load:.2f}'} | "
                     f"{r['prefill_tok_s']:.0f} | "
                     f"{'' if first is None else f'{first:.1f}'} | {'' if tokens is None else f'{tokens:.1f}'} | "
                     f"{r['decode_tok_s']:.1f} | {r['decode_ms_per_token']:.2f} | {mb:.0f} | "
                     f"{'' if frac is None else f'{frac:.2f}'} | {_note(r)} |")
    lines += ["", f"Wall time: {payload['wall_s']:.0f} s. Produced by benchmarks/genai_bench.py; rerun it to "
              "regenerate (models are cached under --workdir).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, HERE)
    from _common import genai_parser, machine

    ap = genai_parser(__doc__, models=",".join(SHAPES))
    ap.add_argument("--runtimes", default=",".join(DEFAULT_RUNTIMES), help=f"any of {','.join(RUNTIMES)}")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hf-compile", action="store_true",
                    help="let transformers torch.compile the static-cache decode (with transformers 5.17 on an H200 "
                         "its timed runs recompiled: 7-10 tok/s, a measure of compilation, not of decode)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    import torch

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    names = [n for n in args.models.split(",") if n]
    precisions = [p for p in args.precisions.split(",") if p]
    runtimes = [r for r in args.runtimes.split(",") if r]
    unknown = [n for n in names if n not in SHAPES] + [r for r in runtimes if r not in RUNTIMES]
    if unknown:
        ap.error(f"unknown model/runtime {unknown}; models: {list(SHAPES)}, runtimes: {list(RUNTIMES)}")
    if not torch.cuda.is_available():
        sys.exit("genai_bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    os.makedirs(args.workdir, exist_ok=True)
    bw = copy_bandwidth()
    log(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    folders = build_all(args.workdir, names, precisions, log)
    log("models ready")
    versions = {}
    for mod, key in (("onnxruntime_genai", "ortgenai_version"), ("transformers", "transformers_version")):
        try:
            versions[key] = (_import_ortgenai() if mod == "onnxruntime_genai" else __import__(mod)).__version__
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            versions[key] = f"unavailable ({type(exc).__name__}: {exc})"[:120]
    rows: list[dict[str, Any]] = []
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 900, (args.prompt,), generator=g).tolist()
    context = args.prompt + args.new / 2
    for name in names:
        hf = os.path.join(args.workdir, f"hf_{name}")
        for p in precisions + ["fp16-hf"]:
            for rt in runtimes:
                if (rt == "hf-static") != (p == "fp16-hf"):
                    continue
                prec = "fp16" if p == "fp16-hf" else p
                row: dict[str, Any] = {"model": name, "precision": prec, "runtime": rt}
                try:
                    folder = folders.get((name, prec))
                    if folder is None:
                        raise RuntimeError(f"no {prec} model was built (see {args.workdir}/build_{name}_{prec}.log)")
                    row["bytes_per_token"] = bytes_per_token(folder, SHAPES[name], context)
                    if rt in FLAGGED:  # crossml with one module constant set for the run
                        module, constant, value, note = FLAGGED[rt]
                        with _constant(module, constant, value):
                            row.update(run_crossml(folder, prompt, args.new, args.repeats))
                        row["note"] = note
                    elif rt.startswith("crossml"):
                        row.update(run_crossml(folder, prompt, args.new, args.repeats, not rt.endswith("eager")))
                        row["note"] = "graph capture off" if rt.endswith("eager") else "prompt and decode graphs recorded"
                    elif rt.startswith("ortgenai"):
                        row.update(run_ortgenai(folder, prompt, args.new, args.repeats, rt.endswith("graph")))
                        row["note"] = "enable_cuda_graph=1" if rt.endswith("graph") else "enable_cuda_graph=0"
                    else:
                        row.update(run_hf(hf, prompt, args.new, args.repeats, args.hf_compile))
                        row["note"] = "generate(cache_implementation='static')" + (
                            ", torch.compile" if args.hf_compile else ", eager")
                    row["bandwidth_fraction"] = row["decode_tok_s"] * row["bytes_per_token"]["total"] / bw
                    log(f"{name} {prec} {rt}: prefill {row['prefill_tok_s']:.0f} tok/s, decode "
                        f"{row['decode_tok_s']:.1f} tok/s ({row['bandwidth_fraction']:.2f} of bandwidth)")
                except Exception as exc:  # noqa: BLE001 - one runtime failing does not stop the table
                    row["error"] = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
                    row["traceback"] = traceback.format_exc()[-3000:]
                    log(f"{name} {prec} {rt}: {row['error'][:300]}")
                rows.append(row)
    payload = {"benchmark": "genai_bench", "machine": machine(), "prompt": args.prompt, "new": args.new,
               "repeats": args.repeats, "copy_bandwidth_gbs": bw / 1e9, **versions, "rows": rows,
               "wall_s": time.perf_counter() - t_start}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "genai_bench.json"), "w") as f:
        json.dump(payload, f, indent=2)
    md = markdown(payload)
    with open(os.path.join(args.out, "genai_bench.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()

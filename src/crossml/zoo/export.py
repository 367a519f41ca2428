"""Export the zoo's models to ONNX (once, into a cache folder) and make example inputs."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import numpy as np
import torch

from crossml.zoo.bert import BertConfig, BertEncoder
from crossml.zoo.vision import MobileNetV2, ResNet, randomize_batchnorm

OPSET = 17


def _resnet50() -> torch.nn.Module:
    m = ResNet()
    randomize_batchnorm(m, 1)
    return m


def _mobilenet_v2() -> torch.nn.Module:
    m = MobileNetV2()
    randomize_batchnorm(m, 2)
    return m


def _bert(config: BertConfig) -> Callable[[], torch.nn.Module]:
    return lambda: BertEncoder(config)


BERT_TINY = BertConfig(vocab_size=1000, hidden=128, layers=2, heads=4, intermediate=512, max_positions=128)

#: name -> (builder, kind)
MODELS: dict[str, tuple[Callable[[], torch.nn.Module], str]] = {
    "resnet50": (_resnet50, "image"),
    "mobilenet_v2": (_mobilenet_v2, "image"),
    "bert_base": (_bert(BertConfig()), "text"),
    "bert_tiny": (_bert(BERT_TINY), "text"),
}


def cache_dir() -> str:
    d = os.environ.get("CROSSML_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "crossml", "zoo"))
    os.makedirs(d, exist_ok=True)
    return d


def example_inputs(name: str, batch: int = 1, seq: int = 128, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded example inputs for a zoo model, as numpy arrays keyed by input name."""
    rng = np.random.default_rng(seed)
    if MODELS[name][1] == "image":
        return {"input": rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)}
    vocab = 1000 if name == "bert_tiny" else 30522
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[:, seq - seq // 8:] = 0
    return {"input_ids": rng.integers(0, vocab, (batch, seq), dtype=np.int64), "attention_mask": mask,
            "token_type_ids": np.zeros((batch, seq), dtype=np.int64)}


def export(name: str, path: str | None = None, fp16: bool = False) -> str:
    """Write the zoo model ``name`` (seed 0 weights) as ONNX; returns the path. Cached by name."""
    if name not in MODELS:
        raise KeyError(f"unknown zoo model '{name}'; choose from {', '.join(MODELS)}")
    path = path or os.path.join(cache_dir(), f"{name}{'_fp16' if fp16 else ''}.onnx")
    if os.path.exists(path):
        return path
    build, kind = MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    if fp16:
        model = model.half()
    feeds = example_inputs(name, batch=1, seq=16)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    if fp16 and kind == "image":
        args = tuple(a.half() for a in args)
    names = list(feeds)
    out_names = ["logits"] if kind == "image" else ["last_hidden_state", "pooler_output"]
    axes = {n: {0: "batch"} if kind == "image" else {0: "batch", 1: "sequence"} for n in names}
    axes.update({n: {0: "batch"} for n in out_names})
    tmp = path + ".tmp"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, tmp, input_names=names, output_names=out_names,
                          dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    os.replace(tmp, path)
    return path

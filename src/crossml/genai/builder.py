"""``python -m crossml.genai.builder``: the ONNX Runtime GenAI model builder (``onnxruntime_genai.models.builder``, same
arguments), run with fixes for the configs newer transformers releases load.

The builder of onnxruntime-genai 0.18 reads some checkpoints' configs in layouts that transformers 5 no longer gives:

* Gemma 3 (``gemma3_text``): a flat ``rope_parameters`` (the global layers') and ``rope_local_base_freq``, where
  transformers 5 nests the rope settings per layer type (the builder fails with ``KeyError: 'rope_type'``).
* Gemma 4 (``Gemma4UnifiedForConditionalGeneration``, ``Gemma4ForConditionalGeneration``): ``global_head_dim`` and
  ``num_global_key_value_heads``, and a readable ``head_dim``, where transformers 5.17+ keeps the global layers'
  settings in ``per_layer_config`` and refuses a global read of a per-layer attribute
  (``AmbiguousGlobalPerLayerAttributeError``).

``patch_transformers_configs()`` wraps ``transformers.AutoConfig.from_pretrained`` so that the configs the builder loads
come back in the old layouts (values unchanged); ``main()`` applies it and runs the builder's command line. Configs of
other models are returned as loaded. The fixes were checked by building tiny random-weight checkpoints and comparing
the exported models' logits with transformers' (``tests/genai``).
"""

from __future__ import annotations

import importlib.util
import runpy
import sys

__all__ = ["main", "patch_transformers_configs"]

_patched = False


def _flat_gemma3_rope(config) -> None:
    rope = getattr(config, "rope_parameters", None)
    if getattr(config, "model_type", "") == "gemma3_text" and isinstance(rope, dict) and "full_attention" in rope:
        config.rope_local_base_freq = rope["sliding_attention"]["rope_theta"]
        config.rope_parameters = dict(rope["full_attention"])
        config.rope_theta = config.rope_parameters["rope_theta"]


def _gemma4_global_dims(config) -> None:
    text = getattr(config, "text_config", config)
    if not str(getattr(text, "model_type", "")).startswith("gemma4") or "global_head_dim" in text.__dict__:
        return
    if not hasattr(text, "per_layer_config") or "full_attention" not in text.layer_types:
        return
    # the builder copies text_config's keys to the top-level config, and reads head_dim from either
    for c in {id(config): config, id(text): text}.values():
        c.allow_global_per_layer_attribute_access = True
    full = text.per_layer_config[text.layer_types.index("full_attention")]
    text.global_head_dim = full.head_dim
    text.num_global_key_value_heads = full.num_key_value_heads


def patch_transformers_configs() -> None:
    """Make ``transformers.AutoConfig.from_pretrained`` return Gemma 3 and Gemma 4 configs in the layouts the model
    builder of onnxruntime-genai 0.18 reads (see the module docstring). Idempotent."""
    global _patched
    if _patched:
        return
    import transformers

    load = transformers.AutoConfig.from_pretrained

    def from_pretrained(*args, **kwargs):
        config = load(*args, **kwargs)
        _flat_gemma3_rope(config)
        _gemma4_global_dims(config)
        return config

    transformers.AutoConfig.from_pretrained = from_pretrained
    _patched = True


def main(argv: list[str] | None = None) -> None:
    """Run the model builder's command line (``argv``, default ``sys.argv[1:]``) with the config fixes."""
    missing = [name for name in ("onnxruntime_genai", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"crossml.genai.builder runs onnxruntime-genai's model builder, which needs "
                         f"{' and '.join(missing)}: pip install onnxruntime-genai transformers (crossml's test extra "
                         "installs both)")
    patch_transformers_configs()
    sys.argv = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

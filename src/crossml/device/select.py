"""GPU provider options and adapter selection (the DirectML execution provider's role).

Accepted options (DirectML's and CUDA's spellings; values are strings, as onnxruntime passes them):

* ``device_id``: adapter index.
* ``performance_preference``: ``default`` | ``high_performance`` | ``minimum_power`` — which adapter
  to take when ``device_id`` is not given (discrete with the most memory, or integrated first).
* ``device_filter``: ``gpu`` | ``any``; ``hardware_vendor_id``: keep adapters of one vendor
  (decimal or 0x hex: NVIDIA 4318 / 0x10DE, AMD 4098, Intel 32902, Apple 0x106B).
* ``disable_metacommands``: ``true`` | ``false`` — when true, no vendor math library runs: crossml's
  own Triton kernels replace cuBLAS / cuDNN for matrix products and convolutions.
* ``enable_graph_capture`` (also CUDA's ``enable_cuda_graph``): ``true`` | ``false`` | ``1`` | ``0``.
* ``use_tf32``: ``1`` | ``0`` — TF32 tensor-core math for fp32 matmul / convolution (default 1, as
  onnxruntime's CUDA provider).
* ``prefer_nhwc``: ``1`` | ``0`` — run 4-D convolutions channels-last (default 1).
* CUDA-provider options that scripts pass and that have no effect here are accepted and reported:
  ``gpu_mem_limit``, ``arena_extend_strategy``, ``cudnn_conv_algo_search``,
  ``do_copy_in_default_stream``, ``cudnn_conv_use_max_workspace``, ``tunable_op_enable``,
  ``tunable_op_tuning_enable``, ``user_compute_stream``.
"""

from __future__ import annotations

from dataclasses import dataclass

from crossml.device.adapter import VENDOR_IDS, Adapter, adapters
from crossml.runtime.errors import InvalidArgument

_BOOL = {"true": True, "1": True, "false": False, "0": False}
_CHOICES = {
    "performance_preference": ("default", "high_performance", "minimum_power"),
    "device_filter": ("gpu", "any", "npu"),
}
_BOOLEAN_KEYS = ("disable_metacommands", "enable_graph_capture", "enable_cuda_graph", "use_tf32", "prefer_nhwc",
                 "do_copy_in_default_stream", "cudnn_conv_use_max_workspace", "tunable_op_enable",
                 "tunable_op_tuning_enable")
_PASSTHROUGH = ("gpu_mem_limit", "arena_extend_strategy", "cudnn_conv_algo_search", "user_compute_stream")
ACCEPTED = ("device_id", "hardware_vendor_id") + tuple(_CHOICES) + _BOOLEAN_KEYS + _PASSTHROUGH


@dataclass(frozen=True)
class GpuConfig:
    adapter: Adapter
    disable_metacommands: bool = False
    graph_capture: bool = True
    use_tf32: bool = True
    prefer_nhwc: bool = True
    user_stream: int | None = None
    applied: tuple[tuple[str, str], ...] = ()

    def options(self) -> dict[str, str]:
        return dict(self.applied)


def _bool(key: str, value: str, provider: str) -> bool:
    v = value.strip().lower()
    if v not in _BOOL:
        raise InvalidArgument(f"{provider} option {key}='{value}' is not valid; accepted values: true, false, 1, 0")
    return _BOOL[v]


def _int(key: str, value: str, provider: str) -> int:
    try:
        return int(value, 0)
    except ValueError:
        raise InvalidArgument(f"{provider} option {key}='{value}' must be an integer") from None


def parse_gpu_options(options: dict[str, str], provider: str, found: list[Adapter] | None = None) -> GpuConfig:
    """Validate provider options and pick the adapter. Raises InvalidArgument naming what is accepted."""
    for key in options:
        if key not in ACCEPTED:
            raise InvalidArgument(
                f"{provider}: unknown provider option '{key}'. Accepted options: {', '.join(ACCEPTED)}"
            )
    for key, choices in _CHOICES.items():
        if key in options and options[key].strip().lower() not in choices:
            raise InvalidArgument(
                f"{provider} option {key}='{options[key]}' is not valid; accepted values: {', '.join(choices)}"
            )
    flags = {k: _bool(k, options[k], provider) for k in _BOOLEAN_KEYS if k in options}
    found = adapters() if found is None else found
    adapter = choose_adapter(found, options, provider)
    capture = flags.get("enable_graph_capture", flags.get("enable_cuda_graph", True))
    applied = dict(options)
    applied["device_id"] = str(adapter.index)
    applied.setdefault("performance_preference", "default")
    applied.setdefault("device_filter", "gpu")
    applied.setdefault("disable_metacommands", "false")
    applied.setdefault("enable_graph_capture", "true" if capture else "false")
    applied.setdefault("use_tf32", "1")
    stream = options.get("user_compute_stream")
    return GpuConfig(
        adapter=adapter,
        disable_metacommands=flags.get("disable_metacommands", False),
        graph_capture=capture,
        use_tf32=flags.get("use_tf32", True),
        prefer_nhwc=flags.get("prefer_nhwc", True),
        user_stream=_int("user_compute_stream", stream, provider) if stream else None,
        applied=tuple(sorted(applied.items())),
    )


def choose_adapter(found: list[Adapter], options: dict[str, str], provider: str) -> Adapter:
    listing = "; ".join(f"{a.index}: {a.name} (vendor 0x{a.vendor_id:04X})" for a in found) or "none"
    if not found:
        raise InvalidArgument(f"{provider}: no GPU adapter is available on this machine")
    candidates = list(found)
    if "hardware_vendor_id" in options:
        raw = options["hardware_vendor_id"].strip().lower()
        vid = VENDOR_IDS[raw] if raw in VENDOR_IDS else _int("hardware_vendor_id", raw, provider)
        candidates = [a for a in candidates if a.vendor_id == vid]
        if not candidates:
            raise InvalidArgument(f"{provider}: no adapter has hardware_vendor_id 0x{vid:04X}; adapters: {listing}")
    if "device_id" in options:
        idx = _int("device_id", options["device_id"], provider)
        match = [a for a in candidates if a.index == idx]
        if idx < 0 or not match:
            raise InvalidArgument(f"{provider}: device_id {idx} is out of range; adapters: {listing}")
        return match[0]
    pref = options.get("performance_preference", "default").strip().lower()
    if pref == "high_performance":
        return max(candidates, key=lambda a: (not a.integrated, a.memory_bytes, a.compute_units, -a.index))
    if pref == "minimum_power":
        return max(candidates, key=lambda a: (a.integrated, -a.memory_bytes, -a.index))
    return candidates[0]

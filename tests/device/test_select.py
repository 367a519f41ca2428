"""GPU provider options and adapter selection, on made-up adapter lists (runs without a GPU)."""

from __future__ import annotations

import pytest

from crossml.device.adapter import Adapter
from crossml.device.select import parse_gpu_options
from crossml.runtime.errors import InvalidArgument

NV = Adapter(0, "NVIDIA H200", "nvidia", 0x10DE, "cuda", 141 << 30, 132, False)
IGPU = Adapter(1, "Intel Arc iGPU", "intel", 0x8086, "xpu", 8 << 30, 64, True)
AMD = Adapter(2, "AMD MI300X", "amd", 0x1002, "cuda", 192 << 30, 304, False)
ALL = [NV, IGPU, AMD]
P = "DmlExecutionProvider"


def test_defaults_take_first_adapter_and_report_applied_options():
    c = parse_gpu_options({}, P, ALL)
    assert c.adapter is NV
    assert c.graph_capture and c.use_tf32 and not c.disable_metacommands
    opts = c.options()
    assert opts["device_id"] == "0" and opts["performance_preference"] == "default"
    assert opts["enable_graph_capture"] == "true" and opts["disable_metacommands"] == "false"


def test_device_id_and_errors_list_adapters():
    assert parse_gpu_options({"device_id": "2"}, P, ALL).adapter is AMD
    with pytest.raises(InvalidArgument, match=r"device_id 5 is out of range; adapters: 0: NVIDIA H200"):
        parse_gpu_options({"device_id": "5"}, P, ALL)
    with pytest.raises(InvalidArgument, match="device_id -1 is out of range"):
        parse_gpu_options({"device_id": "-1"}, P, ALL)
    with pytest.raises(InvalidArgument, match="must be an integer"):
        parse_gpu_options({"device_id": "first"}, P, ALL)


def test_performance_preference():
    assert parse_gpu_options({"performance_preference": "high_performance"}, P, ALL).adapter is AMD
    assert parse_gpu_options({"performance_preference": "minimum_power"}, P, ALL).adapter is IGPU
    with pytest.raises(InvalidArgument, match="accepted values: default, high_performance, minimum_power"):
        parse_gpu_options({"performance_preference": "fast"}, P, ALL)


def test_vendor_filter():
    assert parse_gpu_options({"hardware_vendor_id": "4098"}, P, ALL).adapter is AMD
    assert parse_gpu_options({"hardware_vendor_id": "0x8086"}, P, ALL).adapter is IGPU
    assert parse_gpu_options({"hardware_vendor_id": "nvidia"}, P, ALL).adapter is NV
    with pytest.raises(InvalidArgument, match="no adapter has hardware_vendor_id 0x106B"):
        parse_gpu_options({"hardware_vendor_id": "0x106B"}, P, ALL)
    # device_id indexes the machine's adapters, and must pass the vendor filter
    with pytest.raises(InvalidArgument, match="device_id 0 is out of range"):
        parse_gpu_options({"hardware_vendor_id": "4098", "device_id": "0"}, P, ALL)


def test_boolean_options_and_unknown_keys():
    c = parse_gpu_options({"disable_metacommands": "true", "enable_graph_capture": "0", "use_tf32": "0"}, P, ALL)
    assert c.disable_metacommands and not c.graph_capture and not c.use_tf32
    assert not parse_gpu_options({"enable_cuda_graph": "0"}, "CUDAExecutionProvider", ALL).graph_capture
    with pytest.raises(InvalidArgument, match="accepted values: true, false, 1, 0"):
        parse_gpu_options({"disable_metacommands": "maybe"}, P, ALL)
    with pytest.raises(InvalidArgument, match="unknown provider option 'turbo'. Accepted options: device_id"):
        parse_gpu_options({"turbo": "1"}, P, ALL)
    with pytest.raises(InvalidArgument, match="device_filter='cpu' is not valid"):
        parse_gpu_options({"device_filter": "cpu"}, P, ALL)


def test_cuda_provider_options_are_accepted():
    c = parse_gpu_options({"cudnn_conv_algo_search": "EXHAUSTIVE", "arena_extend_strategy": "kSameAsRequested",
                           "gpu_mem_limit": "1000000", "do_copy_in_default_stream": "1"}, "CUDAExecutionProvider", ALL)
    assert c.options()["cudnn_conv_algo_search"] == "EXHAUSTIVE"


def test_no_adapter():
    with pytest.raises(InvalidArgument, match="no GPU adapter"):
        parse_gpu_options({}, P, [])

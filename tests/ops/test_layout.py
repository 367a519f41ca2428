"""The weight pre-packing rule shared by session plans and the device API (crossml.ops.layout): which layout a
constant weight gets per op, device and provider setting, and that packing keeps values and shapes."""

from __future__ import annotations

import pytest
import torch

import crossml.device.vendor as vendor
from crossml.ops.layout import pack_weight, weight_layout

CUDA = torch.device("cuda")  # a device object only: nothing is allocated on it


def test_convolution_weights_go_channels_last_off_the_cpu() -> None:
    w = torch.zeros(8, 3, 3, 3)
    assert weight_layout("", "Conv", w, CUDA, {}) == "nhwc"
    assert weight_layout("com.crossml", "FusedConv", w, CUDA, {}) == "nhwc"
    assert weight_layout("", "Conv", w, torch.device("cpu"), {}) is None
    assert weight_layout("", "Conv", w, CUDA, {}, channels_last=False) is None  # prefer_nhwc off
    assert weight_layout("", "Conv", torch.zeros(8, 3, 3), CUDA, {}) is None  # 1-D convolution
    assert weight_layout("", "Conv", None, CUDA, {}) is None  # not a constant


def test_matrix_weights_go_column_major_with_tf32_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vendor, "column_major_fp32_weights", lambda device: device.type == "cuda")
    w = torch.zeros(8, 4)
    assert weight_layout("", "MatMul", w, CUDA, {}) == "colmajor"
    assert weight_layout("", "MatMul", w, CUDA, {}, tf32=False) is None
    assert weight_layout("", "MatMul", w, CUDA, {}, own_kernels=True) is None  # disable_metacommands
    assert weight_layout("", "Gemm", w, CUDA, {"transB": 1}) is None
    assert weight_layout("", "MatMul", w.half(), CUDA, {}) is None
    decode = torch.zeros(896, 1152, dtype=torch.float16)  # a GEMV weight: column-major unless own kernels run
    assert weight_layout("", "MatMul", decode, CUDA, {}, tf32=False) == "colmajor"
    assert weight_layout("", "MatMul", decode, CUDA, {}, own_kernels=True) is None


@pytest.mark.parametrize(("layout", "shape"), [("nhwc", (8, 3, 3, 3)), ("colmajor", (8, 4))])
def test_pack_weight_keeps_values_and_shape(layout: str, shape: tuple[int, ...]) -> None:
    w = torch.randn(shape)
    packed = pack_weight(w, layout)
    assert torch.equal(packed, w) and packed.shape == w.shape
    if layout == "nhwc":
        assert packed.is_contiguous(memory_format=torch.channels_last)
    else:
        assert packed.t().is_contiguous()
    with pytest.raises(ValueError, match="unknown weight layout 'nchw'"):
        pack_weight(w, "nchw")

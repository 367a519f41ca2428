"""The Triton convolution (crossml.kernels.conv) against its torch reference, and the Conv
replacement in METACOMMAND_FREE. CPU cases run in Triton's interpreter; ``gpu`` cases compile."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels import METACOMMAND_FREE  # noqa: E402
from crossml.kernels.conv import conv, conv_reference  # noqa: E402
from tests.kernels._common import DEVICES, assert_close, rand, run_own_kernels  # noqa: E402

#: name -> (x shape, w shape, conv keywords, channels-last input)
CASES = {
    "3x3_pad1_few_channels": ((2, 3, 9, 11), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}, False),
    "channel_loop_asym_pads_stride_dilation": ((2, 40, 7, 6), (17, 40, 3, 3),
                                               {"pads": [0, 1, 2, 0], "strides": [2, 1], "dilations": [1, 2]}, False),
    "groups2_relu": ((1, 6, 9, 8), (4, 3, 3, 3), {"group": 2, "pads": [1, 0, 1, 0], "relu": True}, False),
    "depthwise_multiplier2_stride2": ((2, 8, 9, 8), (16, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1],
                                                                    "strides": [2, 2]}, False),
    "depthwise_channels_last": ((2, 8, 9, 8), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}, True),
    "depthwise_relu6": ((2, 8, 9, 8), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1], "relu": True,
                                                     "clip_max": 0.5}, True),
    "3x3_relu6": ((2, 3, 9, 11), (5, 3, 3, 3), {"pads": [1, 1, 1, 1], "relu": True, "clip_max": 0.5}, False),
    "1x1_channels_last": ((2, 40, 7, 6), (17, 40, 1, 1), {}, True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", list(CASES))
def test_conv2d_matches_reference(device: str, dtype: torch.dtype, case: str) -> None:
    xs, ws, kw, channels_last = CASES[case]
    x = rand(*xs, dtype=dtype, device=device, seed=1)
    w = rand(*ws, dtype=dtype, device=device, seed=2)
    b = rand(ws[0], dtype=dtype, device=device, seed=3)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = conv(x, w, b, **kw, allow_tf32=False)
    assert y.device.type == device
    if channels_last:  # the output keeps the input's memory format
        assert y.is_contiguous(memory_format=torch.channels_last)
    assert_close(y, conv_reference(x, w, b, **kw), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("xs", "ws", "kw"), [
    ((2, 5, 13), (4, 5, 3), {"pads": [2, 1], "strides": [2]}),  # 1-D
    ((1, 4, 5, 6, 7), (3, 4, 2, 3, 3), {"pads": [1, 0, 1, 0, 1, 1]}),  # 3-D
    ((2, 6, 70), (6, 1, 61), {"group": 6, "pads": [30, 30]}),  # depthwise, 61 taps: the tap loop is not unrolled
    ((1, 4, 5, 6, 7), (4, 1, 3, 3, 3), {"group": 4, "pads": [1, 1, 1, 1, 1, 1], "strides": [1, 2, 1]}),  # 27 taps
], ids=["conv1d", "conv3d", "depthwise1d_loop", "depthwise3d_unrolled"])
def test_conv_1d_3d(device: str, xs: tuple[int, ...], ws: tuple[int, ...], kw: dict) -> None:
    x, w = rand(*xs, device=device, seed=1), rand(*ws, device=device, seed=2)
    # strict fp32 (None would follow torch.backends.cudnn.allow_tf32, True by default)
    assert_close(conv(x, w, None, **kw, allow_tf32=False), conv_reference(x, w, None, **kw), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_nhwc_layout_auto_pad_bf16(device: str) -> None:
    x = rand(2, 9, 11, 3, dtype=torch.bfloat16, device=device, seed=1)  # (N, H, W, C)
    w = rand(5, 3, 3, 3, dtype=torch.bfloat16, device=device, seed=2)
    kw = {"auto_pad": "SAME_UPPER", "strides": [2, 2], "layout": "NHWC"}
    y = conv(x, w, **kw)
    assert y.shape == (2, 5, 6, 5)
    assert_close(y, conv_reference(x, w, **kw), torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_errors_name_the_problem(device: str) -> None:
    x, w = rand(1, 6, 5, 5, device=device), rand(4, 4, 3, 3, device=device)
    with pytest.raises(ValueError, match="group=2 does not fit"):
        conv(x, w, group=2)
    with pytest.raises(ValueError, match="output would be empty"):
        conv(x[:, :4, :2, :2], w)
    with pytest.raises(ValueError, match="rank 3 to 5"):
        conv(x[0, 0], w[0, 0])


def test_conv_replacement_defers_on_cpu() -> None:
    from crossml.kernels import _registered

    x, w, b = rand(1, 4, 6, 6), rand(4, 2, 3, 3), rand(4)
    kw = {"group": 2, "pads": [1, 0, 1, 0], "strides": [2, 1]}
    torch.testing.assert_close(METACOMMAND_FREE["Conv"](x, w, b, **kw), _registered("Conv")(x, w, b, **kw),
                               rtol=0, atol=0)


# --- GPU: ResNet-like shapes with autotuned tiles, TF32, and no cuDNN in the trace ---


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(("xs", "ws", "kw"), [
    ((2, 3, 64, 64), (64, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ((2, 64, 28, 28), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 256, 14, 14), (128, 256, 1, 1), {}),
    ((2, 128, 14, 14), (128, 4, 3, 3), {"group": 32, "pads": [1, 1, 1, 1]}),
    ((2, 96, 28, 28), (96, 1, 3, 3), {"group": 96, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
], ids=["stem7x7", "3x3", "1x1", "grouped32", "depthwise"])
def test_gpu_resnet_shapes(dtype: torch.dtype, channels_last: bool, xs: tuple, ws: tuple, kw: dict) -> None:
    x, w, b = rand(*xs, dtype=dtype, device="cuda"), rand(*ws, dtype=dtype, device="cuda", seed=1), \
        rand(ws[0], dtype=dtype, device="cuda", seed=2)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.contiguous(memory_format=torch.channels_last)
    tol = {torch.float16: (1e-2, 5e-2), torch.bfloat16: (4e-2, 2.5e-1), torch.float32: (1e-5, 2e-4)}[dtype]
    assert_close(conv(x, w, b, **kw, relu=True, allow_tf32=False),
                 conv_reference(x, w, b, **kw, relu=True), dtype, tol=tol)


@pytest.mark.gpu
def test_gpu_conv_replacement_runs_no_cudnn() -> None:
    x, w, b = rand(2, 64, 28, 28, device="cuda"), rand(64, 64, 3, 3, device="cuda", seed=1), rand(64, device="cuda")
    x, w, b = x.half(), w.half(), b.half()
    y = run_own_kernels(lambda: METACOMMAND_FREE["Conv"](x, w, b, pads=[1, 1, 1, 1]), "_conv_kernel",
                        ("conv", "cudnn", "gemm", "xmma", "cutlass", "miopen", "implicit"))
    assert_close(y, conv_reference(x, w, b, pads=[1, 1, 1, 1]), torch.float16, tol=(1e-2, 5e-2))

"""Type conversions: Cast, CastLike, BitCast.

:func:`cast_to` converts an engine value to any ONNX element type, with ONNX's (and
onnxruntime's) semantics where torch's own ``.to`` differs:

* float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz): round to nearest even; with ``saturate`` (the
  default) out-of-range values clamp to the largest finite value, without it they become NaN
  (or inf for e5m2). torch saturates e4m3fn on its own, so the non-saturating case is patched.
* float8e8m0: the exponent of the float32 value, rounded by ``round_mode`` (up, down, nearest).
* int4 / uint4 / int2 / uint2 (held unpacked in int8 / uint8): truncate, then wrap to the width.
* float4e2m1 (held as its 4-bit code in uint8): round to nearest even, saturate at 6, NaN -> -0.
* strings (numpy object arrays): numbers print like onnxruntime (``%.8g``, ``NaN``, ``INF``,
  bools as 1/0); strings parse like ``strtod`` (``INF``, ``NaN``, hex).

The engine holds float4e2m1 as uint8, so a float4e2m1 *input* is only recognised when the engine
tells the op its input types (``ctx.input_types`` or ``ctx.extra["input_types"]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from crossml import dtypes
from crossml.ops.registry import OpContext, op

TP = dtypes.TP

FLOAT8 = {
    TP.FLOAT8E4M3FN: torch.float8_e4m3fn,
    TP.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz,
    TP.FLOAT8E5M2: torch.float8_e5m2,
    TP.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
}
FLOAT8E8M0 = getattr(TP, "FLOAT8E8M0", -1)
FLOAT4E2M1 = TP.FLOAT4E2M1
#: sub-byte integer types: (bits, signed)
SUBBYTE_INT = {TP.INT4: (4, True), TP.UINT4: (4, False)}
if hasattr(TP, "INT2"):
    SUBBYTE_INT.update({TP.INT2: (2, True), TP.UINT2: (2, False)})

_NARROW_FLOATS = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz,
                  torch.float8_e8m0fnu)
#: magnitudes of the float4e2m1 codes 0..7
_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def input_type(ctx: OpContext | None, i: int) -> int | None:
    """The ONNX element type of input ``i`` when the engine provides it (None otherwise)."""
    if ctx is None:
        return None
    types = getattr(ctx, "input_types", None) or ctx.extra.get("input_types")
    if types and i < len(types):
        return types[i]
    return None


def output_type(ctx: OpContext | None, i: int = 0) -> int | None:
    if ctx is None or i >= len(ctx.output_types):
        return None
    return ctx.output_types[i]


# --- decoding values torch holds in a wider dtype ------------------------------------------------


def fp4_to_float(code: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """float4e2m1 codes (uint8) -> floats."""
    table = torch.tensor(_FP4_VALUES, dtype=dtype, device=code.device)
    c = code.to(torch.int64)
    mag = table[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def float_to_fp4(x: torch.Tensor) -> torch.Tensor:
    """floats -> float4e2m1 codes (uint8): round half to even, saturate at +-6, NaN -> -0."""
    f = x.to(torch.float32)
    a = f.abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    r = torch.clamp(torch.round(a / step) * step, max=6.0)
    table = torch.tensor(_FP4_VALUES, dtype=torch.float32, device=x.device)
    code = torch.searchsorted(table, torch.nan_to_num(r, nan=0.0))
    neg = torch.signbit(f) | torch.isnan(f)
    return (code | torch.where(neg, 8, 0)).to(torch.uint8)


def to_e8m0(x: torch.Tensor, saturate: bool = True, round_mode: str = "up") -> torch.Tensor:
    """floats -> float8e8m0 (the float32 exponent, rounded by ``round_mode``)."""
    bits = x.to(torch.float32).view(torch.int32)
    exp = (bits >> 23) & 0xFF
    special = exp == 0xFF
    if round_mode == "nearest":
        g = (bits & 0x400000) != 0
        r = (bits & 0x200000) != 0
        s = (bits & 0x1FFFFF) != 0
        up = g & (r | s | (exp > 0))
    elif round_mode == "up":
        up = (bits & 0x7FFFFF) != 0
    elif round_mode == "down":
        up = torch.zeros_like(special)
    else:
        raise ValueError(f"Cast: round_mode must be 'up', 'down' or 'nearest', got '{round_mode}'")
    if saturate:
        up = up & (exp != 0xFE)
    exp = (exp + up.to(torch.int32)) & 0xFF
    out = torch.where(special, 0xFF, exp)
    return out.to(torch.uint8).view(torch.float8_e8m0fnu)


def _to_float8(x: torch.Tensor, to: int, saturate: bool) -> torch.Tensor:
    target = FLOAT8[to]
    if x.dtype not in (torch.float16, torch.float32, torch.float64):
        x = x.to(torch.float32)
    if saturate:
        fmax = torch.finfo(target).max
        return torch.clamp(x, -fmax, fmax).to(target)
    y = x.to(target)
    if to == TP.FLOAT8E4M3FN:  # torch saturates e4m3fn; ONNX gives NaN past the last rounding boundary
        overflow = x.abs() > 464.0  # 464 is the tie that rounds (to even) down to 448
        bits = y.view(torch.uint8)
        y = torch.where(overflow, bits | 0x7F, bits).view(target)
    return y


def _to_subbyte_int(x: torch.Tensor, to: int) -> torch.Tensor:
    bits, signed = SUBBYTE_INT[to]
    if x.is_floating_point():
        x = torch.nan_to_num(x.to(torch.float64), nan=0.0).trunc()
    v = x.to(torch.int64)
    mask = (1 << bits) - 1
    if signed:
        half = 1 << (bits - 1)
        return (((v + half) & mask) - half).to(torch.int8)
    return (v & mask).to(torch.uint8)


# --- strings ---------------------------------------------------------------------------------


def _format(v: Any, is_float: bool) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if not is_float:
        return str(v)
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "INF" if v > 0 else "-INF"
    return f"{v:.8g}"


def _to_strings(x: torch.Tensor, src: int | None) -> np.ndarray:
    if src == FLOAT4E2M1:
        x = fp4_to_float(x)
    t = x.detach().cpu()
    if t.dtype in _NARROW_FLOATS or t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    is_float = t.is_floating_point()
    vals = t.reshape(-1).tolist()
    out = np.array([_format(v, is_float) for v in vals], dtype=object)
    return out.reshape(tuple(x.shape))


def _parse(s: Any, want_int: bool) -> Any:
    text = s.decode() if isinstance(s, bytes) else str(s)
    text = text.strip()
    if want_int:
        try:
            return int(text, 0) if text.lower().startswith(("0x", "-0x", "+0x")) else int(text)
        except ValueError:
            pass
    try:
        return float(text)
    except ValueError:
        try:
            return float.fromhex(text)
        except ValueError:
            raise ValueError(f"Cast: cannot parse string '{text}' as a number") from None


def _from_strings(x: np.ndarray, to: int, device: Any) -> torch.Tensor:
    want_int = to not in (TP.FLOAT, TP.DOUBLE, TP.FLOAT16, TP.BFLOAT16) and to not in FLOAT8
    vals = [_parse(s, want_int) for s in x.reshape(-1).tolist()]
    if want_int and all(isinstance(v, int) for v in vals):
        arr = np.array(vals, dtype=np.uint64 if to == TP.UINT64 and any(v > 2**63 - 1 for v in vals)
                       else np.int64)
        t = torch.from_numpy(arr.astype(np.int64) if arr.dtype == np.int64 else arr.view(np.int64))
        if arr.dtype == np.uint64:
            t = t.view(torch.uint64)
    else:
        t = torch.tensor(vals, dtype=torch.float64)
    t = t.reshape(x.shape)
    if device is not None:
        t = t.to(device)
    return cast_to(t, to)


# --- the conversion --------------------------------------------------------------------------


def cast_to(x: Any, to: int, saturate: int = 1, round_mode: str = "up", src: int | None = None,
            device: Any = None) -> Any:
    """``x`` converted to ONNX element type ``to`` (see the module docstring)."""
    if isinstance(x, np.ndarray):
        if to == TP.STRING:
            return x.copy()
        return _from_strings(x, to, device)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"Cast takes a tensor, got {type(x).__name__}")
    if to == TP.STRING:
        return _to_strings(x, src)
    if src == FLOAT4E2M1:
        if to == FLOAT4E2M1:
            return x
        x = fp4_to_float(x)
    elif src is not None and src == to:
        return x
    if to in FLOAT8:
        if x.dtype == FLOAT8[to]:
            return x
        if x.dtype in _NARROW_FLOATS or x.dtype == torch.bfloat16:
            x = x.to(torch.float32)
        return _to_float8(x, to, bool(saturate))
    if to == FLOAT8E8M0:
        if x.dtype == torch.float8_e8m0fnu:
            return x
        return to_e8m0(x.to(torch.float32) if x.dtype in _NARROW_FLOATS else x, bool(saturate), round_mode)
    if to in SUBBYTE_INT:
        if x.dtype in _NARROW_FLOATS or x.dtype == torch.bfloat16 or x.dtype == torch.float16:
            x = x.to(torch.float32)
        return _to_subbyte_int(x, to)
    if to == FLOAT4E2M1:
        return float_to_fp4(x)
    target = dtypes.torch_dtype(to)
    if x.dtype == target:
        return x
    if x.dtype in _NARROW_FLOATS and target not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        x = x.to(torch.float32)
    if target in (torch.uint16, torch.uint32, torch.uint64) and x.is_floating_point():
        # float -> unsigned: truncate through int64 (torch lacks some float->uint kernels)
        return x.trunc().to(torch.int64).to(target)
    return x.to(target)


@op("Cast", since=1, ctx=True)
@op("Cast", since=6, ctx=True)
@op("Cast", since=9, ctx=True)
@op("Cast", since=13, ctx=True)
@op("Cast", since=19, ctx=True)
@op("Cast", since=21, ctx=True)
@op("Cast", since=23, ctx=True)
@op("Cast", since=24, ctx=True)
@op("Cast", since=25, ctx=True)
def cast(x: Any, *, to: Any, saturate: int = 1, round_mode: str = "up", ctx: OpContext | None = None) -> Any:
    if isinstance(to, str):  # opset 1 spelled the type as a string ("FLOAT")
        to = TP.DataType.Value(to.upper())
    return cast_to(x, int(to), saturate, round_mode, src=input_type(ctx, 0), device=ctx.device if ctx else None)


@op("CastLike", since=15, ctx=True)
@op("CastLike", since=19, ctx=True)
@op("CastLike", since=21, ctx=True)
@op("CastLike", since=23, ctx=True)
@op("CastLike", since=24, ctx=True)
@op("CastLike", since=25, ctx=True)
def cast_like(x: Any, target_type: Any, *, saturate: int = 1, round_mode: str = "up",
              ctx: OpContext | None = None) -> Any:
    to = output_type(ctx, 0) or input_type(ctx, 1) or dtypes.onnx_type_of(target_type)
    return cast_to(x, to, saturate, round_mode, src=input_type(ctx, 0), device=ctx.device if ctx else None)


@op("BitCast", since=26, ctx=True)
def bit_cast(x: Any, *, to: int, ctx: OpContext | None = None) -> Any:
    if to == TP.STRING or isinstance(x, np.ndarray):
        raise TypeError("BitCast does not convert strings")
    if to in dtypes.PACKED_SUBBYTE:
        raise TypeError("BitCast to a sub-byte type is not supported")
    target = dtypes.torch_dtype(to)
    if target.itemsize != x.dtype.itemsize:
        raise TypeError(f"BitCast needs types of one bit width: input {x.dtype} ({x.dtype.itemsize * 8} bits), "
                        f"to {dtypes.ort_type_name(to)} ({target.itemsize * 8} bits)")
    if x.dtype == torch.bool or target == torch.bool:
        y = x.view(torch.uint8) if x.dtype == torch.bool else x.view(torch.uint8)
        return y != 0 if target == torch.bool else y.view(target)
    return x.contiguous().view(target)

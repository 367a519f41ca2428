"""Element-wise ops of ai.onnx: unary math, binary arithmetic, comparisons, logical and bitwise ops,
the variadic Sum/Max/Min/Mean, Where and Clip.

ONNX has no implicit type promotion, so every op returns exactly the dtype the spec names (the
input type, or bool for comparisons). Unsigned types that torch has few kernels for are handled
by three small tools: ``widened`` (uint16/uint32 computed as int32/int64), int64 bit patterns for
uint64 where wrapping arithmetic is exact, and ``_ordered`` (the sign bit flipped) where uint64
values must be compared.

Opset 1-6 binary ops carry the legacy ``broadcast``/``axis`` attributes (B aligned to A at ``axis``);
opset 7+ use numpy broadcasting.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from crossml.ops._util import WIDEN, norm_axis, widened
from crossml.ops.registry import OpContext, op

Tensor = torch.Tensor

I64_SIGN = -(1 << 63)
I64_MAX = (1 << 63) - 1


# --------------------------------------------------------------------------------------------
# shared helpers


def _same_type(name: str, *xs: Tensor) -> None:
    """ONNX binary/variadic ops take one element type for all inputs (no implicit promotion)."""
    dts = {x.dtype for x in xs if x is not None}
    if len(dts) > 1:
        got = ", ".join(str(x.dtype).replace("torch.", "") for x in xs if x is not None)
        raise TypeError(f"{name} expects inputs of one element type, got {got}; insert a Cast")


def _legacy_broadcast(a: Tensor, b: Tensor, broadcast: int, axis: int | None) -> tuple[Tensor, Tensor]:
    """Opset 1-6 broadcasting: with ``broadcast=1`` B's dims line up with A's from ``axis`` on."""
    if broadcast and axis is not None and b.dim() > 0 and b.dim() < a.dim():
        ax = norm_axis(axis, a.dim())
        if ax + b.dim() > a.dim():
            raise ValueError(f"broadcast axis {axis} leaves no room for B of shape {tuple(b.shape)} in A of "
                             f"shape {tuple(a.shape)}")
        b = b.reshape(tuple(b.shape) + (1,) * (a.dim() - ax - b.dim()))
    elif not broadcast and a.shape != b.shape and b.numel() != 1:
        raise ValueError(f"inputs of shapes {tuple(a.shape)} and {tuple(b.shape)} differ and the node does not "
                         f"set broadcast=1 (opset < 7 broadcasting)")
    return a, b


_SIGNED_VIEW = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _bits(x: Tensor) -> Tensor:
    """The same bits in a dtype with kernels everywhere (CUDA lacks bitwise ops and where for uint16-64)."""
    if x.dtype in _SIGNED_VIEW:
        return x.view(_SIGNED_VIEW[x.dtype])
    if x.dtype.is_floating_point and x.element_size() == 1:  # float8
        return x.view(torch.uint8)
    return x


def _ordered(x: Tensor) -> Tensor:
    """A tensor torch can compare that orders like ``x`` (uint64 via the flipped sign bit)."""
    if x.dtype == torch.uint64:
        return x.view(torch.int64) ^ I64_SIGN
    if x.dtype in WIDEN:
        return x.to(WIDEN[x.dtype])
    return x


def _unordered(y: Tensor, dtype: torch.dtype) -> Tensor:
    """Inverse of :func:`_ordered`."""
    if dtype == torch.uint64:
        return (y ^ I64_SIGN).view(torch.uint64)
    return y.to(dtype) if y.dtype != dtype else y


def _udivmod64(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Unsigned 64-bit quotient and remainder of int64 bit patterns (torch has no uint64 division)."""
    a, b = torch.broadcast_tensors(a, b)
    big = b < 0  # divisor >= 2**63: the quotient is 0 or 1
    q = torch.div((a >> 1) & I64_MAX, torch.where(big, 1, b), rounding_mode="trunc") << 1
    r = a - q * b
    fix = (r ^ I64_SIGN) >= (b ^ I64_SIGN)
    q, r = q + fix.to(torch.int64), torch.where(fix, r - b, r)
    one = ((a ^ I64_SIGN) >= (b ^ I64_SIGN)).to(torch.int64)
    return torch.where(big, one, q), torch.where(big, a - one * b, r)


# --------------------------------------------------------------------------------------------
# unary


def _float_unary(name: str, fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    def unary(x: Tensor) -> Tensor:
        if not x.dtype.is_floating_point:  # Erf accepts integers: compute in double, cast back
            return fn(x.double()).to(x.dtype)
        return fn(x)

    unary.__name__ = name.lower()
    unary.__doc__ = f"ONNX {name}: element-wise {fn.__name__}, same dtype."
    return unary


_FLOAT_UNARY: dict[str, tuple[int, Callable[[Tensor], Tensor]]] = {
    "Reciprocal": (1, torch.reciprocal), "Sqrt": (1, torch.sqrt), "Exp": (1, torch.exp), "Log": (1, torch.log),
    "Ceil": (1, torch.ceil), "Floor": (1, torch.floor),
    "Sin": (7, torch.sin), "Cos": (7, torch.cos), "Tan": (7, torch.tan),
    "Asin": (7, torch.asin), "Acos": (7, torch.acos), "Atan": (7, torch.atan),
    "Sinh": (9, torch.sinh), "Cosh": (9, torch.cosh),
    "Asinh": (9, torch.asinh), "Acosh": (9, torch.acosh), "Atanh": (9, torch.atanh),
    "Erf": (9, torch.erf), "Round": (11, torch.round),  # torch.round rounds half to even, like ONNX
}
for _name, (_since, _fn) in _FLOAT_UNARY.items():
    op(_name, since=_since)(_float_unary(_name, _fn))


@op("Abs", since=1)
def abs_(x: Tensor) -> Tensor:
    return x if not x.dtype.is_signed and not x.dtype.is_floating_point else torch.abs(x)


@op("Neg", since=1)
def neg(x: Tensor) -> Tensor:
    return torch.neg(x)


@op("Sign", since=9)
def sign(x: Tensor) -> Tensor:
    if not x.dtype.is_signed and not x.dtype.is_floating_point:
        return (_bits(x) != 0).to(x.dtype)
    return torch.sign(x)


def _float_view(x: Tensor) -> Tensor:
    """float8 types have few kernels: their values are exact in float32."""
    return x.float() if x.dtype.is_floating_point and x.element_size() == 1 else x


@op("IsNaN", since=9)
def isnan(x: Tensor) -> Tensor:
    return torch.isnan(_float_view(x))


@op("IsInf", since=10)
def isinf(x: Tensor, *, detect_negative: int = 1, detect_positive: int = 1) -> Tensor:
    x = _float_view(x)
    out = torch.isinf(x)
    if not detect_negative:
        out = out & (x > 0)
    if not detect_positive:
        out = out & (x < 0)
    return out


@op("Not", since=1)
def not_(x: Tensor) -> Tensor:
    return torch.logical_not(x)


@op("BitwiseNot", since=18)
def bitwise_not(x: Tensor) -> Tensor:
    return torch.bitwise_not(_bits(x)).view(x.dtype)


# --------------------------------------------------------------------------------------------
# binary arithmetic


@widened
def _add(a: Tensor, b: Tensor) -> Tensor:
    return torch.add(a, b)


@widened
def _sub(a: Tensor, b: Tensor) -> Tensor:
    return torch.sub(a, b)


@widened
def _mul(a: Tensor, b: Tensor) -> Tensor:
    return torch.mul(a, b)


def _div_signed(a: Tensor, b: Tensor) -> Tensor:
    if a.dtype.is_floating_point:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # C semantics: truncate toward zero


_div_wide = widened(_div_signed)


def _div(a: Tensor, b: Tensor) -> Tensor:
    if a.dtype == torch.uint64:
        return _udivmod64(a.view(torch.int64), b.view(torch.int64))[0].view(torch.uint64)
    return _div_wide(a, b)


def _binary(name: str, fn: Callable[[Tensor, Tensor], Tensor], *, legacy: bool = True,
            since: int = 7) -> None:
    """Register ``name``: opset 1 with legacy broadcast attributes (when ``legacy``), ``since`` with numpy broadcasting."""

    def modern(a: Tensor, b: Tensor) -> Tensor:
        _same_type(name, a, b)
        return fn(a, b)

    def old(a: Tensor, b: Tensor, *, broadcast: int = 0, axis: int | None = None) -> Tensor:
        _same_type(name, a, b)
        return fn(*_legacy_broadcast(a, b, broadcast, axis))

    modern.__name__ = old.__name__ = name.lower()
    if legacy:
        op(name, since=1)(old)
    op(name, since=since)(modern)


_binary("Add", _add)
_binary("Sub", _sub)
_binary("Mul", _mul)
_binary("Div", _div)


def _pow(a: Tensor, b: Tensor) -> Tensor:
    """Output type = base type (opset 12+ lets the exponent have another numeric type)."""
    if a.dtype.is_floating_point:
        if not b.dtype.is_floating_point:
            b = b.to(torch.float64 if a.dtype == torch.float64 else torch.float32)
        return torch.pow(a, b).to(a.dtype)
    if b.dtype.is_floating_point:  # integer base, float exponent: pow in double, then truncate
        r = torch.pow(_as_int64(a).double(), b.double())
        # GPU pow may land an ulp below an exact integer (3 ** 1.0 -> 2.9999...): snap before truncating
        r = torch.where((r - r.round()).abs() <= 1e-12 * r.abs().clamp_min(1), r.round(), r)
        return r.to(a.dtype)
    out = torch.pow(_as_int64(a), _as_int64(b))  # wraps modulo 2**64; the cast keeps the low bits
    return out.view(torch.uint64) if a.dtype == torch.uint64 else out.to(a.dtype)


def _as_int64(x: Tensor) -> Tensor:
    return x.view(torch.int64) if x.dtype == torch.uint64 else x.to(torch.int64)


@op("Pow", since=1)
def pow_legacy(a: Tensor, b: Tensor, *, broadcast: int = 0, axis: int | None = None) -> Tensor:
    return _pow(*_legacy_broadcast(a, b, broadcast, axis))


@op("Pow", since=7)
def pow_(a: Tensor, b: Tensor) -> Tensor:
    return _pow(a, b)


@widened
def _fmod(a: Tensor, b: Tensor) -> Tensor:
    return torch.fmod(a, b)


@widened
def _remainder(a: Tensor, b: Tensor) -> Tensor:
    r = torch.remainder(a, b)
    if a.dtype.is_floating_point:  # a zero result takes the sign of the divisor (numpy.mod)
        r = torch.where(r == 0, torch.copysign(torch.zeros_like(r), b), r)
    return r


@op("Mod", since=10)
def mod(a: Tensor, b: Tensor, *, fmod: int = 0) -> Tensor:
    _same_type("Mod", a, b)
    if fmod not in (0, 1):
        raise ValueError(f"Mod attribute fmod must be 0 or 1, got {fmod}")
    if a.dtype == torch.uint64:  # unsigned: fmod and Python mod agree
        return _udivmod64(a.view(torch.int64), b.view(torch.int64))[1].view(torch.uint64)
    return (_fmod if fmod else _remainder)(a, b)


# --------------------------------------------------------------------------------------------
# comparisons, logical and bitwise ops


def _compare(fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    def run(a: Tensor, b: Tensor) -> Tensor:
        return fn(_ordered(a), _ordered(b))

    return run


@op("Equal", since=1)
def equal_legacy(a: Tensor, b: Tensor, *, broadcast: int = 0, axis: int | None = None) -> Tensor:
    _same_type("Equal", a, b)
    return torch.eq(*_legacy_broadcast(a, b, broadcast, axis))


@op("Equal", since=7, ctx=True)
def equal(a: Any, b: Any, *, ctx: OpContext) -> Tensor:
    _same_type("Equal", a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):  # strings live on the host; the result need not
        eq = torch.from_numpy(np.asarray(np.asarray(a) == np.asarray(b), dtype=bool))
        return eq.to(ctx.device) if ctx.device is not None else eq
    return torch.eq(a, b)


_binary("Less", _compare(torch.lt))
_binary("Greater", _compare(torch.gt))
_binary("LessOrEqual", _compare(torch.le), legacy=False, since=12)
_binary("GreaterOrEqual", _compare(torch.ge), legacy=False, since=12)
_binary("And", torch.logical_and)
_binary("Or", torch.logical_or)
_binary("Xor", torch.logical_xor)
def _bitwise(fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    def run(a: Tensor, b: Tensor) -> Tensor:
        return fn(_bits(a), _bits(b)).view(a.dtype)

    return run


_binary("BitwiseAnd", _bitwise(torch.bitwise_and), legacy=False, since=18)
_binary("BitwiseOr", _bitwise(torch.bitwise_or), legacy=False, since=18)
_binary("BitwiseXor", _bitwise(torch.bitwise_xor), legacy=False, since=18)


@op("BitShift", since=11)
def bit_shift(x: Tensor, y: Tensor, *, direction: str) -> Tensor:
    """Shifts by a negative amount or by >= the bit width give 0 (-1 for a right shift of a negative x)."""
    _same_type("BitShift", x, y)
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"BitShift direction must be 'LEFT' or 'RIGHT', got '{direction}'")
    bits = x.element_size() * 8
    xw, s = _as_int64(x), _as_int64(y)
    out_of_range = (s < 0) | (s >= bits)
    s = s.clamp(0, bits - 1)
    if direction == "LEFT":
        out = torch.where(out_of_range, 0, xw << s)
    elif x.dtype == torch.uint64:  # logical shift of the int64 bit pattern
        mask = torch.where(s == 0, -1, (torch.ones_like(s) << (64 - s)) - 1)
        out = torch.where(out_of_range, 0, (xw >> s) & mask)
    else:  # values fit int64: its arithmetic shift is exact (sign-extending for signed x)
        out = torch.where(out_of_range, torch.where(xw < 0, -1, 0), xw >> s)
    return out.view(torch.uint64) if x.dtype == torch.uint64 else out.to(x.dtype)


# --------------------------------------------------------------------------------------------
# variadic


def _variadic(name: str, xs: tuple[Tensor, ...]) -> None:
    if not xs:
        raise ValueError(f"{name} needs at least one input")
    _same_type(name, *xs)


@op("Sum", since=1)
def sum_(*xs: Tensor) -> Tensor:
    _variadic("Sum", xs)
    return functools.reduce(_add, xs)


@op("Mean", since=1)
def mean(*xs: Tensor) -> Tensor:
    _variadic("Mean", xs)
    return (functools.reduce(_add, xs) / len(xs)).to(xs[0].dtype)


def _extreme(name: str, fn: Callable[[Tensor, Tensor], Tensor], xs: tuple[Tensor, ...]) -> Tensor:
    _variadic(name, xs)
    if len(xs) == 1:
        return xs[0]
    return _unordered(functools.reduce(fn, [_ordered(x) for x in xs]), xs[0].dtype)


@op("Max", since=1)
def max_(*xs: Tensor) -> Tensor:
    return _extreme("Max", torch.maximum, xs)  # NaN propagates, as in numpy.maximum


@op("Min", since=1)
def min_(*xs: Tensor) -> Tensor:
    return _extreme("Min", torch.minimum, xs)


# --------------------------------------------------------------------------------------------
# Where, Clip


@op("Where", since=9)
def where(cond: Any, x: Any, y: Any) -> Any:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):  # string tensors
        c = cond.cpu().numpy() if isinstance(cond, Tensor) else np.asarray(cond)
        return np.where(c, x, y).astype(object)
    _same_type("Where", x, y)
    return torch.where(cond, _bits(x), _bits(y)).view(x.dtype)  # selects bit patterns: any dtype


@op("Clip", since=1)
def clip_attr(x: Tensor, *, min: float = -math.inf, max: float = math.inf) -> Tensor:  # noqa: A002
    """Opset 1-6: the bounds are float attributes."""
    return torch.clamp(x, min=min, max=max)


def _bound(t: Tensor | None, which: str) -> Tensor | None:
    if t is None:
        return None
    if t.numel() != 1:
        raise ValueError(f"Clip input '{which}' must be a scalar, got shape {tuple(t.shape)}")
    return _ordered(t.reshape(()))


@op("Clip", since=11)
def clip(x: Tensor, lo: Tensor | None = None, hi: Tensor | None = None) -> Tensor:
    """Opset 11+: the bounds are optional scalar inputs; min > max gives max everywhere (numpy.clip)."""
    _same_type("Clip", x, lo, hi)
    lo_, hi_ = _bound(lo, "min"), _bound(hi, "max")
    if lo_ is None and hi_ is None:
        return x
    return _unordered(torch.clamp(_ordered(x), min=lo_, max=hi_), x.dtype)

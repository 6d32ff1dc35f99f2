"""Constant folding: the value of an expression that reads nothing but constants.

The lowering folds a single value computed from constants (a scale ``1 / sqrt(d)`` of a
head width fixed by a guard, a fixed position of a lookup) into a constant of the IR.
The value is computed as eager PyTorch computes it, in plain Python (the backend runs
under PyTorch's fake tensor mode, where no tensor holds data): each operation is
computed in float64 (integers exactly) and its result rounded to its dtype (integers
wrap in their width, floats round to nearest even in theirs). Float32 ``+ - * /`` and
``sqrt`` computed that way are exactly the float32 operations (the double rounding is
innocuous for them); transcendental functions, and 16-bit results at a tie of their
float32 rounding, may differ from PyTorch's by an ulp.
"""
from __future__ import annotations

import math
import struct

import torch

from flashlight.ir import Const, Expr, Pointwise

_HALF = (torch.float16, torch.bfloat16)


def fold_constants(expr: Expr) -> Const | None:
    """``expr``'s value as a constant when it reads nothing but constants, else None."""
    try:
        value = _evaluate(expr)
    except (ArithmeticError, ValueError):
        return None  # a domain error or a division by zero: left to the kernel, as written
    return None if value is None else Const(value, expr.dtype)


def rounded(value, dtype: torch.dtype):
    """``value`` as a number of ``dtype``: wrapped into an integer dtype's width, rounded
    to nearest even into a float dtype's precision (a 16-bit one through float32, as
    PyTorch rounds a double)."""
    if dtype == torch.bool:
        return bool(value)
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return (int(value) - info.min) % (1 << info.bits) + info.min
    value = float(value)
    if dtype == torch.float64 or not math.isfinite(value):
        return value
    if dtype == torch.float16:
        try:  # through float32, as PyTorch converts a double (twice rounded: 111.78125 + 2e-7 -> 111.75)
            return struct.unpack("<e", struct.pack("<e", _float32(value)))[0]
        except OverflowError:
            return math.copysign(math.inf, value)
    single = _float32(value)
    if dtype == torch.bfloat16:
        bits = struct.unpack("<I", struct.pack("<f", single))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    return single


def _float32(value: float) -> float:
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _evaluate(expr: Expr, operand: bool = False):
    if isinstance(expr, Const):
        return expr.value
    if not isinstance(expr, Pointwise) or expr.op not in _OPS:
        return None
    args = [_evaluate(a, operand=True) for a in expr.args]
    if any(a is None for a in args):
        return None
    if not expr.dtype.is_floating_point and expr.op not in _EXACT_ON_INTEGERS:
        return None
    return rounded(_OPS[expr.op](*args), expr.dtype)


def _floordiv(a, b):
    return a // b if isinstance(a, int) and isinstance(b, int) else math.floor(a / b)


def _truncdiv(a, b):
    if not (isinstance(a, int) and isinstance(b, int)):
        return math.trunc(a / b)
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient


def _remainder(a, b):  # Python's: the divisor's sign, as torch.remainder
    return a % b


_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "neg": lambda a: -a,
    "abs": abs,
    "maximum": max,
    "minimum": min,
    "pow": lambda a, b: a ** b,
    "floordiv": _floordiv,
    "truncdiv": _truncdiv,
    "remainder": _remainder,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "and": lambda a, b: bool(a) and bool(b),
    "or": lambda a, b: bool(a) or bool(b),
    "not": lambda a: not a,
    "where": lambda c, a, b: a if c else b,
    "cast": lambda a: a,
    "exp": math.exp,
    "log": math.log,
    "sqrt": math.sqrt,
    "rsqrt": lambda a: 1 / math.sqrt(a),
    "reciprocal": lambda a: 1 / a,
    "sigmoid": lambda a: 1 / (1 + math.exp(-a)),
    "tanh": math.tanh,
    "floor": math.floor,
    "ceil": math.ceil,
    "log2": math.log2,
    "sin": math.sin,
    "cos": math.cos,
    "erf": math.erf,
    "expm1": math.expm1,
    "log1p": math.log1p,
    "relu": lambda a: max(a, 0),
}
# ops whose integer form is exact arithmetic on Python ints (a cast from a float truncates)
_EXACT_ON_INTEGERS = frozenset({"add", "sub", "mul", "neg", "abs", "maximum", "minimum", "pow", "floordiv",
                                "truncdiv", "remainder", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not",
                                "where", "cast", "relu"})

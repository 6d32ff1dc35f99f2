"""The op vocabulary: every elementwise op the IR knows, and what it means to each stage.

A :class:`flashlight.ir.Pointwise` names its op by a key of :data:`OPS`. For each op
this table says

- ``aten``: the ATen overloads the lowering turns into it (``flashlight.lower``; ops
  with special rules, such as ``div`` with a rounding mode, add theirs there);
- ``triton``: how codegen prints it, a template over the operand texts ``{0}``,
  ``{1}``, ...; ``None`` where :mod:`flashlight.codegen` has a rule of its own
  (rounding divisions, ``pow``, ``cast``);
- ``integer_exact``: on integers and booleans the printed code is Triton's integer
  arithmetic, exact as in eager (other ops on integers are left to PyTorch);
- ``bounds``: how the tile-liveness scan bounds it over a tile
  (:mod:`flashlight.codegen_live`, [Note: tile skipping]); ``None``: it cannot.

A new op: add its entry here, then its algebra where a pass needs it (the online
rewrite in ``passes/online.py`` matches ops by name).
"""
from __future__ import annotations

import dataclasses

import torch

from flashlight.random_ops import PHILOX_UNIFORM


@dataclasses.dataclass(frozen=True)
class Op:
    """One elementwise op of the IR."""

    arity: int
    aten: tuple[str, ...] = ()  # "packet.overload" of torch.ops.aten
    triton: str | None = None  # template over operand texts; None: a rule in codegen
    integer_exact: bool = False
    # "arith", "compare", "logical", "cast", "select", "division" (by a positive
    # constant) or None: what the liveness scan's interval arithmetic does with it
    bounds: str | None = None
    kind: str = ""  # "comparison" or "logical": a boolean result, never typed as float


def _binary(symbol: str) -> str:
    return "({0} %s {1})" % symbol


OPS: dict[str, Op] = {
    # arithmetic
    "add": Op(2, ("add.Tensor", "add.Scalar"), _binary("+"), True, "arith"),
    "sub": Op(2, ("sub.Tensor", "sub.Scalar", "rsub.Scalar"), _binary("-"), True, "arith"),
    "mul": Op(2, ("mul.Tensor", "mul.Scalar"), _binary("*"), True, "arith"),
    "div": Op(2, ("div.Tensor", "div.Scalar"), _binary("/")),
    "maximum": Op(2, ("maximum.default",), "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", True, "arith"),
    "minimum": Op(2, ("minimum.default",), "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", True, "arith"),
    "pow": Op(2, ("pow.Tensor_Scalar",), None, True),
    "remainder": Op(2, ("remainder.Scalar", "remainder.Tensor"), None, True, "division"),  # the divisor's sign
    "floordiv": Op(2, ("floor_divide.default",), None, True, "division"),
    "truncdiv": Op(2, (), None, True, "division"),
    # comparisons and logic
    "eq": Op(2, ("eq.Tensor", "eq.Scalar"), _binary("=="), True, "compare", "comparison"),
    "ne": Op(2, ("ne.Tensor", "ne.Scalar"), _binary("!="), True, "compare", "comparison"),
    "lt": Op(2, ("lt.Tensor", "lt.Scalar"), _binary("<"), True, "compare", "comparison"),
    "le": Op(2, ("le.Tensor", "le.Scalar"), _binary("<="), True, "compare", "comparison"),
    "gt": Op(2, ("gt.Tensor", "gt.Scalar"), _binary(">"), True, "compare", "comparison"),
    "ge": Op(2, ("ge.Tensor", "ge.Scalar"), _binary(">="), True, "compare", "comparison"),
    "and": Op(2, ("logical_and.default", "bitwise_and.Tensor"), _binary("&"), True, "logical", "logical"),
    "or": Op(2, ("logical_or.default", "bitwise_or.Tensor"), _binary("|"), True, "logical", "logical"),
    "not": Op(1, ("logical_not.default", "bitwise_not.default"), "({0} == 0)", True, "logical", "logical"),
    "where": Op(3, ("where.self",), "tl.where({0}, {1}, {2})", True, "select"),
    "cast": Op(1, (), None, True, "cast"),
    # (seed, c0, c1) -> float32 in [0, 1): [Note: dropout inside a kernel] in flashlight.random_ops
    "uniform": Op(3, (), PHILOX_UNIFORM.format(seed="{0}", c0="{1}", c1="{2}")),
    # unary math (floats are computed on in float32)
    "neg": Op(1, ("neg.default",), "(-{0})", True, "arith"),
    "abs": Op(1, ("abs.default",), "tl.abs({0})", True, "arith"),
    "exp": Op(1, ("exp.default",), "tl.exp({0})"),
    # made by the base-2 pass only (passes/base2.py); torch.exp2 lowers to exp(x * log 2)
    "exp2": Op(1, (), "tl.exp2({0})"),
    "log": Op(1, ("log.default",), "tl.log({0})"),
    # tanh through exp: exact at both tails, and tl has no portable tanh
    "tanh": Op(1, ("tanh.default",), "(1.0 - 2.0 / (tl.exp(2.0 * {0}) + 1.0))"),
    "sigmoid": Op(1, ("sigmoid.default",), "tl.sigmoid({0})"),
    "sqrt": Op(1, ("sqrt.default",), "tl.sqrt({0})"),
    "rsqrt": Op(1, ("rsqrt.default",), "tl.rsqrt({0})"),
    "relu": Op(1, ("relu.default",), "tl.maximum({0}, 0.0)"),  # integer relu lowers to a maximum
    # expm1 / log1p: tl has no portable ones; near 0, where exp(x) - 1 and log(1 + x)
    # lose their relative precision, the leading terms of the series
    "expm1": Op(1, ("expm1.default",), "tl.where(tl.abs({0}) < 1e-5, {0} + 0.5 * {0} * {0}, tl.exp({0}) - 1.0)"),
    "log1p": Op(1, ("log1p.default",),
                "tl.where(tl.abs({0}) < 1e-4, {0} * (1.0 - {0} * (0.5 - {0} / 3.0)), tl.log(1.0 + {0}))"),
    "erf": Op(1, ("erf.default",), "tl.erf({0})"),
    "reciprocal": Op(1, ("reciprocal.default",), "(1.0 / {0})"),
    "log2": Op(1, ("log2.default",), "tl.log2({0})"),
    "sin": Op(1, ("sin.default",), "tl.sin({0})"),
    "cos": Op(1, ("cos.default",), "tl.cos({0})"),
    "floor": Op(1, ("floor.default",), "tl.floor({0})"),  # integers lower to themselves
    "ceil": Op(1, ("ceil.default",), "tl.ceil({0})"),
}

COMPARISONS = frozenset(name for name, op in OPS.items() if op.kind == "comparison")
# ops whose result jumps where an operand crosses some value: a last-bit difference in
# that operand can change the result entirely (flashlight/lower_compare.py)
DISCONTINUOUS = COMPARISONS | {"floor", "ceil", "remainder", "floordiv", "truncdiv"}
DISCONTINUOUS_ATEN = frozenset(f"aten::{overload}" for name in DISCONTINUOUS for overload in OPS[name].aten)
INTEGER_EXACT = frozenset(name for name, op in OPS.items() if op.integer_exact)
# integer / boolean ops the liveness scan bounds over a tile
INTERVAL_OPS = frozenset(name for name, op in OPS.items() if op.bounds not in (None, "division"))
# monotone (or bounded, for the remainder) where the divisor is a positive constant
DIVISION_OPS = frozenset(name for name, op in OPS.items() if op.bounds == "division")
BOOLEAN_OPS = frozenset(name for name, op in OPS.items() if op.kind)  # never typed as float
# the dtypes a kernel loads, computes on and stores (float64 values are left to PyTorch)
HALF_DTYPES = (torch.float16, torch.bfloat16)  # the 16-bit float types a tl.dot takes as they are
KERNEL_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                           torch.int16, torch.int8, torch.uint8, torch.bool})

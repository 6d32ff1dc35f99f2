"""The loop's other exponentials in base 2, their constant factors folded.

[Note: recomputed probabilities in base 2]
The base-2 pass ([Note: base-2 online softmax] in :mod:`flashlight.passes.base2`) rewrites
the exponentials that read an online loop's running max. A backward kernel has none: it
recomputes the probabilities from the forward's saved row statistics,
``p = exp(s / sqrt(d) - m) * (1 / l)``, a loaded ``m`` and ``l`` per query row
([Note: broadcast divisors] in :mod:`flashlight.passes.divisors` made ``/ l`` a multiply).
Printed as written, every score costs a division by the constant (``div.full.f32``: a
reciprocal and a multiply), a subtraction, ``tl.exp``'s own multiply by ``log2(e)`` and
the ``ex2``. With ``L = log2(e)`` distributed over the exponent's sums and differences
and folded into its constant factors,

    exp(s / c - m) = exp2(s * (L / c) - m * L)

a score costs one multiply-add (``ptxas`` contracts it) and the ``ex2``; ``m * L`` is
one value per row, computed at the row vector's shape. Distributing goes through ``+``,
``-``, negation, float casts that round nothing (not a narrowing one: ``round(k * x)``
is not ``k * round(x)``, [Note: rounding keeps the max inside] in passes/online.py) and
a ``where`` with a constant branch (``k * where(p, -inf, a) = where(p, -inf, k * a)``
for ``k > 0``; with two computed branches it would cost a second multiply), folds into
multiplications and divisions by constants and into constants, and stops anywhere else
(a multiply by ``L`` there). An exponential is rewritten only where a constant absorbed
``L``: a constant factor of the scores saves its multiply; a constant term, or a term's
constant factor, takes ``L`` off the sum, so that ``x * L`` and the next addition
contract into one multiply-add (otherwise ``exp2(x * L)`` is what ``tl.exp`` prints
already). Counted per score in the loop, not over a kernel's whole instruction stream: a
term that does not change along the loop is multiplied once, before it.

*Exactness.* ``fl(s * fl(L / c))`` against ``fl(fl(s / c) * L)`` inside ``tl.exp``: the
exponent's rounding is of the order of ``|s / c| * eps`` either way, as in [Note: base-2
online softmax]; special values keep their meaning (``-inf`` scores give ``exp2(-inf) =
0``, NaN stays NaN, a row whose saved max is ``-inf`` gives ``+inf`` as before).
"""
from __future__ import annotations

import math

import torch

from flashlight.ir import Const, Expr, Kernel, Pointwise, replace_nodes
from flashlight.passes import rewrite_loop_bodies
from flashlight.passes.base2 import LOG2E
from flashlight.passes.online import _constant, _exact_cast


def exps_in_base2(kernel: Kernel) -> Kernel:
    """``kernel`` with each loop-body ``exp`` whose exponent has a constant factor (or a
    constant term) written as ``exp2`` with ``log2(e)`` folded in ([Note: recomputed
    probabilities in base 2])."""
    return rewrite_loop_bodies(kernel, _base2_form)


def _base2_form(node: Expr) -> Expr | None:
    if not (isinstance(node, Pointwise) and node.op == "exp" and node.dtype.is_floating_point):
        return None
    arg = replace_nodes(node.args[0], _base2_form)
    scaled, folded, _ = _times(arg, LOG2E)
    if not folded:
        return None if arg == node.args[0] else Pointwise("exp", (arg,), node.dtype)
    return Pointwise("exp2", (scaled,), node.dtype)


def _times(expr: Expr, k: float, limit: float = math.inf) -> tuple[Expr, bool, bool]:
    """``k * expr`` distributed over sums, differences, negations, widening float casts and
    selections with a constant branch, and folded into constant factors and constants;
    whether a constant absorbed ``k`` (an operation per score saved: a folded factor, or a
    multiply-add where a multiply and an add were); and whether distributing ``k`` into
    ``expr`` makes a finite constant infinite (or zero). Nothing is distributed or folded
    where a constant would leave the range of its dtype, or of a narrower float it is
    cast to on the way (``limit``): a sum with such a term keeps its multiply, since an
    infinite term beside another is ``inf - inf`` where the program's sum was finite
    ([Note: constants that absorb a factor])."""
    limit = _narrowed(limit, expr)
    kept = Pointwise("mul", (expr, Const(k, expr.dtype)), expr.dtype)
    value = _constant(expr)
    if value is not None:
        leaves = math.isfinite(value) and not _in_range(k * value, value, limit)
        if not expr.dtype.is_floating_point:
            return kept, False, leaves
        scaled = k * value  # beyond the range: the infinity the kernel computes
        return Const(scaled if abs(scaled) <= limit else math.copysign(math.inf, scaled), expr.dtype), True, leaves
    if not isinstance(expr, Pointwise):
        return kept, False, False
    op, args, dtype = expr.op, expr.args, expr.dtype
    if op in ("add", "sub"):
        (a, fa, la), (b, fb, lb) = _times(args[0], k, limit), _times(args[1], k, limit)
        return (kept, False, True) if la or lb else (Pointwise(op, (a, b), dtype), fa or fb, False)
    if op == "neg":
        inner, _, leaves = _times(args[0], -k, limit)
        return inner, True, leaves
    if _exact_cast(expr):  # a narrowing cast rounds: round(k * x) is not k * round(x)
        inner, folded, leaves = _times(args[0], k, limit)
        return Pointwise("cast", (inner,), dtype), folded, leaves
    if op == "where":
        (a, fa, la), (b, fb, lb) = _times(args[1], k, limit), _times(args[2], k, limit)
        constant = [_constant(x) is not None for x in args[1:]]
        if not any(constant):  # two computed branches: two multiplies
            return kept, False, la or lb
        # the constant branch saves nothing per score; the computed one may
        folded = (fa and not constant[0]) or (fb and not constant[1])
        return Pointwise("where", (args[0], a, b), dtype), folded, la or lb
    leaves = None  # as the first constant factor has it
    if op in ("mul", "div"):
        for x, factor in _factors(expr):
            c = _constant(factor)
            if c is None or not math.isfinite(c) or c == 0:
                continue
            scaled = k * c if op == "mul" else k / c
            if not _in_range(scaled, c, limit):
                leaves = True if leaves is None else leaves
                continue
            inner, _, inner_leaves = _times(x, scaled, limit)
            return inner, True, inner_leaves if leaves is None else leaves
    return kept, False, bool(leaves)


def _factors(expr: Pointwise) -> list[tuple[Expr, Expr]]:
    """(operand, constant candidate) pairs of a product or quotient (a quotient's divisor only)."""
    a, b = expr.args
    return [(a, b)] + ([(b, a)] if expr.op == "mul" else [])


def _narrowed(limit: float, expr: Expr) -> float:
    """The largest magnitude a value of ``expr`` may take on its way: ``limit``, or less
    where ``expr``'s dtype is a narrower float (a cast to float16 on the way)."""
    dtype = expr.dtype
    return min(limit, float(torch.finfo(dtype).max)) if dtype.is_floating_point else limit


def _in_range(scaled: float, constant: float, limit: float) -> bool:
    """Whether a finite constant that absorbed a factor is still finite (at most
    ``limit``) and nonzero where it was nonzero."""
    return abs(scaled) <= limit and (scaled == 0) == (constant == 0)


# [Note: constants that absorb a factor]
# Folding ``log2(e)`` or a scale into constants re-associates the program's arithmetic;
# it is exact enough only while each constant stays finite in its dtype (and in a
# narrower float the value is cast to on the way: float16 values are rounded to float16
# inside a float32 kernel). A mask written with the dtype's most negative value (Hugging
# Face's ``(1 - keep) * finfo.min``) is the case where it does not: ``finfo.min *
# log2(e)`` is beyond the range, and distributed over the difference the kernel computed
# ``-inf - keep * -inf``, NaN for every kept key, so every gradient of such an attention
# was NaN (in float16 the overflow came at the cast). So a product whose constant factor
# would leave the range keeps its multiply, and a sum or difference with a term that
# would (a finite constant turned infinite) keeps its own: ``((1 - keep) * finfo.min) *
# log2(e)`` is ``-inf`` or 0, as the program has it. A selection's constant branch folds
# to the infinity the kernel computes (``where(pad, finfo.min, s) * log2(e)`` is
# ``where(pad, -inf, s * log2(e))``): a selection adds nothing to it.

"""Contraction operands: the product inside a sum, regrouped as the two operands of one
``tl.dot`` under a candidate tiling.

[Note: dot operands]
A sum over one tile role ``r`` of a product ``f_1 * f_2 * ... * f_k`` is one ``tl.dot``
when the factors split in two: a left operand varying along ``r`` and one other tile
role ``x``, and a right operand varying along ``r`` and a role ``y != x`` (grid dims
do not count: every program holds one index of them). Multiplication is associative
and commutative, so any split gives the same sum up to the order of rounding, which
``tl.dot`` changes anyway.

Passes before tiling leave the product in whatever association suits them: the online
rewrite factors per-row and per-key scalars out of a contraction, so RMS-normalised
queries and keys, each times a weight, reach tiling as
``sum_d(((q[i, d] * w_q[d]) * k[j, d]) * w_k[d])``, where no binary split has the
operand shapes a dot needs. Grouping the flattened factors by the role they vary
along restores them: ``(q * w_q * w_k) . k``. Factors that vary along ``r`` alone (a
weight) or along no tile role (a scalar) join the left operand. A factor that varies
along both ``x`` and ``y``, or a product over a third role, is not a contraction the
dot can run, and the product is left as written. A factor that reads the online loop's
running results (the exponential of the scores less the running max, in attention's
``sum_j(p[i, j] * v[j, d] * gate[j, d])``) varies along what the result of that loop
reduction varies along (its body's dims less the loop dim), so the exponential stays
with the rows and the gated values form the other operand: ``p . (v * gate)``.
"""
from __future__ import annotations

import dataclasses
import functools

from flashlight.ir import Dim, Expr, Kernel, LoopReduction, Pointwise, Reduce, rebuild


@dataclasses.dataclass(frozen=True)
class _Tiles:
    """A candidate tiling's ``roles`` by dim, in ``kernel``."""

    roles: dict[Dim, str]
    kernel: Kernel

    def roles_of(self, expr: Expr) -> frozenset[str]:
        """The tile roles ``expr`` varies along, through the loop results it reads too."""
        return frozenset(self.roles[d] for d in self.kernel.varies_along(expr) if d in self.roles)


def group_dot_operands(kernel: Kernel, roles: dict[Dim, str]) -> Kernel:
    """``kernel`` with the product of each contraction regrouped as ``left * right``
    under the tile ``roles`` of one candidate tiling ([Note: dot operands]); products
    that already split that way, or cannot, are kept as they are."""
    tiles = _Tiles(roles, kernel)

    def in_expr(expr: Expr) -> Expr:
        def visit(node: Expr) -> Expr | None:
            if isinstance(node, Reduce) and node.op == "sum" and len(node.dims) == 1 and node.dims[0] in roles:
                body = _grouped(node.body, roles[node.dims[0]], tiles)
                return None if body is node.body else dataclasses.replace(node, body=body)
            return None

        return rebuild(expr, visit)

    def in_loop(loop: tuple[LoopReduction, ...]) -> tuple[LoopReduction, ...]:
        out = []
        for red in loop:
            body = in_expr(red.body)
            if red.op == "sum" and red.dim in roles:
                body = _grouped(body, roles[red.dim], tiles)
                if isinstance(body, Reduce) and body.op == "sum" and not set(body.dims) & set(roles):
                    # an inner loop's sum of products over the loop ([Note: contractions
                    # summed by an inner loop] in passes/tiling)
                    inner = _grouped(body.body, roles[red.dim], tiles)
                    body = body if inner is body.body else dataclasses.replace(body, body=inner)
            out.append(red if body is red.body else dataclasses.replace(red, body=body))
        return tuple(out)

    loop = in_loop(kernel.loop)
    unmasked = None if kernel.unmasked is None else in_loop(kernel.unmasked)
    if loop == kernel.loop and unmasked == kernel.unmasked:
        return kernel
    return dataclasses.replace(kernel, loop=loop, unmasked=unmasked)


def _grouped(body: Expr, reduced: str, tiles: _Tiles) -> Expr:
    """``body`` as ``left * right`` where that makes it a contraction over ``reduced``."""
    if not (isinstance(body, Pointwise) and body.op == "mul"):
        return body
    if _is_dot(body.args[0], body.args[1], reduced, tiles):
        return body  # already two operands
    factors = _factors(body)
    if len(factors) < 3:
        return body
    sides = [tiles.roles_of(f) - {reduced} for f in factors]
    outer = set().union(*sides)
    if len(outer) != 2 or any(len(s) > 1 for s in sides):
        return body
    x = min(outer)
    left = [f for f, s in zip(factors, sides) if s <= {x}]
    right = [f for f, s in zip(factors, sides) if s and not s <= {x}]
    grouped = Pointwise("mul", (_product(left, body.dtype), _product(right, body.dtype)), body.dtype)
    return grouped if _is_dot(grouped.args[0], grouped.args[1], reduced, tiles) else body


def splits_as_dot(a_roles, b_roles, reduced: str) -> bool:
    """Whether operands over tile roles ``a_roles`` and ``b_roles``, multiplied and summed
    over ``reduced``, are one ``tl.dot``: each spans ``reduced`` and one other role."""
    a, b = set(a_roles), set(b_roles)
    return len(a) == 2 and len(b) == 2 and reduced in a and reduced in b and a != b


def _is_dot(a: Expr, b: Expr, reduced: str, tiles: _Tiles) -> bool:
    return splits_as_dot(tiles.roles_of(a), tiles.roles_of(b), reduced)


def _factors(expr: Expr) -> list[Expr]:
    """The leaves of a tree of multiplications, left to right."""
    if isinstance(expr, Pointwise) and expr.op == "mul":
        return [f for a in expr.args for f in _factors(a)]
    return [expr]


def _product(factors: list[Expr], dtype) -> Expr:
    return functools.reduce(lambda a, b: Pointwise("mul", (a, b), dtype), factors)

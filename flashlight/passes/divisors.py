"""Divisions in the loop by a value of fewer dims: one reciprocal, then multiplies.

[Note: broadcast divisors]
A loop body often divides a tile by a value that is the same along one of the tile's
dims: the backward's recomputed probabilities ``exp(s - m) / l`` divide every score of a
row by the row's sum ``l``; a normalisation divides by a per-row or per-column norm.
Printed as written, every element of the ``[BLOCK_M, BLOCK_N]`` tile is divided: a
float32 division is several instructions on a GPU (a reciprocal approximation, a
multiply and range checks), in a loop that is bound by instruction issue
([Note: base-2 online softmax] counts them). Where the divisor ``b`` lacks a dim of the
quotient, ``a / b`` becomes ``a * (1 / b)``: the reciprocal is computed once per element
of ``b`` (a vector of ``BLOCK_M`` values per step, or once before the loop where ``b``
does not change along it: the tile plan hoists every value that does not read the loop
dim), and each tile element costs one multiply.

*Exactness.* ``a * fl(1 / b)`` differs from ``fl(a / b)`` by at most about one unit in
the last place of float32 (two roundings instead of one), far inside the tolerance of
any float32 computation it feeds; special values agree: ``b = 0`` gives ``a * inf``
(``±inf``, or NaN for ``a = 0``), ``b = inf`` gives ``a * 0``, NaN stays NaN. Divisions
by a constant are left as written (eager divides by them exactly, and ``to_base2``
folds the softmax scale's already), as are divisions in the epilogue (once per output
element, not per step).
"""
from __future__ import annotations

import torch

from flashlight.ir import Const, Expr, Kernel, Pointwise, free_dims, replace_nodes
from flashlight.passes import rewrite_loop_bodies


def hoist_divisors(kernel: Kernel) -> Kernel:
    """``kernel`` with each loop-body division by a value of fewer dims written as a
    multiply by its reciprocal ([Note: broadcast divisors])."""
    return rewrite_loop_bodies(kernel, _reciprocal_form)


def _reciprocal_form(node: Expr) -> Expr | None:
    if not (isinstance(node, Pointwise) and node.op == "div" and node.dtype.is_floating_point):
        return None
    a, b = node.args
    if isinstance(b, Const) or not b.dtype.is_floating_point or not free_dims(b) < free_dims(node):
        return None
    a = replace_nodes(a, _reciprocal_form)
    reciprocal = Pointwise("div", (Const(1.0, torch.float32), replace_nodes(b, _reciprocal_form)), b.dtype)
    return Pointwise("mul", (a, reciprocal), node.dtype)

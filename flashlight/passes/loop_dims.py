"""One loop dim for a loop reduction over several dims.

[Note: a loop over several dims]
A contraction over a flattened axis reduces over every dim the axis merges: an output
projection after attention, ``out[s, f] = sum_{h, c} x[s, h, c] W[f, h * c + c]``, is
``sum[h, c]`` in the IR (the lowering splits the contracted axis into the dims of the
operand that keeps them apart). The online loop runs over one dim, so such a sum is
rewritten over one dim ``j`` of size ``|h| |c|`` with ``h = j // |c|`` and
``c = j mod |c|`` (row-major, as the flattened axis itself counts):

- an index that names the merged dims together, in order, as one axis (``W[f, h * c]``)
  reads ``W[f, j]``: the same element, and a plain load;
- an index that names them apart (``x[s, h, c]``) reads at computed positions
  (a :class:`~flashlight.ir.Gather`, [Note: gathers] in :mod:`flashlight.lower_gather`),
  ``x[s, j // |c|, j mod |c|]``, any strides (``j`` is never negative, so C's
  truncating division is the floor);
- an index (``Iota``) of a merged dim becomes the same arithmetic on ``j``.

Exact: the same terms are summed, in another order (which ``tl.dot`` already changes).
The dims after the first must have static sizes (the divisors are constants); a sum over
several dims with a dynamic inner one stays unsupported. So does a sum whose body holds
a reduction over other dims that depends on some of the merged dims only (an attention's
row statistics per head ``h``, inside a sum over ``h`` and ``c``): one loop over ``j``
would compute it again for every ``c``; the back-off then keeps that reduction's
result separate, and the sum over the rest merges. With it, ``sigmoid(m W_g^T + b)
* o`` projected by ``W_o`` (OpenFold's gated output of global attention, any gated
output projection) is a two-contraction chain over the rows like attention's, and one
kernel: the gate is computed, multiplied and projected tile by tile, never stored.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

from flashlight.ir import (
    Axis, Const, Dim, Expr, Gather, Iota, Load, Pointwise, Reduce, Ref, axis_extent, free_dims, rebuild,
    replace_nodes, walk,
)


class MergeFailed(Exception):
    """The reduction's dims cannot be merged (a dynamic inner dim, a computed tensor
    read with the dims apart)."""


def merge_loop_dims(red: Reduce, merged: Dim | None = None) -> Reduce:
    """``red`` as a reduction over one dim ([Note: a loop over several dims]): ``merged``
    if given (of the dims' total size), else a fresh one."""
    if len(red.dims) == 1:
        return red
    if not all(d.is_static for d in red.dims):
        raise MergeFailed(f"a loop reduction over {len(red.dims)} dims of dynamic sizes")
    dims = frozenset(red.dims)
    for inner in (n for n in walk(red.body) if isinstance(n, Reduce)):
        if free_dims(inner) & dims not in (frozenset(), dims):
            raise MergeFailed("a reduction inside the loop depends on some of its dims only, "
                              "so one loop would compute it again for each of the others")
    merged = merged or Dim.fresh(math.prod(d.size for d in red.dims))
    # the stride of each merged dim in the row-major index of ``merged``
    strides = {d: math.prod(e.size for e in red.dims[k + 1:]) for k, d in enumerate(red.dims)}

    def position(d: Dim) -> Expr:
        """The index of merged dim ``d`` at ``merged``'s index."""
        value: Expr = Iota((merged,))
        dtype = value.dtype
        if strides[d] != 1:  # indices are never negative: C's division is the floor
            value = Pointwise("truncdiv", (value, Const(strides[d], dtype)), dtype)
        if d != red.dims[0]:  # value mod |d|
            whole = Pointwise("mul", (Pointwise("truncdiv", (value, Const(d.size, dtype)), dtype),
                                      Const(d.size, dtype)), dtype)
            value = Pointwise("sub", (value, whole), dtype)
        return value

    def axis_position(axis: Axis) -> Expr:
        """The row-major index of ``axis`` as an expression (merged dims computed)."""
        total: Expr | None = None
        for k, d in enumerate(axis):
            term = position(d) if d in strides else Iota((d,))
            if not all(e.is_static for e in axis[k + 1:]):
                raise MergeFailed("a dim of dynamic size after a merged dim in one axis")
            scale = math.prod(e.size for e in axis[k + 1:])
            if scale != 1:
                term = Pointwise("mul", (term, Const(scale, term.dtype)), term.dtype)
            total = term if total is None else Pointwise("add", (total, term), term.dtype)
        return total if total is not None else Const(0, Iota((merged,)).dtype)

    def together(axis: Axis) -> Axis | None:
        """``axis`` with the merged dims replaced by ``merged``, where it names all of
        them in order or none; None where it names them apart."""
        named = [k for k, d in enumerate(axis) if d in strides]
        if not named:
            return axis
        start = named[0]
        if tuple(axis[start:start + len(red.dims)]) != red.dims:
            return None
        return axis[:start] + (merged,) + axis[start + len(red.dims):]

    def rewrite(node: Expr) -> Expr | None:
        if isinstance(node, (Load, Ref)):
            axes = [together(a) for a in node.index]
            if all(a is not None for a in axes):
                return dataclasses.replace(node, index=tuple(axes))
            if isinstance(node, Ref):
                raise MergeFailed("a computed tensor read with the merged dims apart")
            extents = tuple(axis_extent(a) for a in node.index)
            return Gather(node.base, tuple(axis_position(a) for a in node.index), extents, node.dtype)
        if isinstance(node, Iota):
            axis = together(node.axis)
            if axis is not None:
                return dataclasses.replace(node, axis=axis)
            return _cast(axis_position(node.axis), node.dtype)
        return None

    return Reduce(red.op, rebuild(red.body, rewrite), (merged,), red.dtype)


def _cast(expr: Expr, dtype) -> Expr:
    return expr if expr.dtype == dtype else Pointwise("cast", (expr,), dtype)


# [Note: a sum over several dims inside the loop]
# A sum inside a loop reduction's body may run over several small dims: invariant point
# attention's squared distance between a query's and a key's points, ``sum_{p, x} (a[i, p,
# x] - b[j, p, x])^2`` over points and coordinates. Kept apart, the two dims would be two
# tile roles beside the rows and keys, which no tiling has; where every read names them
# together, in order (the points stored as one flattened axis, as a view splits it), the
# sum is rewritten over one dim as the loop's own sums are ([Note: a loop over several
# dims]): the same elements, plain loads, one tile of ``|p| |x|`` positions. Any order of
# the dims that reads them together is taken; where none does (the dims read apart,
# which would need computed positions), the sum stays as it was. Every copy of one sum
# (a distance read by the max and by the sums of a softmax, inlined into each) is
# rewritten over the same merged dim, so that the copies stay equal and the loop
# computes each once (with a fresh dim per copy, the max of a softmax whose numerator
# and denominator were written apart ran twice, and the distances four times).


def merge_inner_sums(expr: Expr) -> Expr:
    """``expr`` with the sums nested in its reductions over several static dims rewritten
    over one dim where every read names those dims together ([Note: a sum over several
    dims inside the loop])."""

    merged_dims: dict[tuple[Dim, ...], Dim] = {}  # one merged dim per order of the same dims

    def inner(node: Expr) -> Expr | None:
        if not (isinstance(node, Reduce) and node.op == "sum" and 1 < len(node.dims) <= 3
                and all(d.is_static for d in node.dims)):
            return None
        for order in itertools.permutations(node.dims):
            if order not in merged_dims:
                merged_dims[order] = Dim.fresh(math.prod(d.size for d in order))
            try:
                merged = merge_loop_dims(dataclasses.replace(node, dims=order), merged_dims[order])
            except MergeFailed:
                continue
            if _gathers(merged.body) == _gathers(node.body):  # every read names the dims together
                return merged
        return None

    def outer(node: Expr) -> Expr | None:
        if isinstance(node, Reduce):
            body = rebuild(node.body, inner)
            return node if body is node.body else dataclasses.replace(node, body=body)
        return None

    return replace_nodes(expr, outer)


def _gathers(expr: Expr) -> int:
    return sum(isinstance(n, Gather) for n in walk(expr))

"""Lowering rules for reductions: sums, maxima, means and norms over dims, softmax and
log-softmax as the nests of their definitions, logsumexp, ``max(dim)``'s values, and
pairwise Euclidean distances (``torch.cdist``).

Each rule takes the lowering context (:class:`flashlight.lower_context.LowerContext`)
and an FX node and returns the :class:`~flashlight.indexing.Access` of its result, like
every rule of :mod:`flashlight.lower`.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import sympy
import torch
import torch.fx as fx

from flashlight.indexing import Access, NodeView, Unsupported, finest, meta_val, node_shape, size_value, sym
from flashlight.ir import Const, Dim, Expr, Pointwise, Reduce
from flashlight.lower_context import LowerContext

aten = torch.ops.aten


def _reduce_axes(lw: LowerContext, node: fx.Node, src: Access, dims: list[int], keepdim: bool):
    n = len(src.axes)
    dims = [d % n for d in dims] if dims else list(range(n))
    out_shape = node_shape(node)
    in_axes = tuple(() if not a else tuple(Dim.fresh(d.size) for d in a) for a in src.axes)
    out_axes = []
    for k, a in enumerate(in_axes):
        if k in dims:
            if keepdim:
                out_axes.append(())
        else:
            out_axes.append(a)
    if len(out_axes) != len(out_shape):
        raise Unsupported("reduction result rank mismatch")
    reduced = tuple(d for k in dims for d in in_axes[k])
    return in_axes, tuple(out_axes), reduced


def reduce_over(op: str, body: Expr, dims: tuple[Dim, ...], dtype: torch.dtype) -> Expr:
    """A reduction; over no dims (a size-1 axis, which Dynamo specializes) it is the body."""
    return Reduce(op, body, dims, dtype) if dims else body


def _reduction(op: str):
    """``sum`` / ``amax`` over dims, ``mean`` (the sum over a count of static size) and
    ``norm`` (``linalg_vector_norm`` of order 2: the square root of a sum of squares)."""

    def rule(lw: LowerContext, node: fx.Node) -> Access:
        dtype = meta_val(node).dtype
        src = lw.value(node.args[0], dtype)
        if not isinstance(src, Access):
            raise Unsupported("reduction of a constant")
        args = list(node.args[1:])
        if op == "norm":
            order = args.pop(0) if args else node.kwargs.get("ord", 2)
            if order != 2:
                raise Unsupported(f"a vector norm of order {order}")
        dims = args[0] if args else node.kwargs.get("dim", [])
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        keepdim = args[1] if len(args) > 1 else node.kwargs.get("keepdim", False)
        if node.kwargs.get("dtype") not in (None, dtype):
            raise Unsupported("reduction with a dtype argument")
        in_axes, out_axes, reduced = _reduce_axes(lw, node, src, dims, keepdim)
        x = lw.read(src, in_axes)
        if op == "norm":
            x = Pointwise("mul", (x, x), dtype)
        body = reduce_over("max" if op == "max" else "sum", x, reduced, dtype)
        if op == "mean":  # over a count of symbolic size: the count read at launch ([Note: sizes used as values])
            total = math.prod((sym(d.size) for d in reduced), start=sympy.Integer(1))
            count = size_value(total)
            count = Const(float(count.value), dtype) if isinstance(count, Const) else Pointwise("cast", (count,), dtype)
            body = Pointwise("div", (body, count), dtype)
        elif op == "norm":
            body = Pointwise("sqrt", (body,), dtype)
        return lw.add_nest(out_axes, body, dtype, op)

    return rule


def _softmax_family(log: bool):
    """softmax(x) = exp(x - m) / sum(exp(x - m)), log_softmax(x) = (x - m) - log(sum(exp(x - m)))
    with m = max(x), as separate nests (``aten._softmax`` / ``aten._log_softmax``)."""
    name = "log_softmax" if log else "softmax"

    def rule(lw: LowerContext, node: fx.Node) -> Access:
        dtype = meta_val(node).dtype
        src = lw.value(node.args[0], dtype)
        if not isinstance(src, Access):
            raise Unsupported(f"{name} of a constant")
        dim = node.args[1]
        compute = torch.float32 if node.args[2] else dtype
        in_axes, keep_axes, reduced = _reduce_axes(lw, _keepdim_view(node), src, [dim], True)
        m = lw.add_nest(keep_axes, reduce_over("max", lw.read(src, in_axes), reduced, compute), compute, "amax")
        axes = tuple(tuple(Dim.fresh(d.size) for d in a) for a in in_axes)
        shifted = lw.add_nest(axes, Pointwise("sub", (lw.read(src, axes), lw.read(m, axes)), compute), compute,
                              "shift")
        in2, keep2, red2 = _reduce_axes(lw, _keepdim_view(node), shifted, [dim], True)
        total = reduce_over("sum", Pointwise("exp", (lw.read(shifted, in2),), compute), red2, compute)
        s = lw.add_nest(keep2, total, compute, "sum")
        axes3 = tuple(tuple(Dim.fresh(d.size) for d in a) for a in in_axes)
        x, s3 = lw.read(shifted, axes3), lw.read(s, axes3)
        if log:
            out = Pointwise("sub", (x, Pointwise("log", (s3,), compute)), compute)
        else:
            out = Pointwise("div", (Pointwise("exp", (x,), compute), s3), compute)
        if compute != dtype:
            out = Pointwise("cast", (out,), dtype)
        return lw.add_nest(axes3, out, dtype, name)

    return rule


def _logsumexp(lw: LowerContext, node: fx.Node) -> Access:
    """logsumexp(x) = log(sum(exp(x - max(x)))) + max(x), as separate nests.

    Fused, the sum runs online with a safe max ([Note: online reduction]): a row of
    ``-inf`` gives ``log(0) + -inf = -inf`` as PyTorch does. (A ``+inf`` score gives
    NaN, where PyTorch gives ``inf``.)"""
    dtype = meta_val(node).dtype
    if not dtype.is_floating_point:
        raise Unsupported("logsumexp of integers")
    src = lw.value(node.args[0], dtype)
    if not isinstance(src, Access):
        raise Unsupported("logsumexp of a constant")
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", [])
    dims = [dims] if isinstance(dims, int) else list(dims)
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    in_axes, out_axes, reduced = _reduce_axes(lw, node, src, dims, keepdim)
    m = lw.add_nest(out_axes, reduce_over("max", lw.read(src, in_axes), reduced, dtype), dtype, "amax")
    # out2: the axes of in2 the reduction keeps, i.e. where the max is read back
    in2, out2, red2 = _reduce_axes(lw, node, src, dims, keepdim)
    shifted = Pointwise("exp", (Pointwise("sub", (lw.read(src, in2), lw.read(m, out2)), dtype),), dtype)
    s = lw.add_nest(out2, reduce_over("sum", shifted, red2, dtype), dtype, "sum")
    axes3 = tuple(tuple(Dim.fresh(d.size) for d in a) for a in out2)
    out = Pointwise("add", (Pointwise("log", (lw.read(s, axes3),), dtype), lw.read(m, axes3)), dtype)
    return lw.add_nest(axes3, out, dtype, "logsumexp")


def _keepdim_view(node: fx.Node) -> NodeView:
    """A softmax node seen with the shape of ``x.amax(dim, keepdim=True)``."""
    x = meta_val(node.args[0])
    shape = list(x.shape)
    shape[node.args[1] % len(shape)] = 1
    return NodeView(node, val=x.new_empty(shape))


def _max_dim(lw: LowerContext, node: fx.Node) -> Access:
    """``x.max(dim, keepdim)``: its values are an amax; its indices have no lowering.

    The node's value is a tuple, so the nest is registered for ``getitem(node, 0)``
    (see :func:`_getitem`), never for the tuple node itself.
    """
    values = _reduction("max")(lw, NodeView(node, val=node.meta["val"][0]))
    lw.set_tuple(node, values)
    return values


def _getitem(lw: LowerContext, node: fx.Node) -> Access:
    source, index = node.args
    values = lw.item_of_tuple(node, source, index)
    if values is None:
        raise Unsupported("only the first output of max(dim) and native_layer_norm is lowered")
    return values


def _layer_norm(lw: LowerContext, node: fx.Node) -> Access:
    """``native_layer_norm``'s first output, ``(x - mean) / sqrt(var + eps) * w + b`` over
    the trailing normalised dims (mean and biased variance as nests of their own); its
    mean and rstd outputs have no lowering. Registered for ``getitem(node, 0)``."""
    x_arg, normalized, weight, bias, eps = node.args[:5]
    dtype = node.meta["val"][0].dtype
    src = lw.value(x_arg, dtype)
    if not isinstance(src, Access):
        raise Unsupported("layer norm of a constant")
    n, k = len(src.axes), len(normalized)
    x_val = meta_val(x_arg)
    if not all(isinstance(size, int) for size in x_val.shape[n - k:]):
        raise Unsupported("layer norm over a dim of dynamic size")
    count = Const(float(math.prod(x_val.shape[n - k:])), dtype)
    kept = NodeView(node, val=x_val.new_empty((*x_val.shape[:n - k], *[1] * k)))
    dims = list(range(n - k, n))

    def mean_of(value: Access, square: bool, hint: str) -> Access:
        in_axes, keep_axes, reduced = _reduce_axes(lw, kept, value, dims, True)
        x = lw.read(value, in_axes)
        total = reduce_over("sum", Pointwise("mul", (x, x), dtype) if square else x, reduced, dtype)
        return lw.add_nest(keep_axes, Pointwise("div", (total, count), dtype), dtype, hint)

    mean = mean_of(src, False, "mean")
    axes = tuple(tuple(Dim.fresh(d.size) for d in a) for a in src.axes)
    centered = lw.add_nest(axes, Pointwise("sub", (lw.read(src, axes), lw.read(mean, axes)), dtype), dtype, "center")
    var = mean_of(centered, True, "var")
    out_axes = tuple(tuple(Dim.fresh(d.size) for d in a) for a in src.axes)
    shifted = Pointwise("add", (lw.read(var, out_axes), Const(float(eps), dtype)), dtype)
    out: Expr = Pointwise("mul", (lw.read(centered, out_axes), Pointwise("rsqrt", (shifted,), dtype)), dtype)
    for param, op in ((weight, "mul"), (bias, "add")):
        if param is not None:
            out = Pointwise(op, (out, lw.read(lw.value(param, dtype), out_axes)), dtype)
    values = lw.add_nest(out_axes, out, dtype, "layer_norm")
    lw.set_tuple(node, values)
    return values


def _euclidean_dist(lw: LowerContext, node: fx.Node) -> Access:
    """``cdist(a, b)`` with ``p = 2`` (``_euclidean_dist``, ``_cdist_forward``), written as
    PyTorch's matmul path computes it: ``sqrt(max(|a_i|^2 + |b_j|^2 - 2 a_i . b_j, 0))``,
    one contraction and two row norms, so it fuses like a dot-product score."""
    if node.target is aten._cdist_forward.default and node.args[2] != 2.0:
        raise Unsupported(f"cdist with p = {node.args[2]}")
    dtype = meta_val(node).dtype
    a, b = (lw.value(x, dtype) for x in node.args[:2])
    if not isinstance(a, Access) or not isinstance(b, Access) or len(a.axes) != len(b.axes):
        raise Unsupported("cdist of constants or of different ranks")
    batch = tuple(tuple(Dim.fresh(s) for s in finest([x, y])) for x, y in zip(a.axes[:-2], b.axes[:-2]))
    rows = tuple(Dim.fresh(d.size) for d in a.axes[-2])  # [..., P, M] x [..., R, M] -> [..., P, R]
    cols = tuple(Dim.fresh(d.size) for d in b.axes[-2])
    feature = finest([a.axes[-1], b.axes[-1]])

    def summed(x: Access, y: Access, x_rows, y_rows) -> Expr:
        k = tuple(Dim.fresh(s) for s in feature)  # each reduction binds its own dims
        product = Pointwise("mul", (lw.read(x, batch + (x_rows, k)), lw.read(y, batch + (y_rows, k))), dtype)
        return reduce_over("sum", product, k, dtype)

    squared = Pointwise("sub", (Pointwise("add", (summed(a, a, rows, rows), summed(b, b, cols, cols)), dtype),
                                Pointwise("mul", (Const(2.0, dtype), summed(a, b, rows, cols)), dtype)), dtype)
    body = Pointwise("sqrt", (Pointwise("maximum", (squared, Const(0.0, dtype)), dtype),), dtype)
    return lw.add_nest(batch + (rows, cols), body, dtype, "cdist")


REDUCTION_LOWERINGS: dict[Any, Callable[[Any, fx.Node], Access]] = {
    aten._euclidean_dist.default: _euclidean_dist,
    aten._cdist_forward.default: _euclidean_dist,
    aten.sum.dim_IntList: _reduction("sum"),
    aten.amax.default: _reduction("max"),
    aten.mean.dim: _reduction("mean"),
    aten.mean.default: _reduction("mean"),
    aten.sum.default: _reduction("sum"),
    aten.linalg_vector_norm.default: _reduction("norm"),
    aten._softmax.default: _softmax_family(log=False),
    aten._log_softmax.default: _softmax_family(log=True),
    aten.logsumexp.default: _logsumexp,
    aten.max.dim: _max_dim,
    aten.native_layer_norm.default: _layer_norm,
    operator.getitem: _getitem,
}

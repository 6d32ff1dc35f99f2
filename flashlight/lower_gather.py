"""Lowering rules for lookups: ``x[idx]`` (``aten.index.Tensor``), ``embedding``,
``index_select`` and ``gather``, as loads at computed positions (:class:`~flashlight.ir.Gather`).

[Note: gathers]
Indexing a tensor by an integer tensor computed in the graph (a relative-position bucket
``clamp(j - i, -B, B) + B`` of the query and key indices, a document id) reads, at each
point of the result, the element whose position along each indexed axis is the index
tensor's value there; the other axes are read at the result's own indices. So a lookup
is a load at computed positions, one integer expression per axis of the table, and the
index arithmetic fuses into those expressions like any elementwise producer: no index
tensor is materialized, and the table (small: ``[H, buckets]``) is read where the scores
need it. A negative index counts from the end (``p + size`` where ``p < 0``), as
PyTorch's indexing does; a position outside the table, which PyTorch reports as an
error, loads 0. The table is a tensor in memory (a graph input or a value computed
outside Flashlight) or an elementwise function of such tensors and of indices (the table
cast to the scores' dtype, a mask table made by ``tril``), which is then evaluated at
the computed positions; the axes it is indexed along have static sizes, and none is a
merge of several dims.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.fx as fx

from flashlight.indexing import Access, NodeView, Unsupported, meta_val, node_shape
from flashlight.ir import (
    Axis,
    Const,
    Dim,
    Expr,
    Gather,
    Iota,
    Load,
    Pointwise,
    Reduce,
    Ref,
    axis_dims,
    contains,
    rebuild,
    substitute,
)
from flashlight.lower_context import LowerContext

aten = torch.ops.aten
INDEX_DTYPES = (torch.int64, torch.int32)


def _index(lw: LowerContext, node: fx.Node) -> Access:
    """``x[i_0, ..., i_k]`` with integer index tensors (``None``: the whole axis); PyTorch's
    rule for the result's axes: the broadcast index axes replace the indexed axes where
    those are adjacent, else they come first."""
    x_arg, indices = node.args[:2]
    dtype = meta_val(node).dtype
    src = lw.value(x_arg, dtype)
    if not isinstance(src, Access):
        raise Unsupported("a lookup in a constant")
    picked = [k for k, i in enumerate(indices) if i is not None]
    index_values = {}
    for k in picked:
        value = meta_val(indices[k])
        if not isinstance(value, torch.Tensor) or value.dtype not in INDEX_DTYPES:
            raise Unsupported("a lookup by a mask or a non-integer index")
        index_values[k] = lw.value(indices[k], value.dtype)
    if not index_values:
        raise Unsupported("a lookup without an index tensor")
    shape = node_shape(node)
    rest = [axis for k, axis in enumerate(src.axes) if k not in index_values]
    n_index = len(shape) - len(rest)
    start = picked[0] if picked == list(range(picked[0], picked[-1] + 1)) else 0
    broadcast = meta_val(node).new_empty(meta_val(node).shape[start:start + n_index])
    index_axes = lw.result_axes(NodeView(node, val=broadcast), list(index_values.values()))
    rest_axes = [tuple(Dim.fresh(d.size) for d in axis) for axis in rest]
    out_axes = (*rest_axes[:start], *index_axes, *rest_axes[start:])
    mapping: dict[Dim, Expr] = {}
    plain = iter(zip(rest, rest_axes))
    for k, axis in enumerate(src.axes):
        if k in index_values:
            if axis:
                mapping[_single(axis)] = _from_end(lw.read(index_values[k], tuple(index_axes)), axis)
        else:
            own, fresh = next(plain)
            mapping.update({d: Iota((f,)) for d, f in zip(own, fresh)})
    return lw.add_nest(out_axes, value_at(lw, src, mapping), dtype, "index")


def _embedding(lw: LowerContext, node: fx.Node) -> Access:
    """``embedding(weight, indices)`` is ``weight[indices]``."""
    weight, indices = node.args[:2]
    return _index(lw, NodeView(node, (weight, [indices, None]), kwargs={}))


def _index_select(lw: LowerContext, node: fx.Node) -> Access:
    """``index_select(x, dim, index)`` is ``x[:, ..., index]`` with ``index`` at ``dim``."""
    x, dim, index = node.args[:3]
    rank = len(meta_val(x).shape)
    return _index(lw, NodeView(node, (x, [None] * (dim % rank) + [index]), kwargs={}))


def _gather(lw: LowerContext, node: fx.Node) -> Access:
    """``gather(x, dim, index)[p] = x[p with index[p] at dim]``."""
    if node.kwargs.get("sparse_grad") or (len(node.args) > 3 and node.args[3]):
        raise Unsupported("a sparse gather")
    x_arg, dim, index_arg = node.args[:3]
    dtype = meta_val(node).dtype
    src = lw.value(x_arg, dtype)
    index = lw.value(index_arg, meta_val(index_arg).dtype)
    if not isinstance(src, Access) or not isinstance(index, Access) or index.dtype not in INDEX_DTYPES:
        raise Unsupported("a gather from a constant or by a non-integer index")
    out_axes = lw.result_axes(node, [index])
    dim = dim % len(src.axes)
    mapping: dict[Dim, Expr] = {}
    for k, (axis, out) in enumerate(zip(src.axes, out_axes)):
        if not axis:
            continue
        if k == dim:
            mapping[_single(axis)] = _from_end(lw.read(index, out_axes), axis)
        elif len(axis) == 1:
            mapping[axis[0]] = Iota(out) if out else Const(0, torch.int64)
        else:
            raise Unsupported("a gather from a value with merged axes")
    return lw.add_nest(out_axes, value_at(lw, src, mapping), dtype, "gather")


def _single(axis: Axis) -> Dim:
    """The dim of a table axis looked up by computed positions: one, of static size."""
    if len(axis) != 1 or not axis[0].is_static:
        raise Unsupported("a lookup along a merged axis or one of dynamic size")
    return axis[0]


def _from_end(position: Expr, axis: Axis) -> Expr:
    """``position`` along a table axis, a negative one counted from its end."""
    size = int(_single(axis).size)
    negative = Pointwise("lt", (position, Const(0, position.dtype)), torch.bool)
    wrapped = Pointwise("add", (position, Const(size, position.dtype)), position.dtype)
    return Pointwise("where", (negative, wrapped, position), position.dtype)


def value_at(lw: LowerContext, src: Access, mapping: dict[Dim, Expr]) -> Expr:
    """The value of ``src`` with its dims read at ``mapping``'s integer expressions (dims
    hidden by its views, of size 1, at 0)."""
    mapping = dict(mapping)
    for d in axis_dims(src.index):
        mapping.setdefault(d, Const(0, torch.int64))
    if src.kind == "input":
        return _gather_node(src.name, src.index, src.dtype, mapping)
    nest = next(n for n in lw.nests if n.name == src.name)
    own: dict[Dim, Expr] = {}
    for axis, index in zip(nest.axes, src.index):
        if len(axis) > 1:
            raise Unsupported("a lookup in a value with merged axes")
        if axis:
            own[axis[0]] = _row_major(index, mapping)
    return at_positions(_written_out(lw, nest.body), own)


def _written_out(lw: LowerContext, expr: Expr) -> Expr:
    """``expr`` with the elementwise values it reads written out: their bodies at its
    indices (a mask table built by ``tril`` from ``ones``)."""
    nests = {n.name: n for n in lw.nests}

    def fn(node: Expr) -> Expr | None:
        if not isinstance(node, Ref):
            return None
        producer = nests[node.nest]
        if contains(producer.body, Reduce):
            raise Unsupported("a lookup in a value computed by a reduction")
        mapping: dict[Dim, Axis] = {}
        for own, index in zip(producer.axes, node.index):
            if len(own) == 1:
                mapping[own[0]] = index
            elif own and len(own) == len(index):
                mapping.update({d: (i,) for d, i in zip(own, index)})
            elif own:
                raise Unsupported("a lookup in a value read through a reshape")
        return _written_out(lw, substitute(producer.body, mapping))

    return rebuild(expr, fn)


def at_positions(expr: Expr, mapping: dict[Dim, Expr]) -> Expr:
    """``expr`` with its free dims ``mapping``'s keys read at those integer expressions:
    its loads become gathers. Values of other nests cannot be read at computed positions."""

    def fn(node: Expr) -> Expr | None:
        if isinstance(node, Ref):
            raise Unsupported("a lookup in a value computed from other Flashlight values")
        if isinstance(node, Load) and set(axis_dims(node.index)) & set(mapping):
            return _gather_node(node.base, node.index, node.dtype, mapping)
        if isinstance(node, Iota) and set(node.axis) & set(mapping):
            return _row_major(node.axis, mapping)
        return None  # a gather's positions are rewritten as its children

    return rebuild(expr, fn)


def _gather_node(base: str, index: tuple[Axis, ...], dtype: torch.dtype, mapping: dict[Dim, Expr]) -> Expr:
    """``base`` read at ``index`` with the dims of ``mapping`` at their positions; a plain
    load where every position is an index of the result."""
    positions = tuple(_row_major(axis, mapping) for axis in index)
    if all(isinstance(p, Iota) or p == Const(0, torch.int64) for p in positions):
        return Load(base, tuple(p.axis if isinstance(p, Iota) else () for p in positions), dtype)
    extents = tuple(math.prod(int(d.size) for d in axis) if all(d.is_static for d in axis) else None
                    for axis in index)
    return Gather(base, positions, extents, dtype)


def _row_major(axis: Axis, mapping: dict[Dim, Expr]) -> Expr:
    """The position along a compound axis (row-major over its dims), each dim's index
    given by ``mapping`` or the dim itself; an index of compound axes where every
    dim's position is one (``Iota``)."""
    terms = [(d, mapping.get(d, Iota((d,)))) for d in axis]
    terms = [(d, t) for d, t in terms if not (d.is_static and d.size == 1)]
    if not terms:
        return Const(0, torch.int64)
    if all(isinstance(t, Iota) for _, t in terms):
        return Iota(tuple(x for _, t in terms for x in t.axis))
    out = terms[0][1]
    for d, term in terms[1:]:
        if not d.is_static:
            raise Unsupported("a lookup along an axis merged with a dim of dynamic size")
        scaled = Pointwise("mul", (out, Const(int(d.size), torch.int64)), torch.int64)
        out = Pointwise("add", (scaled, term), torch.int64)
    return out


GATHER_LOWERINGS: dict[Any, Callable[[LowerContext, fx.Node], Access]] = {
    aten.index.Tensor: _index,
    aten.embedding.default: _embedding,
    aten.index_select.default: _index_select,
    aten.gather.default: _gather,
}

"""Lowering rules for loads at computed positions (:class:`~flashlight.ir.Gather`):
lookups (``x[idx]``, ``aten.index.Tensor``; ``embedding``, ``index_select``,
``gather``) and moves along a dim (slices, ``split``, ``cat``, ``flip``, ``roll``).

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
merge of several dims. A table computed by a reduction (DeBERTa's relative-position
scores ``q @ pos_k^T``, ``[..., L, 2B]``, looked up by distance), or one whose axes merge
dims (a matmul's batch of heads), is not computed again at each position: its
operation's result is kept in memory (the lookup's nest is kept separate) and the lookup
reads that tensor, so the attention kernel reads a small table instead of an ``L x L``
lookup result.

Moves along a dim are the same loads: a slice ``x[a:b:s]`` reads ``x`` at ``a + s * t``,
``split`` makes slices, ``cat`` reads, at ``t``, the piece whose range holds ``t`` at
``t`` less the sizes before it (a ``where`` over the pieces; the other pieces' loads
there fall outside them and are masked), ``flip`` at ``size - 1 - t``, ``roll`` at
``(t - shift) mod size``, a constant pad (``F.pad``) at ``t - before``, its value where
that lies outside. So rotary embeddings in rotate-half form,
``cat((-x[d:], x[:d]))``, fuse into the loads of ``q`` and ``k``. The pieces of a
``cat`` may have symbolic sizes (a piece starts where the sizes before it add up to, a
size used as a value); the dims of a flip or roll have static sizes. The mask of a
piece read at the result's own index is its size (``ir.spans_extent``).
"""
from __future__ import annotations

from typing import Any, Callable

import sympy
import torch
import torch.fx as fx

from flashlight.indexing import (
    Access, NodeView, Unsupported, meta_val, node_shape, size_of, size_value, sizes_equal, sym,
)
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
    axis_extent,
    contains,
    rebuild,
    spans_extent,
    substitute,
)
from flashlight.constants import fold_constants
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
    """The dim of a table axis looked up by computed positions: one dim."""
    if len(axis) != 1:
        raise Unsupported("a lookup along a merged axis")
    return axis[0]


def _from_end(position: Expr, axis: Axis) -> Expr:
    """``position`` along a table axis, a negative one counted from its end (a dynamic
    size read at launch: [Note: sizes used as values] in :mod:`flashlight.indexing`)."""
    size = size_value(_single(axis).size)
    if isinstance(size, Const):
        size = Const(size.value, position.dtype)
    elif size.dtype != position.dtype:
        size = Pointwise("cast", (size,), position.dtype)
    negative = Pointwise("lt", (position, Const(0, position.dtype)), torch.bool)
    wrapped = Pointwise("add", (position, size), position.dtype)
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
    if contains(nest.body, Reduce) or any(len(axis) > 1 for axis in nest.axes):
        # not to be written out at the positions (a contraction's value, DeBERTa's
        # relative-position scores q @ pos_k^T): its stored tensor is read there
        stored = lw.stored_tensor(nest.name)
        if stored is None:
            raise Unsupported("a lookup in an intermediate value of an operation")
        return _gather_node(stored, src.index, src.dtype, mapping)
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
        if isinstance(node, Gather):  # its positions, rewritten as its children
            return _gathered(node.base, node.positions, node.extents, node.dtype)
        return None

    return rebuild(expr, fn)


def _gather_node(base: str, index: tuple[Axis, ...], dtype: torch.dtype, mapping: dict[Dim, Expr]) -> Expr:
    """``base`` read at ``index`` with the dims of ``mapping`` at their positions; a plain
    load where every position is an index of the result."""
    positions = tuple(_row_major(axis, mapping) for axis in index)
    extents = tuple(axis_extent(axis) for axis in index)
    return _gathered(base, positions, extents, dtype)


def _gathered(base: str, positions: tuple[Expr, ...], extents, dtype: torch.dtype) -> Expr:
    """``base`` at ``positions``: a fixed position folded to a number (and checked to lie
    in the tensor), a plain load where every position is an index of the result."""
    positions = tuple(fold_constants(p) or p for p in positions)
    for p, extent in zip(positions, extents):
        if isinstance(p, Const) and (p.value < 0 or (isinstance(extent, int) and p.value >= extent)):
            raise Unsupported(f"a fixed position {p.value} outside a dim of size {extent}")
    if all(spans_extent(p, extent) or p == Const(0, torch.int64) for p, extent in zip(positions, extents)):
        return Load(base, tuple(p.axis if isinstance(p, Iota) else () for p in positions), dtype)
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


# ------------------------------------------------------- slices and concatenations


def _slice(lw: LowerContext, node: fx.Node) -> Access | Const:
    """``x[..., start:end:step, ...]`` along ``dim``: position ``start + step * t``."""
    x, dim, start, end, step = (*node.args, *[None] * 5)[:5]
    dtype = meta_val(node).dtype
    src = lw.value(x, dtype)
    if not isinstance(src, Access):
        return src  # every element of a slice of a constant is that constant
    rank = len(src.axes)
    dim = (dim or 0) % rank
    size, out = node_shape(x)[dim], node_shape(node)[dim]
    start, step = start or 0, step or 1
    if not isinstance(start, int) or not isinstance(step, int):
        raise Unsupported("a slice with a start or step of dynamic size")
    if start < 0:
        if not isinstance(size, int):
            raise Unsupported("a slice from the end of a dim of dynamic size")
        start = max(start + size, 0)
    if isinstance(size, int):
        start = min(start, size)
    if start == 0 and step == 1 and sizes_equal(out, size):
        return src  # the whole dim: the same view
    position = lambda t: _offset(_scaled(t, step), start)  # noqa: E731
    out_axes, mapping = _reindexed(src, {dim: (out, position)})
    return lw.add_nest(out_axes, value_at(lw, src, mapping), dtype, "slice")


def _size_arg(value) -> int | str:
    """A size argument of an operation: a number, or a node holding a size (SymInt)."""
    return size_of(meta_val(value)) if isinstance(value, fx.Node) else value


def _split(lw: LowerContext, node: fx.Node) -> Access | Const:
    """``split`` / ``split_with_sizes``: the pieces are slices; the node's value is their
    tuple, read by ``getitem`` (the first piece stands for the node)."""
    x, sizes = node.args[:2]
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    # a size computed from symbolic sizes is a node of the graph: its value, a number once fixed
    sizes = _size_arg(sizes) if not isinstance(sizes, (list, tuple)) else [_size_arg(n) for n in sizes]
    total = node_shape(x)[dim % len(node_shape(x))]
    if not isinstance(total, int):
        raise Unsupported("a split of a dim of dynamic size")
    if isinstance(sizes, int):
        sizes = [min(sizes, total - start) for start in range(0, total, sizes)] or [0]
    if not all(isinstance(n, int) for n in sizes):
        raise Unsupported("a split into pieces of dynamic size")
    pieces, start = [], 0
    for value, n in zip(meta_val(node), sizes):
        pieces.append(_slice(lw, NodeView(node, (x, dim, start, start + n, 1), kwargs={}, val=value)))
        start += n
    lw.set_tuple(node, *pieces)
    return pieces[0]


def _cat(lw: LowerContext, node: fx.Node) -> Access:
    """``cat(xs, dim)``: at result index ``t`` along ``dim``, the piece whose range holds
    ``t``, read at ``t`` less the sizes before it."""
    tensors = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    dtype = meta_val(node).dtype
    shape = node_shape(node)
    dim %= len(shape)
    out_axes = tuple(() if n == 1 else (Dim.fresh(n),) for n in shape)
    t: Expr = Iota(out_axes[dim]) if out_axes[dim] else Const(0, torch.int64)
    pieces: list[tuple[Expr, Expr]] = []
    offset = sympy.Integer(0)  # where the piece starts: a sum of sizes, symbolic where they are
    for x in tensors:
        piece_shape = node_shape(x)
        if piece_shape == (0,):
            continue  # a legacy empty piece, skipped by cat
        src = lw.value(x, dtype)
        start = size_value(offset)
        value = src if not isinstance(src, Access) else value_at(lw, src, _cat_mapping(src, out_axes, dim, t, start))
        if value.dtype != dtype:
            value = Pointwise("cast", (value,), dtype)
        offset += sym(piece_shape[dim])
        pieces.append((size_value(offset), value))
    body = pieces[-1][1]
    for end, value in reversed(pieces[:-1]):
        inside = Pointwise("lt", (t, end), torch.bool)
        body = Pointwise("where", (inside, value, body), dtype)
    return lw.add_nest(out_axes, body, dtype, "cat")


def _cat_mapping(src: Access, out_axes, dim: int, t: Expr, start: Expr) -> dict[Dim, Expr]:
    mapping: dict[Dim, Expr] = {}
    for k, (axis, out) in enumerate(zip(src.axes, out_axes)):
        if not axis:
            continue
        if len(axis) != 1:
            raise Unsupported("a concatenation of values with merged axes")
        if k != dim:
            mapping[axis[0]] = Iota(out)
        elif isinstance(start, Const):
            mapping[axis[0]] = _offset(t, -start.value)
        else:
            mapping[axis[0]] = Pointwise("sub", (t, start), torch.int64)
    return mapping


def _flip(lw: LowerContext, node: fx.Node) -> Access:
    """``flip(x, dims)``: position ``size - 1 - t`` along each flipped dim."""
    x, dims = node.args[:2]
    dtype = meta_val(node).dtype
    src = lw.value(x, dtype)
    if not isinstance(src, Access):
        return src
    shape = node_shape(x)
    moves = {}
    for d in dims:
        d %= len(shape)
        size = _static_size(shape[d])
        moves[d] = (size, lambda t, size=size: _offset(_scaled(t, -1), size - 1))
    out_axes, mapping = _reindexed(src, moves)
    return lw.add_nest(out_axes, value_at(lw, src, mapping), dtype, "flip")


def _roll(lw: LowerContext, node: fx.Node) -> Access:
    """``roll(x, shifts, dims)``: position ``(t - shift) mod size`` along each rolled dim."""
    x, shifts = node.args[:2]
    dims = node.args[2] if len(node.args) > 2 else node.kwargs.get("dims", [])
    if not dims:
        raise Unsupported("a roll of the flattened tensor")
    dtype = meta_val(node).dtype
    src = lw.value(x, dtype)
    if not isinstance(src, Access):
        return src
    shape = node_shape(x)
    moves = {}
    for shift, d in zip(shifts, dims):
        d %= len(shape)
        size = _static_size(shape[d])
        moves[d] = (size, lambda t, shift=shift, size=size: Pointwise(
            "remainder", (_offset(t, -shift), Const(size, torch.int64)), torch.int64))
    out_axes, mapping = _reindexed(src, moves)
    return lw.add_nest(out_axes, value_at(lw, src, mapping), dtype, "roll")


def _constant_pad(lw: LowerContext, node: fx.Node) -> Access:
    """``constant_pad_nd(x, pad, value)`` (``F.pad``): along each padded dim (the last
    first), position ``t - before``; where that lies outside ``x``, ``value`` (a
    negative pad crops)."""
    x, pad = node.args[:2]
    fill = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
    dtype = meta_val(node).dtype
    src = lw.value(x, dtype)
    if not isinstance(src, Access):
        raise Unsupported("a pad of a constant")
    shape = node_shape(x)
    moves, sizes = {}, {}
    for k in range(len(pad) // 2):
        d, before, after = len(shape) - 1 - k, pad[2 * k], pad[2 * k + 1]
        sizes[d] = _static_size(shape[d])
        moves[d] = (sizes[d] + before + after, lambda t, before=before: _offset(t, -before))
    out_axes, mapping = _reindexed(src, moves)
    body = value_at(lw, src, mapping)
    inside = None
    for d, (_, position) in moves.items():
        p = position(Iota(out_axes[d]) if out_axes[d] else Const(0, torch.int64))
        within = Pointwise("and", (Pointwise("ge", (p, Const(0, torch.int64)), torch.bool),
                                   Pointwise("lt", (p, Const(sizes[d], torch.int64)), torch.bool)), torch.bool)
        inside = within if inside is None else Pointwise("and", (inside, within), torch.bool)
    if inside is not None:
        fill = bool(fill) if dtype == torch.bool else float(fill) if dtype.is_floating_point else int(fill)
        body = Pointwise("where", (inside, body, Const(fill, dtype)), dtype)
    return lw.add_nest(out_axes, body, dtype, "pad")


def _reindexed(src: Access, moves: dict[int, tuple]) -> tuple[tuple[Axis, ...], dict[Dim, Expr]]:
    """Fresh result axes for ``src`` and the position of each of its dims: axis ``k`` of
    ``moves`` (``(result size, position of the result index)``) read at that position,
    every other axis at the result's own index."""
    out_axes: list[Axis] = []
    mapping: dict[Dim, Expr] = {}
    for k, axis in enumerate(src.axes):
        if k in moves:
            size, position = moves[k]
            t = () if size == 1 else (Dim.fresh(size),)
            out_axes.append(t)
            if axis:
                if len(axis) != 1:
                    raise Unsupported("a slice along a merged axis")
                mapping[axis[0]] = position(Iota(t) if t else Const(0, torch.int64))
        else:
            fresh = tuple(Dim.fresh(d.size) for d in axis)
            out_axes.append(fresh)
            mapping.update({d: Iota((f,)) for d, f in zip(axis, fresh)})
    return tuple(out_axes), mapping


def _static_size(size) -> int:
    if not isinstance(size, int):
        raise Unsupported("a reindexing of a dim of dynamic size")
    return size


def _scaled(t: Expr, factor: int) -> Expr:
    return t if factor == 1 else Pointwise("mul", (t, Const(factor, torch.int64)), torch.int64)


def _offset(t: Expr, offset: int) -> Expr:
    return t if offset == 0 else Pointwise("add", (t, Const(offset, torch.int64)), torch.int64)


GATHER_LOWERINGS: dict[Any, Callable[[LowerContext, fx.Node], Access]] = {
    aten.index.Tensor: _index,
    aten.embedding.default: _embedding,
    aten.index_select.default: _index_select,
    aten.gather.default: _gather,
    aten.slice.Tensor: _slice,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split,
    aten.cat.default: _cat,
    aten.flip.default: _flip,
    aten.roll.default: _roll,
    aten.constant_pad_nd.default: _constant_pad,
}

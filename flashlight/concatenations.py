"""Reductions and slices through a concatenation, on the ATen graph before lowering.

[Note: reductions through a concatenation]
A learned sink logit is often written as an extra key column: the scores ``s [.., L]``
and the logit broadcast to ``[.., 1]`` are concatenated along the keys, the softmax runs
over the ``L + 1`` columns and the sink's column is sliced off before ``@ v`` (gpt-oss
writes it so). Concatenated along the dim a softmax reduces, the scores would be a
lookup into a value computed by a reduction, and the loop would run over ``L + 1`` keys
for the softmax but ``L`` for ``@ v``. Both disappear by algebra on the pieces of the
concatenation ``x = cat(x_1, ..., x_n)`` along ``d``:

- a reduction over ``d`` combines the pieces' reductions: ``amax(x) = max_k amax(x_k)``,
  ``sum(x) = sum_k sum(x_k)``, ``logsumexp(x) = m + log(sum_k sum(exp(x_k - m)))``;
- an elementwise op of ``x`` (and of values broadcast along ``d``, or sliced to each
  piece's range) is the concatenation of the op on the pieces;
- a softmax over ``d`` is ``exp(x_k - m) / z`` on each piece, with ``m`` and ``z`` the
  combined max and sum above (computed in float32 for 16-bit inputs, as the softmax is);
- a slice along ``d`` covering exactly one piece's range is that piece.

So the sink's softmax becomes ``m = maximum(amax(s), sink)``,
``z = sum(exp(s - m)) + exp(sink - m)`` and ``exp(s - m) / z @ v``: a max clamped from
below and a sum with a term outside the loop, which the online pass fuses
([Note: online reduction] in :mod:`flashlight.passes.online`). The rewrite is made only
where some reduction over ``d`` is reached from the concatenation through elementwise
ops; users of a value that the rules do not cover keep reading it as before (nothing is
removed but what no one reads any more), so a graph is never made worse than a
concatenation it already had.

Under autograd the rewrite runs on AOTAutograd's joint graph before it is partitioned
(:mod:`flashlight.partition`), where the backward was derived from the concatenated form:
the softmax's backward over ``L + 1`` columns is elementwise ops and sums over the dim
like the forward's, and autograd's ``slice_backward`` (the gradient of the sliced-off
columns placed in its range, zeros elsewhere) has, on each piece, the gradient itself
or zeros. The probabilities over ``L + 1`` columns then have no reader left, so they are
neither stored nor saved for the backward.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from flashlight.graph_edits import add_call, input_size, tidy
from flashlight.vocabulary import OPS

aten = torch.ops.aten

_POINTWISE = frozenset(getattr(getattr(aten, o.split(".")[0]), o.split(".")[1]) for op in OPS.values() for o in op.aten)
# one operand, the same values (casts; autograd's detaches in a joint graph)
_CASTS = frozenset((aten._to_copy.default, torch.ops.prims.convert_element_type.default, aten.detach.default,
                    aten.alias.default))
_HALF = (torch.float16, torch.bfloat16)
_REDUCTIONS = {aten.amax.default: "amax", aten.sum.dim_IntList: "sum", aten.logsumexp.default: "logsumexp"}


def split_concatenations(gm: fx.GraphModule) -> int:
    """Rewrite the reductions, softmaxes and slices of ``gm`` over its concatenations
    ([Note: reductions through a concatenation]); returns how many concatenations."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.cat.default and _Rewrite(gm.graph, node).run():
            done += 1
    return tidy(gm, done)


def _val(x: Any) -> Any:
    return x.meta["val"] if isinstance(x, fx.Node) else x


def _norm_dim(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


def _same(a, b) -> bool:
    return statically_known_true(a == b) if not (isinstance(a, int) and isinstance(b, int)) else a == b


def _range(start, end, size) -> tuple:
    """A slice's ``[start, end)`` with negative ends counted from ``size``."""
    return tuple(v + size if isinstance(v, int) and v < 0 else v for v in (start, end))


class _Rewrite:
    """One concatenation's rewrite: ``pieces`` maps a node equal to a concatenation along
    ``dim`` to the nodes of its pieces."""

    def __init__(self, graph: fx.Graph, cat: fx.Node):
        self.graph, self.cat = graph, cat
        tensors = [t for t in cat.args[0] if tuple(_val(t).shape) != (0,)]  # legacy empty pieces
        rank = _val(cat).dim()
        self.dim = _norm_dim(cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0), rank)
        self.ranges, start = [], 0
        for t in tensors:
            end = start + _val(t).shape[self.dim]
            self.ranges.append((start, end))
            start = end
        self.pieces: dict[fx.Node, list[fx.Node]] = {cat: tensors}

    def run(self) -> bool:
        if len(self.pieces[self.cat]) < 2 or not self._reaches_reduction():
            return False
        for node in list(self.graph.nodes):
            if node.op != "call_function" or not any(a in self.pieces for a in node.all_input_nodes):
                continue
            self._visit(node)
        return True

    # ---- which graphs
    def _reaches_reduction(self) -> bool:
        """Whether a reduction over the dim reads the concatenation through elementwise ops."""
        frontier, seen = [self.cat], set()
        while frontier:
            node = frontier.pop()
            for user in node.users:
                if user in seen:
                    continue
                seen.add(user)
                if self._reduced_dim(user, node) is not None:
                    return True
                if user.target in _POINTWISE or user.target in _CASTS:
                    frontier.append(user)
        return False

    def _reduced_dim(self, node: fx.Node, source: fx.Node) -> str | None:
        """``"amax"``/``"sum"``/``"softmax"`` where ``node`` reduces ``source`` over the dim alone."""
        if not node.args or node.args[0] is not source:
            return None
        rank = _val(source).dim()
        if node.target is aten._softmax.default:
            return "softmax" if _norm_dim(node.args[1], rank) == self.dim and not node.args[2] else None
        if node.target in _REDUCTIONS:
            dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            if dims and [_norm_dim(d, rank) for d in dims] == [self.dim] and "dtype" not in node.kwargs:
                return _REDUCTIONS[node.target]
        return None

    # ---- the rules
    def _visit(self, node: fx.Node) -> None:
        source = node.args[0] if node.args else None
        kind = self._reduced_dim(node, source) if source in self.pieces else None
        if kind in _REDUCTIONS.values():
            keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
            pieces = self.pieces[source]
            node.replace_all_uses_with(self._logsumexp(pieces, keepdim, node) if kind == "logsumexp"
                                       else self._combined(kind, pieces, keepdim, node))
        elif kind == "softmax":
            self.pieces[node] = self._softmax(self.pieces[source], node)
        elif node.target is aten.slice.Tensor and source in self.pieces:
            piece = self._sliced_piece(node, source)
            if piece is not None:
                node.replace_all_uses_with(piece)
        elif node.target in _POINTWISE or node.target in _CASTS:
            self.pieces[node] = [self._pointwise(node, k) for k in range(len(self.ranges))]

    def _combined(self, kind: str, pieces: list[fx.Node], keepdim: bool, where: fx.Node) -> fx.Node:
        reduce_op, join = (aten.amax.default, aten.maximum.default) if kind == "amax" else \
            (aten.sum.dim_IntList, aten.add.Tensor)
        parts = [self._add(reduce_op, (p, [self.dim], keepdim), where) for p in pieces]
        out = parts[0]
        for part in parts[1:]:
            out = self._add(join, (out, part), where)
        return out

    def _cast(self, values: list[fx.Node], dtype: torch.dtype, node: fx.Node) -> list[fx.Node]:
        """``values`` in ``dtype``, where ``node``'s result is 16-bit (a softmax and a
        log-sum-exp compute in float32 and round at the end)."""
        if _val(node).dtype not in _HALF:
            return values
        return [self._add(torch.ops.prims.convert_element_type.default, (v, dtype), node) for v in values]

    def _softmax(self, pieces: list[fx.Node], node: fx.Node) -> list[fx.Node]:
        pieces = self._cast(pieces, torch.float32, node)
        m = self._combined("amax", pieces, True, node)
        exps = [self._add(aten.exp.default, (self._add(aten.sub.Tensor, (p, m), node),), node) for p in pieces]
        z = self._combined("sum", exps, True, node)
        return self._cast([self._add(aten.div.Tensor, (e, z), node) for e in exps], _val(node).dtype, node)

    def _logsumexp(self, pieces: list[fx.Node], keepdim: bool, node: fx.Node) -> fx.Node:
        """``m + log(sum_k sum(exp(x_k - m)))`` with ``m`` the combined max, taken as 0
        where it is infinite (a row of ``-inf`` gives ``-inf``), as PyTorch computes it."""
        pieces = self._cast(pieces, torch.float32, node)
        m = self._combined("amax", pieces, True, node)
        infinite = self._add(aten.eq.Scalar, (self._add(aten.abs.default, (m,), node), float("inf")), node)
        m = self._add(aten.masked_fill.Scalar, (m, infinite, 0.0), node)
        exps = [self._add(aten.exp.default, (self._add(aten.sub.Tensor, (p, m), node),), node) for p in pieces]
        out = self._add(aten.add.Tensor, (self._add(aten.log.default, (self._combined("sum", exps, True, node),), node),
                                         m), node)
        if not keepdim:
            out = self._add(aten.squeeze.dim, (out, self.dim), node)
        return self._cast([out], _val(node).dtype, node)[0]

    def _sliced_piece(self, node: fx.Node, source: fx.Node) -> fx.Node | None:
        rank, size = _val(source).dim(), _val(source).shape[self.dim]
        dim = _norm_dim(node.args[1] if len(node.args) > 1 else 0, rank)
        # a symbolic bound is a node holding its SymInt (``L``, ``L + 1`` in a joint graph)
        start = _val(node.args[2]) if len(node.args) > 2 and node.args[2] is not None else 0
        end = _val(node.args[3]) if len(node.args) > 3 and node.args[3] is not None else size
        step = node.args[4] if len(node.args) > 4 else 1
        if dim != self.dim or step != 1:
            return None
        start, end = _range(start, end, size)
        if isinstance(end, int) and isinstance(size, int):
            end = min(end, size)
        for (a, b), piece in zip(self.ranges, self.pieces[source]):
            if _same(start, a) and _same(end, b):
                return piece
        return None

    def _pointwise(self, node: fx.Node, k: int) -> fx.Node:
        """``node``'s op on piece ``k``: its piecewise operands' piece, other tensors
        sliced to the piece's range where they vary along the dim (a symbolic range's
        bounds computed by nodes from the pieces' sizes)."""
        rank = _val(node).dim()
        like = next(self.pieces[x][k] for x in node.all_input_nodes if x in self.pieces)

        def operand(x):
            if x in self.pieces:
                return self.pieces[x][k]
            if not isinstance(x, fx.Node) or not isinstance(_val(x), torch.Tensor):
                return x
            own = self.dim - (rank - _val(x).dim())  # right-aligned broadcasting
            if own < 0 or _same(_val(x).shape[own], 1):
                return x
            piece = self._backward_piece(x, own, k, like, node)
            return piece if piece is not None else self._add(aten.slice.Tensor, (x, own, *self._bounds(k, node)), node)

        args = tuple(operand(x) for x in node.args)
        kwargs = {key: operand(x) for key, x in node.kwargs.items()}
        return self._add(node.target, args, node, kwargs)

    def _backward_piece(self, x: fx.Node, own: int, k: int, like: fx.Node, where: fx.Node) -> fx.Node | None:
        """Piece ``k`` of ``x`` where ``x`` is autograd's ``slice_backward`` along the dim
        (a gradient placed in one range, zeros elsewhere) of a range that is a piece or
        misses piece ``k``: the gradient itself, or zeros shaped as ``like`` (the piece of
        the other operand, when it has the same shape); None otherwise."""
        if x.target is not aten.slice_backward.default or own != self.dim:
            return None
        grad, sizes, dim, start, end, step = x.args
        sizes, start, end = [_val(n) for n in sizes], _val(start), _val(end)  # SymInts where symbolic
        start, end = _range(start, end, sizes[own])
        if _norm_dim(dim, len(sizes)) != own or step != 1:
            return None
        a, b = self.ranges[k]
        if _same(start, a) and _same(end, b):
            return grad
        shape = list(_val(x).shape)
        shape[own] = b - a
        if all(isinstance(v, int) for v in (start, end, a, b)):
            missed = end <= a or start >= b
        else:  # symbolic: the ranges that touch it
            missed = _same(end, a) or _same(start, b)
        if missed and len(shape) == _val(like).dim() and all(_same(u, w) for u, w in zip(shape, _val(like).shape)):
            return self._add(aten.zeros_like.default, (like,), where)
        return None

    def _bounds(self, k: int, where: fx.Node) -> tuple:
        """Piece ``k``'s range as a slice's arguments: numbers, or where a size is symbolic,
        nodes adding up the pieces' sizes (``sym_size``) before ``where``."""
        if all(isinstance(v, int) for v in self.ranges[k]):
            return self.ranges[k]
        ends: list = []
        for piece in self.pieces[self.cat][:k + 1]:
            size = _val(piece).shape[self.dim]
            if not isinstance(size, int):
                size = self._size_node(size, piece, where)
            if not ends:
                ends.append(size)
            elif isinstance(ends[-1], int) and isinstance(size, int):
                ends.append(ends[-1] + size)
            else:
                ends.append(self._add(operator.add, (ends[-1], size), where))
        return (ends[-2] if k else 0), ends[-1]

    def _size_node(self, size: torch.SymInt, piece: fx.Node, where: fx.Node) -> fx.Node:
        """A node holding ``size``: a graph input that is that size, else the size of an
        input tensor's axis; the piece's own size only where no input has it (reading it
        from the piece would keep the piece computed)."""
        inputs = [n for n in self.graph.nodes if n.op == "placeholder"]
        with self.graph.inserting_before(where):
            held = input_size(self.graph, size.node.expr, inputs)
        return held if held is not None else self._add(aten.sym_size.int, (piece, self.dim), where)

    def _add(self, target, args: tuple, where: fx.Node, kwargs: dict | None = None) -> fx.Node:
        """A new node computing ``target(*args)`` before ``where``, with its value's metadata."""
        with self.graph.inserting_before(where):
            return add_call(self.graph, target, args, kwargs)


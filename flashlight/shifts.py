"""A softmax of values already less their row max, on the ATen graph before lowering.

[Note: a softmax of scores less their row max]
Hand-written attention often subtracts each row's max before the softmax, for stability
(``s = s - s.amax(-1, keepdim=True).detach()``; ``s.max(-1, keepdim=True).values``).
The softmax, decomposed, then takes a second max, of ``y = x - M`` with ``M`` the max of
``x``: ``y - amax(y)``. That second max depends on the first, a reduction over the same
dim, so the two cannot share one online loop ([Note: online reduction] in
:mod:`flashlight.passes.online`): the kernel would be split in two, one pass over the
keys for ``M`` and another for the softmax. But ``amax(y)`` is known:

- where ``M`` is finite, every ``x_i <= M`` and rounding is monotonic, so every
  ``fl(x_i - M) <= fl(M - M) = 0``, with equality at the max: ``amax(y) = 0`` exactly;
- where ``M`` is ``-inf`` (every ``x_i`` is), ``+inf`` or NaN, ``y`` holds a NaN
  (``-inf - -inf``, ``inf - inf``, ``NaN - M``) and ``amax(y)`` is NaN.

``M - M`` is 0 and NaN in exactly those cases, so ``y - amax(y)`` is rewritten as
``y - (M - M)``: the same value everywhere, infinities and NaNs included, and the
softmax is then one of ``x`` with its max ``M``, which the online pass runs in one loop.
Only a max of the very value subtracted from, over the same dims, with ``keepdim``,
reached through value-preserving ops (``detach``, ``alias``), is recognised.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from flashlight.graph_edits import replace, tidy

aten = torch.ops.aten
_SAME_VALUE = (aten.detach.default, aten.alias.default)


def drop_repeated_maxes(gm: fx.GraphModule) -> int:
    """Rewrite every ``y - amax(y)`` of ``gm`` with ``y = x - max(x)`` over the same dims
    ([Note: a softmax of scores less their row max]); returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        y = _difference(node)
        dims = row_max_dims(node.args[1], y) if y is not None else None
        if dims is None:
            continue
        x, shift = y.args
        if row_max_dims(_through_same_value(shift), x) != dims:
            continue
        with gm.graph.inserting_before(node):  # values of the shapes and dtypes already known
            zero = gm.graph.call_function(aten.sub.Tensor, (shift, shift))  # 0, or NaN where M is not finite
            zero.meta["val"] = shift.meta["val"]
            shifted = gm.graph.call_function(aten.sub.Tensor, (y, zero))
            shifted.meta["val"] = node.meta["val"]
        replace(gm.graph, node, shifted)
        count += 1
    return tidy(gm, count)


def _difference(node) -> fx.Node | None:
    """``y`` where ``node`` is ``y - m`` and ``y`` is itself a difference of two nodes."""
    if not _is_plain_sub(node):
        return None
    y = node.args[0]
    return y if _is_plain_sub(y) and isinstance(y.args[0], fx.Node) else None


def _is_plain_sub(node) -> bool:
    return (isinstance(node, fx.Node) and node.op == "call_function" and node.target is aten.sub.Tensor
            and len(node.args) == 2 and not node.kwargs and isinstance(node.args[1], fx.Node))


def _through_same_value(node: fx.Node) -> fx.Node:
    while node.op == "call_function" and node.target in _SAME_VALUE:
        node = node.args[0]
    return node


def row_max_dims(node, of: fx.Node) -> tuple[int, ...] | None:
    """The dims (non-negative, sorted) over which ``node`` is ``of``'s max with ``keepdim``,
    or None where it is not one."""
    if not (isinstance(node, fx.Node) and node.op == "call_function"):
        return None
    rank = of.meta["val"].dim() if "val" in of.meta else None
    if rank is None:
        return None
    if node.target is aten.amax.default and node.args[0] is of:
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", [])
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if keepdim and dims:
            return tuple(sorted(d % rank for d in dims))
        return None
    if node.target is operator.getitem and node.args[1] == 0:
        source = node.args[0]
        if (isinstance(source, fx.Node) and source.target is aten.max.dim and source.args[0] is of
                and len(source.args) > 2 and source.args[2]):
            return (source.args[1] % rank,)
    return None

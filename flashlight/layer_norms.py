"""Layer norms of computed values written out as the ATen ops they are, before lowering.

[Note: a layer norm written out]
``native_layer_norm`` lowers into nests of its own (the mean, the centred values, the
variance, the normalised output), all the work of one ATen node. Fused where the
normalised dims are not a loop's (a norm of the attention output over its features)
that is what a kernel wants. Where they are (scores normalised over the keys before the
softmax), the variance needs the mean's final value and the softmax's max the
variance's: no single online loop holds them, and the back-off must keep the mean and
the variance separate, but it can only keep separate what an ATen node computes, so
every operation of such a graph was left to PyTorch. Written out (a sum, a difference,
a sum of squares, a reciprocal square root, in float32 as the node computes them), the
mean and the variance are nodes, and the back-off keeps them separate as it does for a
layer norm written by hand: two kernels over the rows, then the attention reading them.
Only a layer norm of a value a contraction computes, that a max, sum or softmax over its
normalised dims then reads (scores normalised over the keys), and whose mean and
reciprocal deviation are not used, is rewritten; any other (a norm of an attention's
output or of a block's input, which fuses or goes to Inductor as it is) lowers as the
one node it is.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx

from flashlight.graph_edits import add_call, replace, tidy

aten = torch.ops.aten
_CONTRACTIONS = (aten.bmm.default, aten.mm.default, aten.baddbmm.default, aten.addmm.default)


def write_out_layer_norms(gm: fx.GraphModule) -> int:
    """Rewrite the layer norms of ``gm`` that [Note: a layer norm written out] describes;
    returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.native_layer_norm.default:
            continue
        users = list(node.users)
        if not users or any(u.target is not operator.getitem or u.args[1] != 0 for u in users):
            continue  # its mean or rstd is used (a training forward saves them)
        x, normalized, weight, bias, eps = (*node.args, None, None, 1e-5)[:5]
        value = x.meta.get("val") if isinstance(x, fx.Node) else None
        if value is None or not _computed_by_a_contraction(x):
            continue
        dims = list(range(value.dim() - len(normalized), value.dim()))
        if not any(_reduced_again(user, set(dims)) for user in users):
            continue  # normalised over dims no later reduction loops over: it fuses as it is
        size = math.prod(value.shape[d] for d in dims)
        if not isinstance(size, int):
            continue  # a symbolic count: the node's own lowering says why it cannot
        with gm.graph.inserting_before(node):
            out = _written_out(gm.graph, x, dims, float(size), weight, bias, float(eps), value.dtype)
        for user in users:
            replace(gm.graph, user, out)
        gm.graph.erase_node(node)
        count += 1
    return tidy(gm, count)


def _written_out(graph: fx.Graph, x: fx.Node, dims: list[int], size: float, weight, bias, eps: float,
                 dtype: torch.dtype) -> fx.Node:
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` over ``dims``; a 16-bit ``dtype``
    computed in float32 and rounded at the end."""
    narrow = dtype in (torch.float16, torch.bfloat16)  # computed in float32, as the node does
    wide = add_call(graph, aten._to_copy.default, (x,), {"dtype": torch.float32}) if narrow else x
    mean = add_call(graph, aten.div.Tensor, (add_call(graph, aten.sum.dim_IntList, (wide, dims, True)), size))
    centred = add_call(graph, aten.sub.Tensor, (wide, mean))
    squares = add_call(graph, aten.sum.dim_IntList, (add_call(graph, aten.mul.Tensor, (centred, centred)), dims, True))
    rstd = add_call(graph, aten.rsqrt.default, (add_call(graph, aten.add.Tensor, (add_call(
        graph, aten.div.Tensor, (squares, size)), eps)),))
    out = add_call(graph, aten.mul.Tensor, (centred, rstd))
    if weight is not None:
        out = add_call(graph, aten.mul.Tensor, (out, weight))
    if bias is not None:
        out = add_call(graph, aten.add.Tensor, (out, bias))
    if narrow:  # rounded once, at the end, as the node rounds it
        out = add_call(graph, aten._to_copy.default, (out,), {"dtype": dtype})
    return out


def _computed_by_a_contraction(node: fx.Node) -> bool:
    """Whether a matrix product is among the ops ``node`` is computed from."""
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if current in seen or current.op != "call_function":
            continue
        seen.add(current)
        if current.target in _CONTRACTIONS:
            return True
        stack.extend(current.all_input_nodes)
    return False


_ROW_REDUCTIONS = (aten.amax.default, aten.amin.default, aten.sum.dim_IntList, aten._softmax.default,
                   aten._log_softmax.default, aten.logsumexp.default)


def _reduced_again(node: fx.Node, dims: set[int]) -> bool:
    """Whether a max, sum or softmax over ``dims`` (of ``node``'s rank) reads ``node``,
    directly or through elementwise ops of the same shape: a loop over those dims."""
    rank = node.meta["val"].dim()
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        for user in current.users:
            if user in seen or user.op != "call_function":
                continue
            seen.add(user)
            if user.target in _ROW_REDUCTIONS and len(user.args) > 1:
                over = user.args[1] if isinstance(user.args[1], (list, tuple)) else [user.args[1]]
                if {d % rank for d in over} == dims:
                    return True
            out = user.meta.get("val")
            if isinstance(out, torch.Tensor) and out.shape == node.meta["val"].shape:
                stack.append(user)  # elementwise on the way (a mask, a scale)
    return False

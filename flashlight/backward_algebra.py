"""Algebra on AOTAutograd's joint graph before it is split into forward and backward.

[Note: the softmax backward's row term]
For ``o = softmax(s) @ v`` the backward of the softmax needs, per row ``i``, the term
``D_i = sum_j p_ij dp_ij`` with ``dp = do @ v^T``: the gradient of the scores is
``ds = p * (dp - D)``. Computed as written, ``D`` is a reduction over the keys of a
product of two matrices the size of the scores, so Flashlight's backward gets a kernel of
its own: a pass over every key tile that recomputes the probabilities and ``dp`` (two
dots per tile) only to sum their product. Contractions may be reordered::

    D_i = sum_j p_ij sum_c do_ic v_jc = sum_c do_ic sum_j p_ij v_jc = sum_c do_ic o_ic

so the same term is a sum over the head width of two tensors the graph already has: the
incoming gradient ``do`` and the forward's output ``o`` (FlashAttention-2 computes it
this way). Where the matmul's operand is the probabilities times other factors (a
dropout mask and its scale: ``o = (p m s) @ v``), ``dp`` arrives as the gradient of that
operand times the same factors, and ``sum_j p_ij m_ij s dp'_ij = sum_c do_ic o_ic`` again
(:func:`_scaled_row_term`). :func:`rewrite_row_terms` finds the pattern at the level of the batched
matmuls AOTAutograd writes: a sum over the last dim of ``view(bmm(G, B^T)) * P'``, where
``bmm(P, B)`` is a forward node with the same ``B`` and ``P'`` is that ``P`` up to
re-indexing that keeps each element in place (views, a same-shape expand, detaches) and a
cast both factors share. It replaces the sum by ``sum_c(G * bmm(P, B))``, viewed to the
sum's shape. The remaining uses of ``dp`` (``ds`` itself) are untouched, and the
forward's output is a value the forward kernel stores, which the backward then reads.

[Note: a row term from a rounded output]
In a low-precision graph the forward's output is rounded (to bfloat16, say) while the
term is summed in float32. ``D`` from the rounded ``o`` is off by about the rounding
of ``|do| |o|``, but ``dp - D`` cancels to much less where one key dominates a row,
so ``ds`` there loses most of its digits (several times the error of PyTorch's own
backward, which takes ``D`` from the rounded ``p`` and ``dp``). The forward's matmul is
then computed in the term's precision and rounded after: the forward kernel accumulates
in float32 anyway and now also stores that value, one more output the size of ``o``,
which the backward reads for ``D``. Nothing of the size of the scores is kept.

[Note: a 16-bit softmax's scores rounded]
A softmax written out in a 16-bit graph, ``exp(s - s.amax(-1, keepdim=True))``, has
16-bit scores and a 16-bit row max. The forward kernel computes both wide and rounds
neither, but its backward reads the max rounded (saved to a 16-bit tensor, or taken
again as the derivative of ``amax`` needs it, from scores materialized in 16 bits
beside the comparison: [Note: ties between recomputed values]), and those scores
rounded too: recomputed probabilities then differ from the forward's by
``exp(|s| / 512)`` per element, which the saved row sum does not undo (the gradients
of q and k were 2-4x eager's error from float64). Rounding only the max is no cure:
``s - round(m)`` can be large and positive where a row is masked with ``-1e9``. So the
scores that such a max and its exponent read are rounded to the graph's dtype in the
joint graph, as eager rounds them: the max of rounded scores is a 16-bit value, saved
exactly, and the same in the forward and the backward, and ``s - m <= 0`` still.
The cost is a rounding per score in the training forward's loop; a softmax called as
``torch.softmax`` takes its max in float32 and is left alone.
"""
from __future__ import annotations

import logging

import torch
import torch.fx as fx

from flashlight.graph_edits import add_call, replace, tidy
from flashlight.shifts import row_max_dims

log = logging.getLogger("flashlight")
aten = torch.ops.aten

_IN_PLACE = {aten.detach.default, aten.alias.default}  # the same elements, the same order
_CASTS = {aten._to_copy.default, torch.ops.prims.convert_element_type.default}


def round_softmax_scores(joint: fx.GraphModule) -> int:
    """Round the scores of every 16-bit ``exp(s - amax(s))`` of ``joint`` where its max
    and its exponent read them ([Note: a 16-bit softmax's scores rounded]); returns how
    many were."""
    count = 0
    for node in list(joint.graph.nodes):
        found = _narrow_softmax_shift(node)
        if found is None:
            continue
        scores, readers = found
        with joint.graph.inserting_after(scores):
            wide = add_call(joint.graph, aten._to_copy.default, (scores,), {"dtype": torch.float32})
        with joint.graph.inserting_after(wide):
            rounded = add_call(joint.graph, aten._to_copy.default, (wide,), {"dtype": scores.meta["val"].dtype})
        for reader in readers:
            reader.replace_input_with(scores, rounded)
        count += 1
    if tidy(joint, count):
        log.debug("[flashlight] the scores of %d 16-bit softmax(es) rounded", count)
    return count


def _narrow_softmax_shift(node: fx.Node):
    """``(s, [the nodes reading s])`` where ``node`` is ``exp(s - amax(s, last dim,
    keepdim))`` with ``s`` and its max in 16 bits (float casts, detaches and aliases
    looked through on either side of the difference), else None."""
    if node.op != "call_function" or node.target is not aten.exp.default or not isinstance(node.args[0], fx.Node):
        return None
    shift = _through_casts(node.args[0])[-1]
    if shift.target is not aten.sub.Tensor or len(shift.args) != 2 or shift.kwargs \
            or not all(isinstance(a, fx.Node) for a in shift.args):
        return None
    left, right = _through_casts(shift.args[0]), _through_casts(shift.args[1])
    scores, amax = left[-1], right[-1]
    if amax.target is not aten.amax.default or not isinstance(amax.args[0], fx.Node) \
            or _through_casts(amax.args[0])[-1] is not scores:
        return None
    val, row_max = scores.meta.get("val"), amax.meta.get("val")
    if row_max is None or row_max.dtype not in (torch.bfloat16, torch.float16):
        return None  # a float32 max of widened scores (torch.softmax's) is saved as the kernel had it
    if val is None or val.dtype not in (torch.bfloat16, torch.float16) \
            or row_max_dims(amax, amax.args[0]) != (val.dim() - 1,):
        return None
    readers = [([shift, *left])[-2], ([amax, *_through_casts(amax.args[0])])[-2]]
    return scores, readers


def _through_casts(node: fx.Node) -> list[fx.Node]:
    """``node`` and what it reads through float casts, detaches and aliases, in order."""
    chain = [node]
    while True:
        last = chain[-1]
        inner = last.args[0] if last.target in _IN_PLACE else _uncast(last)[0]
        if inner is last or not isinstance(inner, fx.Node):
            return chain
        chain.append(inner)


def rewrite_row_terms(joint: fx.GraphModule) -> int:
    """Rewrite every softmax-backward row term of ``joint`` ([Note: the softmax
    backward's row term]); returns how many were rewritten."""
    count = 0
    for node in list(joint.graph.nodes):
        found = _row_term(node)
        if found is None:
            continue
        grad, forward_out, dtype, scores_shape = found
        if dtype is not None and forward_out.meta["val"].dtype != dtype:
            forward_out = _widened(joint, forward_out, dtype)  # [Note: a row term from a rounded output]
        with joint.graph.inserting_before(node):
            a, b = grad, forward_out
            if dtype is not None:
                a = add_call(joint.graph, aten._to_copy.default, (a,), {"dtype": dtype})
                b = add_call(joint.graph, aten._to_copy.default, (b,), {"dtype": dtype})
            # [BH, Q, C] -> [BH, Q, 1] -> the row term's own shape [..., Q, 1] (the
            # scores' view with the keys summed; its sizes are the graph's, symbolic or not)
            product = add_call(joint.graph, aten.mul.Tensor, (a, b))
            term = add_call(joint.graph, aten.sum.dim_IntList, (product, [-1], True))
            term = add_call(joint.graph, aten.view.default, (term, [*scores_shape[:-1], 1]))
        replace(joint.graph, node, term)
        count += 1
    if tidy(joint, count):
        log.debug("[flashlight] the backward computes %d softmax row term(s) from the output", count)
    return count


def _widened(joint: fx.GraphModule, forward_mm: fx.Node, dtype: torch.dtype) -> fx.Node:
    """``forward_mm = bmm(P, B)`` computed in ``dtype`` (a new node the forward returns
    rounded to its old dtype, in place of ``forward_mm``); returns the wide node."""
    p, value = forward_mm.args
    with joint.graph.inserting_before(forward_mm):
        wide = add_call(joint.graph, aten.bmm.default, tuple(
            add_call(joint.graph, aten._to_copy.default, (x,), {"dtype": dtype}) for x in (p, value)))
        narrow = add_call(joint.graph, aten._to_copy.default, (wide,), {"dtype": forward_mm.meta["val"].dtype})
    forward_mm.replace_all_uses_with(narrow)
    joint.graph.erase_node(forward_mm)
    return wide


def _row_term(node: fx.Node):
    """``(G, bmm(P, B), cast dtype or None, the view's shape argument)`` where ``node``
    is the row term ``sum(view(bmm(G, B^T)) * P', -1, keepdim=True)``, else None."""
    if node.op != "call_function" or node.target is not aten.sum.dim_IntList or len(node.args) < 3:
        return None
    product, dims, keepdim = node.args[:3]
    val = node.meta.get("val")
    if not keepdim or node.kwargs.get("dtype") is not None or not _is_mul(product) or val is None:
        return None
    if list(dims) not in ([-1], [val.dim() - 1]):
        return None
    for scores_grad, probs in (product.args, product.args[::-1]):
        (dp, cast_a), (p, cast_b) = _uncast(scores_grad), _uncast(probs)
        if cast_a != cast_b:
            continue
        found = _through_matmul(dp, p)
        if found is not None:
            return (*found, cast_a, list(dp.args[1]))
    return _scaled_row_term(product)


def _scaled_row_term(product: fx.Node):
    """The row term of a product of several factors ([Note: the softmax backward's row
    term] with factors): ``dp * F1 * ... * Fn`` where the forward's matmul multiplied
    ``B`` by ``F1 * ... * Fn`` (the probabilities times a dropout mask and its scale:
    ``sum_j p_ij m_ij s dp'_ij`` is ``sum_j (p m s)_ij dp'_ij``, ``dp'`` the gradient of
    the matmul's own operand); the same factors, nodes and numbers, on both sides.
    Returns as :func:`_row_term`, else None."""
    factors = _factors(product)
    for k, dp in enumerate(factors):
        if not isinstance(dp, fx.Node) or dp.target is not aten.view.default:
            continue
        rest = factors[:k] + factors[k + 1:]
        for grad, value in _grad_matmuls(dp):
            for forward_mm in value.users:
                if forward_mm.target is aten.bmm.default and forward_mm.args[1] is value \
                        and _same_factors(_operand_source(forward_mm.args[0], dp), rest):
                    return grad, forward_mm, None, list(dp.args[1])
    return None


def _factors(node) -> list:
    """The factors of a tree of ``mul.Tensor`` (nodes, and numbers where one side is one),
    detaches looked through."""
    node = _source(node)
    if isinstance(node, fx.Node) and node.target is aten.mul.Tensor and len(node.args) == 2:
        return _factors(node.args[0]) + _factors(node.args[1])
    return [node]


def _grad_matmuls(dp: fx.Node):
    """``(G, B)`` where ``dp`` is ``view(bmm(G, B^T))`` with the key dim last; else nothing."""
    grad_mm = dp.args[0]
    if isinstance(grad_mm, fx.Node) and grad_mm.target is aten.bmm.default:
        grad, transposed = grad_mm.args
        value = _transposed_source(transposed)
        if value is not None and _keeps_last_two(grad_mm, dp):
            yield grad, value


def _operand_source(p3: fx.Node, dp: fx.Node):
    """The tensor of ``dp``'s shape whose elements the forward matmul's operand ``p3``
    holds in ``dp``'s order (through a view, a same-shape expand, detaches), or None."""
    node = _source(p3)
    if not isinstance(node, fx.Node) or node.target is not aten.view.default:
        return None
    node = _source(node.args[0])
    if isinstance(node, fx.Node) and node.target is aten.expand.default:
        inner = node.args[0]
        if not isinstance(inner, fx.Node) or _shape(inner) != _shape(node):
            return None
        node = _source(inner)
    return node if _shape(node) is not None and _shape(node) == _shape(dp) else None


def _same_factors(operand, factors: list) -> bool:
    """Whether ``operand`` is the product of ``factors`` (the same nodes, the same numbers),
    with more than one factor (one is the plain case of :func:`_through_matmul`)."""
    if operand is None or len(factors) < 2:
        return False
    mine = _factors(operand)
    key = lambda f: ("node", f.name) if isinstance(f, fx.Node) else ("number", repr(f))  # noqa: E731
    return sorted(map(key, mine)) == sorted(map(key, factors))


def _is_mul(node) -> bool:
    return (isinstance(node, fx.Node) and node.target is aten.mul.Tensor and len(node.args) == 2
            and all(isinstance(a, fx.Node) for a in node.args))


def _uncast(node: fx.Node):
    """``node`` without a float cast (and the dtype cast to, or None)."""
    if node.target in _CASTS and set(node.kwargs) <= {"dtype"} and len(node.args) == 1:
        return node.args[0], node.kwargs.get("dtype")
    return node, None


def _through_matmul(dp: fx.Node, p: fx.Node):
    """``(G, bmm(P, B))`` where ``dp`` is ``view(bmm(G, B^T))`` with the key dim last and
    ``p`` is the forward's ``P`` in ``dp``'s shape; else None."""
    if dp.target is not aten.view.default:
        return None
    for grad, value in _grad_matmuls(dp):
        for forward_mm in value.users:
            if forward_mm.target is aten.bmm.default and forward_mm.args[1] is value \
                    and _same_elements(forward_mm.args[0], p, dp):
                return grad, forward_mm
    return None


def _transposed_source(node) -> fx.Node | None:
    """``B`` where ``node`` is ``B`` with its last two dims swapped, else None."""
    if not isinstance(node, fx.Node):
        return None
    if node.target is aten.transpose.int and sorted(int(d) % 3 for d in node.args[1:3]) == [1, 2]:
        return node.args[0]
    if node.target is aten.permute.default and [int(d) % 3 for d in node.args[1]] == [0, 2, 1]:
        return node.args[0]
    return None


def _keeps_last_two(mm: fx.Node, view: fx.Node) -> bool:
    """Whether ``view`` of the ``[BH, Q, K]`` matmul only splits its batch dim."""
    a, b = mm.meta.get("val"), view.meta.get("val")
    return a is not None and b is not None and a.dim() == 3 and b.dim() >= 2 and tuple(a.shape[1:]) == tuple(b.shape[-2:])


def _same_elements(p3: fx.Node, p: fx.Node, dp: fx.Node) -> bool:
    """Whether the forward matmul's operand ``p3`` holds the elements of ``p`` in the
    order ``dp`` holds its own: ``p3`` is a view of ``p`` (through a same-shape expand)
    and ``p`` has ``dp``'s shape; detaches on either side are looked through."""
    return _operand_source(p3, dp) is _source(p)


def _source(node):
    """``node`` through detaches and aliases (the same elements in the same order)."""
    while isinstance(node, fx.Node) and node.target in _IN_PLACE:
        node = node.args[0]
    return node


def _shape(node: fx.Node):
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if val is not None else None

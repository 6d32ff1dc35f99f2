"""Editing the ATen graph before lowering: the few steps every rewrite there shares
(the concatenations' split, the repeated row max, the backward's row term)."""
from __future__ import annotations

import sympy
import torch
import torch.fx as fx


def add_call(graph: fx.Graph, target, args: tuple, kwargs: dict | None = None) -> fx.Node:
    """A new call of ``target`` at the graph's insertion point, with its ``val`` (the
    metadata lowering reads) computed from its arguments' (fake) values."""
    from torch._guards import detect_fake_mode

    kwargs = kwargs or {}
    node = graph.call_function(target, args, kwargs)
    values, kwvalues = fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
    fake_mode = detect_fake_mode(values)
    with fake_mode if fake_mode is not None else torch.no_grad():
        node.meta["val"] = target(*values, **kwvalues)
    return node


def replace(graph: fx.Graph, node: fx.Node, new: fx.Node) -> None:
    """Every use of ``node`` reads ``new``, and ``node`` is gone."""
    node.replace_all_uses_with(new)
    graph.erase_node(node)


def tidy(gm: fx.GraphModule, edits: int) -> int:
    """After ``edits`` rewrites of ``gm``: what they left unused removed and the module's
    code made again (nothing where there were none); returns ``edits``."""
    if edits:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return edits


# [Note: sizes read off computed tensors]
# Under ``dynamic=True`` Dynamo's graph reads a size it needs later off the tensor that has
# it: ``sym_size(cat, 3)`` for ``math.sqrt(q.shape[-1])`` of concatenated queries,
# ``sym_size(scores, 1)`` for the heads of the probabilities' view. Such a read is a use
# of that tensor: where a kernel computes it, the node stays in the graph after the kernel
# replaced it, for Inductor to compile (and report) as work outside the kernels. Every size
# is an expression of the graph's symbols, which its inputs hold (a size argument, an
# input's axis), so such reads are rewritten to read the inputs: the same symbol where an
# input has it, else sums, products and floor divisions of them.

_SIZE_ARITHMETIC = {"Add": "add", "Mul": "mul", "FloorDiv": "floordiv"}


def sizes_read_from_inputs(gm: fx.GraphModule) -> int:
    """Rewrite the sizes ``gm`` reads off computed tensors to read its inputs ([Note: sizes
    read off computed tensors]); returns how many were."""
    aten = torch.ops.aten
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    edits = 0
    for node in list(gm.graph.nodes):
        if node.target is not aten.sym_size.int or node.args[0].op == "placeholder" \
                or not isinstance(node.meta.get("val"), torch.SymInt):
            continue
        with gm.graph.inserting_before(node):
            new = _size_of_inputs(gm.graph, node.meta["val"].node.expr, inputs)
        if isinstance(new, fx.Node):
            replace(gm.graph, node, new)
            edits += 1
    return tidy(gm, edits)


def input_size(graph: fx.Graph, expr, inputs: list[fx.Node]) -> fx.Node | None:
    """A node holding symbolic size ``expr`` as one of ``inputs`` holds it: a size argument
    that is that size, else a new ``sym_size`` of an input tensor's axis (at the graph's
    insertion point); None where no input holds it as such."""
    for node in inputs:
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt) and value.node.expr == expr:
            return node
    for node in inputs:
        value = node.meta.get("val")
        for axis, size in enumerate(value.shape if isinstance(value, torch.Tensor) else ()):
            if isinstance(size, torch.SymInt) and size.node.expr == expr:
                return add_call(graph, torch.ops.aten.sym_size.int, (node, axis))
    return None


def _size_of_inputs(graph: fx.Graph, expr, inputs: list[fx.Node]):
    """A node (or a number) computing size ``expr`` from ``inputs``, None where it cannot."""
    import operator

    if expr.is_Integer:
        return int(expr)
    held = input_size(graph, expr, inputs)
    if held is not None:
        return held
    name = _SIZE_ARITHMETIC.get(type(expr).__name__)
    args = list(expr.args)
    if name == "floordiv":  # an exact division (``(H * H) // H``) is its quotient
        numerator, denominator = sympy.fraction(sympy.cancel(args[0] / args[1]))
        if denominator == 1:
            return _size_of_inputs(graph, numerator, inputs)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
        name, args = "mul", [expr.base] * int(expr.exp)
    if name is None:
        return None
    args = [_size_of_inputs(graph, arg, inputs) for arg in args]
    if any(arg is None for arg in args):
        return None
    total = args[0]
    for arg in args[1:]:
        total = add_call(graph, getattr(operator, name), (total, arg))
    return total

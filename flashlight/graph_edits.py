"""Editing the ATen graph before lowering: the few steps every rewrite there shares
(the concatenations' split, the repeated row max, the backward's row term)."""
from __future__ import annotations

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

"""FX graphs kept as plain data: pickled without PyTorch's own ``GraphModule`` pickling.

[Note: graphs unpickled without tracing]
Unpickling a ``GraphModule`` the way PyTorch pickles it rebuilds its graph by tracing the
pickled code with an FX tracer, which replaces ``nn.Module.__call__`` for the whole
process while it runs. A graph unpickled on one thread while another calls modules (a
preload beside a model's first pass, a graph captured in another process and received
on a thread) would send that other thread's module calls into the tracer (``NameError:
module is not installed as a submodule``). Flashlight's graphs are therefore kept as
tuples of their nodes (:func:`dump_graph`) and rebuilt node by node (:func:`load_graph`),
which traces nothing: the traced graphs in the cache folder and the unfused graph each
kernel keeps for its fall-back (:class:`flashlight.runtime.Launcher`).
"""
from __future__ import annotations

import dataclasses
import importlib

import torch
import torch.fx as fx


@dataclasses.dataclass(frozen=True)
class _Ref:
    """A node of the serialised graph, by name."""

    name: str


def dump_graph(gm: fx.GraphModule) -> list | None:
    """``gm``'s nodes as picklable tuples ``(op, name, target, args, kwargs)``, or None
    where a node's target cannot be named (the entry then stays in memory)."""
    nodes = []
    for node in gm.graph.nodes:
        target = _target_ref(node)
        if target is None:
            return None
        refer = lambda a: _Ref(a.name) if isinstance(a, fx.Node) else a  # noqa: E731
        nodes.append((node.op, node.name, target, fx.node.map_aggregate(node.args, refer),
                      fx.node.map_aggregate(node.kwargs, refer)))
    return nodes


def _target_ref(node: fx.Node):
    from flashlight.runtime import Launcher

    target = node.target
    if node.op in ("placeholder", "output"):
        return ("name", target)
    if node.op != "call_function":
        return None
    if isinstance(target, Launcher):
        return ("launcher", target)
    if isinstance(target, torch._ops.OpOverload):
        return ("op", str(target))
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if module and qualname and "<" not in qualname:
        return ("python", module, qualname)
    return None


def load_graph(nodes: list) -> fx.GraphModule:
    """The graph :func:`dump_graph` wrote, as a callable ``GraphModule``."""
    graph = fx.Graph()
    made: dict[str, fx.Node] = {}
    resolve = lambda a: made[a.name] if isinstance(a, _Ref) else a  # noqa: E731
    for op, name, target, args, kwargs in nodes:
        made[name] = graph.create_node(op, _resolve_target(target), fx.node.map_aggregate(args, resolve),
                                       fx.node.map_aggregate(kwargs, resolve), name=name)
    return fx.GraphModule(torch.nn.Module(), graph)


def _resolve_target(ref: tuple):
    kind = ref[0]
    if kind in ("name", "launcher"):
        return ref[1]
    if kind == "op":
        namespace, op, overload = ref[1].split(".")
        return getattr(getattr(getattr(torch.ops, namespace), op), overload)
    value = importlib.import_module(ref[1])
    for part in ref[2].split("."):
        value = getattr(value, part)
    return value

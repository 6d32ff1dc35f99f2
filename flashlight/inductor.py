"""The remainder of a graph through Inductor.

After :func:`flashlight.backend.build` has stitched its kernels into the ATen graph as
calls to :class:`~flashlight.runtime.Launcher` objects, :func:`to_custom_ops` turns each
call into the opaque operator ``torch.ops.flashlight.launch`` (:mod:`flashlight.ops`),
and :func:`compile_remainder` hands the graph to Inductor through
``torch._inductor.compile_fx.compile_fx_inner``, the compiler Inductor itself gives
AOTAutograd for graphs AOTAutograd has already traced: the graph is not traced again,
and Inductor's joint-graph passes, which would rewrite attention patterns into SDPA
calls before Flashlight saw them, do not run. Inductor fuses and compiles everything
around the kernels (C++ on the CPU, Triton on CUDA) and calls them where they were.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from flashlight import ops
from flashlight.runtime import Launcher

LAUNCH = torch.ops.flashlight.launch.default
LAUNCH_OUTPUTS = torch.ops.flashlight.launch_outputs.default  # a kernel with several outputs
# the devices Inductor compiles for; a graph on others (meta) keeps the eager remainder
DEVICES = {"cpu", "cuda"}


def to_custom_ops(gm: fx.GraphModule) -> int:
    """Replace each call to a Launcher in ``gm`` by ``flashlight.launch(key, inputs)``
    (``flashlight.launch_outputs`` for a kernel with several outputs, whose items the
    graph reads) on the same inputs; returns how many were replaced."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, Launcher):
            continue
        key = ops.register(node.target)
        op = LAUNCH if len(node.target.kernel.outputs()) == 1 else LAUNCH_OUTPUTS
        with gm.graph.inserting_before(node):
            call = gm.graph.call_function(op, (key, list(node.args)))
        call.meta = {k: v for k, v in node.meta.items() if k != "tensor_meta"}
        values = [a.meta.get("val") for a in node.args]
        if values and all(isinstance(v, FakeTensor) for v in values):
            # the launch's own result: contiguous, where the node it replaced may not be
            call.meta["val"] = op(key, values)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        count += 1
    gm.recompile()
    return count


def devices(gm: fx.GraphModule, example_inputs: Sequence) -> set[str]:
    """The device types of the graph's inputs and values."""
    found = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    for node in gm.graph.nodes:
        fx.node.map_aggregate(node.meta.get("val"),
                              lambda v: found.add(v.device.type) if isinstance(v, torch.Tensor) else None)
    return found


def compile_remainder(gm: fx.GraphModule, example_inputs: Sequence, kind: str):
    """Compile ``gm`` (an ATen graph from AOTAutograd, possibly with Flashlight launches)
    with Inductor; ``kind`` is ``"inference"``, ``"forward"`` or ``"backward"``. ``gm``
    itself is left as it was (Inductor compiles a copy traced through its decompositions)."""
    from torch._inductor.compile_fx import compile_fx_inner

    graph_copy = decompose(gm, example_inputs)
    return compile_fx_inner(graph_copy, list(example_inputs),
                            is_inference=kind == "inference", is_backward=kind == "backward")


def decompose(gm: fx.GraphModule, example_inputs: Sequence) -> fx.GraphModule:
    """``gm`` traced again through Inductor's decomposition table (the one Inductor hands
    AOTAutograd): the ATen ops Inductor only compiles in decomposed form (a layer norm
    Flashlight left outside its kernels) arrive decomposed. Launches stay opaque."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_mode = detect_fake_mode(list(example_inputs))
    with contextlib.ExitStack() as stack:
        if fake_mode is not None:
            stack.enter_context(fake_mode)
        stack.enter_context(enable_python_dispatcher())
        return make_fx(gm, decomposition_table=select_decomp_table())(*example_inputs)

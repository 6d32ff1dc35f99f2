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
            call = gm.graph.call_function(op, (key, [_lifted(gm, a) for a in node.args]))
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


def _lifted(gm: fx.GraphModule, arg: fx.Node) -> fx.Node:
    """``arg``, or where it is a tensor constant of the graph (an attribute: ``torch.tensor``
    called by the traced function) a fresh copy of it, as AOTAutograd's graphs read their
    constants (``aten.lift_fresh_copy``, which a fused kernel absorbed): under a fake mode
    that op turns the real constant into a fake tensor, so that a trace of the graph (the
    remainder's, :func:`decompose`) hands the launch fake tensors only."""
    if not (isinstance(arg, fx.Node) and arg.op == "get_attr"
            and isinstance(getattr(gm, str(arg.target), None), torch.Tensor)):
        return arg
    lifted = gm.graph.call_function(torch.ops.aten.lift_fresh_copy.default, (arg,))
    lifted.meta = dict(arg.meta)
    return lifted


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

    from torch._inductor import config

    # [Note: exact comparisons in the remainder]: the trace marks the roundings to emulate
    with config.patch(emulate_precision_casts=True) if compares_floats(gm) else contextlib.nullcontext():
        graph_copy = decompose(gm, example_inputs)
        native_random_ops(graph_copy, example_inputs)
        if kind == "inference":
            write_into_overwritten_inputs(graph_copy)
        return compile_fx_inner(graph_copy, list(example_inputs),
                                is_inference=kind == "inference", is_backward=kind == "backward")


# [Note: exact comparisons in the remainder]
# Inductor keeps a 16-bit intermediate in float32 inside the kernel that computes it and
# rounds it only where it is stored. A graph that compares floats for equality, as the
# derivative of ``amax`` compares the row max with the scores it came from (``x ==
# amax(x)``, then a division by the count of ties), then compares an unrounded value
# with a max that was rounded on its way through memory: no element equals the max, the
# count is zero and the gradient NaN (a softmax written out in bfloat16, trained with
# the remainder in Inductor). Such a graph is compiled with Inductor's emulation of
# eager's roundings, so equal values in eager are equal there too.
_FLOAT_COMPARISONS = frozenset({torch.ops.aten.eq.Tensor, torch.ops.aten.ne.Tensor})


def compares_floats(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` compares two floating tensors for (in)equality ([Note: exact
    comparisons in the remainder])."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _FLOAT_COMPARISONS:
            values = [a.meta.get("val") for a in node.args if isinstance(a, fx.Node)]
            if any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in values):
                return True
    return False


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


# [Note: random numbers in the remainder]
# Random ops reach the remainder: the seed each dropout draws (``aten.randint``, [Note:
# dropout inside a kernel] in flashlight/random_ops.py), and ``torch.rand``/``randn``
# that a function calls itself. Inductor lowers random ops only in the form its joint-graph
# passes give them (``replace_random_passes``: one seed tensor drawn from PyTorch's
# generator per graph and device, each random op a generator inside the kernel that
# consumes it), or as calls of the ATen op where ``fallback_random`` is set; Flashlight
# hands Inductor graphs AOTAutograd traced, past those passes, so the remainder applies
# that one rewrite itself. Without it a graph with dropout failed Inductor's lowering
# and ran eagerly around the kernels. The values drawn are Inductor's, as under
# ``torch.compile``, not eager PyTorch's: the same distribution, other draws. They depend
# on the seeds (taken from PyTorch's generator when the graph runs, so a restored
# generator state draws the same masks again, as activation checkpointing needs) and on
# each element's place, not on how Inductor schedules its kernels.


def native_random_ops(gm: fx.GraphModule, example_inputs: Sequence) -> int:
    """Rewrite ``gm``'s random ops into Inductor's own ([Note: random numbers in the
    remainder]); returns how many nodes were rewritten (0 with ``fallback_random``)."""
    from torch._guards import detect_fake_mode
    from torch._inductor import config
    from torch._inductor.fx_passes.replace_random import replace_random_passes
    from torch._inductor.pattern_matcher import stable_topological_sort
    from torch._inductor.virtualized import V

    if config.fallback_random or not any(
            n.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
            for n in gm.graph.nodes):
        return 0
    fake_mode = detect_fake_mode(list(example_inputs))
    with V.set_fake_mode(fake_mode) if fake_mode is not None else contextlib.nullcontext():
        count = replace_random_passes(gm)
    if count:
        stable_topological_sort(gm.graph)
        gm.graph.lint()
        gm.recompile()
    return count


# [Note: writing into an input the graph overwrites]
# A function that updates its input in place (``x += f(x)``, OpenFold's residual
# updates under ``inplace_safe``) reaches the backend functionalized: ``x1 = x + f(x)``,
# ``x2 = x1 + g(x1)``, ... and one ``x.copy_(xn)`` at the end (AOTAutograd keeps an
# inference graph's input mutations in the graph). Every ``xk`` then takes a new buffer
# while ``x``'s own buffer, which the caller holds, is kept alive only to be overwritten
# at the end: the graph needs one input-sized buffer more than the in-place code it came
# from. PyTorch's generic re-inplacing (``torch.fx.passes.reinplace``) leaves such inputs
# alone, and Inductor re-inplaces only scatter-like ops into them. Here an elementwise
# node ``xk = op(x_current, ...)`` whose output has the input's shape, strides and dtype
# is written into the input's buffer (``x.copy_(xk)``, which Inductor lowers to a kernel
# that stores into that buffer) when no other node reads the input's current value, or a
# view of it, after ``xk``; its users then read the copy. The final ``x.copy_(xn)``
# becomes a copy of the buffer onto itself and is dropped. Reads before the write stay
# before it: Inductor orders a mutation after the earlier reads of its buffer. Not
# covered: a Flashlight kernel whose epilogue absorbed the update (``x + attention``
# as one launch) still returns a new buffer, which the final copy moves into ``x``.


def write_into_overwritten_inputs(gm: fx.GraphModule) -> int:
    """Rewrite ``gm`` (an ATen inference graph with fake values in ``meta["val"]``) so
    that elementwise results are stored in the buffers of inputs the graph overwrites at
    its end ([Note: writing into an input the graph overwrites]); returns how many."""
    graph = gm.graph
    written = 0
    for node in list(graph.nodes):
        if node.op == "placeholder":
            final = _final_copy(node)
            if final is not None:
                written += _write_chain(graph, node, final)
    if written:
        graph.lint()
        gm.recompile()
    return written


def _final_copy(placeholder: fx.Node) -> fx.Node | None:
    """The one ``placeholder.copy_(value)`` of the graph, where it is the only node that
    writes the input and nothing reads the input after it."""
    copies = [u for u in placeholder.users if u.target is torch.ops.aten.copy_.default and u.args[0] is placeholder]
    val = placeholder.meta.get("val")
    if len(copies) != 1 or not isinstance(val, torch.Tensor) or _overlaps(val):
        return None
    final, storage = copies[0], _storage(val)
    node = final.next
    while node.op != "output":
        if any(_in(a, storage) for a in node.all_input_nodes):
            return None
        node = node.next
    return final


def _write_chain(graph: fx.Graph, placeholder: fx.Node, final: fx.Node) -> int:
    """Store each eligible elementwise value in ``placeholder``'s buffer, in graph order."""
    val = placeholder.meta["val"]
    current, written = placeholder, 0
    while True:
        order = _order(graph)
        target = _next_writer(current, val, order, final)
        if target is None:
            break
        with graph.inserting_after(target):
            copy = graph.call_function(torch.ops.aten.copy_.default, (placeholder, target))
        copy.meta["val"] = val
        target.replace_all_uses_with(copy, delete_user_cb=lambda user: user is not copy)
        current, written = copy, written + 1
    if written and final.args[1] is current:  # the buffer copied onto itself
        final.replace_all_uses_with(placeholder)
        graph.erase_node(final)
    return written


def _next_writer(current: fx.Node, val: torch.Tensor, order: dict, final: fx.Node) -> fx.Node | None:
    """The first elementwise user of ``current`` that may store into the input's buffer:
    the last reader of the buffer's current value, with the input's layout."""
    storage = _storage(val)
    readers = _readers(current, final) - {final}
    for user in sorted(current.users, key=order.get):
        if user is final or not _pointwise(user):
            continue
        out = user.meta.get("val")
        if not (isinstance(out, torch.Tensor) and out.shape == val.shape and out.dtype == val.dtype
                and out.stride() == val.stride()):
            continue
        others = [a for a in user.all_input_nodes if a is not current]
        if any(_in(a, storage) for a in others):
            continue  # it reads the buffer elsewhere too, e.g. through a transposed view
        if not all(order[r] < order[user] for r in readers if r is not user):
            continue
        # its value, once in the buffer, must be read before the final copy overwrites
        # it, unless it is what that copy writes (then the copy is dropped)
        if final.args[1] is user or all(order[r] < order[final] for r in _readers(user, final)):
            return user
    return None


def _readers(node: fx.Node, final: fx.Node) -> set[fx.Node]:
    """The nodes that read ``node``'s value, directly or through views of it."""
    views = _views(node, final)
    return {u for v in views for u in v.users if u not in views}


def _views(node: fx.Node, final: fx.Node) -> set[fx.Node]:
    """``node`` and the nodes that view its memory, transitively (not the final copy)."""
    storage = _storage(node.meta.get("val"))
    found, todo = {node}, [node]
    while todo:
        for user in todo.pop().users:
            if user not in found and user is not final and user.op == "call_function" \
                    and user.target is not torch.ops.aten.copy_.default \
                    and _in(user, storage):
                found.add(user)
                todo.append(user)
    return found


def _pointwise(node: fx.Node) -> bool:
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.pointwise in node.target.tags and not node.target._schema.is_mutable)


def _storage(val):
    """A key for the memory ``val`` (a fake tensor) lives in; None for other values."""
    if not isinstance(val, torch.Tensor):
        return None
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(val.untyped_storage())


def _in(node: fx.Node, storage) -> bool:
    """Whether ``node``'s value lives in ``storage`` (see :func:`_storage`)."""
    found = _storage(node.meta.get("val"))
    return found is not None and found == storage


def _overlaps(val: torch.Tensor) -> bool:
    """Whether ``val`` has elements that share memory (an expanded input)."""
    return any(st == 0 and n > 1 for n, st in zip(val.shape, val.stride()))


def _order(graph: fx.Graph) -> dict[fx.Node, int]:
    return {node: k for k, node in enumerate(graph.nodes)}

"""What a training forward saves for its backward.

AOTAutograd traces one joint graph of a forward and its backward, then a partition
function splits it and decides which forward values are saved. Left to its default,
the forward saves the softmax of every attention: a tensor over queries and keys per
head, the very tensor a fused kernel exists never to write. :func:`partition` asks
Flashlight's own pipeline which values its forward kernels keep inside their loops,
marks those to be recomputed in the backward (the policy tags of
``torch.utils.checkpoint``, which AOTAutograd's partitioners read), and lets
AOTAutograd's partitioner do the rest.

[Note: what the backward saves]
A forward kernel computes values of three kinds: its outputs, which go to memory
anyway; values over the dims of its loop (the scores, their exponentials, the
probabilities), which exist only as tiles; and values over its row dims that its loop
reductions produce (the row max and the row sum of a softmax). The backward saves the
first and the third (a few numbers per row) and recomputes the second tile by tile, as
FlashAttention's backward does: with the row max ``m`` and sum ``l`` saved,
``p = exp(s - m) / l`` is an elementwise function of recomputed scores, so the
backward's kernels need no second pass over the keys to normalise.

Which values are "over the loop's dims" is read off the lowered IR, not off shapes: a
nest is loop-local when a reduction reads it with one of its own axes bound to the
reduced dim, or when a loop-local nest reads it with one of its axes bound to an axis
that is loop-local there (``exp(s - m)`` makes ``s`` loop-local through its key axis,
and not ``m``, whose axes are row axes only). Only values that a kernel computes and
does not store are marked: an attention that a later attention reads as its queries is
a kernel's output, saved like any other.

For softmax to expose ``m`` and ``l`` the training graphs decompose ``_softmax`` and
its backward (:func:`flashlight.decompositions.decompositions`).
"""
from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx as fx

from flashlight.ir import Graph, Reduce, Ref
from flashlight.lower import lower
from flashlight.pipeline import compile_graph, fix_tile_sizes

log = logging.getLogger("flashlight")

__all__ = ["loop_local_nests", "partition", "recomputed_nodes"]

RECOMPUTE_TAG = "recompute"


def partition(joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int, **kwargs: Any):
    """AOTAutograd's default partition of ``joint``, after marking for recomputation
    the forward values Flashlight's kernels keep in their loops ([Note: what the backward
    saves])."""
    from torch._functorch.partitioners import default_partition
    from torch.utils.checkpoint import CheckpointPolicy

    from flashlight.backward_algebra import rewrite_row_terms, round_softmax_scores
    from flashlight.concatenations import split_concatenations

    try:  # the backward derived from a concatenation, rewritten with its forward
        split_concatenations(joint)  # [Note: reductions through a concatenation]
    except Exception as error:  # noqa: BLE001 - the graph as written is right, only slower
        log.warning("[flashlight] the concatenations of the joint graph stay as written: %s", error)
    try:
        round_softmax_scores(joint)  # [Note: a 16-bit softmax's scores rounded]
    except Exception as error:  # noqa: BLE001 - the shift as written is right, only less exact
        log.warning("[flashlight] the 16-bit softmax shifts stay as written: %s", error)
    try:
        rewrite_row_terms(joint)  # [Note: the softmax backward's row term]
    except Exception as error:  # noqa: BLE001 - the term as written is right, only slower
        log.warning("[flashlight] the softmax row terms stay as written: %s", error)
    try:
        names = recomputed_nodes(_forward_module(joint, num_fwd_outputs))
    except Exception as error:  # noqa: BLE001 - saving more is slower, never wrong
        log.warning("[flashlight] the backward saves what AOTAutograd chooses: %s", error)
        names = frozenset()
    names |= _repeats_and_their_views(joint)
    names |= _selections_tied_in_backward(joint, num_fwd_outputs)
    for node in joint.graph.nodes:  # topological order: a view's source is tagged first
        if node.name in names or _view_of_recomputed(node):
            node.meta[RECOMPUTE_TAG] = CheckpointPolicy.MUST_RECOMPUTE
    return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)


# A row max the forward saves and the backward compares for equality with the scores it
# computes again (the derivative of ``amax``: the keys equal to the max share its
# gradient) is computed again too, from the very scores compared: [Note: ties between
# recomputed values] in flashlight/lower_compare.py.
_SELECTIONS = frozenset({torch.ops.aten.amax.default, torch.ops.aten.amin.default})
_TIES = frozenset({torch.ops.aten.eq.Tensor, torch.ops.aten.ne.Tensor, torch.ops.aten.ge.Tensor,
                   torch.ops.aten.le.Tensor, torch.ops.aten.gt.Tensor, torch.ops.aten.lt.Tensor})


def _selections_tied_in_backward(joint: fx.GraphModule, num_fwd_outputs: int) -> frozenset[str]:
    """The float maxima and minima of the forward that a node outside the forward (the
    backward) compares with another tensor, looking through views and detaches."""
    forward = _forward_nodes(joint, num_fwd_outputs)[0]
    found = set()
    for node in joint.graph.nodes:
        value = node.meta.get("val")
        if node.target not in _SELECTIONS or not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            continue
        stack, seen = list(node.users), set()
        while stack:
            user = stack.pop()
            if user in seen:
                continue
            seen.add(user)
            if user.target is torch.ops.aten.detach.default or _is_view(user):
                stack.extend(user.users)
            elif user.target in _TIES and user not in forward:
                found.add(node.name)
    return frozenset(found)


# [Note: repeated values are not saved]
# Keys and values shared by a group of query heads are repeated for the matmuls
# (``k[:, :, None].expand(...).reshape(...)``, ``repeat_interleave``: a copy of an
# expand). Saved, the copy costs the group's size times the keys' memory, and the
# backward's kernels read each query head's copy, as if every head had keys of its own
# (the shared keys' gradient kernel then loads a key tile per head of the group).
# Recomputed, the backward reads the copy through to the shared tensor ([Note: a finer
# read of a producer] in passes/fusion.py), saved once.
def _repeats_and_their_views(joint: fx.GraphModule) -> frozenset[str]:
    """The repeats of ``joint`` ([Note: repeated values are not saved]) and the views they
    copy, back to the tensor viewed (so that tensor is saved, not a view of it whose
    strides hide the repeat from the backward's kernels)."""
    found = set()
    for node in joint.graph.nodes:
        if _repeats_a_smaller_value(node):
            found.add(node.name)
            source = node.args[0]
            # through views that keep or repeat their source's elements (unsqueeze,
            # expand, view), not through one that selects some of them (a slice)
            while isinstance(source, fx.Node) and _is_view(source) and _keeps_every_element(source):
                found.add(source.name)
                source = source.args[0]
    return frozenset(found)


def _keeps_every_element(view: fx.Node) -> bool:
    """Whether the view ``view`` holds every element of its source (as many, or repeated)."""
    source = view.args[0]
    return _known(_numel(source) <= _numel(view)) or _repeats(source, view)


def _repeats(small: Any, big: fx.Node) -> bool:
    """Whether the tensor ``big`` holds the tensor ``small``'s elements repeated (``small``
    expanded to ``big``'s shape: :func:`_broadcasts`)."""
    small, big = (n.meta.get("val") if isinstance(n, fx.Node) else None for n in (small, big))
    return isinstance(small, torch.Tensor) and isinstance(big, torch.Tensor) and _broadcasts(small.shape, big.shape)


def _numel(node) -> float:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value.numel() if isinstance(value, torch.Tensor) else float("inf")


def _is_view(node: fx.Node) -> bool:
    """Whether ``node`` returns a view of its first argument."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    return bool(schema is not None and node.args and schema.arguments
                and schema.arguments[0].alias_info is not None and not schema.arguments[0].alias_info.is_write)


def _repeats_a_smaller_value(node: fx.Node) -> bool:
    """Whether ``node`` copies an expand of a smaller tensor (a repeat)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.clone.default:
        return False
    source = node.args[0]
    if not (isinstance(source, fx.Node) and source.target is torch.ops.aten.expand.default):
        return False
    return _repeats(source.args[0], node)


def _broadcasts(small, big) -> bool:
    """Whether expanding ``small`` to ``big`` repeats its elements: a dim of size 1 (or a
    new leading dim) that becomes one known to be larger. Asked dim by dim, so that a
    symbolic repeat count ``H // h`` known above 1 by a guard is seen as such (the whole
    tensors' sizes, ``c * h * L`` against ``c * h * L * (H // h)``, are not compared so by
    the shape environment)."""
    offset = len(big) - len(small)
    return any(_known(size > 1) for size, within in
               ((size, k - offset) for k, size in enumerate(big)) if within < 0 or _known(small[within] == 1))


def _known(claim) -> bool:
    """Whether ``claim`` (about sizes, possibly symbolic) holds for every size, without
    adding a guard on them."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(claim))


def _view_of_recomputed(node: fx.Node) -> bool:
    """Whether ``node`` only re-indexes (or detaches) a value marked for recomputation:
    saving the view would save the value."""
    from torch._functorch.partitioners import must_recompute

    source = node.args[0] if node.op == "call_function" and node.args else None
    reindexes = node.target in _COPIES or _is_view(node)
    return reindexes and isinstance(source, fx.Node) and must_recompute(source)


_COPIES = {torch.ops.aten.clone.default, torch.ops.aten.detach.default, torch.ops.aten._unsafe_view.default}


def _forward_nodes(joint: fx.GraphModule, num_fwd_outputs: int) -> tuple[set[fx.Node], list[fx.Node]]:
    """The nodes of ``joint`` that its first ``num_fwd_outputs`` outputs need, and those
    outputs."""
    output = next(n for n in joint.graph.nodes if n.op == "output")
    results = [r for r in output.args[0][:num_fwd_outputs] if isinstance(r, fx.Node)]
    needed, stack = set(), list(results)
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    return needed, results


def _forward_module(joint: fx.GraphModule, num_fwd_outputs: int) -> fx.GraphModule:
    """The nodes of ``joint`` that its first ``num_fwd_outputs`` outputs need, as a
    graph returning those outputs (node names kept)."""
    needed, results = _forward_nodes(joint, num_fwd_outputs)
    graph, env = fx.Graph(), {}
    for node in joint.graph.nodes:  # topological order
        if node in needed:
            env[node] = graph.node_copy(node, lambda n: env[n])
            env[node].name = node.name
    graph.output(tuple(env[r] for r in results))
    return fx.GraphModule(joint, graph)


def recomputed_nodes(forward: fx.GraphModule) -> frozenset[str]:
    """The FX nodes of ``forward`` that Flashlight's kernels compute inside their loops
    and do not store: what the backward computes again. Sizes the kernels must know
    are fixed first, as the forward's compile will fix them (a head width left symbolic
    would keep the scores' matmul out of the kernel here, and the scores saved)."""
    lowered = lower(forward)
    if fix_tile_sizes(forward, (), lowered):
        lowered = lower(forward)
    plan = compile_graph(lowered)
    local = loop_local_nests(lowered.graph)
    stored = {name for node in plan.kernels for name in plan.nodes_of(node)}
    inside = {origin for tiled in plan.kernels.values() for origin in tiled.kernel.origins}
    return frozenset(name for name, nest in lowered.nest_of_node.items()
                     if nest in local and name in inside and name not in stored)


def loop_local_nests(graph: Graph) -> frozenset[str]:
    """The nests of ``graph`` read along the dim of a reduction that reads them, directly
    or through other loop-local nests ([Note: what the backward saves])."""
    loop_axes: dict[str, set[int]] = {}
    for consumer in reversed(graph.nests):  # every reader before what it reads
        own = consumer.axes
        looped = {d for k in loop_axes.get(consumer.name, ()) for d in own[k]}
        _mark_reads(consumer.body, frozenset(looped), loop_axes)
    return frozenset(name for name, axes in loop_axes.items() if axes)


def _mark_reads(expr, looped: frozenset, loop_axes: dict[str, set[int]]) -> None:
    """Record, for each nest ``expr`` reads, which of its axes are bound to ``looped``
    dims (the reduced dims around the read, and the loop-local axes of the reader)."""
    if isinstance(expr, Reduce):
        _mark_reads(expr.body, looped | frozenset(expr.dims), loop_axes)
        return
    if isinstance(expr, Ref):
        axes = loop_axes.setdefault(expr.nest, set())
        axes.update(k for k, axis in enumerate(expr.index) if any(d in looped for d in axis))
    for child in expr.children():
        _mark_reads(child, looped, loop_axes)


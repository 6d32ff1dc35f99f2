"""The IR's invariant checker: what every pass must keep of a graph of nests
(:func:`check_invariants`) and of a fused kernel (:func:`check_kernel_invariants`); the
pipeline runs it after every pass when ``FLASHLIGHT_CHECK_IR=1``, and tests always."""
from __future__ import annotations

import torch

from flashlight.ir import (Gather, Graph, Kernel, Load, LoopResult, Reduce, Ref, RunningMax, free_dims, walk)


class InvariantError(AssertionError):
    pass


def check_invariants(graph: Graph) -> None:
    """Structural invariants every pass must keep (run after each pass in tests).

    - nests are topologically ordered and reference only earlier nests or inputs;
    - a nest's free dims are exactly its output dims, with no dim used twice;
    - reductions bind dims that are not free outside them;
    - materialized nests exist.
    """
    seen: set[str] = set()
    for nest in graph.nests:
        out = nest.dims
        if len(set(out)) != len(out):
            raise InvariantError(f"{nest.name}: a dim appears twice in its axes {nest.axes}")
        free = free_dims(nest.body)
        if not free <= set(out):
            raise InvariantError(f"{nest.name}: body depends on {sorted(map(repr, free - set(out)))} not in its axes")
        for node in walk(nest.body):
            if isinstance(node, Ref) and node.nest not in seen:
                raise InvariantError(f"{nest.name}: reads {node.nest} before it is defined")
            if isinstance(node, (Load, Gather)) and node.base not in graph.inputs:
                raise InvariantError(f"{nest.name}: loads unknown input {node.base}")
            if isinstance(node, Gather) and any(p.dtype.is_floating_point for p in node.positions):
                raise InvariantError(f"{nest.name}: a gather from {node.base} at a float position")
            if isinstance(node, Reduce) and set(node.dims) & set(out):
                raise InvariantError(f"{nest.name}: reduction rebinds output dims")
        seen.add(nest.name)
    missing = graph.materialized - seen
    if missing:
        raise InvariantError(f"materialized nests missing: {sorted(missing)}")
    if not graph.recomputed <= graph.materialized:
        raise InvariantError(f"recomputed nests that are not materialized: {sorted(graph.recomputed - graph.materialized)}")
    if not graph.pinned <= graph.separate:
        raise InvariantError(f"pinned nests that are not kept separate: {sorted(graph.pinned - graph.separate)}")


def check_kernel_invariants(kernel: Kernel) -> None:
    """A kernel's loop shares one dim; its epilogue and liveness read only known dims."""
    loop_dims = {red.dim for red in kernel.loop}
    if len(loop_dims) != 1:
        raise InvariantError(f"{kernel.name}: loop reductions over several dims {loop_dims}")
    outer = frozenset(kernel.dims)
    for red in kernel.loop:
        if not free_dims(red.body) <= outer | loop_dims:
            raise InvariantError(f"{kernel.name}: a loop body reads dims outside the kernel")
        if red.init is not None and (red.op != "max" or not free_dims(red.init) <= outer
                                     or any(isinstance(n, (Reduce, RunningMax, LoopResult)) for n in walk(red.init))):
            raise InvariantError(f"{kernel.name}: a loop initial value that is not a max's row value")
    if not free_dims(kernel.epilogue) <= outer:
        raise InvariantError(f"{kernel.name}: the epilogue reads dims outside the output")
    for out in kernel.extra_outputs:
        dims = out.dims
        if len(set(dims)) != len(dims) or not set(dims) <= outer or not free_dims(out.epilogue) <= set(dims):
            raise InvariantError(f"{kernel.name}: output {out.name} is not over dims of the kernel")
        if any(isinstance(n, LoopResult) and n.index >= len(kernel.loop) for n in walk(out.epilogue)):
            raise InvariantError(f"{kernel.name}: output {out.name} reads a loop result the loop lacks")
    if kernel.live is not None:
        if kernel.live.dtype != torch.bool:
            raise InvariantError(f"{kernel.name}: live predicate of dtype {kernel.live.dtype}")
        if not free_dims(kernel.live) <= outer | loop_dims:
            raise InvariantError(f"{kernel.name}: live predicate reads dims outside the loop nest")
    if (kernel.full is None) != (kernel.unmasked is None) or (kernel.full is not None and kernel.live is None):
        raise InvariantError(f"{kernel.name}: a full-tile predicate needs its unmasked loop and a live predicate")
    if kernel.full is not None:
        if kernel.full.dtype != torch.bool or not free_dims(kernel.full) <= outer | loop_dims:
            raise InvariantError(f"{kernel.name}: full-tile predicate not boolean over the loop nest")
        shapes = [(r.op, r.dim, r.rescaled_by, r.dtype, r.init) for r in kernel.loop]
        if [(r.op, r.dim, r.rescaled_by, r.dtype, r.init) for r in kernel.unmasked] != shapes:
            raise InvariantError(f"{kernel.name}: the unmasked loop differs from the loop in more than its bodies")

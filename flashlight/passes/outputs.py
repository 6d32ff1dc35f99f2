"""Several outputs of one loop: kernels whose online loops coincide become one kernel.

[Note: several outputs]
A function may return several values computed from the same reductions over the keys:
the attention output and the row log-sum-exp (what a training forward keeps for its
backward), or the output with the row max and the row sum. Each returned value is a
materialized nest of its own, and the online pass makes each one a kernel with its own
loop; run separately, each of those kernels would read the scores' operands again.

Two online kernels ``A`` and ``B`` share their loop when ``B``'s loop reductions are
``A``'s written over other dims: a renaming ``sigma`` of ``B``'s dims onto ``A``'s
(one-to-one, equal sizes, ``B``'s loop dim onto ``A``'s) makes each reduction of ``B``
structurally equal to one of ``A``. ``sigma`` is found by unification: both trees are
walked together, and where they load the same tensor the dims that index it are paired.
A reduction of ``B`` equal to none of ``A``'s joins ``A``'s loop as a new one (a row sum
of squared scores next to the softmax: one more accumulator of the same loop) once
``sigma`` covers every dim it reads: its sub-expressions, largest first, are unified with
those of ``A``'s loop (the scores inside it with the scores inside the softmax); an
output dim of ``B`` that no shared tensor ties to ``A`` (the head width of the keys'
gradient, beside the values' gradient of a backward) is then paired with an output dim
of ``A`` of the same size that nothing else took, since ``B`` only stores along it (only
where some sub-expression along the loop unified: the merged loop then shares work). Dims a
reduction binds are only paired with dims a reduction binds, free dims with free dims,
so renaming never captures a dim. Then every output dim of ``B`` must be renamed
onto an output dim of ``A``; ``B``'s epilogue, renamed and reading ``A``'s loop results,
becomes an extra output of the merged kernel (:class:`flashlight.ir.KernelOutput`),
stored over its own dims (the log-sum-exp has no value-feature dim).

Renaming is exact (equal sizes, the same tensors at the same indices), so the merged
kernel computes every output as the separate kernels did, with one pass over the keys.
It runs where the first of its outputs was computed, or, where one of them reads a
value computed later (the keys' gradient reads the softmax row term, the values'
gradient does not), after the last value it reads, if nothing but views uses its
outputs before that (``flashlight.backoff._place``).
The kernel with the most output dims is taken as ``A`` (the attention output, not its
row statistics), so the others' dims can map into its dims.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from flashlight.indexing import sizes_equal
from flashlight.passes.online import NotOnline
from flashlight.ir import (
    Const,
    Dim,
    Expr,
    Gather,
    Iota,
    Kernel,
    KernelOutput,
    Load,
    LoopReduction,
    LoopResult,
    Pointwise,
    Reduce,
    Ref,
    RunningMax,
    free_dims,
    rebuild,
    replace_nodes,
    substitute,
    walk,
)


class NotShared(NotOnline):
    """The kernels do not share one loop; the message says why."""


def primary_first(kernels: Sequence[Kernel]) -> list[Kernel]:
    """``kernels`` with the one of most output dims first (ties: the given order)."""
    order = sorted(range(len(kernels)), key=lambda k: -len(kernels[k].dims))
    return [kernels[k] for k in order]


def merge_outputs(kernels: Sequence[Kernel]) -> Kernel:
    """One kernel storing the outputs of all ``kernels`` from one loop; the first is the
    primary (see [Note: several outputs]); raises :class:`NotShared`."""
    merged = kernels[0]
    for other in kernels[1:]:
        merged = merge_two(merged, other)
    return merged


def merge_two(a: Kernel, b: Kernel) -> Kernel:
    """``a`` with ``b``'s output (and ``b``'s extra outputs) computed from ``a``'s loop."""
    loop_a, loop_b = a.loop[0].dim, b.loop[0].dim
    if not sizes_equal(loop_a.size, loop_b.size):
        raise NotShared("loops over different extents")
    u = _Unifier({loop_b: loop_a}, _bound_dims(b), _bound_dims(a))
    loop = list(a.loop)
    for k in _dependency_order(b.loop):
        red = b.loop[k]
        for j, target in enumerate(loop):
            if u.attempt(lambda t=target: u.reduction(red, t)):
                u.index[k] = j
                break
        else:
            if _anchor(red, loop, u):
                _pair_output_dims(b, a, u)
            loop.append(_appended(red, u, frozenset(a.dims) | {loop_a}))
            u.index[k] = len(loop) - 1
    renamed = [KernelOutput(out.name, u.axes(out.axes), out.dtype, _renamed(out.epilogue, u))
               for out in b.outputs()]
    own = set(a.dims)
    for out in renamed:
        if not set(out.dims) <= own:
            raise NotShared(f"output {out.name} has a dim the primary output lacks")
    origins = tuple(sorted(set(a.origins) | set(b.origins)))
    return dataclasses.replace(a, loop=tuple(loop), origins=origins,
                               extra_outputs=(*a.extra_outputs, *renamed))


def _dependency_order(loop: tuple[LoopReduction, ...]) -> list[int]:
    """Loop indices with each reduction after the loop maxima it is rescaled by."""
    order: list[int] = []

    def visit(k: int) -> None:
        if k in order:
            return
        for j, _ in loop[k].rescaled_by:
            visit(j)
        order.append(k)

    for k in range(len(loop)):
        visit(k)
    return order


def _bound_dims(kernel: Kernel) -> frozenset[Dim]:
    return frozenset(d for red in kernel.loop for e in red.exprs() for n in walk(e)
                     if isinstance(n, Reduce) for d in n.dims)


def _subtrees(exprs) -> list[Expr]:
    """The distinct sub-expressions of ``exprs`` that read some dim, parents first."""
    seen: set[int] = set()
    found: list[Expr] = []
    for expr in exprs:
        for node in walk(expr):
            if id(node) not in seen and free_dims(node) | _own_dims(node):
                seen.add(id(node))
                found.append(node)
    return found


def _own_dims(node: Expr) -> frozenset[Dim]:
    return frozenset(node.dims) if isinstance(node, Reduce) else frozenset()


def _anchor(red: LoopReduction, loop: list[LoopReduction], u: "_Unifier") -> bool:
    """Pair the dims ``red`` reads with the primary's by unifying its sub-expressions,
    largest first, with those of the primary's loop ([Note: several outputs]); returns
    whether one that varies along the loop unified (the loop's work is shared)."""
    targets = _subtrees(e for r in loop for e in r.exprs())
    shared = False
    for x in _subtrees(red.exprs()):
        if free_dims(x) <= set(u.sigma):
            continue
        for y in targets:
            if type(y) is type(x) and u.attempt(lambda y=y: u.expr(x, y)):
                shared = shared or red.dim in free_dims(x)
                break
    return shared


def _pair_output_dims(b: Kernel, a: Kernel, u: "_Unifier") -> None:
    """Pair each output dim of ``b`` that unification left unnamed with an unpaired output
    dim of ``a`` of the same size, the one at the same position first ([Note: several
    outputs]: a dim no shared tensor ties to ``a`` is only stored along, and any dim of
    ``a``'s of its size can carry it)."""
    own = _all_dims(b)
    for k, x in enumerate(b.dims):
        if x in u.sigma or x in u.bound_b:
            continue
        if x in a.dims:  # the same dim in both kernels
            u.attempt(lambda: u.dim(x, x))
            continue
        same_place = [a.dims[k]] if k < len(a.dims) else []
        for y in same_place + [y for y in a.dims if y not in same_place]:
            if y not in own and y not in u.bound_a and u.attempt(lambda y=y: u.dim(x, y)):
                break


def _all_dims(kernel: Kernel) -> frozenset[Dim]:
    """Every dim ``kernel`` names: its output dims, loop dims and the dims it reduces."""
    found = set(kernel.dims) | {red.dim for red in kernel.loop} | set(_bound_dims(kernel))
    for red in kernel.loop:
        for e in red.exprs():
            found |= free_dims(e)
    return frozenset(found)


def _appended(red: LoopReduction, u: "_Unifier", dims: frozenset[Dim]) -> LoopReduction:
    """``red`` renamed onto the primary's dims (``dims``: those of its loop nest), as a
    new reduction of its loop."""
    free = set().union(*(free_dims(e) for e in red.exprs()))
    if not free <= set(u.sigma) or not {u.sigma[d] for d in free} <= dims:
        raise NotShared("a loop reduction reads dims the shared loop does not name")
    body = _renamed(red.body, u, loop=True)
    init = None if red.init is None else _renamed(red.init, u, loop=True)
    rescaled = tuple((u.index[k], c) for k, c in red.rescaled_by)
    return LoopReduction(red.op, body, u.sigma[red.dim], rescaled, red.dtype, init)


def _renamed(expr: Expr, u: "_Unifier", loop: bool = False) -> Expr:
    """``expr`` over the primary's dims, reading the merged loop's reductions."""
    mapping = {d: (e,) for d, e in u.sigma.items()}
    expr = substitute(expr, mapping)  # every index, bound dims' too; then the reductions' own dims
    expr = rebuild(expr, lambda n: dataclasses.replace(n, dims=tuple(u.sigma.get(d, d) for d in n.dims))
                   if isinstance(n, Reduce) and any(d in u.sigma for d in n.dims) else None)
    kind = RunningMax if loop else LoopResult
    return replace_nodes(expr, lambda n: kind(u.index[n.index], n.dtype) if isinstance(n, kind) else None)


class _Unifier:
    """A renaming of one kernel's dims onto another's, grown by unifying trees."""

    def __init__(self, sigma: dict[Dim, Dim], bound_b: frozenset[Dim], bound_a: frozenset[Dim]):
        self.sigma = dict(sigma)
        self.bound_b, self.bound_a = bound_b, bound_a  # dims some reduction binds
        self.index: dict[int, int] = {}  # loop reduction of b -> of the merged loop

    def attempt(self, unify) -> bool:
        """Run ``unify``; keep its pairings if it succeeds, else forget them."""
        saved = dict(self.sigma)
        if unify():
            return True
        self.sigma = saved
        return False

    def axes(self, axes):
        return tuple(tuple(self.sigma.get(d, d) for d in axis) for axis in axes)

    def dim(self, x: Dim, y: Dim) -> bool:
        if x in self.sigma:
            return self.sigma[x] == y
        if y in self.sigma.values() or not sizes_equal(x.size, y.size) \
                or (x in self.bound_b) != (y in self.bound_a):
            return False
        self.sigma[x] = y
        return True

    def index_axes(self, xs, ys) -> bool:
        return len(xs) == len(ys) and all(
            len(a) == len(b) and all(self.dim(d, e) for d, e in zip(a, b)) for a, b in zip(xs, ys))

    def reduction(self, x: LoopReduction, y: LoopReduction) -> bool:
        if (x.op, x.dtype) != (y.op, y.dtype) or (x.init is None) != (y.init is None):
            return False
        if sorted((self.index.get(k, -1), c) for k, c in x.rescaled_by) != sorted(y.rescaled_by):
            return False
        return self.dim(x.dim, y.dim) and self.expr(x.body, y.body) and (
            x.init is None or self.expr(x.init, y.init))

    def expr(self, x: Expr, y: Expr) -> bool:
        if type(x) is not type(y) or x.dtype != y.dtype:
            return False
        if isinstance(x, Const):
            return x == y
        if isinstance(x, Load):
            return x.base == y.base and self.index_axes(x.index, y.index)
        if isinstance(x, Ref):
            return x.nest == y.nest and self.index_axes(x.index, y.index)
        if isinstance(x, Gather):
            return x.base == y.base and len(x.positions) == len(y.positions) and all(
                self.expr(p, q) for p, q in zip(x.positions, y.positions))
        if isinstance(x, Iota):
            return self.index_axes((x.axis,), (y.axis,))
        if isinstance(x, RunningMax):
            return self.index.get(x.index) == y.index
        if isinstance(x, Reduce):
            return (x.op == y.op and len(x.dims) == len(y.dims)
                    and all(self.dim(d, e) for d, e in zip(x.dims, y.dims)) and self.expr(x.body, y.body))
        if isinstance(x, Pointwise):
            return x.op == y.op and len(x.args) == len(y.args) and all(
                self.expr(p, q) for p, q in zip(x.args, y.args))
        return False

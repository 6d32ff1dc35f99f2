"""The compiler pipeline: lowered IR -> named passes -> tiled kernels.

    lower  ->  fuse_elementwise  ->  fuse_reductions  ->  read_materialized
           ->  make_online  ->  find_live_tiles  ->  tile  (per kernel)  ->  codegen

``compile_graph`` runs it, backing off fusion where a fused nest cannot become one
online kernel or cannot be tiled, or where its kernel would repeat the loop's work in
every program along a grid dim (see [Note: demotion legality] in
:mod:`flashlight.passes.fusion`).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from flashlight import settings
from flashlight.ir import (
    Dim,
    Graph,
    Kernel,
    Load,
    Nest,
    Reduce,
    Ref,
    TiledKernel,
    check_invariants,
    check_kernel_invariants,
    dim_names,
    contains,
    free_dims,
    rebuild,
    walk,
)
from flashlight.ir_print import format_graph, format_kernel
from flashlight.lower import Lowered
from flashlight.passes.fusion import fuse_elementwise, fuse_reductions
from flashlight.passes.online import NotOnline, fused_work, make_online
from flashlight.passes.skipping import find_live_tiles
from flashlight.passes.tiling import NotTileable, tile

log = logging.getLogger("flashlight")


@dataclasses.dataclass
class Plan:
    """What the pipeline decided for one graph."""

    kernels: dict[str, TiledKernel]  # FX node name -> the kernel computing it
    rejected: dict[str, str]  # FX node name -> why its nest is not a kernel
    graph: Graph


def _debug(title: str, text: str) -> None:
    if settings.debug_level() >= 2:
        log.warning("[flashlight] %s\n%s", title, text)


def read_materialized(graph: Graph, node_of_nest: dict[str, str]) -> Graph:
    """Turn reads of materialized nests into loads of their tensors (kernel inputs)."""
    dtype_of = {n.name: n.dtype for n in graph.nests}
    inputs = list(graph.inputs)

    def fn(node):
        if isinstance(node, Ref) and node.nest in graph.materialized:
            name = node_of_nest[node.nest]
            if name not in inputs:
                inputs.append(name)
            return Load(name, node.index, dtype_of[node.nest])
        return None

    nests = tuple(dataclasses.replace(n, body=rebuild(n.body, fn)) for n in graph.nests)
    return graph.replace(nests=nests, inputs=tuple(inputs))


PASSES: tuple[tuple[str, Callable[[Graph], Graph]], ...] = (
    ("fuse_elementwise", fuse_elementwise),
    ("fuse_reductions", fuse_reductions),
)


def run_passes(graph: Graph, node_of_nest: dict[str, str], check: bool = False) -> Graph:
    """Run the graph-level passes in order (checking invariants after each if asked)."""
    _debug("lowered IR", format_graph(graph))
    for name, fn in PASSES:
        graph = fn(graph)
        if check:
            check_invariants(graph)
        _debug(f"IR after {name}", format_graph(graph))
    graph = read_materialized(graph, node_of_nest)
    if check:
        check_invariants(graph)
    _debug("IR after read_materialized", format_graph(graph))
    return graph


def _backoff_candidates(lowered: Lowered, fused: Nest, keep: frozenset[str],
                        node_of_nest: dict[str, str]) -> list[str]:
    """The reduction producers inlined into ``fused`` that are not kept separate yet,
    earliest first."""
    return [nest.name for nest in lowered.graph.nests  # topological order
            if (nest.name != fused.name and node_of_nest.get(nest.name) in fused.origins
                and nest.name not in keep and contains(nest.body, Reduce))]


class NothingFused(NotOnline):
    """The nest is one ATen operation on its own: it runs as PyTorch does."""


def _kernel_for(nest: Nest, node: str, check: bool) -> TiledKernel:
    """One materialized nest as a tiled kernel; raises ``NotOnline`` or ``NotTileable``."""
    kernel = make_online(nest)
    if not fused_work(kernel):
        raise NothingFused("a single operation with nothing fused into it")
    if check:
        check_kernel_invariants(kernel)
    _debug(f"online form of {node}", format_kernel(kernel))
    kernel = find_live_tiles(kernel)
    if check:
        check_kernel_invariants(kernel)
    if kernel.live is not None:
        _debug(f"tile liveness of {node}", format_kernel(kernel))
    tiled = tile(kernel)
    _debug(f"tiling of {node}", repr(tiled.tiling))
    return tiled


def _attempt(graph: Graph, name: str, node_of_nest: dict[str, str]) -> TiledKernel | bool | None:
    """Nest ``name`` of ``graph`` as a kernel; False if it cannot become one, None if it
    is a single operation left to PyTorch or no longer a nest of its own."""
    nest = next((n for n in graph.nests if n.name == name), None)
    if nest is None:
        return None
    try:
        return _kernel_for(nest, node_of_nest[name], check=False)
    except NothingFused:
        return None
    except (NotOnline, NotTileable):
        return False


def _spread_grid(tiled: TiledKernel) -> set[Dim]:
    """The grid dims of ``tiled`` with more than one program along them."""
    return {d for d in tiled.tiling.grid if not (d.is_static and d.size == 1)}


def _repeated(tiled: TiledKernel, exprs, only_along_loop: bool) -> bool:
    """Whether a loop reduction of ``tiled``, or a reduction inside ``exprs`` (only those
    over loop values if ``only_along_loop``), is free of a grid dim with several programs."""
    grid = _spread_grid(tiled)
    loop_dims = {red.dim for red in tiled.kernel.loop}
    if any(grid - free_dims(loop.body) for loop in tiled.kernel.loop):
        return True
    return any(isinstance(node, Reduce) and grid - free_dims(node)
               and (free_dims(node) & loop_dims or not only_along_loop)
               for e in exprs for node in walk(e))


def recomputes_across_grid(tiled: TiledKernel) -> bool:
    """Whether some reduction of ``tiled`` is free of one of its grid dims, so that every
    program along that dim computes it again: e.g. a softmax's row statistics in a
    kernel with a program per output feature (attention averaged over heads, fused with
    the heads as its loop and the keys eliminated into tiles)."""
    kernel = tiled.kernel
    exprs = [kernel.epilogue, *(e for loop in kernel.loop for e in loop.exprs())]
    return _repeated(tiled, exprs, only_along_loop=False)


def repeats_loop_work(tiled: TiledKernel) -> bool:
    """Whether work done at every step of the loop is free of one of the grid dims, so
    that every program along that dim repeats it over all the loop: a loop reduction, or
    an inner reduction of the loop's values (a key projection, a key norm) in a kernel
    with a program per query. Unlike :func:`recomputes_across_grid`, a reduction before
    the loop (a norm of the query row, a mean of a weight) does not count: its cost does
    not grow with the loop."""
    exprs = [e for loop in tiled.kernel.loop for e in loop.exprs()]
    return _repeated(tiled, exprs, only_along_loop=True)


def _rescuing_cut(base: Graph, failed: Nest, candidates: list[str], node_of_nest: dict[str, str]) -> str | None:
    """The candidate to keep separate so that ``failed`` stops failing.

    First choice: the earliest candidate whose materialization alone lets ``failed``
    compile, into a kernel that computes nothing again across its grid. The cut then
    falls where the failing part starts: an epilogue reduction (a norm of q dividing the
    attention output) becomes its own nest and the attention still fuses; of two
    attentions in a chain the first one's output is kept, not its scores. Else the
    earliest candidate that becomes a kernel itself: an output projection after the
    attention then runs as PyTorch's matmul on the attention kernel's output (the rest
    is examined again on the next round). Last, a rescue whose kernel recomputes
    reductions across its grid (:func:`recomputes_across_grid`). See
    [Note: demotion legality] in :mod:`flashlight.passes.fusion`.
    """
    trials, wasteful = [], []
    with settings.override(debug=0):
        for candidate in candidates:
            graph = run_passes(base.replace(materialized=base.materialized | {candidate}), node_of_nest)
            rescued = _attempt(graph, failed.name, node_of_nest)
            if rescued and not recomputes_across_grid(rescued):
                return candidate
            if rescued:
                wasteful.append(candidate)
            trials.append((candidate, graph))
        for candidate, graph in trials:
            if _attempt(graph, candidate, node_of_nest):
                return candidate
    return wasteful[0] if wasteful else None


def _row_dims(kernel: Kernel) -> list[Dim]:
    """The output dims every loop reduction is computed per (an attention's batch, heads
    and queries, not its value features), the tiling's preferred row first: dynamic,
    then larger."""
    common = frozenset(kernel.dims)
    for red in kernel.loop:
        common &= free_dims(red.body)
    rows = [d for d in kernel.dims if d in common]
    return sorted(rows, key=lambda d: (not d.is_static, d.size if d.is_static else 0), reverse=True)


def _read_along_loop_only(kernel: Kernel, tensor: str, row: Dim) -> bool:
    """Whether ``kernel`` reads ``tensor`` inside its loop, always along the loop dim and
    never along ``row``: a key-side value (key norms, a key or value projection), not a
    matrix over rows and keys."""
    loop_dims = {red.dim for red in kernel.loop}
    reads = [free_dims(node) for red in kernel.loop for e in red.exprs() for node in walk(e)
             if isinstance(node, Load) and node.base == tensor]
    return bool(reads) and all(read & loop_dims and row not in read for read in reads)


def _online_with(base: Graph, cuts: set[str], name: str, node_of_nest: dict[str, str]) -> Kernel | None:
    """The online form of nest ``name`` once ``cuts`` are kept separate too, or None."""
    graph = run_passes(base.replace(materialized=base.materialized | cuts), node_of_nest)
    nest = next((n for n in graph.nests if n.name == name), None)
    try:
        return make_online(nest) if nest is not None else None
    except NotOnline:
        return None


def _relieving_cuts(base: Graph, lowered: Lowered, nest: Nest, tiled: TiledKernel,
                    node_of_nest: dict[str, str]) -> frozenset[str]:
    """For a kernel that repeats work of its loop across its grid
    (:func:`repeats_loop_work`): the reduction producers to keep separate so that it no
    longer does, or nothing.

    For each row dim the kernel's loop reductions share (the tiling's preference
    first), the producers that, each kept separate on its own, are read inside the loop
    along the loop dim but not along that row (key norms, key and value projections: the
    reductions that block that row, see ``Layouts._inner_reduce``) are kept separate
    together; they are taken if the kernel then repeats nothing. A producer read along
    both the row and the loop (the scores, a distance matrix) is never one of them, so no
    ``rows x keys`` matrix is materialized that the kernel kept in registers.
    """
    if not repeats_loop_work(tiled):
        return frozenset()
    candidates = _backoff_candidates(lowered, nest, base.materialized, node_of_nest)
    with settings.override(debug=0):
        trials = {c: _online_with(base, {c}, nest.name, node_of_nest) for c in candidates}
        for row in _row_dims(tiled.kernel):
            cuts = frozenset(c for c, kernel in trials.items()
                             if kernel is not None and _read_along_loop_only(kernel, node_of_nest[c], row))
            if not cuts:
                continue
            graph = run_passes(base.replace(materialized=base.materialized | cuts), node_of_nest)
            relieved = _attempt(graph, nest.name, node_of_nest)
            if relieved and not repeats_loop_work(relieved):
                return cuts
    return frozenset()


def _operand_cut(base: Graph, lowered: Lowered, failed: Nest, node_of_nest: dict[str, str]) -> str | None:
    """For a nest no producer cut rescues: the elementwise operand its own ATen op reads
    (before fusion inlined it), latest first, that becomes a kernel of its own. Only what
    fails (an output projection contracting two dims, say) is then left to PyTorch, and
    the elementwise work before it (a sigmoid gate times the attention output, with the
    gate's projection) still runs fused. Else the latest operand of any kind."""
    written = next((nest for nest in lowered.graph.nests if nest.name == failed.name), None)
    if written is None:
        return None
    nests = {nest.name: nest for nest in lowered.graph.nests}
    operands = {node.nest for node in walk(written.body) if isinstance(node, Ref)}
    elementwise = [name for name in nests if name in operands and name in node_of_nest
                   and name not in base.materialized and not contains(nests[name].body, Reduce)]
    with settings.override(debug=0):
        for candidate in reversed(elementwise):
            graph = run_passes(base.replace(materialized=base.materialized | {candidate}), node_of_nest)
            if _attempt(graph, candidate, node_of_nest):
                return candidate
    # none is a kernel as it stands: keep the latest operand anyway, so the failing op
    # runs on its own and the operand is compiled (backing off in turn) next round
    pending = [name for name in nests if name in operands and name in node_of_nest and name not in base.materialized]
    return pending[-1] if pending else None


def compile_graph(lowered: Lowered, check: bool = False) -> Plan:
    """Fuse, rewrite online and tile; back off fusion until every fused nest is a kernel
    or is left to PyTorch with the reason."""
    with dim_names(lowered.next_dim_id):
        return _compile_graph(lowered, check)


def _compile_graph(lowered: Lowered, check: bool) -> Plan:
    node_of_nest = {v: k for k, v in lowered.nest_of_node.items()}
    base = lowered.graph
    while True:
        graph = run_passes(base, node_of_nest, check)
        kernels: dict[str, TiledKernel] = {}
        rejected: dict[str, str] = {}
        retry = False
        for nest in graph.nests:
            if nest.name not in graph.materialized or nest.name not in node_of_nest:
                continue
            node = node_of_nest[nest.name]
            try:
                kernels[node] = _kernel_for(nest, node, check)
            except (NotOnline, NotTileable) as why:
                candidates = _backoff_candidates(lowered, nest, base.materialized, node_of_nest)
                candidate = _rescuing_cut(base, nest, candidates, node_of_nest)
                if candidate is None and isinstance(why, NotTileable) and candidates:
                    candidate = candidates[0]  # no single cut is enough: back off one step and retry
                if candidate is None and not isinstance(why, NothingFused):
                    candidate = _operand_cut(base, lowered, nest, node_of_nest)
                if candidate is None:
                    rejected.update({origin: str(why) for origin in nest.origins})
                    continue
                base = base.replace(materialized=base.materialized | {candidate})
                _debug("backoff", f"{node}: {why}; keeping {candidate} separate")
                retry = True
                break
            cuts = _relieving_cuts(base, lowered, nest, kernels[node], node_of_nest)
            if cuts:
                base = base.replace(materialized=base.materialized | cuts)
                _debug("backoff", f"{node}: repeats its loop's work across its grid; "
                                  f"keeping {', '.join(sorted(cuts))} separate")
                retry = True
                break
        if not retry:
            return Plan(kernels, rejected, graph)

"""The compiler pipeline: lowered IR -> named passes -> tiled kernels.

:data:`GRAPH_PASSES` run on the whole lowered graph, :data:`KERNEL_PASSES` on each
materialized nest; codegen (:mod:`flashlight.codegen`) then prints each tiled kernel.
After each pass its invariant checker runs when ``FLASHLIGHT_CHECK_IR=1`` (or
``compile_graph(..., check=True)``), in back-off trials too, and ``FLASHLIGHT_DEBUG=2``
logs what the pass produced.

:func:`compile_graph` hands the pipeline to the back-off search
(:mod:`flashlight.backoff`), which keeps fused producers separate where a fused nest
cannot become one online kernel or cannot be tiled, or where its kernel would repeat
the loop's work in every program along a grid dim.

A new pass goes into one of the two lists, with its checker and its printer.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import torch
import torch.fx as fx

from flashlight import settings
from flashlight.backoff import Plan, recomputes_across_grid, repeats_loop_work, search
from flashlight.indexing import base_symbols
from flashlight.ir import (
    Graph,
    Kernel,
    Load,
    Nest,
    Reduce,
    Ref,
    TiledKernel,
    contains,
    dim_names,
    free_dims,
    rebuild,
    walk,
)
from flashlight.ir_check import check_invariants, check_kernel_invariants
from flashlight.ir_print import format_graph, format_kernel, format_tiled
from flashlight.lower import Lowered
from flashlight.passes.base2 import RESCALE_THRESHOLD, check_base2, to_base2
from flashlight.passes.divisors import hoist_divisors
from flashlight.passes.exponentials import exps_in_base2
from flashlight.passes.fusion import fuse_elementwise, fuse_reductions, producers
from flashlight.passes.online import NotOnline, make_online, online_kernel
from flashlight.passes.outputs import merge_outputs
from flashlight.passes.skipping import find_live_tiles
from flashlight.passes.tile_plan import check_plan
from flashlight.passes.tiling import MAX_TILE, length_symbols, sizes_to_fix, tile

__all__ = ["GRAPH_PASSES", "KERNEL_PASSES", "Plan", "compile_graph", "recomputes_across_grid",
           "fix_tile_sizes", "repeats_loop_work", "tile_sizes_to_fix"]

log = logging.getLogger("flashlight")


@dataclasses.dataclass(frozen=True)
class Pass:
    """One named pass: ``run(value, context)``, then ``check(result)`` when checking,
    and ``show(result)`` logged under ``title`` (``{node}``: the FX node compiled)."""

    name: str
    run: Callable[[Any, "Context"], Any]
    check: Callable[[Any], None]
    show: Callable[[Any], str]
    title: str


@dataclasses.dataclass(frozen=True)
class Context:
    """What a pass may need besides its input: the FX node of each nest, and the node
    being compiled (kernel passes)."""

    node_of_nest: dict[str, str]
    node: str = ""
    # results the passes keep for the rest of the compile ([Note: inlining again in a search])
    memo: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)


def _rescale_threshold() -> float | None:
    """The lazy rescaling threshold the settings ask for ([Note: lazy rescaling])."""
    return RESCALE_THRESHOLD if settings.get("lazy_rescale") else None


def read_materialized(graph: Graph, context: Context) -> Graph:
    """Turn reads of materialized nests into loads of their tensors (kernel inputs)."""
    dtype_of = {n.name: n.dtype for n in graph.nests}
    inputs = list(graph.inputs)
    nests = []
    for nest in graph.nests:
        body, loaded = _reading_materialized(nest, graph.materialized, dtype_of, context)
        nests.append(dataclasses.replace(nest, body=body))
        inputs.extend(name for name in loaded if name not in inputs)
    return graph.replace(nests=tuple(nests), inputs=tuple(inputs))


def _reading_materialized(nest: Nest, materialized: frozenset[str], dtype_of: dict, context: Context):
    """``nest``'s body with its reads of ``materialized`` nests turned into loads, and the
    tensors it then loads in the order it reads them; kept by the body and the nests
    it reads that are materialized ([Note: inlining again in a search])."""
    read = tuple(name for name in producers(nest, context.memo) if name in materialized)
    key = ("read_materialized", id(nest.body), read)
    if key not in context.memo:
        loaded: list[str] = []

        def fn(node):
            if isinstance(node, Ref) and node.nest in materialized:
                name = context.node_of_nest[node.nest]
                if name not in loaded:
                    loaded.append(name)
                return Load(name, node.index, dtype_of[node.nest])
            return None

        context.memo[key] = ((rebuild(nest.body, fn), tuple(loaded)), nest.body)
    return context.memo[key][0]


GRAPH_PASSES: tuple[Pass, ...] = (
    Pass("fuse_elementwise", lambda g, c: fuse_elementwise(g, c.memo), check_invariants, format_graph,
         "IR after fuse_elementwise"),
    Pass("fuse_reductions", lambda g, c: fuse_reductions(g, c.memo), check_invariants, format_graph,
         "IR after fuse_reductions"),
    Pass("read_materialized", read_materialized, check_invariants, format_graph,
         "IR after read_materialized"),
)


def online_form(value: Nest | tuple[Nest, ...], context: Context):
    """The online kernel of a nest; of a group of nests, one kernel storing each nest's
    value from one loop ([Note: several outputs] in :mod:`flashlight.passes.outputs`)."""
    if isinstance(value, Nest):
        return online_kernel(value)
    return merge_outputs([make_online(nest) for nest in value])


KERNEL_PASSES: tuple[Pass, ...] = (
    Pass("make_online", online_form, check_kernel_invariants, format_kernel,
         "online form of {node}"),
    Pass("find_live_tiles", lambda k, _: find_live_tiles(k), check_kernel_invariants, format_kernel,
         "tile liveness of {node}"),
    Pass("to_base2", lambda k, _: to_base2(k, _rescale_threshold()), check_base2, format_kernel,
         "base-2 form of {node}"),
    Pass("hoist_divisors", lambda k, _: hoist_divisors(k), check_kernel_invariants, format_kernel,
         "broadcast divisors of {node}"),
    Pass("exps_in_base2", lambda k, _: exps_in_base2(k), check_kernel_invariants, format_kernel,
         "other exponentials of {node} in base 2"),
    Pass("tile", lambda k, _: tile(k), check_plan, format_tiled, "tiling of {node}"),
)


def _debug(title: str, text: str) -> None:
    if settings.debug_level() >= 2:
        log.warning("[flashlight] %s\n%s", title, text)


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """The passes of one compile (the :class:`flashlight.backoff.Compiler` the search runs).

    [Note: one result per input in a search]
    The back-off search compiles the same inputs many times: each round runs the graph
    passes on the whole graph and the kernel passes on every nest again, and each trial
    cut runs the graph passes once more; a nest no cut touches comes out of the graph
    passes equal to itself. On a whole Evoformer block that was 480 graph runs and 844
    kernel runs for one graph (three minutes on a 2-core CPU). The passes are pure
    functions of their input (fresh dims only name new loops), so the pipeline keeps
    each result, failures included, for the life of one compile: a graph by its nests
    and which of them are kept separate, a kernel by its nests (structural equality)
    and FX node. Only the dims' numbers differ from running the passes again."""

    context: Context
    check: bool
    graph_passes: tuple[Pass, ...] = GRAPH_PASSES
    kernel_passes: tuple[Pass, ...] = KERNEL_PASSES
    _results: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def run(self, passes: tuple[Pass, ...], value, trace: bool, context: Context):
        for p in passes:
            value = p.run(value, context)
            if self.check:
                p.check(value)
            if trace and settings.debug_level() >= 2:  # printing the IR is not free
                _debug(p.title.format(node=context.node), p.show(value))
        return value

    def graph(self, base: Graph, trace: bool = True) -> Graph:
        if trace and settings.debug_level() >= 2:
            _debug("lowered IR", format_graph(base))
        key = ("graph", id(base.nests), base.inputs, base.materialized, base.recomputed, base.pinned)
        return self._once(key, trace, lambda: self.run(self.graph_passes, base, trace, self.context),
                          keep=base.nests)  # so that their id stays theirs

    def kernel(self, nest: Nest | tuple[Nest, ...], node: str, trace: bool = True) -> TiledKernel:
        context = dataclasses.replace(self.context, node=node)
        return self._once(("kernel", nest, node), trace,
                          lambda: self.run(self.kernel_passes, nest, trace, context))

    def _once(self, key: tuple, trace: bool, compute: Callable[[], Any], keep: Any = None):
        """``compute()``, or what it gave (or raised) for ``key`` earlier in this compile
        ([Note: one result per input in a search]). At ``FLASHLIGHT_DEBUG=2`` a traced call
        runs the passes again, so that the IR after each of them is logged."""
        if key in self._results and not (trace and settings.debug_level() >= 2):
            ok, value, _ = self._results[key]
            if ok:
                return value
            raise value
        try:
            value = compute()
        except Exception as error:
            self._results[key] = (False, error, keep)
            raise
        self._results[key] = (True, value, keep)
        return value


def pipeline_for(lowered: Lowered, check: bool = False) -> Pipeline:
    """The pipeline compiling ``lowered``; checking after each pass if ``check`` or
    ``FLASHLIGHT_CHECK_IR``."""
    context = Context({v: k for k, v in lowered.nest_of_node.items()})
    return Pipeline(context, check or settings.get("check_ir"))


def compile_graph(lowered: Lowered, check: bool = False) -> Plan:
    """Fuse, rewrite online and tile; back off fusion until every fused nest is a kernel
    or is left to PyTorch with the reason."""
    pipeline = pipeline_for(lowered, check)
    with dim_names(lowered.next_dim_id):
        return search(lowered, pipeline, _debug)


def tile_sizes_to_fix(lowered: Lowered) -> frozenset[str]:
    """The symbols of the sizes the fused kernels of ``lowered`` need static to tile
    ([Note: sizes a tile must know] in :mod:`flashlight.passes.tiling`): of a width of
    several sizes (queries concatenated with a rotary part, ``d + r``; a head width split
    off a projection, ``(H c) // H``), each symbol but a loop's extent, the heads too."""
    pipeline = pipeline_for(lowered)
    wanted: set[str] = set()
    lengths: set[str] = set()
    extents: set[str] = set()
    with dim_names(lowered.next_dim_id):
        graph = pipeline.graph(lowered.graph, trace=False)
        for nest in graph.nests:
            if nest.name not in graph.materialized:
                continue
            kernel = _kernel_or_cut(nest)
            if kernel is not None:
                wanted |= sizes_to_fix(kernel)
                lengths |= {n for text in length_symbols(kernel) for n in base_symbols(text)}
                extents |= base_symbols(str(kernel.loop[0].dim.size))
    symbols: set[str] = set()
    for text in wanted:
        free = base_symbols(text)
        # a width of several sizes (a head width split off a projection, ``(H c) // H``) is
        # static only with every one of them: only a loop's extent stays a runtime size
        symbols |= free - (extents if len(free) > 1 else lengths)
    return frozenset(symbols)


def _kernel_or_cut(nest: Nest) -> Kernel | None:
    """``nest`` as one online kernel; where it is none (two chained contractions over
    different extents, ``(p @ c) @ W``), the kernel the back-off would cut from it: the
    outermost reduction inside it over values that are reductions (``p @ c``) that is one
    online loop on its own (its parts, a softmax's row sum alone, are not kernels of the
    cut, and their lengths would not be the cut's); None where there is neither."""
    try:
        return make_online(nest)
    except NotOnline:
        pass
    for node in walk(nest.body):
        if isinstance(node, Reduce) and node is not nest.body and contains(node.body, Reduce):
            dims = sorted(free_dims(node), key=lambda d: d.name)
            try:
                return make_online(Nest(f"{nest.name}_part", tuple((d,) for d in dims), node, node.dtype,
                                        nest.origins))
            except NotOnline:
                continue
    return None


def fix_tile_sizes(gm: fx.GraphModule, example_inputs, lowered: Lowered) -> bool:
    """Fix the symbolic sizes the kernels of ``lowered`` (``gm`` lowered) need static
    (:func:`tile_sizes_to_fix`) whose value in this call fits one tile to that value,
    with a guard: a later call with another value compiles again ([Note: sizes a tile
    must know] in :mod:`flashlight.passes.tiling`). Returns whether one was fixed; the
    graph's sizes then read as numbers (lower it again). A graph of static sizes is left
    as it is without a look at its kernels."""
    sizes = _symbolic_sizes(gm, example_inputs)
    if not sizes:
        return False
    texts = tile_sizes_to_fix(lowered)
    fixed = False
    for size in sizes:
        expr = size.node.expr
        if expr.is_symbol and str(expr) in texts:
            hint = size.node.hint
            if isinstance(hint, int) and 1 < hint <= MAX_TILE:
                int(size)  # guards the size to its value in this call
                fixed = True
    return fixed


def _symbolic_sizes(gm: fx.GraphModule, example_inputs) -> list[torch.SymInt]:
    """The symbolic sizes of the graph's tensors and its size arguments."""
    found: list[torch.SymInt] = []
    for value in [*example_inputs, *(n.meta.get("val") for n in gm.graph.nodes)]:
        if isinstance(value, torch.SymInt):
            found.append(value)
        elif isinstance(value, torch.Tensor):
            found.extend(s for s in value.shape if isinstance(s, torch.SymInt))
    return found

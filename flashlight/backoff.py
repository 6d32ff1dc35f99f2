"""The back-off search: which fused producers to keep separate so every kernel compiles.

Fusion inlines every producer it can; a fused nest may then fail to become one online
kernel, fail to tile, or compile into a kernel that repeats its loop's work, or computes
a reduction again, in every program along a grid dim. :func:`search` then keeps
producers separate (materialized), one decision per round, and compiles again, until
every fused nest is a kernel or is left to PyTorch with the reason (see [Note: demotion
legality] in :mod:`flashlight.passes.fusion`). Kernels whose loops then coincide (the
attention output and its row log-sum-exp) become one kernel with several outputs
([Note: several outputs] in :mod:`flashlight.passes.outputs`).

Inputs: the lowered graph and a :class:`Compiler` that runs the pipeline's passes (the
graph passes on a whole graph, the kernel passes on one nest); trials run it quietly
(``trace=False``). Output: a :class:`Plan`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Protocol

from flashlight.ir import (
    Dim,
    Gather,
    Graph,
    Kernel,
    Load,
    Nest,
    Pointwise,
    Reduce,
    Ref,
    TiledKernel,
    contains,
    free_dims,
    walk,
)
from flashlight.lower import Lowered
from flashlight.passes.online import NothingFused, NotOnline, make_online
from flashlight.passes.tile_plan import kernel_exprs
from flashlight.passes.outputs import NotShared, merge_outputs, primary_first
from flashlight.passes.tiling import MAX_TILE, NotTileable
from flashlight.grid_work import recomputes_across_grid, repeats_loop_work, spread_grid, wide_grid_dims


@dataclasses.dataclass
class Plan:
    """What the pipeline decided for one graph."""

    kernels: dict[str, TiledKernel]  # FX node name -> the kernel computing it
    rejected: dict[str, str]  # FX node name -> why its nest is not a kernel
    graph: Graph | None
    # FX node name of a kernel with several outputs -> the FX nodes of its outputs, in order
    outputs: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def nodes_of(self, node: str) -> tuple[str, ...]:
        """The FX nodes the kernel registered under ``node`` computes, in output order."""
        return self.outputs.get(node, (node,))


class Compiler(Protocol):
    """The pipeline as the search runs it."""

    def graph(self, base: Graph, trace: bool = True) -> Graph:
        """The graph passes on ``base`` (its materialized nests kept separate)."""

    def kernel(self, nest: Nest | tuple[Nest, ...], node: str, trace: bool = True) -> TiledKernel:
        """The kernel passes on one materialized nest (or on a group of them, stored by
        one kernel); raises ``NotOnline``, ``NotTileable`` or ``NothingFused``."""


@dataclasses.dataclass(frozen=True)
class _Search:
    lowered: Lowered
    compiler: Compiler
    node_of_nest: dict[str, str]
    log: Callable[[str, str], None]
    online_forms: dict[Nest, Kernel | None] = dataclasses.field(default_factory=dict)
    pins: set[str] = dataclasses.field(default_factory=set)  # cuts that elementwise fusion respects too

    def trial(self, base: Graph, cuts, pin: bool = False) -> Graph:
        """The graph passes, quietly, with ``cuts`` kept separate too (``pin``: from
        elementwise fusion as well)."""
        return self.compiler.graph(base.pinning(cuts) if pin else base.keeping_separate(cuts), trace=False)

    def attempt(self, graph: Graph, name: str) -> TiledKernel | bool | None:
        """Nest ``name`` of ``graph`` as a kernel; False if it cannot become one, None if
        it is a single operation left to PyTorch or no longer a nest of its own."""
        nest = next((n for n in graph.nests if n.name == name), None)
        if nest is None:
            return None
        try:
            return self.compiler.kernel(nest, self.node_of_nest[name], trace=False)
        except NothingFused:
            return None
        except (NotOnline, NotTileable):
            return False

    def online(self, nest: Nest) -> Kernel | None:
        """The online form of ``nest``, or None if it has none; each nest's once per
        search ([Note: one result per input in a search] in :mod:`flashlight.pipeline`)."""
        if nest not in self.online_forms:
            try:
                self.online_forms[nest] = make_online(nest)
            except NotOnline:
                self.online_forms[nest] = None
        return self.online_forms[nest]

    def candidates(self, fused: Nest, keep: frozenset[str]) -> list[str]:
        """The reduction producers inlined into ``fused`` that are not kept separate yet,
        earliest first, a softmax's row statistics after the others
        ([Note: row statistics are cut last])."""
        return sorted(self.inlined(fused, keep, reductions=True), key=self.row_statistic)

    def inlined(self, fused: Nest, keep: frozenset[str], reductions: bool) -> list[str]:
        """The producers inlined into ``fused`` and not in ``keep``, with reductions or
        without, in topological order."""
        return [nest.name for nest in self.lowered.graph.nests
                if (nest.name != fused.name and self.node_of_nest.get(nest.name) in fused.origins
                    and nest.name not in keep and contains(nest.body, Reduce) == reductions)]

    @functools.cached_property
    def nests_by_name(self) -> dict[str, Nest]:
        return {nest.name: nest for nest in self.lowered.graph.nests}

    def row_statistic(self, name: str) -> bool:
        """Whether nest ``name`` is a softmax's row statistic: a max, or a sum of
        exponentials ([Note: row statistics are cut last])."""
        body, by_name = self.nests_by_name[name].body, self.nests_by_name
        if not isinstance(body, Reduce):
            return False
        if body.op == "max":
            return True
        summand, seen = body.body, set()
        while isinstance(summand, Ref) and summand.nest in by_name and summand.nest not in seen:
            seen.add(summand.nest)
            summand = by_name[summand.nest].body
        return body.op == "sum" and isinstance(summand, Pointwise) and summand.op == "exp"

    @functools.cached_property
    def score_terms(self) -> frozenset[str]:
        """The nests a softmax's row max reads, through nests computed pointwise, along
        the dim it reduces: the scores and every term of them (``(q W) c^T`` and
        ``q_pe k_pe^T`` in multi-head latent attention), each a matrix over rows and
        keys, whatever its size in this call."""
        by_name, found = self.nests_by_name, set()
        work = [(n.body.body, frozenset(n.body.dims)) for n in by_name.values()
                if isinstance(n.body, Reduce) and n.body.op == "max"]
        seen = set()
        while work:
            expr, keys = work.pop()
            for ref in (e for e in walk(expr) if isinstance(e, Ref) and e.nest in by_name):
                producer = by_name[ref.nest]
                along = frozenset(d for axis, index in zip(producer.axes, ref.index)
                                  if keys & set(index) for d in axis)
                if not along or (ref.nest, along) in seen:
                    continue
                seen.add((ref.nest, along))
                found.add(ref.nest)
                if not contains(producer.body, Reduce):
                    work.append((producer.body, along))
        return frozenset(found)


def search(lowered: Lowered, compiler: Compiler, log: Callable[[str, str], None]) -> Plan:
    """Compile ``lowered`` through ``compiler``, backing off fusion until every fused
    nest is a kernel or is left to PyTorch with the reason; ``log(title, text)`` is told
    each decision."""
    s = _Search(lowered, compiler, {v: k for k, v in lowered.nest_of_node.items()}, log)
    base = lowered.graph
    while True:
        graph = compiler.graph(base)
        plan, cuts = _round(s, base, graph)
        if not cuts:
            return _shared_loops(s, plan)
        base = base.keeping_separate(cuts).pinning(cuts & s.pins)


def _round(s: _Search, base: Graph, graph: Graph) -> tuple[Plan, frozenset[str]]:
    """Compile every materialized nest of ``graph``; stop at the first that needs a cut.
    Returns the plan and no cuts, or the cuts to make before the next round."""
    kernels: dict[str, TiledKernel] = {}
    rejected: dict[str, str] = {}
    for nest in graph.nests:
        if nest.name not in graph.materialized or nest.name not in s.node_of_nest:
            continue
        node = s.node_of_nest[nest.name]
        try:
            kernels[node] = s.compiler.kernel(nest, node)
        except (NotOnline, NotTileable) as why:
            cuts = _cut_for_failure(s, base, nest, why)
            if not cuts:
                rejected.update({origin: str(why) for origin in nest.origins})
                continue
            s.log("backoff", f"{node}: {why}; keeping {', '.join(sorted(cuts))} separate")
            return Plan(kernels, rejected, graph), cuts
        cuts = _relieving_cuts(s, base, nest, kernels[node])
        if cuts:
            s.log("backoff", f"{node}: repeats its loop's work across its grid; "
                             f"keeping {', '.join(sorted(cuts))} separate")
            return Plan(kernels, rejected, graph), cuts
        cuts = _prologue_cut(s, base, nest, kernels[node])
        if cuts:
            s.log("backoff", f"{node}: computes a key-side prologue again for every row block; "
                             f"keeping {', '.join(sorted(cuts))} separate")
            return Plan(kernels, rejected, graph), cuts
        wide = wide_grid_dims(kernels[node])
        if wide:
            del kernels[node]
            why = (f"its loop would run once for every position of a {wide[0].size}-wide dim "
                   f"(wider than the {MAX_TILE} a tile holds)")
            s.log("backoff", f"{node}: {why}; left to PyTorch")
            rejected.update({origin: why for origin in nest.origins})
            continue
        cuts = _sharing_cut(s, base, nest, kernels[node])
        if cuts:
            s.log("backoff", f"{node}: computes a reduction again in every program along a grid dim; "
                             f"keeping {', '.join(sorted(cuts))} separate")
            return Plan(kernels, rejected, graph), cuts
    return Plan(kernels, rejected, graph), frozenset()


def _cut_for_failure(s: _Search, base: Graph, nest: Nest, why: Exception) -> frozenset[str]:
    """The nests to keep separate so that failing ``nest`` compiles, or none: reject it.

    [Note: row statistics are cut last]
    Softmax arrives as its row max, exponentials, row sum and quotient, each a node the
    back-off may keep separate. A function of the final probabilities inside the key loop
    (an entropy ``p log p``, a threshold on ``p``) needs the row's final sum while the loop
    visits the keys, which no online loop has; keeping the two statistics separate (two
    small kernels over the rows, then the loop reading them) computes it with nothing of
    the size of rows x keys in memory. They are tried after every other rescue that keeps
    no such matrix (an attention followed by a layer norm keeps its output separate, not
    its statistics), alone and then together, and only where they let the failing nest
    compile; the scores themselves remain the last resort."""
    candidates = s.candidates(nest, base.separate)
    statistics = [c for c in candidates if s.row_statistic(c)]
    others = [c for c in candidates if c not in statistics]
    cut = _rescuing_cut(s, base, nest, others, matrices_last=False) or _rescuing_cut(
        s, base, nest, statistics, rescues_only=True)
    if cut is not None:
        return frozenset({cut})
    if len(statistics) > 1 and s.attempt(s.trial(base, set(statistics)), nest.name):
        return frozenset(statistics)
    cut = _rescuing_cut(s, base, nest, others)
    if cut is None and isinstance(why, NotTileable) and candidates:
        cut = candidates[0]  # no single cut is enough: back off one step and retry
    if cut is None and not isinstance(why, NothingFused):
        cut = _operand_cut(s, base, nest)
    return frozenset({cut}) if cut is not None else frozenset()


# ------------------------------------------------------------------ shared loops


def _shared_loops(s: _Search, plan: Plan) -> Plan:
    """``plan`` with kernels whose loops coincide stored by one kernel with several
    outputs ([Note: several outputs] in :mod:`flashlight.passes.outputs`), where that
    kernel compiles and repeats no more work across its grid than its parts."""
    nests = {n.name: n for n in plan.graph.nests}
    online: dict[str, Kernel] = {}
    for name, nest in nests.items():
        if s.node_of_nest.get(name) in plan.kernels and s.online(nest) is not None:
            online[name] = s.online(nest)
    groups: list[list[str]] = []
    for name in online:  # topological order
        for group in groups:
            try:
                merge_outputs(primary_first([online[n] for n in (*group, name)]))
            except NotShared:
                continue
            group.append(name)
            break
        else:
            groups.append([name])
    placed: dict[str, float] = {}  # FX node -> where a kernel placed late computes it
    read = {node.base for tiled in plan.kernels.values() for e in kernel_exprs(tiled.kernel)
            for node in walk(e) if isinstance(node, (Load, Gather))}  # values some kernel loads
    for group in (g for g in groups if len(g) > 1):
        members = [k.name for k in primary_first([online[n] for n in group])]
        nodes = tuple(s.node_of_nest[n] for n in members)
        place = _place(s, [online[n] for n in members], nodes, placed, read)
        if place is None:
            continue
        try:
            tiled = s.compiler.kernel(tuple(nests[n] for n in members), nodes[0])
        except (NotOnline, NotTileable):
            continue
        if repeats_loop_work(tiled) and not any(repeats_loop_work(plan.kernels[n]) for n in nodes):
            continue
        s.log("outputs", f"{', '.join(nodes)}: one loop, one kernel")
        for node in nodes[1:]:
            del plan.kernels[node]
        plan.kernels[nodes[0]] = tiled
        plan.outputs[nodes[0]] = nodes
        placed.update((node, place) for node in nodes)
    return plan


def _place(s: _Search, kernels: list[Kernel], nodes: tuple[str, ...], placed: dict[str, float],
           read: set[str]) -> float | None:
    """Where in the FX graph one kernel can compute all of ``nodes``, or None.

    Where the first of them was, when every tensor ``kernels`` load comes before it (none
    is computed from another's output); else just after the last tensor they load, when
    every use of ``nodes`` that computes comes after that (views of them move along; the
    backward's key and value gradients, say, are needed only at the end) and no other
    kernel loads them (``read``: what the plan's kernels load; a kernel placed where its
    first output was could otherwise come before them). ``placed``: the values of
    kernels already placed late, and where. Nodes the lowering did not place: no
    constraint."""
    order = {**s.lowered.order, **placed}
    first = min((order[n] for n in nodes if n in order), default=None)
    if first is None:
        return -1.0
    loads = {node.base for k in kernels for e in kernel_exprs(k) for node in walk(e) if isinstance(node, (Load, Gather))}
    if loads & set(nodes):
        return None  # one of them is computed from another's output
    last_load = max((order.get(base, -1) for base in loads), default=-1)
    if last_load < first:
        return float(first)
    uses = [order[u] for u in _computing_uses(s.lowered, nodes) if u in order]
    if any(n in placed or n in read for n in nodes) or not all(use > last_load for use in uses):
        return None
    return last_load + 0.5


def _computing_uses(lowered: Lowered, nodes: tuple[str, ...]) -> set[str]:
    """The FX users of ``nodes`` that compute, looking through views of them (which
    move with a kernel placed late: ``backend._stitch``)."""
    found, stack = set(), [u for n in nodes for u in lowered.users.get(n, ()) if u not in nodes]
    while stack:
        use = stack.pop()
        if use in lowered.views:
            stack.extend(lowered.users.get(use, ()))
        else:
            found.add(use)
    return found


# --------------------------------------------------------------------------- cuts


def _rescuing_cut(s: _Search, base: Graph, failed: Nest, candidates: list[str],
                  matrices_last: bool = True, rescues_only: bool = False) -> str | None:
    """The candidate to keep separate so that ``failed`` stops failing.

    First choice: the earliest candidate whose materialization alone lets ``failed``
    compile, into a kernel that computes nothing again across its grid. The cut then
    falls where the failing part starts: an epilogue reduction (a norm of q dividing the
    attention output) becomes its own nest and the attention still fuses; of two
    attentions in a chain the first one's output is kept, not its scores. Else the
    candidate that becomes a kernel itself, a term of the scores last whatever its size
    (``(q W) c^T`` in multi-head latent attention is smaller than the attention's output
    wherever the latent width exceeds the keys), then over the fewest lengths, then
    writing the fewest values, then the earliest: an output projection after the
    attention then runs as PyTorch's matmul on the attention kernel's output (the rest is
    examined again on the next round); but not one that writes more values than one
    of the rescues below (:func:`_elements`): a cut holds for every consumer, and the
    gradient of a mask, which sums score gradients over heads and queries, is rescued by
    keeping its sum over the queries, not ``dp``, which every other backward kernel
    then would read from memory. Last, a rescue whose kernel recomputes
    reductions across its grid (:func:`recomputes_across_grid`), which the next round
    may relieve (:func:`_relieving_cuts`), and after it a rescue that materializes a
    matrix over the kernel's rows and keys (:func:`_rows_by_keys`): the scores of an
    attention whose query is itself a reduction over the keys (a masked mean over the
    sequences, as global attention pools it) are never the cut while cutting the pooled
    query is possible (``matrices_last=False``: never those). ``rescues_only``: only a
    candidate whose cut lets ``failed`` compile, none of the fallbacks. See [Note:
    demotion legality] in :mod:`flashlight.passes.fusion`.
    """
    trials, wasteful, matrices = [], [], []
    for candidate in candidates:
        graph = s.trial(base, {candidate})
        rescued = s.attempt(graph, failed.name)
        if rescued and _rows_by_keys(rescued.kernel, s.node_of_nest[candidate]):
            matrices.append(candidate)
        elif rescued and not recomputes_across_grid(rescued):
            return candidate
        elif rescued:
            wasteful.append(candidate)
        trials.append((candidate, graph))
    if rescues_only:
        return next(iter(wasteful + matrices), None)
    least = min((_elements(s, c) for c in wasteful + matrices), default=None)
    # a term of the scores last (:attr:`_Search.score_terms`); then a value over fewer
    # lengths (dynamic sizes), then the fewest values written (then the earliest): of an
    # attention with its output projected, the attention's output, whatever the sizes
    for candidate, graph in sorted(trials, key=lambda trial: (
            trial[0] in s.score_terms, _lengths(s, trial[0]), _elements(s, trial[0]))):
        if (candidate not in matrices and (least is None or _elements(s, candidate) <= least)
                and s.attempt(graph, candidate)):
            return candidate
    return next(iter(wasteful + (matrices if matrices_last else [])), None)


_DYNAMIC_EXTENT = 256  # what a dynamic size counts for when cuts are compared (a length)


def _elements(s: _Search, name: str) -> int:
    """How many values keeping nest ``name`` separate writes to memory (a dynamic size
    counted as :data:`_DYNAMIC_EXTENT`)."""
    nest = next(n for n in s.lowered.graph.nests if n.name == name)
    return math.prod(d.size if d.is_static else _DYNAMIC_EXTENT for d in nest.dims)


def _lengths(s: _Search, name: str) -> int:
    """How many dims of nest ``name`` have a dynamic size (a length: the scores have two)."""
    nest = next(n for n in s.lowered.graph.nests if n.name == name)
    return sum(1 for d in nest.dims if not d.is_static)


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
    reads = _loop_reads(kernel, tensor)
    return bool(reads) and all(read & loop_dims and row not in read for read in reads)


def _rows_by_keys(kernel: Kernel, tensor: str) -> bool:
    """Whether ``kernel`` reads ``tensor`` inside its loop along the loop dim and along
    every row dim its loop reductions share: a matrix over rows and keys (the scores, a
    distance matrix), which a fused kernel keeps in registers, not a key-side value or
    a bias shared by some rows (a mask per batch row, a pair bias shared by MSA rows)."""
    loop_dims = {red.dim for red in kernel.loop}
    rows = set(_row_dims(kernel))
    return bool(rows) and any(read & loop_dims and rows <= read for read in _loop_reads(kernel, tensor))


def _loop_reads(kernel: Kernel, tensor: str) -> list[frozenset[Dim]]:
    """The dims of each load of ``tensor`` inside ``kernel``'s loop reductions."""
    return [free_dims(node) for red in kernel.loop for e in red.exprs() for node in walk(e)
            if isinstance(node, Load) and node.base == tensor]


def _online_with(s: _Search, base: Graph, cut: str, name: str) -> Kernel | None:
    """The online form of nest ``name`` once ``cut`` is kept separate too, or None."""
    nest = next((n for n in s.trial(base, {cut}).nests if n.name == name), None)
    return s.online(nest) if nest is not None else None


def _relieving_cuts(s: _Search, base: Graph, nest: Nest, tiled: TiledKernel) -> frozenset[str]:
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

    Else, where the loop itself is free of a grid dim (:func:`_broadcast_loop_cut`),
    the producer computing the loop's value is kept separate.
    """
    if not repeats_loop_work(tiled):
        return frozenset()
    trials = {c: _online_with(s, base, c, nest.name) for c in s.candidates(nest, base.separate)}
    per_row = []
    for row in _row_dims(tiled.kernel):
        cuts = frozenset(c for c, kernel in trials.items()
                         if kernel is not None and _read_along_loop_only(kernel, s.node_of_nest[c], row))
        per_row.append(cuts)
        if cuts and _relieves(s, base, nest, cuts):
            return cuts
    # the work repeats along more than one row dim (key projections along the queries,
    # a triangle bias shared by the batch rows along them): the rows' cuts together
    union = frozenset().union(*per_row)
    if union and len([cuts for cuts in per_row if cuts]) > 1 and _relieves(s, base, nest, union):
        return union
    return _broadcast_loop_cut(s, base, nest, tiled)


# [Note: key-side prologues computed once]
# An elementwise producer read inside the loop along the loop dim and never along the
# rows (rotary embeddings of the keys: ``k * cos + rotate_half(k) * sin``) is inlined
# into every program's loop, so each row block computes it again for every key tile:
# with rows spanning R row tiles, its work and its reads run R times. Where it reads
# PROLOGUE_READS or more input tiles per element (the rotated keys read the keys three
# times, at shifted feature positions, and the two tables) and the rows span more than
# two of the largest row tiles (a static size above PROLOGUE_MIN_ROWS), it is kept
# separate: computed once over the keys (by Inductor or PyTorch), it is one tile load in
# the loop. Measured on an H100 (bf16, causal attention with rotary embeddings, 16 heads
# of 64, the same run): 0.733 -> 0.427 ms at 4 x 4096 (FlexAttention, rotating first,
# 0.468), 0.246 -> 0.168 at 16 x 1024 (Flex 0.194), and 0.145 -> 0.150 at 64 x 256, where
# computing it twice costs less than the separate pass: hence the two tiles. Cheaper
# prologues (keys times a gate: two reads) stay fused, as do rows of symbolic length.
PROLOGUE_READS = 3
PROLOGUE_MIN_ROWS = 2 * 128  # two of the largest row tiles


def _prologue_cut(s: _Search, base: Graph, nest: Nest, tiled: TiledKernel) -> frozenset[str]:
    """The latest elementwise producer of ``nest`` that [Note: key-side prologues
    computed once] keeps separate, with the kernel still a kernel; else nothing."""
    row = tiled.tiling.row
    if row is None or not row.is_static or row.size <= PROLOGUE_MIN_ROWS:
        return frozenset()
    for name in reversed(s.inlined(nest, base.separate, reductions=False)):  # the latest covers its producers
        graph = s.trial(base, {name}, pin=True)
        kept = next((n for n in graph.nests if n.name == name), None)
        if kept is None or _input_reads(kept.body) < PROLOGUE_READS:
            continue
        fused = next((n for n in graph.nests if n.name == nest.name), None)
        kernel = s.online(fused) if fused is not None else None
        if kernel is not None and _read_along_loop_only(kernel, s.node_of_nest[name], row) \
                and s.attempt(graph, nest.name):
            s.pins.add(name)
            return frozenset({name})
    return frozenset()


def _input_reads(body) -> int:
    """How many reads of inputs ``body`` makes per element (loads and gathers)."""
    return len({node for node in walk(body) if isinstance(node, (Load, Gather))})


def _relieves(s: _Search, base: Graph, nest: Nest, cuts: frozenset[str]) -> bool:
    """Whether ``nest`` becomes a kernel that repeats no loop work once ``cuts`` are kept
    separate."""
    relieved = s.attempt(s.trial(base, cuts), nest.name)
    return bool(relieved) and not repeats_loop_work(relieved)


def _broadcast_loop_cut(s: _Search, base: Graph, nest: Nest, tiled: TiledKernel) -> frozenset[str]:
    """For a kernel whose loop reductions are free of one of its grid dims with several
    programs: its epilogue broadcasts the loop's value along that dim (an attention
    output, per column, times a gate per sequence of the column), so every program
    along it runs the whole loop again. The latest reduction producer that the fused
    nest then reads outside its reductions only, free of those dims, and whose cut
    leaves a nest that repeats nothing (or only elementwise work, left to PyTorch), is
    kept separate: the loop runs once per value, as its own kernel, and the broadcast
    reads its result. A value read inside a reduction (the scores, a distance matrix
    the loop runs over) is never the cut."""
    grid = spread_grid(tiled)
    repeated = frozenset(d for loop in tiled.kernel.loop for d in grid - free_dims(loop.body))
    if not repeated:
        return frozenset()
    for candidate in reversed(s.candidates(nest, base.separate)):
        graph = s.trial(base, {candidate})
        fused = next((n for n in graph.nests if n.name == nest.name), None)
        if fused is None:
            continue
        tensor = s.node_of_nest[candidate]
        reads = [free_dims(node) for node in walk(fused.body) if isinstance(node, Load) and node.base == tensor]
        inside = [node for red in walk(fused.body) if isinstance(red, Reduce) for node in walk(red.body)
                  if isinstance(node, Load) and node.base == tensor]
        if not reads or inside or any(read & repeated for read in reads):
            continue
        relieved = s.attempt(graph, nest.name)
        if relieved is None or (relieved and not repeats_loop_work(relieved)) or (
                relieved is False and not contains(fused.body, Reduce)):
            return frozenset({candidate})
    return frozenset()


def _sharing_cut(s: _Search, base: Graph, nest: Nest, tiled: TiledKernel) -> frozenset[str]:
    """For a kernel that computes a reduction again in every program along a grid dim
    (:func:`recomputes_across_grid`) but repeats no loop work: the earliest reduction
    producer whose cut leaves a kernel that computes nothing again, or nothing. A masked
    mean over the sequences, pooled into the query of every head in a kernel with a
    program per head, is then computed once per column and read by each head. A cut read
    inside the loop along its rows and keys (:func:`_rows_by_keys`) is never taken."""
    if not recomputes_across_grid(tiled) or repeats_loop_work(tiled):
        return frozenset()
    for candidate in s.candidates(nest, base.separate):
        relieved = s.attempt(s.trial(base, {candidate}), nest.name)
        if (relieved and not recomputes_across_grid(relieved) and not repeats_loop_work(relieved)
                and not _rows_by_keys(relieved.kernel, s.node_of_nest[candidate])):
            return frozenset({candidate})
    return frozenset()


def _operand_cut(s: _Search, base: Graph, failed: Nest) -> str | None:
    """For a nest no producer cut rescues: the elementwise operand its own ATen op reads
    (before fusion inlined it), latest first, that becomes a kernel of its own. Only what
    fails (an output projection contracting two dims, say) is then left to PyTorch, and
    the elementwise work before it (a sigmoid gate times the attention output, with the
    gate's projection) still runs fused. Else the latest operand of any kind."""
    written = next((nest for nest in s.lowered.graph.nests if nest.name == failed.name), None)
    if written is None:
        return None
    nests = {nest.name: nest for nest in s.lowered.graph.nests}
    operands = {node.nest for node in walk(written.body) if isinstance(node, Ref)}
    pending = [name for name in nests if name in operands and name in s.node_of_nest
               and name not in base.separate]
    for candidate in reversed([name for name in pending if not contains(nests[name].body, Reduce)]):
        if s.attempt(s.trial(base, {candidate}), candidate):
            return candidate
    # none is a kernel as it stands: keep the latest operand anyway, so the failing op
    # runs on its own and the operand is compiled (backing off in turn) next round
    return pending[-1] if pending else None

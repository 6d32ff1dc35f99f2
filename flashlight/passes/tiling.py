"""Tiling: which dims become tiles, which disappear, and which form the launch grid.

Every kernel runs as programs over a *logical grid* (one program per combination of
grid dims and per ``BLOCK_M`` rows). Inside a program, values are tiles of rank at
most two over *roles*: ``m`` (the row dim, ``BLOCK_M``), ``n`` (the loop dim,
``BLOCK_N``), ``f`` (a small output feature dim, one padded tile) and ``e0, e1, ...``
(small contracted dims, one padded tile each). A small dim that fits one tile is
*eliminated* as a loop: that is what turns ``softmax(Q Kᵀ) V`` into one loop over
``n`` with ``tl.dot`` on ``[m, e] x [e, n]`` and ``[m, n] x [n, f]``.

The pass tries every (row, feature) choice over the output dims, keeps those whose
every value has a legal tile layout, and picks the best by a small cost model: more
contractions as ``tl.dot`` first, then a dynamic or large row dim, then a feature tile.

[Note: sizes a tile must know]
A dim eliminated into one tile, or a feature tile, has its padded size written into the
kernel (``tl.arange`` needs a compile-time extent), so its size must be static. When
Dynamo makes every size of a graph symbolic (it does so for a tensor whose rank
changed between calls, say a batch dim added), the head width of an attention is
symbolic too, and no tiling could fuse its scores. :func:`sizes_to_fix` names the
symbolic sizes a kernel needs static: the dims a product is contracted over inside the
loop (``q . k``; a plain sum, such as a pooled query, is left to the back-off) and the
output dims the loop's statistics do not vary along. Never a length, though: a size
that is some kernel's loop extent or row dim (:func:`length_symbols`: the key length,
the number of sequences of an MSA) stays a runtime argument, even where a fused nest
that the back-off will split contracts over it; only a width of several sizes (a head
width split off a projection, ``(H c) // H``, the heads a row dim of the first fusion)
fixes every one of them but a loop's extent, since it is static with all of them or not
at all. The backend fixes the remaining sizes
whose value fits one tile to the value of this call, with a guard, so a call with
another head width compiles again (as Inductor specializes sizes it must know), and
lowers the graph again.

[Note: serial loops]
Some loops carry no contraction along their own dim: the gradient of a pair bias
broadcast over the rows of an MSA sums, over those rows, a score gradient that is
itself two contractions over the head width per (query, key) pair. Tiled the usual
way, the rows' dim is the ``n`` role and the queries and keys cannot both be tiles (a
value would span three roles), so each program would compute one (query, key) pair
with vector sums. A *serial* loop runs one position of its dim per step instead: the
loop dim takes no role (it indexes like a grid dim, by the loop counter), and a second
output dim, the ``column``, is tiled by ``BLOCK_N`` across the grid. Each step's
values are then ``[BLOCK_M, BLOCK_N]`` tiles with ``tl.dot`` over the head width, and
the loop's sums and maxes accumulate elementwise, deterministically (no atomics).
The tiling takes a serial loop only where it makes more contractions ``tl.dot`` than
every ordinary tiling, so attention's own kernels never change, and only where every
reduction computed at each step varies along the column: one that does not (a softmax
over keys eliminated into a tile, in an attention averaged over a serial loop of heads)
would be computed again by every column tile.

[Note: split serial loops]
A serial loop's grid holds only the output's tiles: a pair bias's gradient over 4 heads
and 256 x 256 (query, key) pairs is 64 programs of 64 x 64 tiles, each stepping through
all 256 rows of the batch, on a GPU with 132 multiprocessors. Where the kernel's one
output is its one loop sum itself (no max, no epilogue arithmetic, no liveness
predicate), the sum is split over the loop's positions instead: the launcher gives each
of ``SPLITS`` programs per tile a run of ``SPLIT_LEN`` consecutive positions; each stores
its float32 partial sum in its own slice of a ``[SPLITS, ...]`` buffer, and the launcher
adds the slices in order afterwards (one small reduction; no atomics, so the result does
not depend on the programs' timing). How many splits is the launcher's choice per call,
from the sizes and the GPU (:func:`flashlight.tuning.split_count`); one split is the
unsplit loop.

[Note: inner loops]
Talking-heads attention mixes the heads' scores before the softmax:
``s[g, i, j] = sum_h W[g, h] * sum_d q[h, i, d] k[h, j, d]``. Inside the loop over keys
the inner product is a ``[rows, keys]`` tile from a ``tl.dot`` over the head width, but
the sum over heads around it would make the head a third tile role (``q`` would span
rows, heads and width). A small static dim summed over a value that contains a
contraction of its own can instead take no tile at all: the sum becomes a loop of its
own inside the key loop, one position per step, whose values that read the dim are
computed in it (each head's query and key tiles, its ``tl.dot``, its weight) and added
to a ``[rows, keys]`` accumulator; values that do not read it stay outside. A sum is
exact in any order up to rounding, as ``tl.dot`` already reorders. Registers hold one
head's tiles at a time (the sm_90 build of 8 heads of 64 uses the registers of 2), where
copies printed per head kept every head's query tile live through the key loop and
spilled from 8 heads. The tiling takes it only where no tiling with every inner
reduction dim as a tile exists, where the loop's body holds a ``tl.dot``, and for at
most ``MAX_INNER_LOOP`` positions: each program computes the contraction for every
position (every head, for each mixed head it outputs), work the unfused graph does once
per head; the autotuner's timing against the unfused graph on the GPU keeps whichever
is faster (a sum of an elementwise value runs so where it keeps the rows in a tile:
[Note: elementwise inner loops]). A symbolic count (grouped-query attention's repeats
``H // h`` under ``dynamic=True``) has no bound to check: its loop runs the count read at
launch, and the tiling takes that form whenever such a dim is too wide to be a tile (it
always is).
"""
from __future__ import annotations

import dataclasses
import itertools
import math

from flashlight.ir import (
    Const,
    Dim,
    Expr,
    Gather,
    Iota,
    Kernel,
    Layout,
    Load,
    LoopReduction,
    LoopResult,
    Pointwise,
    Reduce,
    RunningMax,
    SizeValue,
    Tiling,
    TiledKernel,
    canonical,
    contains,
    free_dims,
    walk,
)
from flashlight import settings
from flashlight.indexing import sizes_equal, sym
from flashlight.passes.contractions import group_dot_operands, splits_as_dot
from flashlight.passes.tile_plan import record_plan

MAX_TILE = 256  # largest dim eliminated into one tile
MIN_DOT = 16  # tl.dot needs every tile dim >= 16
SCAN_TILES = 16  # key tiles per step of the tile-liveness scan (its coarse or vector step)
MAX_POW_PRODUCT = 8  # integer powers up to this are printed as products (sign-exact)
MAX_INNER_LOOP = 16  # most positions of a sum looped over in the key loop's body ([Note: inner loops])
MAX_LOOPED_SUMS = 3  # most elementwise sums tried as inner loops together ([Note: elementwise inner loops])
MAX_ELEMENTWISE_LOOP = 64  # most positions of an elementwise sum looped over ([Note: elementwise inner loops])


class NotTileable(Exception):
    """No tiling expresses this kernel; the message says why."""


def padded_size(size: int) -> int:
    return max(MIN_DOT, 1 << (size - 1).bit_length())


class Layouts:
    """Tile layouts of every value of a kernel under one role assignment."""

    def __init__(self, kernel: Kernel, roles: dict[Dim, str], grid: set[Dim], serial: bool = False,
                 inner_loops: frozenset[Dim] = frozenset()):
        self.kernel = kernel
        self.roles = roles
        self.serial = serial  # the loop dim indexes like a grid dim ([Note: serial loops])
        self.inner_loops = inner_loops  # so do these, a loop step each ([Note: inner loops])
        self.grid = grid | ({red.dim for red in kernel.loop} if serial else set()) | inner_loops
        # loop sums whose body is an inner loop's sum of contractions over the loop dim
        # ([Note: contractions summed by an inner loop])
        # (and their forms without masks, for the loop over full tiles)
        self.looped_dots = frozenset(red.body for red in (*kernel.loop, *(kernel.unmasked or ()))
                                     if red.op == "sum" and not serial and looped_sum(red.body, inner_loops))
        self.memo: dict[Expr, Layout] = {}
        self.dots = 0
        self._loop_results: dict[int, Layout] = {}
        self.loop_layouts = [self.loop_result(k) for k in range(len(kernel.loop))]
        self.epilogue = self.of(kernel.epilogue)
        for out in kernel.extra_outputs:
            self.of(out.epilogue)

    def loop_result(self, k: int) -> Layout:
        """Layout of the ``k``-th loop reduction's result (its body's, less the loop role)."""
        if k not in self._loop_results:
            self._loop_results[k] = self.reduction_layout(self.kernel.loop[k])
        return self._loop_results[k]

    def reduction_layout(self, red: LoopReduction) -> Layout:
        """Layout of a loop reduction's result: its body's, less the loop role."""
        if self.serial:  # one loop position per step: the accumulator is the body's tile
            body = self.of(red.body)
            if red.init is not None and not set(self.of(red.init)) <= set(body):
                raise NotTileable("a running max starts from a value wider than its result")
            return body
        body = self.of(red.body, allow_dot=red.op == "sum", reduced="n")
        if "n" not in body and red.body not in self.looped_dots:
            raise NotTileable("a loop reduction does not depend on the loop dim")
        dot = self.is_dot(red.body, "n")
        result = self._dot_result(red.body, "n") if dot else tuple(r for r in body if r != "n")
        if red.init is not None and not set(self.of(red.init)) <= set(result):
            raise NotTileable("a running max starts from a value wider than its result")
        return result

    # -- per node
    def of(self, expr: Expr, allow_dot: bool = False, reduced: str | None = None) -> Layout:
        if expr in self.memo and not allow_dot:
            return self.memo[expr]
        layout = self._compute(expr, allow_dot, reduced)
        # three tile dims only as the product of a contraction (checked by _compute)
        if len(layout) > 2 and not (allow_dot and len(layout) == 3 and isinstance(expr, Pointwise)):
            raise NotTileable(f"a value spans {len(layout)} tile dims {layout}")
        if not allow_dot:
            self.memo[expr] = layout
        return layout

    def _dims_layout(self, dims) -> Layout:
        roles = []
        for d in dims:
            role = self.roles.get(d)
            if role is not None:
                roles.append(role)
            elif d not in self.grid:
                raise NotTileable(f"dim {d!r} has no role")
        return canonical(roles)

    def _compute(self, expr: Expr, allow_dot: bool, reduced: str | None) -> Layout:
        if isinstance(expr, (Load, Iota)):
            return self._dims_layout(free_dims(expr))
        if isinstance(expr, Gather):
            return canonical(r for p in expr.positions for r in self.of(p))
        if isinstance(expr, (Const, SizeValue)):
            return ()
        if isinstance(expr, (RunningMax, LoopResult)):
            return self.loop_result(expr.index)
        if isinstance(expr, Reduce):
            return self._inner_reduce(expr)
        if isinstance(expr, Pointwise):
            if expr.op == "pow" and not _supported_pow(expr):
                raise NotTileable("pow with an unsupported exponent")
            parts = [self.of(a) for a in expr.args]
            layout = canonical(r for p in parts for r in p)
            if allow_dot and len(layout) == 3:
                if not self.is_dot(expr, reduced):
                    raise NotTileable("a three-dim product that is not a contraction")
            return layout
        raise NotTileable(f"cannot tile {type(expr).__name__}")

    def _inner_reduce(self, expr: Reduce) -> Layout:
        if len(expr.dims) != 1:
            raise NotTileable("an inner reduction over several dims")
        if expr in self.looped_dots and self.is_dot(expr, "n"):  # a tl.dot a step, added up
            return self._dot_result(expr, "n")
        if expr.dims[0] in self.inner_loops:  # a loop of its own, added up elementwise
            layout = self.of(expr.body)
            if contains(expr.body, Reduce) and not any(
                    isinstance(node, Reduce) and node.op == "sum" and node.dims[0] in self.roles
                    and self.is_dot(node.body, self.roles[node.dims[0]]) for node in walk(expr.body)):
                raise NotTileable("a sum in a loop of its own whose body holds no tl.dot")
            return layout
        role = self.roles.get(expr.dims[0])
        if role is None or not (role.startswith("e") or role == "f"):
            raise NotTileable("an inner reduction over a dim that does not fit one tile")
        body = self.of(expr.body, allow_dot=expr.op == "sum", reduced=role)
        if role == "f" and "n" in body:  # the feature tile's reduction runs on loop results
            raise NotTileable("a reduction over the feature tile inside the loop")
        if self.is_dot(expr.body, role):
            result = self._dot_result(expr.body, role)
        else:
            result = tuple(r for r in body if r != role)
        if "n" in result and "m" not in result and "m" in self.roles.values():
            # the same contraction for every row block: fusing it would recompute it
            raise NotTileable("a row-independent contraction inside the loop")
        if self.serial and "n" not in result and any(red.dim in free_dims(expr) for red in self.kernel.loop):
            # every column tile would compute it again at every step ([Note: serial loops])
            raise NotTileable("a reduction in a serial loop that does not vary along the column")
        return result

    # -- contractions
    def is_dot(self, body: Expr, reduced: str) -> bool:
        if body in self.looped_dots:  # ([Note: contractions summed by an inner loop])
            return reduced == "n" and self.is_dot(body.body, reduced)
        if not (isinstance(body, Pointwise) and body.op == "mul"):
            return False
        a, b = (self.of(x) for x in body.args)
        ok = splits_as_dot(a, b, reduced)
        if ok and body not in self.memo:
            self.dots += 1
            self.memo[body] = canonical(a + b)
        return ok

    def _dot_result(self, body: Expr, reduced: str) -> Layout:
        if body in self.looped_dots:
            body = body.body
        a, b = (self.of(x) for x in body.args)
        return canonical(r for r in a + b if r != reduced)


# [Note: contractions summed by an inner loop]
# The gradient of keys shared by a group of query heads sums, over the group's repeats
# ``r``, a contraction over the queries: ``dk[j] = sum_i sum_r ds_r[i, j] q_r[i]`` ([Note:
# a small sum inside the loop] in passes/online.py puts the repeats inside). The loop runs
# over the queries; each step's contribution is ``sum_r ds_r^T q_r``, a ``tl.dot`` over
# the step's query tile for every repeat, added up by a loop over the repeats of its own
# ([Note: inner loops]) whose other values (``ds_r``: each repeat's scores, probabilities
# and ``dp`` from ``tl.dot``s of their own) are computed inside it. Without this, the
# value width went to the grid (a ``[keys, repeats, queries, width]`` product has no
# two-role tile), every program recomputed the loop, and the back-off kept the scores of
# every head as a ``rows x keys`` matrix in memory for the kernel to read. The sums of
# one step over the same repeats share one loop (``dk`` and ``dv`` each repeat's
# probabilities), and a sum that no running max rescales adds each repeat's dot to its
# accumulator directly (no step total held beside it: sm_90 builds of the bf16 kernel at
# head width 64 spill 48-416 bytes per thread at 32-key tiles where separate loops with
# step totals spilled 296-784). Such a sum is the loop sum's whole body: a contraction
# over the loop's tile is a partial result of the loop, so it cannot sit deeper inside.
def looped_sum(body: Expr, inner_loops) -> bool:
    """Whether ``body`` (a loop sum's) is an inner loop's sum of one product
    ([Note: contractions summed by an inner loop])."""
    return (isinstance(body, Reduce) and body.op == "sum" and len(body.dims) == 1
            and body.dims[0] in inner_loops and isinstance(body.body, Pointwise) and body.body.op == "mul")


# [Note: the repeats outside the key loop]
# When every loop sum is an inner loop's sum of contractions over the same repeats
# ([Note: contractions summed by an inner loop]; the shared keys' and values' gradients,
# ``dk[j] = sum_i sum_r ds_r[i, j] q_r[i]``), the two sums can be exchanged back:
# ``sum_r sum_i``, the repeats a loop around the whole key loop, each repeat's pass
# plain attention's backward into the shared accumulators. Inside the key loop, a short
# loop over the repeats is the innermost loop holding the loads, which Triton
# software-pipelines across the repeats; outside, the key loop is the innermost. Exact up
# to the order of additions, which ``tl.dot`` already changes. Only where no running max
# rescales a sum (the order of the loop's steps is free), and only where the key loop is
# one loop: with tile skipping ([Note: tile skipping] in flashlight/passes/skipping.py) it
# is three (partial tiles, full tiles, partial tiles), each pipelined with its own
# prologue, and inside a loop over the repeats their buffers and bounds stay live across
# it. Measured (H100, bf16, head width 128, shared keys' gradient kernel; builds specialized
# on the launch as Triton's JIT does): causal, 4 heads per key head, outside 540 us against
# 300 inside, its sm_90 builds spilling 360-3,080 B per thread against 32-1,816 inside;
# unmasked, 16 heads per key head, outside 360 us against 420, both with candidates that
# do not spill (bench/results/training_runs/README.md).
def _repeats_outside(kernel: Kernel, tiling: Tiling, layouts: Layouts) -> bool:
    """Whether the one inner loop runs around the key loop ([Note: the repeats outside
    the key loop])."""
    if len(tiling.inner_loops) != 1 or tiling.serial or not settings.get("repeats_outside"):
        return False
    if kernel.live is not None or kernel.full is not None:  # the key loop split in three
        return False
    (repeats,) = tiling.inner_loops
    loops = [*kernel.loop, *(kernel.unmasked or ())]
    # each loop sum one tl.dot per pass (a looped sum whose body is no contraction runs as
    # an inner loop over every repeat: around the key loop, each pass would add all of them)
    if not all(red.op == "sum" and not red.rescaled_by and red.body in layouts.looped_dots
               and red.body.dims == (repeats,) and layouts.is_dot(red.body, "n") for red in loops):
        return False
    inside = [node for red in loops for node in walk(red.body.body)]
    return not any(isinstance(node, Reduce) and repeats in node.dims for node in inside)


def _supported_pow(expr: Pointwise) -> bool:
    """A constant, finite, non-zero exponent (codegen: products for small integers,
    ``exp(c * log(x))`` otherwise, which is NaN for a negative base as in PyTorch)."""
    exponent = expr.args[1]
    if not isinstance(exponent, Const) or isinstance(exponent.value, bool) or not math.isfinite(exponent.value):
        return False
    value = float(exponent.value)
    return value != 0 and (not value.is_integer() or abs(value) <= MAX_POW_PRODUCT)


def _inner_reduce_dims(kernel: Kernel) -> list[Dim]:
    dims: list[Dim] = []
    for red in kernel.loop:
        for node in walk(red.body):
            if isinstance(node, Reduce):
                dims.extend(d for d in node.dims if d not in dims)
    for node in (n for e in kernel.epilogues() for n in walk(e)):
        # over the output's features, on the loop's results ([Note: reductions over an
        # output's features] in flashlight.passes.features): a reduction of the feature tile;
        # or one of the inputs alone that fits a tile (a few features summed beside a contraction)
        if isinstance(node, Reduce) and not set(node.dims) <= set(kernel.dims):
            if any(isinstance(n, (LoopResult, Reduce)) for n in walk(node.body)) \
                    or not all(d.is_static for d in node.dims) or math.prod(d.size for d in node.dims) > MAX_TILE:
                raise NotTileable("a reduction left in the epilogue")
            dims.extend(d for d in node.dims if d not in dims)
    return dims


def sizes_to_fix(kernel: Kernel) -> frozenset[str]:
    """The symbolic sizes a tile of ``kernel`` has to know when it is compiled
    ([Note: sizes a tile must know]): of the dims a product is contracted over inside the
    loop's body (a head width), and of the output dims some loop reduction does not vary
    along (the value width of an attention), unless that size is the loop's extent."""
    loop_dim = kernel.loop[0].dim
    common = frozenset(kernel.dims)
    for red in kernel.loop:
        common &= free_dims(red.body)
    features = {d for d in kernel.dims if d not in common and not sizes_equal(d.size, loop_dim.size)}
    return frozenset(str(d.size) for d in _contracted_inside(kernel) | features if not d.is_static)


def _product_dims(expr: Expr) -> set[Dim]:
    """The dims of the sums of products in ``expr``."""
    return {d for node in walk(expr) if isinstance(node, Reduce) and node.op == "sum"
            and isinstance(node.body, Pointwise) and node.body.op == "mul" for d in node.dims}


def _contracted_inside(kernel: Kernel) -> set[Dim]:
    """The dims a product is contracted over inside ``kernel``'s loop body (``q . k``)."""
    return {d for red in kernel.loop for e in red.exprs() for d in _product_dims(e)}


def length_symbols(kernel: Kernel) -> frozenset[str]:
    """The symbols of ``kernel``'s lengths: its loop's extent and the row dims every loop
    reduction varies along (queries, batch, heads), never fixed ([Note: sizes a tile
    must know]). An output dim the size of a width contracted inside the loop is that
    width, not a length: with one loop reduction (``relu(q . k)^2 @ v``, no softmax
    statistics) the value width is such a dim."""
    common = frozenset(kernel.dims)
    for red in kernel.loop:
        common &= free_dims(red.body)
    widths = {d.size for d in _contracted_inside(kernel)}
    sizes = [kernel.loop[0].dim.size, *(d.size for d in common if d.size not in widths)]
    return frozenset(s.name for size in sizes if not isinstance(size, int) for s in sym(size).free_symbols)


def _rank(d: Dim | None) -> tuple[int, int]:
    if d is None:
        return (0, 0)
    return (2, 0) if not d.is_static else (1, int(d.size))


def tile(kernel: Kernel) -> TiledKernel:
    """Choose the tiling of ``kernel``; raise :class:`NotTileable` if none is legal."""
    inner = _inner_reduce_dims(kernel)
    looped = _inner_loop_dims(kernel)  # [Note: inner loops]
    wide = [d for d in inner if not d.is_static or d.size > MAX_TILE]
    for d in wide:
        if d not in looped:
            raise NotTileable(f"contracted dim of size {d.size} does not fit one tile")
    if not wide:
        try:
            return _with_rows(kernel, inner, _tile(kernel, inner, frozenset()))
        except NotTileable:
            if not looped:
                raise
    return _tile(kernel, [d for d in inner if d not in looped], looped)


def _with_rows(kernel: Kernel, inner: list[Dim], tiled: TiledKernel) -> TiledKernel:
    """``tiled``, or where it has no row tile and some small sum of a product over rows,
    keys and its own dim kept the rows out of every tile, the tiling that loops over
    that sum's positions instead and so has rows ([Note: elementwise inner loops])."""
    if tiled.tiling.row is not None or tiled.tiling.column is not None:
        return tiled
    loopable = sorted(_elementwise_loop_dims(kernel) & frozenset(inner), key=lambda d: d.name)
    best = None
    for count in range(1, min(len(loopable), MAX_LOOPED_SUMS) + 1):  # the fewest loops first
        for looped in map(frozenset, itertools.combinations(loopable, count)):
            try:
                alternative = _tile(kernel, [d for d in inner if d not in looped], looped)
            except NotTileable:
                continue
            if alternative.tiling.row is not None and (best is None or alternative.tiling.dots > best.tiling.dots):
                best = alternative
        if best is not None:
            return best
    return tiled


def _inner_loop_dims(kernel: Kernel) -> frozenset[Dim]:
    """The dims of the loop body's inner sums that may run as loops of their own ([Note:
    inner loops]): at most ``MAX_INNER_LOOP`` positions where static (a symbolic count,
    such as grouped-query attention's repeats under ``dynamic=True``, is read at launch),
    summing a value that holds a contraction of its own."""
    return frozenset(node.dims[0] for node in _small_loop_sums(kernel) if contains(node.body, Reduce))


def _small_loop_sums(kernel: Kernel, most: int = MAX_INNER_LOOP) -> list[Reduce]:
    """The sums over one dim inside the loop's body with at most ``most`` positions, or
    a symbolic count: those that may run as loops of their own."""
    return [node for red in kernel.loop for node in walk(red.body)
            if isinstance(node, Reduce) and node.op == "sum" and len(node.dims) == 1
            and (not node.dims[0].is_static or node.dims[0].size <= most)]


# [Note: elementwise inner loops]
# A sum of an elementwise value over a few positions inside the key loop's body, such as
# squared distances between points, ``sum_c (a[i, c] - b[j, c])^2``, reads the rows, the
# keys and its own dim at once: taken as a tile, it is a three-dim value that no
# ``tl.dot`` computes, which the tiling rejects, so the rows went to the grid, one
# query per program, and the scores' contraction ran without the tensor core. Where the
# best tiling has no row tile, such a sum over at most ``MAX_ELEMENTWISE_LOOP`` static
# positions (no reduction in its body, and not a contraction: a product of two different
# factors is a ``tl.dot`` or a projection the back-off keeps separate) may instead run as
# an inner loop of its own ([Note: inner loops]): one position per step, a ``[rows,
# keys]`` tile added up, its operands' columns loaded at the step's position. The fewest
# such loops that give a tiling with rows are taken, the one with the most dots among
# them. The same terms are summed in float32, one position after another. Each position
# costs a few float operations per score, the work the unfused graph's elementwise
# kernel does too, so the bound is wider than a loop of contractions' (``MAX_INNER_LOOP``):
# 8 points of 3 coordinates (24 positions) tiled with one query per program ran 5x slower
# than torch.compile on an H100 (bf16, 12 heads, 1024 positions: 0.97 against 0.19 ms).
def _elementwise_loop_dims(kernel: Kernel) -> frozenset[Dim]:
    """The dims of the loop body's small static sums of elementwise values ([Note:
    elementwise inner loops])."""
    return frozenset(node.dims[0] for node in _small_loop_sums(kernel, MAX_ELEMENTWISE_LOOP)
                     if node.dims[0].is_static
                     and node.dims[0] not in kernel.dims  # an output's dim is the grid's
                     and not _a_contraction(node.body) and not contains(node.body, Reduce))


def _a_contraction(body: Expr) -> bool:
    """A product of two different factors: a contraction (a projection of the keys, the
    scores' ``q k^T``), which is a ``tl.dot`` or kept separate by the back-off, never an
    elementwise loop (a square written ``d * d`` is not one)."""
    return isinstance(body, Pointwise) and body.op == "mul" and body.args[0] != body.args[1]


def _tile(kernel: Kernel, inner: list[Dim], looped: frozenset[Dim]) -> TiledKernel:
    """The best tiling of ``kernel`` with the dims ``inner`` eliminated into tiles and
    ``looped`` run as loops of their own."""
    eliminated = {d: f"e{k}" for k, d in enumerate(inner)}
    out = kernel.dims
    small = [d for d in out if d.is_static and d.size <= MAX_TILE]
    best, best_score, last_error = None, None, "no candidate tiling"
    for row, feature in itertools.product([*out, None], [None, *small]):
        if row == feature and row is not None:
            continue
        roles = dict(eliminated)
        roles.update({red.dim: "n" for red in kernel.loop})
        if row is not None:
            roles[row] = "m"
        if feature is not None:
            roles[feature] = "f"
        grid = [d for d in out if d not in (row, feature)]
        candidate = group_dot_operands(kernel, roles)  # [Note: dot operands]
        try:
            layouts = Layouts(candidate, roles, set(grid), inner_loops=looped)
        except NotTileable as why:
            last_error = str(why)
            continue
        score = (layouts.dots, _rank(row), feature is not None, -out.index(row) if row else 0)
        if best_score is None or score > best_score:
            padded = tuple((d, padded_size(int(d.size))) for d in [*inner, *([feature] if feature else [])])
            best = Tiling(row, feature, tuple(grid), tuple(inner), padded, layouts.dots,
                          inner_loops=tuple(sorted(looped, key=lambda d: d.name)))
            best_score, best_layouts, best_kernel = score, layouts, candidate
    serial = None if looped else _serial_tiling(kernel, inner, eliminated, best_score)
    if serial is not None:
        return serial
    if best is None:
        raise NotTileable(last_error)
    kernel = best_kernel
    if kernel.unmasked is not None and not _unmasked_loop_tiles_alike(kernel, best_layouts):
        kernel = dataclasses.replace(kernel, full=None, unmasked=None)
    best = dataclasses.replace(best, scan_tiles=_scan_tiles(kernel, best_layouts),
                               outer_loop=_repeats_outside(kernel, best, best_layouts))
    return TiledKernel(kernel, best, record_plan(kernel, best, best_layouts))


def _serial_tiling(kernel: Kernel, inner: list[Dim], eliminated: dict[Dim, str], best_score) -> TiledKernel | None:
    """The best serial-loop tiling of ``kernel`` ([Note: serial loops]) if it makes more
    contractions ``tl.dot`` than the ordinary tiling's score ``best_score``, else None."""
    best_dots = best_score[0] if best_score is not None else -1
    if best_dots >= _sums_of_products(kernel):
        return None  # every product summed is a tl.dot already: a serial loop cannot do better
    # skipping tiles of (rows, loop positions) does not apply to a loop of single positions
    kernel = dataclasses.replace(kernel, live=None, full=None, unmasked=None)
    out = kernel.dims
    best = None
    for row, column in itertools.permutations(out, 2):
        roles = {**eliminated, row: "m", column: "n"}
        grid = [d for d in out if d not in (row, column)]
        candidate = group_dot_operands(kernel, roles)
        try:
            layouts = Layouts(candidate, roles, set(grid), serial=True)
        except NotTileable:
            continue
        if layouts.dots > best_dots:
            padded = tuple((d, padded_size(int(d.size))) for d in inner)
            tiling = Tiling(row, None, tuple(grid), tuple(inner), padded, layouts.dots, column=column,
                            split=_splittable(candidate))
            best, best_dots = TiledKernel(candidate, tiling, record_plan(candidate, tiling, layouts)), layouts.dots
    return best


def _splittable(kernel: Kernel) -> bool:
    """Whether a serial loop's positions may be split among programs ([Note: split
    serial loops]): one output that is the loop's one sum, possibly cast."""
    if kernel.extra_outputs or len(kernel.loop) != 1 or kernel.loop[0].op != "sum" or kernel.live is not None:
        return False
    out = kernel.epilogue
    while isinstance(out, Pointwise) and out.op == "cast" and out.dtype.is_floating_point:
        out = out.args[0]
    return isinstance(out, LoopResult) and out.index == 0


def _sums_of_products(kernel: Kernel) -> int:
    """How many sums of products the kernel's loop computes (its loop sums and the sums
    inside them): the most contractions that could become ``tl.dot``."""
    def product(body: Expr) -> bool:
        return isinstance(body, Pointwise) and body.op == "mul"

    inner = {node for red in kernel.loop for e in red.exprs() for node in walk(e)
             if isinstance(node, Reduce) and node.op == "sum" and product(node.body)}
    return len(inner) + sum(1 for red in kernel.loop if red.op == "sum" and product(red.body))


def _scan_tiles(kernel: Kernel, layouts: Layouts) -> int:
    """Key tiles per coarse or vector step of the liveness scan ([Note: tile skipping]).

    A coarse step loads ``SCAN_TILES`` key tiles of every value the predicate reads
    along the loop dim at once; that fits in registers only when those values are
    vectors over the keys alone (document ids, key lengths), not ``[rows, keys]`` tiles.
    """
    if kernel.live is None:
        return 1
    loop_dim = kernel.loop[0].dim
    for node in walk(kernel.live):
        if isinstance(node, Load) and loop_dim in free_dims(node) and layouts.of(node) != ("n",):
            return 1
    return SCAN_TILES


def _unmasked_loop_tiles_alike(kernel: Kernel, layouts: Layouts) -> bool:
    """Whether the loop without its masks ([Note: tile skipping]) tiles like the loop
    (under the chosen tiling's ``layouts``), so the two can run on the same accumulators."""
    for k, (red, plain) in enumerate(zip(kernel.loop, kernel.unmasked)):
        try:
            if layouts.reduction_layout(plain) != layouts.loop_layouts[k]:
                return False
            if layouts.is_dot(plain.body, "n") != layouts.is_dot(red.body, "n"):
                return False
        except NotTileable:
            return False
    return True


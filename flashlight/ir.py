"""The loop-nest IR: every operation is a loop nest over named dimensions.

A :class:`Nest` computes one tensor. Each of its output axes is a tuple of
:class:`Dim` s (row-major: an axis built by merging dims ``(a, b)`` has index
``a * size(b) + b``); the scalar :class:`Expr` ``body`` gives the value at one
point of those dims. Reductions (``sum``, ``max``) bind their own dims, so a
matrix multiply is not special: ``S[i, j] = Reduce(sum, Q[i, c] * K[j, c], (c,))``.

Views, permutes, expands and broadcasts never become nests: they are index
maps folded into :class:`Load` (a graph input or fallback value read at a
compound index) and :class:`Ref` (another nest's value read at a compound
index). A broadcast axis is the empty tuple: it is read at index 0.

All nodes are frozen dataclasses, so structurally equal sub-expressions are
equal and hash alike: the code generator uses that for common-subexpression
elimination.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import math
from typing import Callable, Iterator, Union

import torch

Size = Union[int, str]  # a static size, or the text of a symbolic (dynamic) size

# Dim ids are numbered per compile (see :func:`dim_names`), so the IR of one graph
# prints the same names whatever was compiled before it.
_dim_ids: contextvars.ContextVar[Iterator[int]] = contextvars.ContextVar("flashlight_dim_ids")
_unscoped_ids = itertools.count()  # dims made outside any compile (IR built by hand)


@contextlib.contextmanager
def dim_names(start: int = 0) -> Iterator[Iterator[int]]:
    """Number the dims made inside the block from ``start``: a graph's lowering starts
    at 0 and its passes go on from where the lowering stopped. Yields the counter."""
    ids = itertools.count(start)
    token = _dim_ids.set(ids)
    try:
        yield ids
    finally:
        _dim_ids.reset(token)


@dataclasses.dataclass(frozen=True)
class Dim:
    """A named loop dimension with a static or symbolic extent."""

    name: str
    size: Size

    @staticmethod
    def fresh(size: Size, hint: str = "d") -> "Dim":
        return Dim(f"{hint}{next(_dim_ids.get(_unscoped_ids))}", size)

    @property
    def is_static(self) -> bool:
        return isinstance(self.size, int)

    def __repr__(self) -> str:
        return f"{self.name}:{self.size}"


Axis = tuple  # tuple[Dim, ...]; () is a broadcast axis of size 1


def axis_dims(axes: tuple[Axis, ...]) -> tuple[Dim, ...]:
    return tuple(d for axis in axes for d in axis)


def spans_extent(position: "Expr", extent: Size | None) -> bool:
    """Whether ``position`` (along a tensor axis of size ``extent``) is the index of an
    axis of that size: every position it takes lies in the tensor, so a read there needs
    no bound. A concatenation's piece read at the whole concatenation's index does not
    ([Note: gathers] in :mod:`flashlight.lower_gather`)."""
    if not isinstance(position, Iota):
        return False
    size = axis_extent(position.axis)
    return extent is None or size is None or size == extent


def axis_extent(axis: Axis) -> Size | None:
    """The size of a compound axis: a number where its dims are static, the symbolic size
    of its one dim, else None (a product of sizes some of them symbolic)."""
    if all(d.is_static for d in axis):
        return math.prod(int(d.size) for d in axis)
    return axis[0].size if len(axis) == 1 else None


class Expr:
    """Base class of scalar expressions evaluated at one point of a loop nest."""

    def children(self) -> tuple["Expr", ...]:
        return ()


@dataclasses.dataclass(frozen=True)
class Load(Expr):
    """Element of tensor ``base`` (an input of the kernel) at a compound index per axis."""

    base: str
    index: tuple[Axis, ...]
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class Gather(Expr):
    """Element of input ``base`` at one integer expression per axis (``table[h, bucket(j -
    i)]``); a :class:`Load` is the gather at the indices of its axes. See [Note: gathers]
    in :mod:`flashlight.lower_gather`."""

    base: str
    positions: tuple[Expr, ...]
    extents: tuple[Size | None, ...]  # per axis of ``base``: its size (see axis_extent)
    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return self.positions


@dataclasses.dataclass(frozen=True)
class Ref(Expr):
    """Element of the tensor computed by nest ``nest`` at a compound index per axis."""

    nest: str
    index: tuple[Axis, ...]
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class Iota(Expr):
    """The integer index of a compound axis (``torch.arange`` and friends)."""

    axis: Axis
    dtype: torch.dtype = torch.int64


@dataclasses.dataclass(frozen=True)
class Const(Expr):
    value: float | int | bool
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class SizeValue(Expr):
    """A symbolic size used as a value (an offset, a bound, a clamp: ``(T - 1) // 2``,
    ``Lk - Lq``): the same at every point, known at launch, where the runtime computes
    it from the inputs' sizes ([Note: sizes used as values] in :mod:`flashlight.indexing`)."""

    size: str
    dtype: torch.dtype = torch.int64


@dataclasses.dataclass(frozen=True)
class Pointwise(Expr):
    """An elementwise operation; ``op`` names an entry of the codegen's op table."""

    op: str
    args: tuple[Expr, ...]
    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return self.args


@dataclasses.dataclass(frozen=True)
class Reduce(Expr):
    """``op`` (``sum`` or ``max``) of ``body`` over the dims it binds."""

    op: str
    body: Expr
    dims: tuple[Dim, ...]
    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return (self.body,)


@dataclasses.dataclass(frozen=True)
class LoopResult(Expr):
    """The final value of the ``index``-th reduction of a kernel's online loop."""

    index: int
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class RunningMax(Expr):
    """Inside the online loop: the running value of loop max-reduction ``index``.

    It stands for the finished max wherever the online rewrite proved that using
    the running max and rescaling later gives the same result; see
    [Note: online reduction] in :mod:`flashlight.passes.online`.
    """

    index: int
    dtype: torch.dtype


def _hash_once(cls: type) -> type:
    """Make ``cls`` (a frozen dataclass) keep its structural hash once computed.

    [Note: hashing an expression once]
    A frozen dataclass hashes its fields on every call, so hashing an expression
    walks all of it; free-dim caches and the search's memos key on expressions, and
    on a whole Evoformer block those deep hashes took most of the compile. The hash
    is stored on the node at its first use; it is left out of pickles (string hashes
    differ between processes), so a loaded node computes it again."""
    structural = cls.__hash__

    def __hash__(self) -> int:
        value = self.__dict__.get("_hash")
        if value is None:
            value = structural(self)
            object.__setattr__(self, "_hash", value)
        return value

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    return cls


for _node_class in (Load, Gather, Ref, Iota, Const, Pointwise, Reduce, LoopResult, RunningMax):
    _hash_once(_node_class)


@dataclasses.dataclass(frozen=True)
class Nest:
    """One loop nest: computes a tensor whose axes are ``axes`` from ``body``."""

    name: str
    axes: tuple[Axis, ...]
    body: Expr
    dtype: torch.dtype
    origins: tuple[str, ...]  # the FX nodes (ATen ops) this nest computes

    @property
    def dims(self) -> tuple[Dim, ...]:
        return axis_dims(self.axes)


_hash_once(Nest)


@dataclasses.dataclass(frozen=True)
class Graph:
    """The program: nests in topological order, plus which of them are materialized.

    ``inputs`` names the tensors kernels may load (graph inputs and values computed
    outside Flashlight). ``materialized`` are the nests whose values must exist in
    memory (graph outputs, values needed by fallback operations, or nests that a
    pass decided not to inline). ``recomputed`` are the materialized nests that their
    consumers may still inline: those needed outside Flashlight, which a consumer
    computes again in its own loop (a row max returned next to the attention that uses
    it), until the back-off keeps one separate. The rest of ``materialized`` is
    :attr:`separate`: consumers read those from memory. ``pinned`` are separate nests that
    elementwise fusion leaves alone too (it inlines every other nest without reductions,
    separate or not): [Note: key-side prologues computed once].
    """

    nests: tuple[Nest, ...]
    inputs: tuple[str, ...]
    materialized: frozenset[str]
    recomputed: frozenset[str] = frozenset()
    pinned: frozenset[str] = frozenset()

    @property
    def separate(self) -> frozenset[str]:
        """The materialized nests whose consumers read them from memory."""
        return self.materialized - self.recomputed

    def keeping_separate(self, names) -> "Graph":
        """This graph with the nests ``names`` materialized and read from memory."""
        names = frozenset(names)
        return self.replace(materialized=self.materialized | names, recomputed=self.recomputed - names)

    def pinning(self, names) -> "Graph":
        """This graph keeping the nests ``names`` separate, elementwise fusion too."""
        return self.keeping_separate(names).replace(pinned=self.pinned | frozenset(names))

    def nest(self, name: str) -> Nest:
        for nest in self.nests:
            if nest.name == name:
                return nest
        raise KeyError(name)

    def replace(self, **changes) -> "Graph":
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------- traversal


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of ``expr``, parents before children (shared nodes repeat)."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children()))


def rebuild(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rewrite bottom-up: ``fn`` returns a replacement for a node, or None to keep it."""
    memo: dict[int, Expr] = {}

    def visit(node: Expr) -> Expr:
        key = id(node)
        if key in memo:
            return memo[key]
        if isinstance(node, Pointwise):
            new_args = tuple(visit(a) for a in node.args)
            if new_args != node.args:
                node = dataclasses.replace(node, args=new_args)
        elif isinstance(node, Reduce):
            new_body = visit(node.body)
            if new_body is not node.body:
                node = dataclasses.replace(node, body=new_body)
        elif isinstance(node, Gather):
            new_positions = tuple(visit(p) for p in node.positions)
            if new_positions != node.positions:
                node = dataclasses.replace(node, positions=new_positions)
        out = fn(node)
        result = node if out is None else out
        memo[key] = result
        return result

    return visit(expr)


def replace_nodes(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rewrite top-down: where ``fn`` gives a replacement, it is used and not descended."""
    memo: dict[int, Expr] = {}

    def visit(node: Expr) -> Expr:
        key = id(node)
        if key not in memo:
            out = fn(node)
            if out is None:
                if isinstance(node, Pointwise):
                    out = dataclasses.replace(node, args=tuple(visit(a) for a in node.args))
                elif isinstance(node, Reduce):
                    out = dataclasses.replace(node, body=visit(node.body))
                elif isinstance(node, Gather):
                    out = dataclasses.replace(node, positions=tuple(visit(p) for p in node.positions))
                else:
                    out = node
            memo[key] = out
        return memo[key]

    return visit(expr)


def free_dims(expr: Expr) -> frozenset[Dim]:
    """The dims ``expr`` depends on (dims bound by its reductions excluded)."""
    return _free_dims(expr)


_FREE_CACHE: dict[Expr, frozenset[Dim]] = {}


def _free_dims(expr: Expr) -> frozenset[Dim]:
    cached = _FREE_CACHE.get(expr)
    if cached is not None:
        return cached
    if isinstance(expr, (Load, Ref)):
        out = frozenset(axis_dims(expr.index))
    elif isinstance(expr, Iota):
        out = frozenset(expr.axis)
    elif isinstance(expr, Reduce):
        out = _free_dims(expr.body) - frozenset(expr.dims)
    else:
        out = frozenset().union(*(_free_dims(c) for c in expr.children()))
    if len(_FREE_CACHE) > 200_000:
        _FREE_CACHE.clear()
    _FREE_CACHE[expr] = out
    return out


def contains(expr: Expr, kind: type) -> bool:
    return any(isinstance(node, kind) for node in walk(expr))


# ------------------------------------------------------------------------- substitution


def substitute(expr: Expr, mapping: dict[Dim, Axis]) -> Expr:
    """Replace free dims by compound axes (``()`` reads index 0 of a size-1 axis).

    Row-major composition makes this exact: if ``x`` becomes ``(p, q)`` then an
    index ``(x, w)`` becomes ``(p, q, w)``.
    """
    if not mapping:
        return expr

    def sub_axis(axis: Axis) -> Axis:
        return tuple(d2 for d in axis for d2 in mapping.get(d, (d,)))

    def fn(node: Expr) -> Expr | None:
        if isinstance(node, (Load, Ref)):
            return dataclasses.replace(node, index=tuple(sub_axis(a) for a in node.index))
        if isinstance(node, Iota):
            return dataclasses.replace(node, axis=sub_axis(node.axis))
        return None

    return rebuild(expr, fn)


# ------------------------------------------------------------------ fused kernel forms


@dataclasses.dataclass(frozen=True)
class Base2Max:
    """How a loop max and the sums it rescales run in base 2 (set by
    :mod:`flashlight.passes.base2`; see [Note: base-2 online softmax] there).

    The max runs over its body as written (after positive constant factors moved out);
    a sum rescaled by it with power ``c`` is rescaled by
    ``exp2(c * log2_scale * (m_old - m_new))``. With ``threshold`` (lazy rescaling,
    [Note: lazy rescaling]), the max the sums are relative to is raised only on a step
    where some row's max grew by more than ``threshold / log2_scale``; ``settle``: after
    the loop the sums are rescaled once to the true max (the epilogue depends on it).
    """

    log2_scale: float
    threshold: float | None = None
    settle: bool = False


@dataclasses.dataclass(frozen=True)
class LoopReduction:
    """One reduction of a kernel's single online loop over the key-like dim.

    ``body`` may read ``RunningMax(k)`` for each ``(k, c)`` in ``rescaled_by``: the
    online pass proved the body scales by ``exp(-c * max_k)``, so partial results are
    rescaled by ``exp(c * (m_old - m_new))`` when the running max grows. See
    [Note: online reduction]. A max may start from ``init`` (a value free of the loop
    dim and of reductions) instead of ``-inf``: ``max(init, max_j body_j)``.
    """

    op: str  # "sum" or "max"
    body: Expr
    dim: Dim
    rescaled_by: tuple[tuple[int, float], ...]  # (loop max k, power c)
    dtype: torch.dtype
    init: Expr | None = None
    base2: Base2Max | None = None  # on a max: its rescaling in base 2 (passes/base2.py)

    def exprs(self) -> tuple[Expr, ...]:
        """The expressions the reduction evaluates: its body, and its initial value."""
        return (self.body,) if self.init is None else (self.body, self.init)


@dataclasses.dataclass(frozen=True)
class KernelOutput:
    """One tensor a kernel stores: ``epilogue`` (reading loop results through
    ``LoopResult(k)``) over ``axes``, whose dims are dims of the kernel."""

    name: str  # the nest it computes
    axes: tuple[Axis, ...]
    dtype: torch.dtype
    epilogue: Expr

    @property
    def dims(self) -> tuple[Dim, ...]:
        return axis_dims(self.axes)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A fused kernel: one online loop of reductions, then an elementwise epilogue.

    The epilogue reads loop results through ``LoopResult(k)``; its free dims are the
    output dims. ``extra_outputs`` are further tensors computed from the same loop (a
    row log-sum-exp next to the attention output), each over some of the kernel's dims,
    see [Note: several outputs] in :mod:`flashlight.passes.outputs`.
    """

    name: str
    axes: tuple[Axis, ...]
    dtype: torch.dtype
    loop: tuple[LoopReduction, ...]
    epilogue: Expr
    origins: tuple[str, ...]
    # false on a (row, loop) tile => the tile changes no loop result; see
    # [Note: tile skipping] in flashlight.passes.skipping. None: every tile runs.
    live: Expr | None = None
    # true on a (row, loop) tile => every mask keeps every position of it, and ``unmasked``
    # (the loop with each mask replaced by the value it keeps) computes the same loop
    # results there. None: every tile runs ``loop``.
    full: Expr | None = None
    unmasked: tuple[LoopReduction, ...] | None = None
    extra_outputs: tuple[KernelOutput, ...] = ()

    @property
    def dims(self) -> tuple[Dim, ...]:
        return axis_dims(self.axes)

    def outputs(self) -> tuple[KernelOutput, ...]:
        """Every tensor the kernel stores, its own output first."""
        return (KernelOutput(self.name, self.axes, self.dtype, self.epilogue), *self.extra_outputs)

    def epilogues(self) -> tuple[Expr, ...]:
        """The epilogue of every output, in output order."""
        return tuple(out.epilogue for out in self.outputs())

    def varies_along(self, expr: Expr) -> frozenset[Dim]:
        """The dims ``expr`` varies along: its free dims, and those of the loop results
        (running or final) it reads, less the dims a reduction at its top binds."""
        dims = set(free_dims(expr))
        for node in walk(expr):
            if isinstance(node, (LoopResult, RunningMax)):
                red = self.loop[node.index]
                dims |= free_dims(red.body) - {red.dim}
        return frozenset(dims - set(expr.dims)) if isinstance(expr, Reduce) else frozenset(dims)


@dataclasses.dataclass(frozen=True)
class Tiling:
    """Where each dim of a kernel lives.

    ``row`` is tiled by ``BLOCK_M``; loop dims by ``BLOCK_N``; ``feature`` and the
    ``eliminated`` reduction dims fit one padded tile each (size in ``padded``) and
    disappear as loops; ``grid`` dims are the logical launch grid, one program each.
    ``scan_tiles``: key tiles bounded at once by a coarse or vector step of the tile-liveness
    scan (1: one tile per step; [Note: tile skipping]).

    ``column``: an output dim tiled by ``BLOCK_N`` across the grid, set when the loop is
    *serial*: one loop position per step, the loop dim in no tile ([Note: serial
    loops] in :mod:`flashlight.passes.tiling`). None: the loop dim is the ``n`` role.
    ``split``: the serial loop's positions may be shared out among programs that each
    store a float32 partial sum, added up after the launch ([Note: split serial loops]).
    ``inner_loops``: small reduction dims inside the loop's body that take no tile: each
    sum runs as a loop of its own in the key loop's body ([Note: inner loops]).
    ``outer_loop``: the one inner loop runs around the key loop instead, every loop sum
    summing over it ([Note: the repeats outside the key loop] in
    :mod:`flashlight.passes.tiling`).
    """

    row: Dim | None
    feature: Dim | None
    grid: tuple[Dim, ...]
    eliminated: tuple[Dim, ...]
    padded: tuple[tuple[Dim, int], ...]
    dots: int  # how many contractions map to tl.dot
    scan_tiles: int = 1
    column: Dim | None = None
    split: bool = False
    inner_loops: tuple[Dim, ...] = ()
    outer_loop: bool = False

    @property
    def serial(self) -> bool:
        """Whether the loop runs one position per step ([Note: serial loops])."""
        return self.column is not None

    def tiled_by_block_n(self, loop_dim: Dim) -> Dim:
        """The dim ``BLOCK_N`` tiles: the column of a serial loop, else the loop dim."""
        return self.column if self.column is not None else loop_dim


Layout = tuple  # tuple[str, ...]: the roles a tile value spans, in canonical order


def canonical(roles) -> Layout:
    """Tile roles in canonical order: ``m``, ``n``, ``f``, then ``e0``, ``e1``, ..."""
    def order(role: str) -> tuple[int, int]:
        return ({"m": 0, "n": 1, "f": 2}.get(role[0], 3), int(role[1:]) if role[0] == "e" else 0)

    return tuple(sorted(set(roles), key=order))


@dataclasses.dataclass(frozen=True)
class DotPlan:
    """One contraction printed as ``tl.dot(A, B)``: ``A [x, r] @ B [r, y]`` over role ``r``.

    The operands are the product's two factors as computed (``trans_a``: transposed to
    ``[x, r]`` first, ``trans_b``: to ``[r, y]``), in the product's order, or the other
    way round when ``swap`` (``A`` the second factor, ``B`` the first), so that the
    result comes out of the dot in canonical order ``out`` (a transposed result costs a
    layout change of the accumulator's size, and the dot cannot add into the
    accumulator in place); where not, the result is transposed into ``out`` when
    ``trans_out`` ([Note: the order of a dot's operands] in passes/tile_plan). On the
    GPU the operands go in as ``dtype`` (a 16-bit product's own dtype, else float32);
    the Triton interpreter multiplies 16-bit floats wrongly, so there they are always
    float32.
    """

    reduced: str
    trans_a: bool
    trans_b: bool
    out: Layout
    trans_out: bool
    dtype: torch.dtype
    interpreter_dtype: torch.dtype = torch.float32
    swap: bool = False

    def operand_dtype(self, interpret: bool) -> torch.dtype:
        return self.interpreter_dtype if interpret else self.dtype


@dataclasses.dataclass(frozen=True)
class TilePlan:
    """What the tiling decided for every value of a kernel, for codegen to print.

    - ``roles``: the tile role of each tiled dim (``m``, ``n``, ``f``, ``e0``...);
    - ``layouts``: the roles each value's tile spans (every value codegen prints);
    - ``in_loop``: the values that change along the loop dim; every other value of the
      loop is hoisted before the loop;
    - ``dots``: the contractions printed as ``tl.dot``, keyed by their product;
    - ``loop_layouts``: the layout of each loop reduction's result (its accumulator);
    - ``store_layout``: the output tile's layout (``extra_store_layouts``: those of the
      kernel's extra outputs);
    - ``inputs``: the tensors the kernel loads, in argument order, with their ranks;
    - ``relayouts``: ``(input, axis)``: inputs re-read by many programs whose
      innermost tile axis is strided; the launcher copies them with that axis
      contiguous first (a one-off copy is far cheaper than strided tiles);
    - ``sum_dots``: ``(k, dot)``: loop sums ``k`` of a 16-bit dot's operand over the loop
      role, computed on the tensor core as that operand times a column of ones, beside
      ``dot`` ([Note: row sums on the tensor core] in passes/tile_plan.py).
    """

    roles: tuple[tuple[Dim, str], ...]
    layouts: dict = dataclasses.field(compare=False, repr=False)  # Expr -> Layout
    in_loop: frozenset = dataclasses.field(compare=False, repr=False)  # of Expr
    dots: dict = dataclasses.field(compare=False, repr=False)  # product Expr -> DotPlan
    loop_layouts: tuple[Layout, ...]
    store_layout: Layout  # the output tile's roles
    inputs: tuple[tuple[str, int], ...]
    relayouts: tuple[tuple[str, int], ...]
    extra_store_layouts: tuple[Layout, ...] = ()  # the tile roles of each extra output
    sum_dots: tuple = ()  # (loop sum index, the DotPlan whose operand it sums)

    def sum_dot(self, k: int) -> DotPlan | None:
        """The dot beside which loop sum ``k`` runs on the tensor core, if it does."""
        return dict(self.sum_dots).get(k)

    @property
    def store_layouts(self) -> tuple[Layout, ...]:
        """The tile roles of every output, in the kernel's output order."""
        return (self.store_layout, *self.extra_store_layouts)

    def fma_dots(self, fp32_precision: str, interpret: bool = False) -> bool:
        """Whether some ``tl.dot`` multiplies IEEE float32 operands: it then runs on CUDA
        cores with operands and products in registers, not on tensor cores."""
        return fp32_precision == "ieee" and any(
            dot.operand_dtype(interpret) == torch.float32 for dot in self.dots.values())


@dataclasses.dataclass(frozen=True)
class TiledKernel:
    """A kernel with its tiling and everything the tiling decided per value."""

    kernel: Kernel
    tiling: Tiling
    plan: TilePlan

"""Index maps: sizes, axis factorizations and the view operations.

A lowered tensor value is an :class:`Access`: a base tensor read through an index map.
View-like ATen operations (permute, transpose, unsqueeze, squeeze, expand, reshape)
only change that map, so they never become loop nests. An axis is a tuple of dims in
row-major order (``()`` for a size-1 broadcast axis); a reshape regroups, and where
needed splits, those factors.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
from typing import Any

import sympy
import torch
import torch.fx as fx

from flashlight.ir import Axis, Const, Dim, SizeValue


class Unsupported(Exception):
    """A node the lowering cannot express; it becomes opaque (runs outside Flashlight)."""


@dataclasses.dataclass(frozen=True)
class Access:
    """A lowered tensor value: (a view of) base ``name`` read through an index map.

    ``index`` gives, per axis of the base, the compound of template dims that indexes
    it; ``axes`` gives, per axis of this value, the compound of template dims that
    axis spans (``()`` for a size-1 broadcast axis).
    """

    kind: str  # "input" (graph input or opaque value) or "nest"
    name: str
    index: tuple[Axis, ...]
    axes: tuple[Axis, ...]
    dtype: torch.dtype


# ------------------------------------------------------------------------------ sizes


def size_of(value: Any) -> int | str:
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        expr = _exact_divisions(value.node.expr, value.node.shape_env)
        return int(expr) if expr.is_number else str(expr)
    raise Unsupported(f"size {value!r}")


def _exact_divisions(expr: sympy.Expr, shape_env) -> sympy.Expr:
    """``expr`` with the exact divisions its shape environment knows of made explicit
    ([Note: sizes divisible by a guard])."""
    from torch.utils._sympy.functions import FloorDiv, Mod

    exact = getattr(shape_env, "divisible", None)
    if not exact or not expr.free_symbols:
        return expr
    pairs = [tuple(fact.args) for fact in exact
             if isinstance(fact, Mod) and all(isinstance(a, sympy.Symbol) for a in fact.args)]
    numerators = [a for a, _ in pairs]
    # one rewrite per symbol, none of a symbol rewritten itself: the bases stay consistent
    quotients = {(a, b): sympy.Symbol(f"{a.name}_over_{b.name}", integer=True, positive=True)
                 for a, b in pairs if numerators.count(a) == 1 and b not in numerators}
    if not quotients:
        return expr
    expr = expr.replace(lambda e: isinstance(e, FloorDiv) and tuple(e.args) in quotients,
                        lambda e: quotients[tuple(e.args)])
    return sympy.expand(expr.xreplace({a: b * q for (a, b), q in quotients.items()}))


def base_symbols(text: str) -> frozenset[str]:
    """The shape environment's symbols a size written by :func:`size_of` depends on: its
    own, with a quotient ``a_over_b`` ([Note: sizes divisible by a guard]) standing for
    ``a`` and ``b``."""
    names: set[str] = set()
    for symbol in sym(text).free_symbols:
        numerator, over, denominator = symbol.name.partition("_over_")
        names |= {numerator, denominator} if over else {symbol.name}
    return frozenset(names)


# [Note: sizes divisible by a guard]
# Dynamo's shape environment records facts its guards established; one of them matters to
# the lowering: that a size divides another (``Mod(H, h) == 0``), as grouped-query
# attention implies where it repeats ``h`` key heads ``H // h`` times to meet ``H`` query
# heads. Sizes reach the IR as expressions of the environment's symbols, without the
# environment, and ``h * (H // h)`` is ``H`` only by that fact: the repeated keys' heads
# would not line up with the queries' and the reshapes around them would not factor.
# So a size is written in a basis where the fact is built in: for every recorded
# ``Mod(a, b) == 0`` of two symbols, ``a`` becomes ``b * q`` with ``q`` a new positive
# integer symbol ``a_over_b`` (and ``a // b`` becomes ``q``). Every size of the graph
# goes through this, so equal sizes stay equal, ``H`` factors into ``h`` and ``H // h``
# as a static ``8`` factors into ``2 * 4``, and at run time ``q`` is read as ``a``'s axis
# divided by ``b`` (a merged axis, :func:`flashlight.launch_sizes.size_sources`).


# [Note: sizes used as values]
# A size is also a value of the graph: ``(T - 1) // 2`` clamps a relative distance to a
# table of ``T`` buckets, ``Lk - Lq`` offsets a causal mask whose queries are the keys'
# last rows. With the sizes symbolic, such a value is a SymInt node, an expression of
# the shape environment's symbols; it is the same at every point of a kernel and known
# at launch. The IR holds it as ``SizeValue`` with its text (the sympy expression as
# :func:`size_of` prints it: Python's integer syntax, ``((s3 - 1)//2)``). The kernel
# takes it as a size argument; the runtime reads the symbols it names from the inputs'
# axes, as it reads every symbolic size, and evaluates the text with them
# (:func:`evaluate_size`). Only integer arithmetic on symbols and numbers is accepted
# (``+ - * // %`` and powers): a text with any other name or operation stays a node of
# the graph, computed outside the kernel.

_SIZE_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd)


@functools.lru_cache(maxsize=1024)
def size_formula(text: str):
    """``text`` compiled for :func:`evaluate_size` and the names of the sizes it reads;
    raises :class:`Unsupported` for any text but integer arithmetic on names and numbers."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise Unsupported(f"a size {text!r} that is not an integer expression") from error
    for node in ast.walk(tree):
        allowed = isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, *_SIZE_OPERATORS)) \
            or isinstance(node, ast.Constant) and type(node.value) is int
        if not allowed:
            raise Unsupported(f"a size {text!r} that is not integer arithmetic on sizes")
    names = tuple(sorted({node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}))
    return compile(tree, "<size>", "eval"), names


def size_value(value: Any) -> Const | SizeValue:
    """A size (an int, a SymInt, a sympy expression of sizes or a size's text) used as a
    value ([Note: sizes used as values])."""
    if isinstance(value, sympy.Expr):
        value = int(value) if value.is_number else str(value)
    size = value if isinstance(value, str) else size_of(value)
    if isinstance(size, int):
        return Const(size, torch.int64)
    size_formula(size)  # raises Unsupported where the runtime could not evaluate it
    return SizeValue(size)


def evaluate_size(text: str, values: dict[str, int]) -> int:
    """The value of size expression ``text`` with its names' ``values``."""
    code, names = size_formula(text)
    value = eval(code, {"__builtins__": {}}, {name: values[name] for name in names})  # noqa: S307 - checked above
    if not isinstance(value, (int, torch.SymInt)):  # a negative power (SymInts: a trace's sizes)
        raise ValueError(f"size {text!r} is {value!r} at {values}, not an integer")
    return value


def sym(size: int | str) -> sympy.Expr:
    """A size as a sympy expression; the symbols of a symbolic size are positive
    integers, as the shape environment that made them declares them (parsed from text
    without that, ``s0 * s1 / s0`` would not be known to be an integer, and a reshape
    merging two symbolic dims would not line up)."""
    return sympy.Integer(size) if isinstance(size, int) else _parse_size(size)


@functools.lru_cache(maxsize=4096)
def _parse_size(text: str) -> sympy.Expr:
    expr = sympy.sympify(text)
    return expr.subs({s: sympy.Symbol(s.name, integer=True, positive=True) for s in expr.free_symbols})


def sizes_equal(a: int | str, b: int | str) -> bool:
    return a == b or sympy.simplify(sym(a) - sym(b)) == 0


def meta_val(node: fx.Node):
    return node.meta.get("val")


class NodeView:
    """An FX node seen with other arguments or another value (``meta["val"]``), so a
    lowering rule can handle it as a node of that form (``rsub`` as ``sub`` with its
    operands swapped, a tuple-valued node as its first output)."""

    def __init__(self, node: fx.Node, args: tuple | None = None, kwargs: dict | None = None, val=None):
        self.name = node.name
        self.args = node.args if args is None else args
        self.kwargs = node.kwargs if kwargs is None else kwargs
        self.meta = node.meta if val is None else {**node.meta, "val": val}


def node_shape(node: fx.Node) -> tuple:
    val = meta_val(node)
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"{node.name} is not a tensor")
    return tuple(size_of(s) for s in val.shape)


def match_axis(own: Axis, target: Axis) -> dict[Dim, Axis]:
    """Map the template dims of an operand axis onto groups of the result axis dims.

    The result axis is factored at least as finely as every operand axis (see
    :func:`finest`), so each operand factor covers consecutive result factors.
    """
    mapping: dict[Dim, Axis] = {}
    pos = 0
    for d in own:
        group: list[Dim] = []
        remaining = sym(d.size)
        while remaining != 1:
            if pos >= len(target):
                raise Unsupported("operands factor a broadcast axis differently")
            remaining = sympy.simplify(remaining / sym(target[pos].size))
            group.append(target[pos])
            pos += 1
        if not is_one(remaining):
            raise Unsupported("operands factor a broadcast axis differently")
        mapping[d] = tuple(group)
    if pos != len(target):
        raise Unsupported("operands factor a broadcast axis differently")
    return mapping


def is_one(value: sympy.Expr) -> bool:
    return bool(value == 1)


def finest(axes: list[Axis]) -> list:
    """Factor sizes of the finest factorization among operand axes of one result axis."""
    axes = [a for a in axes if a]
    if not axes:
        return []
    best = max(axes, key=len)
    for other in axes:
        match_axis(other, best)  # raises when the factorizations are incompatible
    return [d.size for d in best]


# --------------------------------------------------------------------------- views


def view_permute(src: Access, node: fx.Node) -> Access:
    order = [d % len(src.axes) for d in node.args[1]]
    return dataclasses.replace(src, axes=tuple(src.axes[d] for d in order))


def view_transpose(src: Access, node: fx.Node) -> Access:
    n = len(src.axes)
    a, b = node.args[1] % n, node.args[2] % n
    axes = list(src.axes)
    axes[a], axes[b] = axes[b], axes[a]
    return dataclasses.replace(src, axes=tuple(axes))


def view_t(src: Access, node: fx.Node) -> Access:
    return dataclasses.replace(src, axes=tuple(reversed(src.axes)))


def view_unsqueeze(src: Access, node: fx.Node) -> Access:
    axes = list(src.axes)
    pos = node.args[1] % (len(axes) + 1)
    axes.insert(pos, ())
    return dataclasses.replace(src, axes=tuple(axes))


def view_squeeze(src: Access, node: fx.Node) -> Access:
    dims = node.args[1] if len(node.args) > 1 else None
    if dims is None:
        return dataclasses.replace(src, axes=tuple(a for a in src.axes if a))
    dims = [dims] if isinstance(dims, int) else list(dims)
    drop = {d % len(src.axes) for d in dims}
    return dataclasses.replace(src, axes=tuple(a for k, a in enumerate(src.axes) if not (k in drop and not a)))


def view_expand(src: Access, node: fx.Node) -> Access:
    shape = node_shape(node)
    offset = len(shape) - len(src.axes)
    axes: list[Axis] = [(Dim.fresh(s, "b"),) if s != 1 else () for s in shape[:offset]]
    for k, own in enumerate(src.axes):
        size = shape[offset + k]
        axes.append((Dim.fresh(size, "b"),) if not own and size != 1 else own)
    return dataclasses.replace(src, axes=tuple(axes))


def view_reshape(src: Access, node: fx.Node) -> Access:
    """Regroup the factors of the source axes into the target shape (splitting if needed)."""
    shape = node_shape(node)
    factors = [d for axis in src.axes for d in axis]
    if 0 in shape or any(d.size == 0 for d in factors):
        raise Unsupported("reshape of a zero-size tensor")  # 0 / 0 has no factorization
    index = src.index
    new_axes: list[Axis] = []
    pos = 0
    for size in shape:
        if size == 1:
            new_axes.append(())
            continue
        group: list[Dim] = []
        remaining = sym(size)
        while remaining != 1:
            if pos >= len(factors):
                raise Unsupported("reshape does not line up with the source factors")
            f = factors[pos]
            ratio = sympy.simplify(remaining / sym(f.size))
            if ratio.is_integer is True or (ratio.is_number and ratio == int(ratio)) or ratio.is_Integer:
                group.append(f)
                remaining = ratio
                pos += 1
                continue
            # split factor f into (head, tail) with head of the remaining size
            tail = sympy.simplify(sym(f.size) / remaining)
            if not (tail.is_Integer or tail.is_integer):
                raise Unsupported("reshape splits a dim by a size that does not divide it")
            head = Dim.fresh(size_of_sym(remaining), "r")
            rest = Dim.fresh(size_of_sym(tail), "r")
            mapping = {f: (head, rest)}
            index = tuple(tuple(x for d in axis for x in mapping.get(d, (d,))) for axis in index)
            factors[pos:pos + 1] = [head, rest]
            group.append(head)
            pos += 1
            remaining = sympy.Integer(1)
        new_axes.append(tuple(group))
    if pos != len(factors):
        raise Unsupported("reshape leaves source factors unused")
    return dataclasses.replace(src, index=index, axes=tuple(new_axes))


def size_of_sym(expr: sympy.Expr) -> int | str:
    return int(expr) if expr.is_number else str(expr)


def view_identity(src: Access, node: fx.Node) -> Access:
    return src



"""Lowering: an ATen-level FX graph to the loop-nest IR.

Every compute node becomes one :class:`~flashlight.ir.Nest` with fresh dims for its
output axes (``_softmax`` becomes the nests of its definition: max, shift, sum of exps,
quotient). View-like nodes (view, permute, transpose, expand, unsqueeze, ...) produce no
nest: they change the index map through which consumers read their base. Nodes with
no lowering become *opaque*: they run outside Flashlight, and Flashlight kernels read
their results as inputs.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch
import torch.fx as fx

from flashlight.indexing import (
    Access,
    NodeView,
    Unsupported,
    finest,
    meta_val,
    node_shape,
    size_value,
    view_expand,
    view_identity,
    view_permute,
    view_reshape,
    view_squeeze,
    view_t,
    view_transpose,
    view_unsqueeze,
)
from flashlight.ir import (
    Const,
    Dim,
    Expr,
    Graph,
    Iota,
    Load,
    Nest,
    Pointwise,
    Reduce,
    dim_names,
    walk,
)
from flashlight.lower_compare import as_eager_holds, check_not_a_tie, compared_with_a_copy
from flashlight.lower_context import LowerContext, compared
from flashlight.lower_gather import GATHER_LOWERINGS
from flashlight.lower_reductions import REDUCTION_LOWERINGS, reduce_over
from flashlight.lower_sources import SOURCE_LOWERINGS
from flashlight.vocabulary import COMPARISONS, DISCONTINUOUS, HALF_DTYPES, INTEGER_EXACT, KERNEL_DTYPES, OPS

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Lowered:
    graph: Graph
    opaque: dict[str, str]  # FX node name -> why it was not lowered
    nest_of_node: dict[str, str]  # FX node name -> the nest computing it
    next_dim_id: int = 0  # the passes number the dims they make from here (ir.dim_names)
    order: dict[str, int] = dataclasses.field(default_factory=dict)  # FX node name -> its place in the graph
    users: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # FX node name -> its users
    views: frozenset[str] = frozenset()  # FX nodes that only re-index their input (REINDEXING)


# ------------------------------------------------------------------------- the lowerer


class _Lowerer:
    """Lowers the nodes of ``gm`` in order through the rules, into one context."""

    def __init__(self, gm: fx.GraphModule):
        self.gm = gm
        self.lw = LowerContext()
        self.opaque: dict[str, str] = {}
        self.materialized: set[str] = set()

    # ---- main loop
    def run(self) -> Lowered:
        lw = self.lw
        for node in self.gm.graph.nodes:
            if node.op in ("placeholder", "call_function") and isinstance(meta_val(node), torch.SymInt):
                try:  # a size (fixed by a guard: a number) used as a value ([Note: sizes used as values])
                    lw.env[node.name] = size_value(meta_val(node))
                except Unsupported as why:
                    if node.op != "placeholder":
                        self._make_opaque(node, f"{_op_name(node)}: {why}")
                continue
            if node.op == "call_function" and isinstance(meta_val(node), torch.SymFloat):
                self._float_of_sizes(node)
                continue
            if node.op == "placeholder":
                if isinstance(meta_val(node), torch.Tensor):
                    lw.env[node.name] = lw.input_access(node)
                continue
            if node.op == "output":
                for arg in fx.graph.map_arg(node.args, lambda n: n).__iter__():
                    self._use_outside(arg)
                continue
            if node.op != "call_function":
                self._make_opaque(node, f"{node.op} nodes run outside Flashlight")
                continue
            lw.origin = node.name
            rule = LOWERINGS.get(node.target)
            if rule is None:
                self._make_opaque(node, f"no Flashlight lowering for {_op_name(node)}")
                continue
            before = len(lw.nests)
            try:
                value = rule(lw, node)
                inexact = next(filter(None, (inexact_reason(n) for n in lw.nests[before:])), None)
                if inexact is not None:
                    raise Unsupported(inexact)
                lw.env[node.name] = value
                if len(lw.nests) > before and isinstance(meta_val(node), torch.Tensor):
                    lw.nest_of_node[node.name] = lw.nests[-1].name
            except Unsupported as why:
                del lw.nests[before:]  # what the rule built before it gave up
                lw.tuple_values.pop(node.name, None)
                self._make_opaque(node, f"{_op_name(node)}: {why}")
        outside = frozenset(self.materialized)  # needed outside Flashlight; kernels may recompute them
        # nests every kernel reads from memory (flashlight/lower_compare.py), pinned: else
        # elementwise fusion would inline them; only those an FX node computes can be stored
        read = (compared_with_a_copy(self.gm, lw.env, self.opaque, outside) | lw.tied) \
            & frozenset(lw.nest_of_node.values())
        graph = Graph(tuple(lw.nests), tuple(lw.inputs), outside | lw.stored | read,
                      recomputed=outside - lw.stored - read, pinned=read)
        order = {node.name: k for k, node in enumerate(self.gm.graph.nodes)}
        users = {node.name: tuple(u.name for u in node.users) for node in self.gm.graph.nodes}
        views = frozenset(node.name for node in self.gm.graph.nodes if node.target in REINDEXING)
        return Lowered(graph, self.opaque, lw.nest_of_node, order=order, users=users, views=views)

    def _use_outside(self, arg: Any) -> None:
        """``arg`` is consumed outside Flashlight: its base nest must be materialized."""
        nodes: list[fx.Node] = []
        fx.graph.map_arg(arg, nodes.append)
        for n in nodes:
            found = self.lw.env.get(n.name)
            if isinstance(found, Access) and found.kind == "nest":
                self.materialized.add(found.name)

    def _float_of_sizes(self, node: fx.Node) -> None:
        """A float computed from sizes (``1 / math.sqrt(d)`` with ``d`` symbolic): a constant
        where the sizes it reads are fixed (a head width fixed to this call's value,
        [Note: sizes a tile must know] in :mod:`flashlight.passes.tiling`), else computed
        outside, as the runtime evaluates only integer sizes. The constant is the shape
        environment's exact expression rounded once to a double, where Python computes
        ``1 / math.sqrt(d)`` in two roundings: at most an ulp of a double apart."""
        expr = meta_val(node).node.expr
        if expr.is_number:
            self.lw.env[node.name] = Const(float(expr), torch.float64)  # retyped where used (LowerContext.value)
        else:
            self._make_opaque(node, f"{_op_name(node)}: a float computed from symbolic sizes")

    def _make_opaque(self, node: fx.Node, reason: str) -> None:
        self._use_outside((node.args, node.kwargs))
        self.opaque[node.name] = reason
        val = meta_val(node)
        if isinstance(val, torch.Tensor):
            try:
                self.lw.env[node.name] = self.lw.input_access(node)
            except Unsupported:
                pass


def _op_name(node: fx.Node) -> str:
    target = node.target
    return getattr(target, "__name__", None) or str(target)


# ---------------------------------------------------------------------- numerics
#
# Kernels compute floats in float32 and accumulate every reduction in float32; integer
# and boolean elementwise work runs in Triton's integer arithmetic, exact as in eager.
# A nest whose value would differ from eager's that way (float64 values, integer
# reductions, integer ops printed through float32) is not lowered: its op runs as
# PyTorch does, and the reason is what explain() and FLASHLIGHT_DEBUG=1 show.



def inexact_reason(nest: Nest) -> str | None:
    """Why ``nest`` computed in a Flashlight kernel would not give eager PyTorch's values
    in its dtype, or None when it would."""
    if nest.dtype == torch.float64:
        return "float64 values (Flashlight kernels compute in float32)"
    for node in walk(nest.body):
        if node.dtype not in KERNEL_DTYPES and node.dtype != torch.float64:
            return f"{_dtype_name(node.dtype)} values (no Flashlight kernel type)"
    return _inexact_expr(nest.body)


def _inexact_expr(expr: Expr) -> str | None:
    if isinstance(expr, Pointwise) and expr.op == "cast" and expr.dtype == torch.float32 \
            and isinstance(expr.args[0], Load):
        return None  # a float64 input rounded to float32 once, as eager rounds it
    if expr.dtype == torch.float64:
        return "float64 values (Flashlight kernels compute in float32)"
    if isinstance(expr, Reduce) and not expr.dtype.is_floating_point:
        return f"a {expr.op} of {_dtype_name(expr.dtype)} values (Flashlight kernels accumulate in float32)"
    if isinstance(expr, Pointwise) and not expr.dtype.is_floating_point:
        why = _integer_op_issue(expr)
        if why is not None:
            return f"{why} (Flashlight kernels would compute it in float32)"
    return next(filter(None, (_inexact_expr(child) for child in expr.children())), None)


def _integer_op_issue(expr: Pointwise) -> str | None:
    """What in integer (or boolean) op ``expr`` the kernel would print as float arithmetic."""
    op, kind = expr.op, _dtype_name(expr.dtype)
    if op not in INTEGER_EXACT:
        return f"{op} of {kind} values"
    if op in COMPARISONS or op == "cast":
        return None  # comparisons promote as eager does; a cast is Triton's
    operands = expr.args[1:] if op == "where" else expr.args
    if op in ("and", "or", "not"):
        logical_on_ints = expr.dtype == torch.bool and any(a.dtype != torch.bool for a in operands)
        return f"a logical {op} of integers" if logical_on_ints or (op == "not" and expr.dtype != torch.bool) else None
    if op == "pow":
        exponent = expr.args[1]
        if not (isinstance(exponent, Const) and float(exponent.value).is_integer() and exponent.value >= 0):
            return f"a power of {kind} values"
        operands = expr.args[:1]
    if any(a.dtype.is_floating_point or isinstance(a, Const) and isinstance(a.value, float) for a in operands):
        return f"{op} of {kind} values with a float operand"
    return None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------- views


def _view_like(fn: Callable[[Access, fx.Node], Access]):
    def rule(lw: LowerContext, node: fx.Node) -> Access | Const:
        src = lw.value(node.args[0], meta_val(node).dtype)
        if not isinstance(src, Access):
            return src  # every element of a view of a constant is that constant
        return fn(src, node)

    return rule


# ------------------------------------------------------------------------ pointwise


def _pointwise(op: str, nargs: int | None = None):
    def rule(lw: LowerContext, node: fx.Node) -> Access:
        dtype = meta_val(node).dtype
        args = list(node.args if nargs is None else node.args[:nargs])
        if op == "sub" and node.kwargs.get("alpha", 1) != 1 or op == "add" and node.kwargs.get("alpha", 1) != 1:
            raise Unsupported("alpha != 1")
        if op == "div" and node.kwargs.get("rounding_mode") is not None:
            raise Unsupported("rounding division")
        if op in COMPARISONS:
            common = _common_dtype(args)
            operands = [compared(lw.value(a, _operand_dtype(a, common))) for a in args]
            check_not_a_tie(lw, op, operands)
        else:
            operands = [lw.value(a, _operand_dtype(a, dtype)) for a in args]
        if op in ("floor", "ceil") and not dtype.is_floating_point and isinstance(operands[0], Access):
            return operands[0]  # integers are their own floor and ceiling
        axes = lw.result_axes(node, operands)
        reads = [lw.read(v, axes) for v in operands]
        if op in DISCONTINUOUS:  # [Note: a comparison sees 16-bit values rounded]
            reads = [as_eager_holds(r) if isinstance(v, Access) and v.kind == "nest" else r
                     for v, r in zip(operands, reads)]
        if op == "relu" and not dtype.is_floating_point:
            return lw.add_nest(axes, eager_arithmetic("maximum", (reads[0], Const(0, dtype)), dtype), dtype, op)
        if (nargs == 1 or op == "pow") and dtype.is_floating_point and not reads[0].dtype.is_floating_point:
            reads[0] = Pointwise("cast", (reads[0],), dtype)  # exp(int), int ** 0.5: eager's promotion
        return lw.add_nest(axes, eager_arithmetic(op, tuple(reads), dtype), dtype, op)

    return rule


def _operand_dtype(arg: Any, default: torch.dtype) -> torch.dtype:
    """The dtype of a scalar operand of an op computed in ``default``."""
    if isinstance(arg, bool):
        return torch.bool
    if isinstance(arg, int) and not default.is_floating_point:
        return default if default != torch.bool else torch.int64
    return default


def _common_dtype(args) -> torch.dtype:
    """The dtype PyTorch computes a comparison of ``args`` in (``torch.result_type``): a
    scalar compared with a tensor takes the tensor's dtype (an integer tensor compared
    with a float scalar, the default float dtype)."""
    values = [meta_val(a) if isinstance(a, fx.Node) else a for a in args]
    if len(values) != 2 or not all(isinstance(v, (torch.Tensor, bool, int, float)) for v in values):
        return torch.bool  # a size compared: its scalars keep their own dtypes
    return torch.result_type(*values)


# [Note: integer and boolean arithmetic]
# PyTorch computes integer arithmetic in the result's dtype, wrapping modulo its width
# (a uint8 ``x - 100`` is ``x + 156``; a scalar out of range wraps too), and bool ``+``
# and ``*`` as logical or / and (``True + True`` is ``True``). Triton's integer literals
# are int32 and its int1 arithmetic wraps, so the lowering spells eager's meaning out:
# arithmetic on 8- and 16-bit integers is computed in int32 and cast back to the
# result's dtype (exact: the low bits of a sum, difference or product do not depend on
# the high ones; a quotient or remainder of operands already wrapped fits), the scalars
# of an integer op are wrapped into its dtype (``LowerContext.value``), and bool sums
# and products are ``or`` and ``and``.
NARROW_INTEGERS = (torch.int8, torch.uint8, torch.int16)
_WRAPPING = frozenset({"add", "sub", "mul", "neg", "abs", "pow", "floordiv", "truncdiv", "remainder"})
_LOGICAL = {"add": "or", "maximum": "or", "mul": "and", "minimum": "and"}


def eager_arithmetic(op: str, args: tuple[Expr, ...], dtype: torch.dtype) -> Expr:
    """``op`` of ``args`` with PyTorch's meaning in ``dtype`` ([Note: integer and boolean
    arithmetic])."""
    if dtype == torch.bool and op in _LOGICAL:
        return Pointwise(_LOGICAL[op], args, dtype)
    if dtype in NARROW_INTEGERS and op in _WRAPPING:
        wide = tuple(_as_int32(a) for a in args)
        return Pointwise("cast", (Pointwise(op, wide, torch.int32),), dtype)
    return Pointwise(op, args, dtype)


def _as_int32(expr: Expr) -> Expr:
    if expr.dtype not in (*NARROW_INTEGERS, torch.bool):
        return expr
    if isinstance(expr, Const):
        return Const(int(expr.value), torch.int32)
    return Pointwise("cast", (expr,), torch.int32)


def _where_scalar_fill(lw: LowerContext, node: fx.Node) -> Access:
    """``masked_fill(x, mask, value)`` is ``where(mask, value, x)``."""
    dtype = meta_val(node).dtype
    x = lw.value(node.args[0], dtype)
    mask = lw.value(node.args[1], torch.bool)
    fill = lw.value(node.args[2], dtype)
    axes = lw.result_axes(node, [x, mask, fill])
    body = Pointwise("where", (lw.read(mask, axes), lw.read(fill, axes), lw.read(x, axes)), dtype)
    return lw.add_nest(axes, body, dtype, "masked_fill")


def _to_copy(lw: LowerContext, node: fx.Node) -> Access:
    dtype = meta_val(node).dtype
    src = lw.value(node.args[0], dtype)
    if isinstance(src, Access) and src.dtype == dtype:
        return src
    axes = lw.result_axes(node, [src])
    return lw.add_nest(axes, Pointwise("cast", (lw.read(src, axes),), dtype), dtype, "cast")


def _clamp(lw: LowerContext, node: fx.Node) -> Access:
    dtype = meta_val(node).dtype
    x = lw.value(node.args[0], dtype)
    axes = lw.result_axes(node, [x])
    body = lw.read(x, axes)
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    if lo is not None:  # a number, or a node holding a size
        body = Pointwise("maximum", (body, lw.read(lw.value(lo, dtype), axes)), dtype)
    if hi is not None:
        body = Pointwise("minimum", (body, lw.read(lw.value(hi, dtype), axes)), dtype)
    return lw.add_nest(axes, body, dtype, "clamp")


def _clamp_one_side(side: str):
    """``clamp_min(x, lo)`` / ``clamp_max(x, hi)``: a clamp with one bound."""

    def rule(lw: LowerContext, node: fx.Node) -> Access:
        bound = node.args[1]
        args = (node.args[0], bound, None) if side == "min" else (node.args[0], None, bound)
        return _clamp(lw, NodeView(node, args, kwargs={}))

    return rule


def _tri(keep_lower: bool):
    def rule(lw: LowerContext, node: fx.Node) -> Access:
        dtype = meta_val(node).dtype
        x = lw.value(node.args[0], dtype)
        diagonal = node.args[1] if len(node.args) > 1 else node.kwargs.get("diagonal", 0)
        axes = lw.result_axes(node, [x])
        # [..., R, C]; a unit axis has index 0
        row, col = (Iota(a) if a else Const(0, torch.int64) for a in axes[-2:])
        offset = Pointwise("sub", (col, row), torch.int64)
        cmp = "le" if keep_lower else "ge"
        keep = Pointwise(cmp, (offset, Const(diagonal, torch.int64)), torch.bool)
        body = Pointwise("where", (keep, lw.read(x, axes), Const(0, dtype)), dtype)
        return lw.add_nest(axes, body, dtype, "tril" if keep_lower else "triu")

    return rule


def _contraction(lw: LowerContext, node: fx.Node) -> Access:
    """mm / bmm: out[..., m, n] = sum_k a[..., m, k] * b[..., k, n]."""
    return _contract(lw, node, *node.args[:2])


def _baddbmm(lw: LowerContext, node: fx.Node) -> Access:
    """baddbmm(c, a, b, beta, alpha) = beta * c + alpha * (a @ b)."""
    dtype = meta_val(node).dtype
    c = lw.value(node.args[0], dtype)
    product = _contract(lw, node, node.args[1], node.args[2])
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)  # numbers, or nodes of sizes
    axes = lw.result_axes(node, [c, product])  # factored as finely as both (a batch of b x h)
    scaled = Pointwise("mul", (lw.value(alpha, dtype), lw.read(product, axes)), dtype)
    body = scaled if isinstance(beta, (int, float)) and beta == 0 else Pointwise(
        "add", (Pointwise("mul", (lw.value(beta, dtype), lw.read(c, axes)), dtype), scaled), dtype)
    return lw.add_nest(axes, body, dtype, "baddbmm")


def _contract(lw: LowerContext, node: fx.Node, a_arg, b_arg) -> Access:
    dtype = meta_val(node).dtype
    a, b = (lw.value(x, dtype) for x in (a_arg, b_arg))
    if not isinstance(a, Access) or not isinstance(b, Access):
        raise Unsupported("matmul with a constant")
    out_shape = node_shape(node)
    if len(a.axes) != len(b.axes) or len(a.axes) != len(out_shape):
        raise Unsupported("matmul rank")
    batch = tuple(tuple(Dim.fresh(s) for s in finest([x, y])) for x, y in zip(a.axes[:-2], b.axes[:-2]))
    m_axis = tuple(Dim.fresh(d.size) for d in a.axes[-2])
    n_axis = tuple(Dim.fresh(d.size) for d in b.axes[-1])
    k_axis = tuple(Dim.fresh(s) for s in finest([a.axes[-1], b.axes[-2]]))
    a_read = lw.read(a, batch + (m_axis, k_axis))
    b_read = lw.read(b, batch + (k_axis, n_axis))
    body = reduce_over("sum", Pointwise("mul", (a_read, b_read), _product_dtype(a_arg, b_arg, dtype)), k_axis, dtype)
    return lw.add_nest(batch + (m_axis, n_axis), body, dtype, "matmul")


def _product_dtype(a_arg, b_arg, dtype: torch.dtype) -> torch.dtype:
    """The dtype of a matmul's products: its own, or, for a float32 matmul of two
    factors both widened from one 16-bit dtype (a matmul asked for in float32 to keep its
    sum unrounded: [Note: a row term from a rounded output]), that 16-bit dtype. Widening
    is exact and a product of two 16-bit floats is exact in float32, so the products
    are the same; the kernel's ``tl.dot`` then takes 16-bit operands (tensor cores) and
    still accumulates in float32."""
    narrow = {_widened_from(a_arg), _widened_from(b_arg)}
    return narrow.pop() if dtype == torch.float32 and len(narrow) == 1 and narrow <= set(HALF_DTYPES) else dtype


def _widened_from(arg) -> torch.dtype | None:
    """The 16-bit dtype ``arg`` is a float cast of (through re-indexing), else None."""
    while isinstance(arg, fx.Node) and arg.target in REINDEXING:
        arg = arg.args[0]
    if not (isinstance(arg, fx.Node) and LOWERINGS.get(arg.target) is _to_copy and isinstance(arg.args[0], fx.Node)):
        return None
    source = meta_val(arg.args[0])
    return source.dtype if source is not None and source.dtype in HALF_DTYPES else None


# operations that give their input's values re-indexed (or copied as they are)
REINDEXING = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
    aten.transpose.int, aten.t.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.expand.default, aten.clone.default, aten.alias.default,
    aten.detach.default, aten.lift_fresh_copy.default,
})

LOWERINGS: dict[Any, Callable[[LowerContext, fx.Node], Access]] = {
    aten.view.default: _view_like(view_reshape),
    aten._unsafe_view.default: _view_like(view_reshape),
    aten.reshape.default: _view_like(view_reshape),
    aten.permute.default: _view_like(view_permute),
    aten.transpose.int: _view_like(view_transpose),
    aten.t.default: _view_like(view_t),
    aten.unsqueeze.default: _view_like(view_unsqueeze),
    aten.squeeze.dim: _view_like(view_squeeze),
    aten.squeeze.dims: _view_like(view_squeeze),
    aten.squeeze.default: _view_like(view_squeeze),
    aten.expand.default: _view_like(view_expand),
    aten.clone.default: _view_like(view_identity),
    aten.alias.default: _view_like(view_identity),
    aten.detach.default: _view_like(view_identity),
    aten.lift_fresh_copy.default: _view_like(view_identity),
    aten._to_copy.default: _to_copy,
    torch.ops.prims.convert_element_type.default: _to_copy,
    aten.masked_fill.Scalar: _where_scalar_fill,
    aten.masked_fill.Tensor: _where_scalar_fill,
    aten.clamp.default: _clamp,
    aten.clamp_min.default: _clamp_one_side("min"),
    aten.clamp_max.default: _clamp_one_side("max"),
    aten.tril.default: _tri(True),
    aten.triu.default: _tri(False),
    **SOURCE_LOWERINGS,
    aten.bmm.default: _contraction,
    aten.baddbmm.default: _baddbmm,
    aten.mm.default: _contraction,
    **REDUCTION_LOWERINGS,
    **GATHER_LOWERINGS,
}

for _op, _info in OPS.items():  # the elementwise ops of the vocabulary
    for _overload in _info.aten:
        _packet, _name = _overload.split(".")
        LOWERINGS[getattr(getattr(aten, _packet), _name)] = _pointwise(_op, _info.arity)


def _rsub(lw: LowerContext, node: fx.Node) -> Access:
    """``rsub(x, y) = y - x``: ``sub`` with its two operands swapped."""
    return _pointwise("sub", 2)(lw, NodeView(node, (node.args[1], node.args[0])))


LOWERINGS[aten.rsub.Scalar] = _rsub


def _rounding_div(lw: LowerContext, node: fx.Node) -> Access:
    """``div(a, b, rounding_mode=...)``: ``floor`` (``a // b``) or ``trunc``."""
    mode = node.kwargs.get("rounding_mode")
    if mode not in ("floor", "trunc"):
        return _pointwise("div", 2)(lw, node)
    return _pointwise(f"{mode}div", 2)(lw, NodeView(node, kwargs={}))


LOWERINGS[aten.div.Tensor_mode] = _rounding_div
LOWERINGS[aten.div.Scalar_mode] = _rounding_div


def _scalar_pow(lw: LowerContext, node: fx.Node) -> Access:
    """``base ** x`` for a positive scalar base is ``exp(x * log(base))``."""
    base, exponent = node.args[:2]
    if not isinstance(base, (int, float)) or base <= 0:
        raise Unsupported("pow of a non-positive scalar base")
    dtype = meta_val(node).dtype
    x = lw.value(exponent, dtype)
    axes = lw.result_axes(node, [x])
    scaled = Pointwise("mul", (lw.read(x, axes), Const(math.log(base), dtype)), dtype)
    return lw.add_nest(axes, Pointwise("exp", (scaled,), dtype), dtype, "pow")


LOWERINGS[aten.pow.Scalar] = _scalar_pow


def _exp2(lw: LowerContext, node: fx.Node) -> Access:
    """``exp2(x)`` is ``2 ** x``, so ``exp(x * log 2)``: softmax written with ``exp2`` of
    log2(e)-scaled scores, as FlashAttention kernels write it, is then the exponential of
    a positively scaled difference from the max, which the online pass recognises."""
    return _scalar_pow(lw, NodeView(node, (2.0, node.args[0])))


LOWERINGS[aten.exp2.default] = _exp2


def _float_class(kind: str):
    """``isnan`` (``x != x``), ``isposinf`` / ``isneginf`` (``x == +-inf``) and ``isinf``
    (``|x| == inf``): what ``nan_to_num``'s decomposition tests."""

    def rule(lw: LowerContext, node: fx.Node) -> Access:
        x_dtype = meta_val(node.args[0]).dtype
        x = lw.value(node.args[0], x_dtype)
        axes = lw.result_axes(node, [x])
        value = lw.read(x, axes)
        if kind == "nan":
            body = Pointwise("ne", (value, value), torch.bool)
        else:
            if kind == "inf":
                value = Pointwise("abs", (value,), x_dtype)
            infinity = Const(-math.inf if kind == "neginf" else math.inf, x_dtype)
            body = Pointwise("eq", (value, infinity), torch.bool)
        return lw.add_nest(axes, body, torch.bool, f"is{kind}")

    return rule


for _kind in ("nan", "inf", "posinf", "neginf"):
    LOWERINGS[getattr(aten, f"is{_kind}").default] = _float_class(_kind)


def lower(gm: fx.GraphModule) -> Lowered:
    """Lower an ATen FX graph; nodes that cannot be lowered become opaque inputs.
    Its dims are numbered from 0, so equal graphs lower to equal IR."""
    with dim_names() as ids:
        lowered = _Lowerer(gm).run()
        return dataclasses.replace(lowered, next_dim_id=next(ids))

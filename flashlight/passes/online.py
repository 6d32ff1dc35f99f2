"""Semantic fusion: dependent reduction chains rewritten into a single online pass.

[Note: online reduction]
Let ``M = max_j a_j`` and let a sum over the same extent have the form
``R = sum_j g_j * exp(c * (b_j - M))`` with a constant ``c > 0``, where ``g`` and ``b``
do not depend on ``M`` (the *exp-power* of the body in ``M`` is ``c``: one for a
softmax, ``1 / T`` for a temperature applied after the max is subtracted, two for a
squared softmax). Because ``exp`` maps ``+`` to ``×``,
``exp(c (b - M_new)) = exp(c (b - M_old)) * exp(c (M_old - M_new))``. So walking ``j``
in tiles with a running max ``m`` and a running sum ``r``::

    m_new = max(m, max_{j in tile} a_j)
    r     = r * exp(c * (m - m_new)) + sum_{j in tile} g_j * exp(c * (b_j - m_new))
    m     = m_new

ends with ``m = M`` and ``r = R``: every reduction of the chain is computed in one pass
over ``j``, without the intermediate ``exp(b - M)`` in memory (``c > 0`` keeps every
factor at most one where ``b <= M``, as for a softmax). Nothing here looks for
the word softmax: a chain qualifies by this algebra alone (``torch.softmax``,
a hand-written ``exp(s - s.amax()) / sum``, two softmaxes sharing a loop).

Five rewrites prepare the chain. *Absorbing floors* uses
``max(max_j a_j, r) = max_j max(a_j, r)`` for ``r`` that does not depend on ``j``: a max
clamped from below (``softmax_1``'s ``max(M, 0)``, the extra zero logit of "quiet"
attention, a learned sink logit) is again a plain loop max, so ``exp(s - max(M, 0))``
qualifies with ``c = 1``; the loop max then starts from ``r`` instead of ``-inf``
(``LoopReduction.init``), which keeps its body the bare scores that tile skipping reads.
*Leaving log space* turns ``exp(a - log b)`` into
``exp(a) / b`` (and ``exp(a + log b)`` into ``exp(a) * b``), for every ``log`` term of
the exponent: ``exp(log_softmax(s))`` and ``exp(s - logsumexp(s))`` become the softmax
quotient. *Invariant factoring* uses linearity:
``sum_j (c * x_j) = c * sum_j x_j`` when ``c`` does not depend on ``j``; it moves the
softmax denominator out of ``sum_j p_j v_j``. *Splitting sums* uses linearity the other way:
``sum_j (x_j + y_j) = sum_j x_j + sum_j y_j``. A sum whose body depends on a loop max
other than through ``exp(c * (x - max))`` factors is expanded (``*`` and ``/`` distributed
over ``+`` and ``-``) into terms that each qualify on their own: a softmax mixed with a
uniform prior, ``(p1 - lam * p2) @ v`` over two softmaxes, each term rescaled by its own
max. *Hoisting* lifts reductions that do not
depend on an enclosing reduction's dim to the loop level (the row max inside
``exp(s - max)``).

Rows where every ``a_j`` is ``-inf``: the running max stays ``-inf``. We subtract a
*safe* max (``0`` where the max is ``-inf``) so ``exp(-inf - 0) = 0`` instead of
``exp(-inf + inf) = nan`` while the row is still empty, and rescale by
``exp(m_old - m_safe)``, which is ``0`` or ``1`` exactly when nothing was accumulated.
A row that stays empty ends with ``0 / 0 = nan`` where eager softmax also gives
``nan``; NaN inputs propagate through ``max`` as in eager.
"""
from __future__ import annotations

import math

import torch

from flashlight.ir import (
    Const,
    Dim,
    Expr,
    Iota,
    Kernel,
    LoopReduction,
    LoopResult,
    Nest,
    Pointwise,
    Reduce,
    RunningMax,
    free_dims,
    rebuild,
    replace_nodes,
    substitute,
    walk,
)
from flashlight.indexing import sizes_equal
from flashlight.passes.features import features_from_results, over_output_dims
from flashlight.passes.loop_dims import MergeFailed, merge_inner_sums, merge_loop_dims


class NotOnline(Exception):
    """The nest's reductions cannot share one online loop; the message says why."""


class NothingFused(NotOnline):
    """The nest is one ATen operation on its own: it runs as PyTorch does."""


# ---------------------------------------------------------------- invariant factoring


def _factors(expr: Expr) -> tuple[list[Expr], list[Expr]]:
    """Split a product/quotient tree into numerator and denominator factors."""
    if isinstance(expr, Pointwise) and expr.op == "mul":
        na, da = _factors(expr.args[0])
        nb, db = _factors(expr.args[1])
        return na + nb, da + db
    if isinstance(expr, Pointwise) and expr.op == "div":
        na, da = _factors(expr.args[0])
        nb, db = _factors(expr.args[1])
        return na + db, da + nb
    if _float_cast(expr):
        # kernels compute in fp32; a cast between float types only marks a rounding
        return _factors(expr.args[0])
    if isinstance(expr, Pointwise) and expr.op == "pow" and isinstance(expr.args[1], Const):
        exponent = expr.args[1]
        if float(exponent.value).is_integer():  # (a / b) ** n = a ** n / b ** n
            num, den = _factors(expr.args[0])
            raised = [[Pointwise("pow", (f, exponent), expr.dtype) for f in fs] for fs in (num, den)]
            return raised[0], raised[1]
    return [expr], []


def _float_cast(expr: Expr) -> bool:
    return (isinstance(expr, Pointwise) and expr.op == "cast" and expr.dtype.is_floating_point
            and expr.args[0].dtype.is_floating_point)


# [Note: rounding keeps the max inside]
# The online rewrite writes exp(c * (x - max)) with the loop's running max in place of the
# row's max, which needs the exponent linear in the max. A cast to a float type that
# holds every value of its operand exactly (bfloat16 to float32) keeps it linear; a
# narrowing one rounds, and round(x - max) is not round(x) - max: eager's
# exp(log_softmax(s)) in bfloat16 rounds the log-probabilities s - max - log(sum), values
# near zero for the keys that matter, while the rewritten loop rounded s - log(sum), of
# the scores' magnitude (2-3x eager's error from float64, where the plain softmax has
# less than eager's). Through a narrowing cast the max is therefore not factored out:
# the row's max is computed first and read, as eager does.
def _exact_cast(expr: Expr) -> bool:
    """A cast between float types whose destination holds every value of its source
    (range and precision), so that it commutes with the arithmetic around it."""
    if not _float_cast(expr):
        return False
    src, dst = torch.finfo(expr.args[0].dtype), torch.finfo(expr.dtype)
    return dst.eps <= src.eps and dst.max >= src.max and dst.tiny <= src.tiny


def _product(num: list[Expr], den: list[Expr], dtype) -> Expr:
    out: Expr = num[0] if num else Const(1.0, dtype)
    for f in num[1:]:
        out = Pointwise("mul", (out, f), dtype)
    for f in den:
        out = Pointwise("div", (out, f), dtype)
    return out


def factor_invariants(expr: Expr) -> Expr:
    """``sum_j (c * x_j / d) -> (c / d) * sum_j x_j`` for factors free of ``j``."""

    def fn(node: Expr) -> Expr | None:
        if not (isinstance(node, Reduce) and node.op == "sum"):
            return None
        bound = set(node.dims)
        num, den = _factors(node.body)
        dep_num = [f for f in num if free_dims(f) & bound]
        dep_den = [f for f in den if free_dims(f) & bound]
        if len(dep_num) == len(num) and len(dep_den) == len(den):
            return None
        kept = _product(dep_num, dep_den, node.body.dtype) if dep_num or dep_den else _ones_over(node.dims, node.body.dtype)
        inner = Reduce("sum", kept, node.dims, node.dtype)
        inv_num = [f for f in num if not free_dims(f) & bound]
        inv_den = [f for f in den if not free_dims(f) & bound]
        return _product([inner] + inv_num, inv_den, node.dtype)

    return rebuild(expr, fn)


def _ones_over(dims, dtype) -> Expr:
    """1 at every position of ``dims``, written as a value of those dims, so that
    ``sum_j c = c * sum_j 1`` still reduces over ``j`` (counts every position)."""
    index = Iota(tuple(dims))
    return Pointwise("cast", (Pointwise("ge", (index, Const(0, index.dtype)), torch.bool),), dtype)


def absorb_max_floors(expr: Expr) -> Expr:
    """``maximum(max_j a_j, r) -> max_j maximum(a_j, r)`` for ``r`` free of ``j``
    ([Note: online reduction]); reductions bind at least one position, so it is exact."""

    def fn(node: Expr) -> Expr | None:
        if not (isinstance(node, Pointwise) and node.op == "maximum"):
            return None
        for red, floor in (node.args, node.args[::-1]):
            if (isinstance(red, Reduce) and red.op == "max" and red.dtype == node.dtype
                    and not free_dims(floor) & frozenset(red.dims)):
                body = Pointwise("maximum", (red.body, floor), red.dtype)
                return Reduce("max", body, red.dims, red.dtype)
        return None

    return rebuild(expr, fn)


def leave_log_space(expr: Expr) -> Expr:
    """``exp(a - log b + ...) -> exp(a + ...) / b`` (``* b`` for ``+ log b``), for every
    ``log`` term of the exponent's sum whose argument is provably non-negative (a sum of
    exps): ``exp(s - logsumexp(s))``, ``exp(log_softmax(s))``."""

    def fn(node: Expr) -> Expr | None:
        if not (isinstance(node, Pointwise) and node.op == "exp"):
            return None
        terms = _signed_terms(node.args[0], 1)
        is_log = [isinstance(t, Pointwise) and t.op == "log" and _nonnegative(t.args[0]) for _, t in terms]
        logs = [(sign, t.args[0]) for (sign, t), log in zip(terms, is_log) if log]
        rest = [term for term, log in zip(terms, is_log) if not log]
        if not logs:
            return None
        out: Expr = Pointwise("exp", (_signed_sum(rest, node.dtype),), node.dtype)
        for sign, b in logs:
            out = Pointwise("mul" if sign > 0 else "div", (out, b), node.dtype)
        return out

    return rebuild(expr, fn)


def _nonnegative(expr: Expr) -> bool:
    """Provably >= 0 (exps and their sums and products), where ``exp(-log b) = 1 / b``
    holds exactly; a ``log`` of anything else may be NaN, which eager keeps."""
    if isinstance(expr, Reduce):
        return expr.op in ("sum", "max") and _nonnegative(expr.body)
    if isinstance(expr, Pointwise):
        if expr.op == "exp":
            return True
        if expr.op in ("mul", "add", "div") or _float_cast(expr):
            return all(_nonnegative(a) for a in expr.args)
    return False


def _signed_terms(expr: Expr, sign: int) -> list[tuple[int, Expr]]:
    """``a - (b + c)`` -> ``[(+1, a), (-1, b), (-1, c)]``."""
    if isinstance(expr, Pointwise) and expr.op in ("add", "sub"):
        a, b = expr.args
        return _signed_terms(a, sign) + _signed_terms(b, sign if expr.op == "add" else -sign)
    return [(sign, expr)]


def _signed_sum(terms: list[tuple[int, Expr]], dtype) -> Expr:
    if not terms:
        return Const(0.0, dtype)
    sign, out = terms[0]
    if sign < 0:
        out = Pointwise("neg", (out,), dtype)
    for sign, t in terms[1:]:
        out = Pointwise("add" if sign > 0 else "sub", (out, t), dtype)
    return out


# ------------------------------------------------------------------- splitting sums

MAX_TERMS = 8  # expanding a body into more terms than this is not attempted


def split_sums(expr: Expr, out_dims: frozenset[Dim] = frozenset()) -> Expr:
    """``sum_j (x_j + y_j) -> sum_j x_j + sum_j y_j`` where a sum's body depends on a
    loop max other than through ``exp(c * (x - max))`` factors ([Note: online reduction]).
    Sums over output dims run after the loop on finished values and are kept as written
    (a layer norm's centred variance expanded into ``E[x^2] - E[x]^2`` would cancel)."""
    maxes = [r for r in _loop_reductions(expr, out_dims) if r.op == "max"]

    def fn(node: Expr) -> Expr | None:
        if not (isinstance(node, Reduce) and node.op == "sum") or over_output_dims(node, out_dims):
            return None
        if all(_rescalable(exp_power(node.body, m)) for m in maxes):
            return None
        terms = _expanded_terms(node.body)
        if not 1 < len(terms) <= MAX_TERMS:
            return None
        return _signed_sum([(sign, Reduce("sum", t, node.dims, node.dtype)) for sign, t in terms], node.dtype)

    return rebuild(expr, fn)


def _rescalable(power: float | None) -> bool:
    return power is not None and power >= 0


def _expanded_terms(expr: Expr) -> list[tuple[int, Expr]]:
    """``(a - b) * c / d`` -> ``[(+1, a * c / d), (-1, b * c / d)]``."""
    if isinstance(expr, Pointwise):
        op, dtype = expr.op, expr.dtype
        if op in ("add", "sub"):
            a, b = (_expanded_terms(x) for x in expr.args)
            return a + [(s if op == "add" else -s, t) for s, t in b]
        if op == "neg":
            return [(-s, t) for s, t in _expanded_terms(expr.args[0])]
        if op == "mul":
            a, b = (_expanded_terms(x) for x in expr.args)
            if len(a) * len(b) > MAX_TERMS:
                return [(1, expr)]
            return [(sa * sb, Pointwise("mul", (ta, tb), dtype)) for sa, ta in a for sb, tb in b]
        if op == "div":
            return [(s, Pointwise("div", (t, expr.args[1]), dtype)) for s, t in _expanded_terms(expr.args[0])]
        if _float_cast(expr):
            return [(s, Pointwise("cast", (t,), dtype)) for s, t in _expanded_terms(expr.args[0])]
    return [(1, expr)]


# -------------------------------------------------------------------------- hoisting


def _loop_reductions(expr: Expr, out_dims: frozenset[Dim] = frozenset()) -> list[Reduce]:
    """Reductions evaluated at loop level: not inside a reduction whose dims they use, and
    not over output dims (those run after the loop, on the loop's results: [Note:
    reductions over an output's features] in :mod:`flashlight.passes.features`)."""
    found: list[Reduce] = []

    def visit(node: Expr, enclosing: frozenset[Dim]) -> None:
        if isinstance(node, Reduce):
            if over_output_dims(node, out_dims):
                visit(node.body, enclosing)
                return
            if free_dims(node) & enclosing:
                visit(node.body, enclosing | frozenset(node.dims))
                return
            if node not in found:
                found.append(node)
            visit(node.body, frozenset(node.dims))
            return
        for child in node.children():
            visit(child, enclosing)

    visit(expr, frozenset())
    return found


# ------------------------------------------------------------------ exp-power check


def _constant(expr: Expr) -> float | None:
    """The value of a constant (through casts), else None."""
    if isinstance(expr, Const) and not isinstance(expr.value, bool):
        return float(expr.value)
    if isinstance(expr, Pointwise) and expr.op == "cast":
        return _constant(expr.args[0])
    return None


def _linear_coeff(expr: Expr, target: Expr) -> float | None:
    """``c`` such that ``expr = x + c * target`` with ``x`` free of ``target``."""
    if expr == target:
        return 1
    if not any(node == target for node in walk(expr)):
        return 0
    if isinstance(expr, Pointwise):
        if expr.op in ("add", "sub"):
            a, b = (_linear_coeff(x, target) for x in expr.args)
            if a is None or b is None:
                return None
            return a + b if expr.op == "add" else a - b
        if expr.op == "neg":
            c = _linear_coeff(expr.args[0], target)
            return None if c is None else -c
        if expr.op == "cast":  # rounding is not linear ([Note: rounding keeps the max inside])
            return _linear_coeff(expr.args[0], target) if _exact_cast(expr) else None
        if expr.op in ("mul", "div"):  # by a constant: a temperature
            x, k = expr.args
            if expr.op == "mul" and _constant(k) is None:
                k, x = expr.args
            c, value = _linear_coeff(x, target), _constant(k)
            if c is None or value is None or (expr.op == "div" and value == 0):
                return None
            return c * value if expr.op == "mul" else c / value
    return None


def exp_power(expr: Expr, target: Expr) -> float | None:
    """``p`` such that ``expr = exp(-p * target) * (expression free of target)``."""
    if not any(node == target for node in walk(expr)):
        return 0
    if isinstance(expr, Pointwise):
        if expr.op in ("mul", "div"):
            a, b = (exp_power(x, target) for x in expr.args)
            if a is None or b is None:
                return None
            return a + b if expr.op == "mul" else a - b
        if expr.op == "pow":  # (exp(-p * t) * x) ** c = exp(-c * p * t) * x ** c
            base, value = exp_power(expr.args[0], target), _constant(expr.args[1])
            return None if base is None or value is None else base * value
        if expr.op == "cast":
            return exp_power(expr.args[0], target) if _exact_cast(expr) else None
        if expr.op == "exp":
            c = _linear_coeff(expr.args[0], target)
            return None if c is None else -c
        if expr.op == "where":
            cond, a, b = expr.args
            pa, pb = exp_power(a, target), exp_power(b, target)
            if exp_power(cond, target) != 0 or pa is None:
                return None
            if pb == pa or (isinstance(b, Const) and b.value == 0):
                return pa
    return None


# ------------------------------------------------------------------------- the pass


def make_online(nest: Nest) -> Kernel:
    """Rewrite a fused nest into one online loop of reductions plus an epilogue."""
    out_dims = frozenset(nest.dims)
    body = features_from_results(nest.body, nest.dims)
    body = factor_invariants(split_sums(leave_log_space(absorb_max_floors(body)), out_dims))
    body = small_sums_inside(body)  # [Note: a small sum inside the loop]
    body = merge_inner_sums(body)  # [Note: a sum over several dims inside the loop]
    body, loop = _loops_over_one_dim(body, _loop_reductions(body, out_dims), out_dims)
    if not loop:
        raise NotOnline("no reduction to run as a loop")
    loop = _over_one_extent(loop)
    extent = loop[0].dims[0].size

    index_of = {red: k for k, red in enumerate(loop)}
    shared = Dim.fresh(extent, "j")  # one loop: every loop reduction binds the same dim
    reductions = tuple(_shared_dim(_loop_reduction(red, loop, index_of), shared) for red in loop)
    epilogue = replace_nodes(body, lambda n: LoopResult(index_of[n], n.dtype) if n in index_of else None)
    return Kernel(nest.name, nest.axes, nest.dtype, reductions, epilogue, nest.origins)


def _loops_over_one_dim(body: Expr, loop: list[Reduce],
                        out_dims: frozenset[Dim]) -> tuple[Expr, list[Reduce]]:
    """``body`` and its loop reductions, each over several dims rewritten over one
    ([Note: a loop over several dims] in :mod:`flashlight.passes.loop_dims`), where it
    is computed per output position; a total over several dims (a weight's sum, the
    same for every output) is no loop of the output's rows."""
    merged = {}
    for red in loop:
        if len(red.dims) > 1:
            if not free_dims(red) & out_dims:
                raise NotOnline(f"a loop reduction over {len(red.dims)} dims, free of the output's")
            try:
                merged[red] = merge_loop_dims(red)
            except MergeFailed as why:
                raise NotOnline(str(why)) from None
    if not merged:
        return body, loop
    body = replace_nodes(body, merged.get)
    return body, _loop_reductions(body, out_dims)


# [Note: a small sum inside the loop]
# ``sum_r sum_i x`` with ``r`` a few static positions and ``i`` long: the gradient of keys
# shared by ``G`` query heads sums the repeated keys' gradients, each a sum over the
# queries, over the ``G`` repeats ([Note: a finer read of a producer] in
# passes/fusion.py). The loop runs over the outermost reduction, which would make the
# ``G`` repeats the loop and each step a whole pass over the queries. The two sums are
# exchanged (``sum_i sum_r x``, exact up to the order of additions, which ``tl.dot``
# already changes) where the outer one is a static dim of at most ``SMALL_SUM``
# positions and the inner one is not: the loop then runs over the queries, and the sum
# over the repeats is a small sum inside it ([Note: inner loops] in passes/tiling.py).
# Where both sums run over symbolic sizes (``dynamic=True``: the repeats ``H // h`` and
# the length), they are exchanged too: a symbolic inner sum cannot be a tile, so the
# other order has no tiling, and this one is exact all the same.
SMALL_SUM = 16


def _positions(red: Reduce) -> float:
    """How many positions ``red`` sums over (a symbolic count is taken as the most)."""
    return math.prod(d.size for d in red.dims) if all(d.is_static for d in red.dims) else math.inf


def _small(dims) -> bool:
    """Static dims of at most ``SMALL_SUM`` positions in all."""
    return all(d.is_static for d in dims) and math.prod(d.size for d in dims) <= SMALL_SUM


def small_sums_inside(body: Expr) -> Expr:
    """``body`` with each small static sum around a longer sum moved inside it, and each
    symbolic sum around another symbolic one ([Note: a small sum inside the loop])."""
    def symbolic(dims) -> bool:
        return any(not d.is_static for d in dims)

    def swap(node: Expr) -> Expr | None:
        inner = node.body if isinstance(node, Reduce) else None
        if (isinstance(inner, Reduce) and node.op == inner.op == "sum"
                and (_small(node.dims) and not _small(inner.dims)
                     or len(node.dims) == 1 and symbolic(node.dims) and symbolic(inner.dims))):
            return Reduce("sum", Reduce("sum", inner.body, node.dims, inner.dtype), inner.dims, node.dtype)
        return None

    return rebuild(body, swap)


def _over_one_extent(candidates: list[Reduce]) -> list[Reduce]:
    """The reductions the loop runs, when the candidates reduce over different extents.

    The loop runs over the extent of the outermost candidates (those inside no other's
    body; among them, those that contain others: ``sum_j p_ij v_j`` over the softmax's
    max and sum; where the others are sums over at most ``SMALL_SUM`` positions, the
    longest: a product's contraction beside a sum over a few features). A candidate over
    another extent that uses none of those stays a plain reduction computed before the
    loop (a norm of the query row over its head dim) or after it (those few features).
    """
    if all(sizes_equal(r.dims[0].size, candidates[0].dims[0].size) for r in candidates):
        return candidates
    inside = {id(c): [o for o in candidates if o is not c and any(n == o for n in walk(c.body))] for c in candidates}
    nested = {id(o) for c in candidates for o in inside[id(c)]}
    outer = [c for c in candidates if id(c) not in nested]
    outer = [c for c in outer if inside[id(c)]] or outer
    largest = max(outer, key=_positions)
    if all(c.op == "sum" and _small(c.dims) or sizes_equal(c.dims[0].size, largest.dims[0].size) for c in outer):
        outer = [c for c in outer if sizes_equal(c.dims[0].size, largest.dims[0].size)]
    extent = outer[0].dims[0].size
    if not all(sizes_equal(c.dims[0].size, extent) for c in outer):
        raise NotOnline("loop reductions run over different extents")
    loop = [c for c in candidates if sizes_equal(c.dims[0].size, extent)]
    for c in candidates:
        if c not in loop and any(o in loop for o in inside[id(c)]):
            raise NotOnline("a reduction over another extent depends on the loop's reductions")
    return loop


def _loop_reduction(red: Reduce, loop: list[Reduce], index_of: dict) -> LoopReduction:
    used = [other for other in loop if other is not red and any(n == other for n in walk(red.body))]
    rescaled: list[tuple[int, float]] = []
    for other in used:
        if red.op != "sum" or other.op != "max":
            raise NotOnline(f"a {red.op} over the loop depends on a loop {other.op}")
        power = exp_power(red.body, other)
        if power is None or power <= 0:
            raise NotOnline("a sum depends on a loop max other than through exp(c * (x - max)), c > 0")
        rescaled.append((index_of[other], power))
    body, init = _peel_floor(red) if red.op == "max" else (red.body, None)
    body = replace_nodes(body, lambda n: RunningMax(index_of[n], n.dtype) if n in index_of and n is not red else None)
    return LoopReduction(red.op, body, red.dims[0], tuple(rescaled), red.dtype, init)


def _peel_floor(red: Reduce) -> tuple[Expr, Expr | None]:
    """``max_j maximum(b_j, r) -> (b, r)``: the running max starts from ``r`` (free of
    ``j`` and of reductions) instead of ``-inf``, so the body keeps only what varies along
    the loop (tile skipping sees the masked scores themselves)."""
    body, init, dims = red.body, None, frozenset(red.dims)
    while isinstance(body, Pointwise) and body.op == "maximum":
        for keep, floor in (body.args, body.args[::-1]):
            if free_dims(keep) & dims and not free_dims(floor) & dims and not any(isinstance(n, Reduce) for n in walk(floor)):
                init = floor if init is None else Pointwise("maximum", (init, floor), red.dtype)
                body = keep
                break
        else:
            break
    return body, init


def _shared_dim(red: LoopReduction, shared: Dim) -> LoopReduction:
    """Rename the reduction's own loop dim to the loop's shared dim (enables CSE)."""
    body = substitute(red.body, {red.dim: (shared,)})
    return LoopReduction(red.op, body, shared, red.rescaled_by, red.dtype, red.init)


def fused_work(kernel: Kernel) -> bool:
    """Whether the kernel fused several ATen operations (else it is a standalone op)."""
    return len(set(kernel.origins)) > 1


def online_kernel(nest: Nest) -> Kernel:
    """:func:`make_online`, for a nest that fused several ATen operations; raises
    :class:`NothingFused` for one that did not (it runs as PyTorch does)."""
    kernel = make_online(nest)
    if not fused_work(kernel):
        raise NothingFused("a single operation with nothing fused into it")
    return kernel



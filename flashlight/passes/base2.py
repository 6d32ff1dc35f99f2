"""The online loop's exponentials in base 2, and lazy rescaling of its sums.

[Note: base-2 online softmax]
GPUs evaluate ``2 ** x`` in one instruction (``ex2.approx`` on NVIDIA); ``exp(x)`` is
``exp2(x * L)`` with ``L = log2(e)``, a multiply more. The online loop
([Note: online reduction] in :mod:`flashlight.passes.online`) evaluates, for every key
of every step, ``exp(c * (b_j - M))`` against a running max ``M = max_j a_j``. In base 2:

    exp(c * (b - M)) = exp2(c * (L * b - L * M))

*The scale folds into one multiply.* Where the max's body is a positive constant times
a value, ``a = k * x`` (the softmax scale, written ``* k`` or ``/ (1 / k)``, also under
``-inf`` masks: ``where(p, -inf, k * x) = k * where(p, -inf, x)``), the loop max runs
over ``x`` itself, ``m = max_j x_j``, and with ``sigma = k * L``

    exp(c * (a_j - M)) = exp2(c * (sigma * x_j - sigma * m))

``sigma * m`` is one value per row and step; per score there remain one multiply-add
(``x * sigma - sigma * m``, which ``ptxas`` contracts into one FMA) and one ``exp2``,
where ``exp(k * x - M)`` took a multiply, a subtraction and ``exp``'s own multiply. The
factor that rescales a sum when the max grows is ``exp2(c * sigma * (m_old - m_new))``.
Other exponents keep their form, times ``L`` with constant factors folded into it:
``exp((s - M) / T) = exp2(s * (L / T) - (sigma / T) * m)`` for ``s = k * x``. Folding
``sigma`` into the query tile instead would save nothing (the multiply-add costs the
same as the subtraction alone) and would round the queries again in their 16-bit dtype,
which is exact only for powers of two; so the scores are scaled, not the queries.

*Exactness.* Rounding is monotone and ``k > 0``, so ``max_j fl(k * x_j) = fl(k *
max_j x_j)``: an epilogue that reads the max (a logsumexp, an ``amax`` output) gets it
as ``fl(k * m)``, computed as the program wrote it, equal to eager's bit for bit. The
exponentials are the same numbers up to rounding: the value subtracted from a row's
exponents only stabilises them (the loop's results do not depend on it, as long as
every term and every rescale of the row uses the same one), and ``fl(sigma * x_j) <=
fl(sigma * m)`` by monotonicity, so no exponent of the row's own scores is positive. The
absolute rounding of ``x * sigma - sigma * m`` is that of ``|sigma * m|`` (``exp(a - M)``
had that of ``|a - M|``): of the order of the scores' own rounding (a dot product of
``d`` terms rounds at about ``|s| * eps``), so it adds no error the scores do not have.
A max with a floor (``max(M, 0)``, a sink: ``LoopReduction.init``) keeps ``k = 1``: its
floor ``r`` would have to become ``r / k``, which does not round back exactly. Rows
whose max is ``-inf`` still subtract the safe max ``0`` ([Note: online reduction]):
``exp2(-inf) = 0``.

[Note: lazy rescaling]
The sums of a row may be kept relative to any value ``m_ref`` of that row, not only its
running max, provided every term and every rescale of the row uses the same one and
nothing overflows. As FlashAttention-4 does, the loop keeps the true running max
``m_true`` and the ``m_ref`` the sums are relative to, and on each step (``m_true``
already raised by the step's scores):

    if some row has sigma * (m_true - m_ref) > tau:   rescale every row's sums to m_ref = m_true
    otherwise:                                         keep m_ref: no exp2, no multiply

*No overflow.* After every step ``sigma * (m_true - m_ref) <= tau`` in every row, so
every term ``exp2(c * sigma * (x - m_ref)) <= exp2(c * tau)``: with ``tau = 8 / max c``
(over the powers ``c`` of the sums the max rescales) a term is at most ``2 ** 8 = 256``,
where it was at most 1. Sums grow by at most that factor (float32 holds 3.4e38:
256 times the number of keys times the largest ``|v|`` is far below it), and a 16-bit
``tl.dot`` operand holds 256 (bfloat16 to 3.4e38, float16 to 65504) with the same
relative precision as a value in ``[0, 1]``; terms relative to a smaller ``m_ref`` are
larger, so they underflow less, not more.

*One decision per tile, not per row.* A Triton program computes a whole tile, and a
branch is uniform over the program: skipping the multiply needs a condition on the
tile, "some row grew by more than ``tau``", a max over the tile's rows. Rows that did
not need it are rescaled to their true max when another row does: the eager step,
exact. (A per-row select, each row keeping its own stale max, would still multiply
every row and save nothing.) A row whose ``m_ref`` is ``-inf`` (nothing accumulated)
grows infinitely at its first finite score, so the tile rescales; a NaN max never
triggers (comparisons with NaN are false), but its terms are NaN already, as in eager.

*After the loop* the max's result is ``m_true``; the sums are relative to ``m_ref``,
i.e. each is its true value times ``lambda ** c`` for a per-row ``lambda >= 1``. An
epilogue of degree 0 in ``lambda`` (attention's ``acc / l``: both sums scale alike)
gives its exact value up to rounding as it stands. Otherwise (a logsumexp
``M + log(l)``, an unnormalised sum) the sums are rescaled once by
``exp2(c * sigma * (m_ref - m_true))`` after the loop (``Base2Max.settle``): one
multiply per accumulator value per program.

*On sm_90* the branch costs more than the multiply it saves, by the builds (Triton's
code for the Evoformer core, bf16, head width 32, 128 x 64 tiles): the max over the
tile's rows crosses warps (a warp reduction, a shared-memory round trip and two
barriers per step), and two maxima stay live across the loop, for 816 instructions per
step against 783 rescaling every step (4 warps; 476 against 454 with 8), and more
spills where the length is a runtime argument; what it skips is 32 multiplies per
thread (a Hopper accumulator lives in registers, where FlashAttention-4's Blackwell
one lives in tensor memory). So the pipeline rescales on every step
(:data:`DEFAULT_THRESHOLD`); the lazy loop stays correct and tested, and
``FLASHLIGHT_LAZY_RESCALE=1`` turns it on, for a GPU where a measurement says otherwise
(with the row sums on the tensor core, [Note: row sums on the tensor core] in
passes/tile_plan.py, the skipped block also holds the sum's rescale: 405 instructions
per step on the path that skips it against 448 rescaling every step, 128 x 32 tiles).
"""
from __future__ import annotations

import dataclasses
import math

from flashlight.ir import (
    Base2Max,
    Const,
    Expr,
    Kernel,
    LoopReduction,
    LoopResult,
    Pointwise,
    Reduce,
    RunningMax,
    rebuild,
    replace_nodes,
    walk,
)
from flashlight.ir_check import check_kernel_invariants, InvariantError
from flashlight.passes.online import _constant, _exact_cast, _linear_coeff

LOG2E = 1.4426950408889634  # log2(e)
# exp2 of the largest exponent a lazily rescaled term reaches: 2 ** 8 = 256 ([Note: lazy rescaling])
RESCALE_THRESHOLD = 8.0
# What the pipeline runs: rescaling on every step (see "On sm_90" in [Note: lazy
# rescaling]; timed on an H100 the lazy loop was 5-17% slower on the bf16 Evoformer core,
# bench/results/core_terms/README.md); FLASHLIGHT_LAZY_RESCALE turns it on.
DEFAULT_THRESHOLD: float | None = None

Steps = tuple  # tuple[tuple[str, float], ...]: ("mul" | "div", positive constant), innermost first


def to_base2(kernel: Kernel, threshold: float | None = DEFAULT_THRESHOLD) -> Kernel:
    """``kernel`` with every loop max that rescales sums run in base 2
    ([Note: base-2 online softmax]), lazily rescaled above ``threshold`` powers of two
    ([Note: lazy rescaling]; None: rescaled on every step)."""
    maxes = sorted({k for red in kernel.loop for k, _ in red.rescaled_by})
    if not maxes:
        return kernel
    loops = [kernel.loop] + ([kernel.unmasked] if kernel.unmasked is not None else [])
    factors = {k: _common_factor([loop[k] for loop in loops]) for k in maxes}
    base2 = {k: _base2_of(kernel, k, factors[k][0], threshold) for k in maxes}
    rewritten = [_rewrite_loop(loop, factors, base2, form) for form, loop in enumerate(loops)]
    natural = lambda e: replace_nodes(e, lambda n: _natural_max(n, factors))  # noqa: E731
    extra = tuple(dataclasses.replace(out, epilogue=natural(out.epilogue)) for out in kernel.extra_outputs)
    return dataclasses.replace(kernel, loop=rewritten[0], epilogue=natural(kernel.epilogue), extra_outputs=extra,
                               unmasked=rewritten[1] if len(rewritten) > 1 else None)


def check_base2(kernel: Kernel) -> None:
    """The kernel's invariants, and base-2 rescaling only on maxes, the same in the loop
    and in its form on full tiles."""
    check_kernel_invariants(kernel)
    for red in kernel.loop:
        if red.base2 is not None and (red.op != "max" or not red.base2.log2_scale > 0
                                      or (red.base2.threshold is not None and not red.base2.threshold > 0)):
            raise InvariantError(f"{kernel.name}: base-2 rescaling {red.base2} on a {red.op}")
    if kernel.unmasked is not None and [r.base2 for r in kernel.unmasked] != [r.base2 for r in kernel.loop]:
        raise InvariantError(f"{kernel.name}: the loop on full tiles rescales in another base")


# --------------------------------------------------------------- positive factors


def _positive_factor(expr: Expr) -> tuple[Steps, Expr]:
    """``(steps, x)`` with ``expr`` equal to ``x`` with ``steps`` applied (multiplications
    and divisions by positive finite constants, innermost first), through ``-inf`` masks
    and float casts that round nothing; ``((), expr)`` where there is no such factor. A
    narrowing cast is a barrier: ``round(k * x)`` is not ``k * round(x)`` ([Note: rounding
    keeps the max inside] in passes/online.py)."""
    if isinstance(expr, Pointwise) and expr.op in ("mul", "div"):
        pairs = [(expr.args[0], expr.args[1])] + ([(expr.args[1], expr.args[0])] if expr.op == "mul" else [])
        for x, k in pairs:
            value = _constant(k)
            if value is not None and 0 < value < math.inf:
                steps, raw = _positive_factor(x)
                return steps + ((expr.op, value),), raw
    if isinstance(expr, Pointwise) and expr.op == "where":
        cond, a, b = expr.args
        for branch, other in ((1, a), (2, b)):
            inf = expr.args[3 - branch]
            if isinstance(inf, Const) and not isinstance(inf.value, bool) and math.isinf(inf.value):
                steps, raw = _positive_factor(other)
                if steps:  # k * (+-inf) = +-inf for k > 0
                    args = list(expr.args)
                    args[branch] = raw
                    return steps, Pointwise("where", tuple(args), expr.dtype)
    if _exact_cast(expr):
        steps, raw = _positive_factor(expr.args[0])
        if steps:
            return steps, Pointwise("cast", (raw,), expr.dtype)
    return (), expr


def _apply(steps: Steps, expr: Expr) -> Expr:
    for op, value in steps:
        expr = Pointwise(op, (expr, Const(value, expr.dtype)), expr.dtype)
    return expr


def _scale_of(steps: Steps) -> float:
    k = 1.0
    for op, value in steps:
        k = k * value if op == "mul" else k / value
    return k


def _common_factor(reds: list[LoopReduction]) -> tuple[Steps, list[Expr]]:
    """The positive factor the max's body has in every form of the loop (masked, on
    full tiles), and each form's body without it; none for a max with a floor."""
    found = [_positive_factor(red.body) if red.init is None else ((), red.body) for red in reds]
    if any(steps != found[0][0] for steps, _ in found):
        return (), [red.body for red in reds]
    return found[0][0], [raw for _, raw in found]


def _base2_of(kernel: Kernel, k: int, steps: Steps, threshold: float | None) -> Base2Max:
    powers = [power for red in kernel.loop for j, power in red.rescaled_by if j == k]
    tau = None if threshold is None else threshold / max(powers)
    settle = tau is not None and any(_degree(e, k, kernel.loop) != 0 for e in kernel.epilogues())
    return Base2Max(_scale_of(steps) * LOG2E, tau, settle)


def _natural_max(node: Expr, factors) -> Expr | None:
    """The max in the units the program wrote it: the loop's max of ``x`` times ``k``."""
    if isinstance(node, LoopResult) and node.index in factors and factors[node.index][0]:
        return _apply(factors[node.index][0], node)
    return None


# --------------------------------------------------------------- the loop bodies


def _rewrite_loop(loop, factors, base2, form: int) -> tuple[LoopReduction, ...]:
    """One form of the loop (``form``: 0 as masked, 1 on full tiles) in base 2."""
    # per max: its body as the program wrote it, that body without its factor, the factor
    scores = {k: (loop[k].body, factors[k][1][form], _scale_of(factors[k][0])) for k in factors}
    sigma = {k: base2[k].log2_scale for k in factors}
    out = []
    for k, red in enumerate(loop):
        if k in factors:
            out.append(dataclasses.replace(red, body=scores[k][1], base2=base2[k]))
        elif red.rescaled_by:
            body = _exps_in_base2(red.body, scores, sigma, factors)
            out.append(dataclasses.replace(red, body=body))
        else:
            out.append(red)
    return tuple(out)


def _exps_in_base2(body: Expr, scores, sigma, factors) -> Expr:
    """Every ``exp`` of ``body`` that reads a running max, as ``exp2`` of scaled scores
    minus the scaled raw running max; other reads of it in the units the program wrote."""

    def fn(node: Expr) -> Expr | None:
        if isinstance(node, Pointwise) and node.op == "exp":
            running = {n.index: n for n in walk(node.args[0]) if isinstance(n, RunningMax) and n.index in factors}
            if running:
                return _exp2(node, running, scores, sigma, factors)
            return None
        if isinstance(node, RunningMax) and node.index in factors:
            return _apply(factors[node.index][0], node)
        return None

    return replace_nodes(body, fn)


def _exp2(node: Pointwise, running: dict, scores, sigma, factors) -> Expr:
    """``exp(X + sum_k coef_k * M_k) = exp2(L * X + sum_k coef_k * sigma_k * m_k)``, with
    ``M_k = k * m_k`` the natural max and ``m_k`` the running max of the raw body."""
    arg, dtype = node.args[0], node.dtype
    coefs = {k: _linear_coeff(arg, rm) for k, rm in running.items()}
    if any(c is None for c in coefs.values()):  # not affine in the max: exp(x) = exp2(L * x)
        natural_arg = replace_nodes(arg, lambda n: _apply(factors[n.index][0], n) if n in running.values() else None)
        return Pointwise("exp2", (Pointwise("mul", (natural_arg, Const(LOG2E, dtype)), dtype),), dtype)
    zero = replace_nodes(arg, lambda n: Const(0.0, n.dtype) if n in running.values() else None)
    out = _scaled(_without_zeros(zero), LOG2E, scores)
    for k, rm in running.items():
        if coefs[k] == 0:
            continue
        term = Pointwise("mul", (rm, Const(abs(coefs[k]) * sigma[k], rm.dtype)), dtype)
        out = Pointwise("sub" if coefs[k] < 0 else "add", (out, term), dtype)
    return Pointwise("exp2", (out,), dtype)


def _scaled(expr: Expr, s: float, scores) -> Expr:
    """``s * expr``, with constant factors folded into ``s`` and the max's own scores
    written as its raw body times one constant ([Note: base-2 online softmax])."""
    for natural, raw, k in scores.values():
        if expr == natural:
            return Pointwise("mul", (raw, Const(s * k, expr.dtype)), expr.dtype)
    if isinstance(expr, Const) and not isinstance(expr.value, bool):
        return Const(s * float(expr.value), expr.dtype)
    if isinstance(expr, Pointwise):
        if expr.op == "neg":
            return _scaled(expr.args[0], -s, scores)
        if expr.op in ("mul", "div"):
            pairs = [(expr.args[0], expr.args[1])] + ([(expr.args[1], expr.args[0])] if expr.op == "mul" else [])
            for x, k in pairs:
                value = _constant(k)
                if value is not None and math.isfinite(value) and value != 0:
                    return _scaled(x, s * value if expr.op == "mul" else s / value, scores)
    return Pointwise("mul", (expr, Const(s, expr.dtype)), expr.dtype)


def _without_zeros(expr: Expr) -> Expr:
    """``x + 0``, ``x - 0``, ``0 - x``, ``c * 0``, ``0 / c``, ``-0`` simplified (the
    affine exponent with its max terms set to zero)."""

    def zero(e: Expr) -> bool:
        return isinstance(e, Const) and not isinstance(e.value, bool) and e.value == 0

    def fn(node: Expr) -> Expr | None:
        if not isinstance(node, Pointwise):
            return None
        args = node.args
        if node.op in ("add", "sub") and zero(args[1]):
            return args[0]
        if node.op == "add" and zero(args[0]):
            return args[1]
        if node.op == "sub" and zero(args[0]):
            return Pointwise("neg", (args[1],), node.dtype)
        if (node.op == "mul" and any(zero(a) for a in args)) or (node.op in ("div", "neg", "cast") and zero(args[0])):
            return Const(0.0, node.dtype)
        return None

    return rebuild(expr, fn)


# --------------------------------------------------------------- the epilogue's degree


def _degree(expr: Expr, k: int, loop) -> float | None:
    """The degree of ``expr`` in a per-row factor ``lambda`` that multiplies each sum the
    loop max ``k`` rescales by ``lambda ** c`` ([Note: lazy rescaling]); None where it is
    not homogeneous (or reads the max itself)."""
    if isinstance(expr, LoopResult):
        if expr.index == k:
            return None
        return sum(c for j, c in loop[expr.index].rescaled_by if j == k)
    if isinstance(expr, Reduce):
        return _degree(expr.body, k, loop)
    if not isinstance(expr, Pointwise):
        return 0
    degrees = [_degree(a, k, loop) for a in expr.args]
    if any(d is None for d in degrees):
        return None
    op = expr.op
    if op == "mul":
        return degrees[0] + degrees[1]
    if op == "div":
        return degrees[0] - degrees[1]
    if op == "pow":
        value = _constant(expr.args[1])
        return None if value is None or degrees[1] != 0 else degrees[0] * value
    if op == "where":
        return degrees[1] if degrees[0] == 0 and degrees[1] == degrees[2] else None
    if op in ("add", "sub", "neg", "cast", "maximum", "minimum", "abs"):
        return degrees[0] if all(d == degrees[0] for d in degrees) else None
    return 0 if all(d == 0 for d in degrees) else None

"""Tile skipping: find the predicate that says which key tiles can change the result.

[Note: tile skipping]
A mask written as ``where(keep, s, -inf)`` (``masked_fill``, an additive ``-inf``
bias, ``torch.where``) turns whole stretches of the online loop into no-ops: where
``keep`` is false the scores are ``-inf``, so the running max does not move
(``max(m, -inf) = m``), the rescale factor is ``exp(m - m) = 1`` and every sum gains
``exp(-inf - m) * x = 0``. The pass proves this per kernel, by algebra and without
knowing what the mask means:

1. every ``where`` in a loop body with a ``-inf`` branch and a condition that depends
   on the loop dim is a *site*; its *keep* condition selects the other branch;
2. each loop body, with every site replaced by ``-inf``, must evaluate symbolically
   to its reduction's neutral value (``-inf`` for max, ``0`` for sum) using
   ``-inf + x = -inf``, ``-inf * c = -inf`` (``c > 0``), ``exp(-inf) = 0``,
   ``0 * x = 0``, ``0 / x = 0`` (``x`` not computed from the masked scores),
   ``0 +- 0 = 0`` and ``sum``/``max`` of neutral values (so the loops of a backward,
   whose ``P = exp(s - m) / l`` and ``dS = P * dP - P * delta`` are zero where the
   mask removes, skip the tiles their forward skips);
3. then ``live = keep_1 | keep_2 | ...`` is false exactly where the loop does
   nothing, and a tile on which ``live`` can never be true may be skipped.
4. Conversely, where ``full = keep_1 & keep_2 & ...`` holds, every site selects the
   value it keeps, so the loop with each site replaced by that value (``unmasked``)
   gives the same results without evaluating any mask; a tile on which ``full`` can
   never be false runs that loop (as FlashAttention kernels skip the causal mask off
   the diagonal).

The code generator evaluates ``live`` and ``full`` with interval arithmetic over a
whole ``BLOCK_M x BLOCK_N`` tile (index ranges for ``iota``, min/max of the loaded
values for integer loads such as document ids or lengths) and runs the loop only from
the first to the last tile that may be live, the first run of tiles that are surely
full without their masks. That is why the predicates must be computed from indices,
constants and loaded integers or booleans (see ``bounded_by_intervals``); other
predicates (a float threshold on the scores) keep the whole masked loop. The scan
handles many key tiles per step (``Tiling.scan_tiles``): for index-only predicates a
coarse step bounds them together, then tile by tile only over the range that step could
not rule out (every bound is monotone under inclusion: a value's interval over a wide
tile contains its interval over any tile inside it, so no tile inside a wide tile that
cannot be live can be live); predicates that load along the keys bound every tile of
the step at once ([Note: the vector scan] in :mod:`flashlight.codegen_live`).

Rule 2 treats the operands other than the masked scores (``v``, a bias added after
masking, a divisor such as the backward's saved row sum) as finite, and a divisor as
non-zero: as in every FlashAttention kernel, an ``inf`` or ``NaN`` in ``v``
at a position the mask removes reaches eager PyTorch's output (``0 * nan``) but not
a skipped tile's. Rows whose every position is removed still give ``NaN`` as in eager
(no tile runs, so ``0 / 0``). Their gradients differ: eager's ``NaN`` probabilities
make every key's gradient ``NaN``; a backward that skips reaches such a row only from
tiles live for another row of its tile (``NaN`` there too), and a tile of rows that are
all removed adds nothing (its gradients are 0). The forward's output is ``NaN`` in that
row either way.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from flashlight.ir import Const, Expr, Iota, Kernel, Load, Pointwise, Reduce, SizeValue, free_dims, replace_nodes, walk
from flashlight.vocabulary import DIVISION_OPS, INTERVAL_OPS

NEG_INF, ZERO = "-inf", "0"


def find_live_tiles(kernel: Kernel) -> Kernel:
    """``kernel`` with ``live`` set when masked tiles provably do nothing, and ``full`` /
    ``unmasked`` for the tiles every mask keeps whole (see the Note)."""
    loop_dim = kernel.loop[0].dim
    sites: dict[Expr, tuple[Expr, Expr]] = {}  # site -> (its keep condition, the value it keeps)
    for red in kernel.loop:
        for node in walk(red.body):
            site = mask_site(node, loop_dim)
            if site is not None:
                sites[node] = site
    if not sites:
        return kernel
    for red in kernel.loop:
        masked = replace_nodes(red.body, lambda n: Const(-math.inf, n.dtype) if n in sites else None)
        if symbolic_value(masked) != (NEG_INF if red.op == "max" else ZERO):
            return kernel
    conditions = list(dict.fromkeys(keep for keep, _ in sites.values()))
    live, full = conditions[0], conditions[0]
    for cond in conditions[1:]:
        live = Pointwise("or", (live, cond), torch.bool)
        full = Pointwise("and", (full, cond), torch.bool)
    if not bounded_by_intervals(live):
        return kernel
    unmasked = tuple(dataclasses.replace(red, body=_without_masks(red.body, sites)) for red in kernel.loop)
    return dataclasses.replace(kernel, live=live, full=full, unmasked=unmasked)


def _without_masks(body: Expr, sites: dict[Expr, tuple[Expr, Expr]]) -> Expr:
    """``body`` on a tile every mask keeps whole: each site is the value it keeps, and so
    is every other ``where`` on a site's condition (a backward's ``where(masked, 0, dS)``):
    the condition is constant there."""
    taken: dict[Expr, int] = {}  # a site's condition -> the branch it takes on full tiles
    for site in sites:
        cond, if_true, _ = site.args
        taken[cond] = 2 if _is_neg_inf(if_true) else 1

    def plain(node: Expr) -> Expr | None:
        if not (isinstance(node, Pointwise) and node.op == "where" and node.args[0] in taken):
            return None
        kept = replace_nodes(node.args[taken[node.args[0]]], plain)
        return kept if kept.dtype == node.dtype else Pointwise("cast", (kept,), node.dtype)

    return replace_nodes(replace_nodes(body, lambda n: sites[n][1] if n in sites else None), plain)


def mask_site(node: Expr, loop_dim) -> tuple[Expr, Expr] | None:
    """``(keep condition, kept value)`` when ``node`` masks with ``-inf`` along the loop."""
    if not (isinstance(node, Pointwise) and node.op == "where"):
        return None
    cond, if_true, if_false = node.args
    if loop_dim not in free_dims(cond):
        return None
    if _is_neg_inf(if_true):
        keep, kept = (cond.args[0] if isinstance(cond, Pointwise) and cond.op == "not"
                      else Pointwise("not", (cond,), torch.bool)), if_false
    elif _is_neg_inf(if_false):
        keep, kept = cond, if_true
    else:
        return None
    if kept.dtype != node.dtype:
        kept = Pointwise("cast", (kept,), node.dtype)
    return keep, kept


def _is_neg_inf(expr: Expr) -> bool:
    return isinstance(expr, Const) and expr.value == -math.inf


def symbolic_value(expr: Expr) -> str | None:
    """``NEG_INF`` or ``ZERO`` when ``expr`` is that everywhere, else None (taken finite)."""
    if isinstance(expr, Const):
        if expr.value == -math.inf:
            return NEG_INF
        return ZERO if expr.value == 0 else None
    if isinstance(expr, Reduce):
        body = symbolic_value(expr.body)
        return body if (expr.op, body) in (("sum", ZERO), ("max", NEG_INF)) else None
    if not isinstance(expr, Pointwise):
        return None
    vals = [symbolic_value(a) for a in expr.args]
    op = expr.op
    if op in ("add", "sub") and vals[0] == NEG_INF and (op == "add" or vals[1] != NEG_INF):
        return NEG_INF
    if op == "add" and vals[1] == NEG_INF:
        return NEG_INF
    if op == "mul" and ZERO in vals and NEG_INF not in vals:
        return ZERO
    if op in ("add", "sub") and vals[0] == vals[1] == ZERO:
        return ZERO
    if op in ("mul", "div") and vals[0] == NEG_INF and _positive_const(expr.args[1]):
        return NEG_INF
    if op == "mul" and vals[1] == NEG_INF and _positive_const(expr.args[0]):
        return NEG_INF
    if op == "div" and vals[0] == ZERO and (_nonzero_const(expr.args[1]) or _unmasked(expr.args[1], vals[1])):
        return ZERO
    if op == "exp" and vals[0] == NEG_INF:
        return ZERO
    if op == "where" and vals[1] is not None and vals[1] == vals[2]:
        return vals[1]
    if op in ("maximum", "minimum") and vals[0] == vals[1] == NEG_INF:
        return NEG_INF
    if op == "minimum" and NEG_INF in vals:
        return NEG_INF
    if op == "cast" and expr.dtype.is_floating_point:
        return vals[0]
    return None


def _unmasked(divisor: Expr, value: str | None) -> bool:
    """A divisor read or computed from operands taken finite and non-zero (a row sum
    saved by the forward, which is at least 1 in every row with a live key), not from
    the masked scores: those could be 0 exactly where the mask removes."""
    return value is None and not any(_is_neg_inf(node) for node in walk(divisor))


def _positive_const(expr: Expr) -> bool:
    return isinstance(expr, Const) and isinstance(expr.value, (int, float)) and 0 < expr.value < math.inf


def _nonzero_const(expr: Expr) -> bool:
    return isinstance(expr, Const) and expr.value != 0 and math.isfinite(expr.value)


def _positive_constant(expr: Expr) -> bool:
    return isinstance(expr, Const) and not isinstance(expr.value, bool) and math.isfinite(expr.value) and expr.value > 0


def bounded_by_intervals(expr: Expr) -> bool:
    """Whether codegen can bound ``expr`` over a tile: values computed from indices,
    finite constants and loaded integers or booleans by the ``INTERVAL_OPS``. Floats
    computed from those (ALiBi's ``(j - i).float()``, ``tril(ones) == 0``) are bounded
    too: IEEE rounding is monotone, so the same operations on the ends of the ranges
    give bounds. Loaded floats (scores, biases) are not."""
    for node in walk(expr):
        if isinstance(node, (Iota, SizeValue)):  # a size: one value, known at launch
            continue
        if isinstance(node, Const) and (not isinstance(node.value, float) or math.isfinite(node.value)):
            continue
        if isinstance(node, Load) and not node.dtype.is_floating_point and not node.dtype.is_complex:
            continue
        if isinstance(node, Pointwise) and node.op in INTERVAL_OPS:
            continue
        if isinstance(node, Pointwise) and node.op in DIVISION_OPS and _positive_constant(node.args[1]):
            continue
        return False
    return True

"""ATen operations rewritten, before lowering, into operations the lowering knows.

``aot_autograd`` applies this table while it traces the graph, so each rewritten
operation arrives as several FX nodes. That matters beyond coverage: the fusion back-off
can only keep separate a value that is an FX node of its own (a tensor between two
kernels), so a variance, whose sum of squared deviations needs its mean first, must
arrive as a mean node and a sum node to become two online kernels rather than one
operation left to PyTorch.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import torch

from flashlight.random_ops import native_dropout, native_dropout_backward

aten = torch.ops.aten

# PyTorch's own decompositions of these rewrite them into elementwise operations the
# lowering knows (``elu`` into ``where`` and ``expm1``, ``gelu`` into ``erf``,
# ``softplus`` into ``log1p`` and ``exp``, ``nan_to_num`` into ``where`` over
# comparisons), so they fuse like any other
DECOMPOSED = (
    aten.elu, aten.celu, aten.selu, aten.gelu, aten.silu, aten.mish, aten.softplus,
    aten.hardtanh, aten.relu6, aten.leaky_relu, aten.hardsigmoid, aten.hardswish,
    aten.log_sigmoid_forward, aten.logaddexp, aten.square, aten.lerp, aten.nan_to_num,
)


# in graphs with a backward, softmax arrives as its row max, exponentials, row sum and
# quotient, so the backward can save the row statistics and recompute the rest
# ([Note: what the backward saves] in :mod:`flashlight.partition`)
TRAINING_DECOMPOSED = (
    aten._softmax, aten._softmax_backward_data, aten._log_softmax, aten._log_softmax_backward_data,
    # the derivatives of elementwise functions, as the elementwise maths they are, so a
    # score gradient through a soft cap (``tanh``) or a gate fuses like the scores
    aten.tanh_backward, aten.sigmoid_backward, aten.threshold_backward, aten.gelu_backward,
    aten.silu_backward, aten.softplus_backward, aten.elu_backward, aten.hardtanh_backward,
    aten.hardsigmoid_backward, aten.hardswish_backward, aten.leaky_relu_backward,
    aten.log_sigmoid_backward, aten.mish_backward, aten.logit_backward,
)


def _reduced_dims(x: torch.Tensor, dim: int | Sequence[int] | None) -> list[int]:
    if dim is None:
        return list(range(x.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [d % max(x.dim(), 1) for d in dims] or list(range(x.dim()))


def variance(x: torch.Tensor, dim=None, *, correction=None, keepdim: bool = False) -> torch.Tensor:
    """``var``: the sum of squared deviations from the mean over ``count - correction``
    (1 unless given: Bessel's correction), as a mean, a difference and a sum."""
    dims = _reduced_dims(x, dim)
    count = math.prod(x.shape[d] for d in dims)
    mean = x.sum(dims, keepdim=True) / count  # [..., 1, ...] over the reduced dims
    deviation = x - mean
    squares = (deviation * deviation).sum(dims, keepdim=keepdim)
    return squares / (count - (1 if correction is None else correction))


def _variance_dim(x, dim=None, unbiased: bool = True, keepdim: bool = False):
    return variance(x, dim, correction=1 if unbiased else 0, keepdim=keepdim)


def _variance_all(x, unbiased: bool = True):
    return variance(x, None, correction=1 if unbiased else 0)


def sum_over_several(x: torch.Tensor, dims, keepdim: bool = False, *, dtype=None):
    """``sum`` over several dims as sums over one dim each, the longest dim first, so the
    value between two sums is the smallest one can be (the gradient of a key mask
    ``[N, 1, 1, L]`` sums the score gradients over queries, then over heads). A kernel
    runs one loop; each sum then becomes a loop of its own, and the first, which reads
    the most, can fuse with what produced its input. Over one dim or none: not rewritten."""
    if dims is None or len(dims) < 2 or x.dim() == 0:
        return NotImplemented
    order = sorted({d % x.dim() for d in dims}, key=lambda d: (x.shape[d], d), reverse=True)
    for k, d in enumerate(order):
        # each later dim's position shifts down once an earlier one is gone (no keepdim)
        shift = 0 if keepdim else sum(1 for e in order[:k] if e < d)
        x = torch.sum(x, [d - shift], keepdim=keepdim, dtype=dtype if k == 0 else None)
    return x


def _sum_of_all(x: torch.Tensor, *, dtype=None):
    """``sum`` of every element (the gradient of a learned scalar) as sums over one dim."""
    return sum_over_several(x, list(range(x.dim())), dtype=dtype)


def _root(var):
    return lambda *args, **kwargs: torch.sqrt(var(*args, **kwargs))


@functools.cache
def decompositions(inference: bool = False) -> dict:
    """The table handed to ``aot_autograd``: PyTorch's decompositions of ``DECOMPOSED``
    and ours of ``var`` and ``std`` (PyTorch's go to ``prims.var``, which does not lower);
    for graphs that need no gradients (``inference``), also the SDPA kernels' math
    (:mod:`flashlight.sdpa`), so that attention written with
    ``F.scaled_dot_product_attention`` fuses like attention written out; for graphs with
    a backward, softmax and its backward (``TRAINING_DECOMPOSED``) and sums over several
    dims (:func:`sum_over_several`)."""
    from torch._decomp import get_decompositions

    table = get_decompositions(list(DECOMPOSED))
    table[aten.native_dropout.default] = native_dropout  # [Note: dropout inside a kernel]
    table[aten.native_dropout_backward.default] = native_dropout_backward
    for overload, var in (("correction", variance), ("dim", _variance_dim), ("default", _variance_all)):
        table[getattr(aten.var, overload)] = var
        table[getattr(aten.std, overload)] = _root(var)
    if inference:
        from flashlight.sdpa import SDPA_DECOMPOSITIONS

        table.update(SDPA_DECOMPOSITIONS)
        for op, rewrite in get_decompositions(list(_ROW_STATISTICS)).items():
            table[op] = _over_static_floats(rewrite)
    else:
        # the gradient of an input broadcast over several dims (a key mask over heads and
        # queries, a learned scalar over everything) sums over them: one dim at a time
        table[aten.sum.dim_IntList] = sum_over_several
        table[aten.sum.default] = _sum_of_all
        for op, rewrite in get_decompositions(list(TRAINING_DECOMPOSED)).items():
            table[op] = _unless_empty(rewrite) if op in _ROW_STATISTICS else rewrite
    return table


# softmax as a row max: not over an empty dim, where the max is undefined and PyTorch's
# own kernel returns the empty result
_ROW_STATISTICS = (aten._softmax.default, aten._log_softmax.default)


def _over_static_floats(rewrite):
    """A softmax of a graph without a backward, decomposed ([Note: row statistics are cut
    last] in :mod:`flashlight.backoff`) where it reduces a float tensor over a dim that
    cannot be empty: a static, non-zero size, or a symbolic one that the shape environment
    backs with a hint (it specialises 0 and 1, so such a size is at least 2 wherever the
    graph's guards hold). Over an unbacked size (``mark_unbacked``: the same graph serves
    length 0) it stays one operation: the launcher runs a kernel's unfused graph for a
    call at size 0 (``Launcher._call_empty``), where the row max of the decomposition
    would have no element; over integers eager PyTorch raises, and so must the compiled
    function."""
    def decompose(x, dim, half_to_float):
        if not x.dtype.is_floating_point or not _never_empty(x.shape[dim]):
            return NotImplemented
        return rewrite(x, dim, half_to_float)
    return decompose


def _never_empty(size) -> bool:
    """Whether a dim of ``size`` has at least one element wherever the graph runs."""
    if isinstance(size, int):
        return size != 0
    from torch.fx.experimental.symbolic_shapes import has_free_unbacked_symbols

    return not has_free_unbacked_symbols(size)


def _unless_empty(rewrite):
    def decompose(x, dim, half_to_float):
        if x.shape[dim] == 0:  # sizes 0 and 1 are never symbolic
            return NotImplemented
        return rewrite(x, dim, half_to_float)
    return decompose


def recompose_softmax(gm: torch.fx.GraphModule) -> int:
    """Every softmax that the decompositions above split into its row max, exponentials,
    row sum and quotient (each of 16-bit values computed in float32 between two casts),
    made one ``aten._softmax`` call again; returns how many. For graphs that run as
    PyTorch ops, as a kernel's unfused graph does (what autotuning times against the
    kernel, and what runs where it wins): PyTorch's softmax kernel reads the scores once,
    where the parts write and read them five times over."""
    from flashlight.graph_edits import add_call, tidy

    found = 0
    for quotient in list(gm.graph.nodes):
        parts = _softmax_parts(quotient)
        if parts is None:
            continue
        x, dim, result = parts
        with gm.graph.inserting_before(result):
            softmax = add_call(gm.graph, aten._softmax.default, (x, dim, False))
        result.replace_all_uses_with(softmax)
        found += 1
    return tidy(gm, found)


def _softmax_parts(quotient: torch.fx.Node):
    """``(x, dim, result)`` where ``quotient`` is ``e / sum(e, [dim], keepdim)`` with ``e =
    exp(x' - amax(x', [dim], keepdim))`` (``x'`` is ``x``, or ``x`` cast up to float32 with
    ``result`` the cast of the quotient back to ``x``'s dtype); else None."""
    def call(node, target):
        return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target == target

    if not call(quotient, aten.div.Tensor):
        return None
    e, total = quotient.args
    if not (call(total, aten.sum.dim_IntList) and total.args[0] is e and call(e, aten.exp.default)
            and len(total.args) > 2 and total.args[2] and len(total.args[1]) == 1):
        return None
    difference = e.args[0]
    if not call(difference, aten.sub.Tensor):
        return None
    x, row_max = difference.args
    if not (call(row_max, aten.amax.default) and row_max.args[0] is x and list(row_max.args[1]) == list(total.args[1])
            and len(row_max.args) > 2 and row_max.args[2]):
        return None
    if "val" not in x.meta:
        return None
    dim, result = total.args[1][0], quotient
    users = list(quotient.users)
    if (call(x, aten._to_copy.default) and len(users) == 1 and call(users[0], aten._to_copy.default)
            and "val" in x.args[0].meta
            and x.args[0].meta["val"].dtype == users[0].meta["val"].dtype != x.meta["val"].dtype):
        x, result = x.args[0], users[0]
    return x, dim, result

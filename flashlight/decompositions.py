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


def _root(var):
    return lambda *args, **kwargs: torch.sqrt(var(*args, **kwargs))


@functools.cache
def decompositions(inference: bool = False) -> dict:
    """The table handed to ``aot_autograd``: PyTorch's decompositions of ``DECOMPOSED``
    and ours of ``var`` and ``std`` (PyTorch's go to ``prims.var``, which does not lower);
    for graphs that need no gradients (``inference``), also the SDPA kernels' math
    (:mod:`flashlight.sdpa`), so that attention written with
    ``F.scaled_dot_product_attention`` fuses like attention written out."""
    from torch._decomp import get_decompositions

    table = get_decompositions(list(DECOMPOSED))
    for overload, var in (("correction", variance), ("dim", _variance_dim), ("default", _variance_all)):
        table[getattr(aten.var, overload)] = var
        table[getattr(aten.std, overload)] = _root(var)
    if inference:
        from flashlight.sdpa import SDPA_DECOMPOSITIONS

        table.update(SDPA_DECOMPOSITIONS)
    return table

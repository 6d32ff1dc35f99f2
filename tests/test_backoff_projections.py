"""Key-side reductions in a fused attention: key and value projections, key norms.

Fused into the attention's loop, a reduction that does not depend on the query (a key
projection over the model width, the norm of a key row) blocks tiling the query rows,
and the kernel then runs a program per query or per output feature, each computing it
again over every key. The back-off keeps such producers separate (own kernels, or
PyTorch ops) and the attention kernel is tiled over query rows like attention on
precomputed q, k, v. It never materializes a matrix over queries and keys to get there:
cdist attention, whose only such cut is its distance matrix, stays one kernel.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashlight
from flashlight.pipeline import recomputes_across_grid, repeats_loop_work
from tests.helpers import SOFTMAX_PARTS, computes_softmax, plan_of, rand
from tests.helpers import matches_float64 as _matches_float64

pytest.importorskip("triton")

B, H, L, D = 2, 3, 29, 16  # L differs from every other size: dims of size L are query or key dims
C = H * D


def _qkv(seed):
    return tuple(rand(B, H, L, D, seed=seed + k) for k in range(3))


def _plan(fn, args):
    """What the pipeline decides for the ATen graph of ``fn``."""
    return plan_of(fn, args)


def _attention_kernel(plan):
    (kernel,) = [t for t in plan.kernels.values() if any(o.startswith(("_softmax", "amax")) for o in t.kernel.origins)]
    return kernel


def _assert_no_rows_by_keys(plan):
    """No tensor the plan materializes is a matrix over queries and keys."""
    for nest in plan.graph.nests:
        if nest.name in plan.graph.materialized:
            assert sum(d.size == L for d in nest.dims) < 2, (nest.name, nest.dims)


def _assert_row_tiled(plan, dots: int):
    """The attention kernel tiles query rows with ``dots`` contractions as ``tl.dot``, and
    no kernel of the plan computes anything again across its grid."""
    attention = _attention_kernel(plan)
    assert attention.tiling.row is not None and attention.tiling.row.size == L, attention.tiling
    assert attention.tiling.row in attention.kernel.dims and attention.tiling.dots == dots, attention.tiling
    for tiled in plan.kernels.values():
        assert not recomputes_across_grid(tiled) and not repeats_loop_work(tiled), tiled.tiling
    _assert_no_rows_by_keys(plan)


def _projected(x, wq, wk, wv):
    q, k, v = ((x @ w).view(B, L, H, D).transpose(1, 2) for w in (wq, wk, wv))  # [B, H, L, D]
    return torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, -1) @ v


def test_projections_inside_the_function_leave_a_row_tiled_attention():
    """With the model width in one tile, the key and value projections once fused into a
    kernel with a program per output feature, each projecting every key again. Now they
    run on their own and the attention kernel (the query projection fused or not) tiles
    the queries, with the contractions as ``tl.dot``."""
    args = (rand(B, L, C, seed=1), *(rand(C, C, seed=2 + i) * C ** -0.5 for i in range(3)))
    _assert_row_tiled(_plan(_projected, args), dots=3)
    report = _matches_float64(_projected, args)
    assert all(op.name == "mm.default" for op in report.fallback_ops), str(report)


def _cosine(q, k, v):
    return torch.softmax(10.0 * F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2), -1) @ v


def _cosine_written_out(q, k, v):
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    return torch.softmax(10.0 * q @ k.transpose(-1, -2), -1) @ v


def _qk_rms_norm(q, k, v):
    q, k = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) for x in (q, k))
    return torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, -1) @ v


def _neg_sq_distance(q, k, v):  # -|q - k|^2 = 2 q.k - |q|^2 - |k|^2
    d2 = (q * q).sum(-1, keepdim=True) - 2 * q @ k.transpose(-1, -2) + (k * k).sum(-1)[..., None, :]
    return torch.softmax(-d2, -1) @ v


@pytest.mark.parametrize("fn", [_cosine, _cosine_written_out, _qk_rms_norm, _neg_sq_distance])
def test_key_norms_are_computed_once_and_read_along_the_loop(fn):
    """A norm of the key rows is the same for every block of queries: it is computed
    once, on its own, and the attention kernel tiles query rows, reading it as a vector
    along the key loop; the scores stay in registers."""
    args = _qkv(11)
    plan = _plan(fn, args)
    _assert_row_tiled(plan, dots=2)
    report = _matches_float64(fn, args)
    attention = [kr for kr in report.kernels if computes_softmax(kr.aten_ops)]
    assert len(attention) == 1 and sum(op.startswith("bmm") for op in attention[0].aten_ops) == 2, str(report)
    assert not any(op.name.startswith(("bmm", *SOFTMAX_PARTS)) for op in report.fallback_ops), str(report)


def _cdist(q, k, v):
    return torch.softmax(-torch.cdist(q, k), -1) @ v


def _broadcast_distance(q, k, v):
    return torch.softmax(-((q[..., :, None, :] - k[..., None, :, :]) ** 2).sum(-1), -1) @ v


@pytest.mark.parametrize("fn", [_cdist, _broadcast_distance])
def test_distances_between_queries_and_keys_are_never_materialized(fn):
    """The fused cdist kernel computes the key norms again per program, and keeping the
    distance matrix separate would end that; that cut is a matrix over queries and keys,
    which the kernel keeps in registers, so it is not made: one kernel, nothing else."""
    args = _qkv(21)
    _assert_no_rows_by_keys(_plan(fn, args))
    report = _matches_float64(fn, args)
    assert len(report.kernels) == 1 and report.fallback_ops == [], str(report)


def test_attention_averaged_over_heads_stays_row_tiled():
    """``o.mean(1)`` after the attention: the mean runs on the kernel's output and the
    attention kernel tiles query rows."""
    args = _qkv(31)

    def mean_over_heads(q, k, v):
        return (torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, -1) @ v).mean(1)

    _assert_row_tiled(_plan(mean_over_heads, args), dots=2)
    _matches_float64(mean_over_heads, args)

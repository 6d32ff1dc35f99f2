"""The compiler's stages, one by one: lowering, the passes (with invariant checks), the
online rewrite's algebra, tiling decisions, and the fused form of many written variants
(the backend's surface is in test_backend.py)."""
from __future__ import annotations

import dataclasses
import math
import pickle

import pytest
import torch
import torch.nn.functional as F

import flashlight
from flashlight import settings
from flashlight.ir import Const, Dim, Load, Pointwise, Reduce, walk
from flashlight.ir_check import check_invariants
from flashlight.lower import lower
from flashlight.passes.online import exp_power, factor_invariants
from flashlight.pipeline import compile_graph
from tests.helpers import SOFTMAX_PARTS, attention, capture, computes_softmax, matches_float64, plan_of, rand
from tests.helpers import run_with_report
from tests.helpers import attention_inputs as _inputs
from tests.helpers import cdist_scores as _cdist_scores
from tests.helpers import elementary_functions as _elementary_functions
from tests.helpers import rounding_divisions as _rounding_divisions


def test_matmul_lowers_to_a_reduction_and_views_to_index_maps():
    gm = capture(attention, *_inputs(0))
    lowered = lower(gm)
    check_invariants(lowered.graph)
    matmuls = [n for n in lowered.graph.nests if n.name.endswith("matmul")]
    assert len(matmuls) == 2
    for nest in matmuls:
        assert isinstance(nest.body, Reduce) and nest.body.op == "sum"
        assert isinstance(nest.body.body, Pointwise) and nest.body.body.op == "mul"
    # view/expand/transpose nodes produce no nests: only compute ops do
    assert not any("view" in n.name or "expand" in n.name or "transpose" in n.name for n in lowered.graph.nests)
    # the merged batch axis of bmm is a compound of two dims
    assert any(len(axis) == 2 for axis in matmuls[0].axes)


def test_an_expression_hashes_once_and_its_pickle_carries_no_hash():
    """[Note: hashing an expression once]: the structural hash is kept on the node after
    its first use, equal nodes still hash alike, and a pickle leaves it out (another
    process hashes strings differently)."""
    i, j = Dim("i", 7), Dim("j", 5)

    def expr():
        return Reduce("sum", Pointwise("mul", (Load("q", ((i,), (j,)), torch.float32), Const(0.5, torch.float32)),
                                       torch.float32), (j,), torch.float32)

    first, second = expr(), expr()
    assert first is not second and first == second and hash(first) == hash(second)
    assert first.__dict__["_hash"] == hash(first) and "_hash" not in pickle.loads(pickle.dumps(expr())).__dict__
    loaded = pickle.loads(pickle.dumps(first))
    assert "_hash" not in loaded.__dict__ and loaded == first and hash(loaded) == hash(first)
    assert {first: 1}[loaded] == 1


def test_every_pass_keeps_the_invariants_and_attention_becomes_one_kernel():
    gm = capture(attention, *_inputs(1))
    plan = compile_graph(lower(gm), check=True)
    assert len(plan.kernels) == 1
    (tiled,) = plan.kernels.values()
    ops = sorted(r.op for r in tiled.kernel.loop)
    assert ops == ["max", "sum", "sum"]  # max, denominator, P@V: one online loop
    assert tiled.tiling.dots == 2
    assert tiled.tiling.row is not None and tiled.tiling.feature is not None


def test_online_rescaling_is_derived_from_the_algebra():
    j = Dim.fresh(7, "j")
    s = Load("s", ((j,),), torch.float32)
    m = Reduce("max", s, (j,), torch.float32)
    e = Pointwise("exp", (Pointwise("sub", (s, m), torch.float32),), torch.float32)
    assert exp_power(e, m) == 1
    assert exp_power(Pointwise("mul", (e, Load("v", ((j,),), torch.float32)), torch.float32), m) == 1
    assert exp_power(Pointwise("mul", (e, e), torch.float32), m) == 2
    assert exp_power(Pointwise("sub", (s, m), torch.float32), m) is None  # linear in max: not rescalable
    assert exp_power(Pointwise("exp", (Pointwise("add", (s, m), torch.float32),), torch.float32), m) == -1
    f32, half = torch.float32, Const(0.5, torch.float32)
    shifted = Pointwise("sub", (s, m), f32)
    assert exp_power(Pointwise("exp", (Pointwise("mul", (shifted, half), f32),), f32), m) == 0.5
    assert exp_power(Pointwise("exp", (Pointwise("div", (shifted, half), f32),), f32), m) == 2
    assert exp_power(Pointwise("pow", (e, Const(3, f32)), f32), m) == 3
    assert exp_power(Pointwise("div", (e, e), f32), m) == 0


def test_invariant_factoring_moves_the_denominator_out():
    j = Dim.fresh(5, "j")
    i = Dim.fresh(3, "i")
    p = Load("p", ((i,), (j,)), torch.float32)
    denom = Reduce("sum", p, (j,), torch.float32)
    body = Pointwise("mul", (Pointwise("div", (p, denom), torch.float32), Load("v", ((j,),), torch.float32)), torch.float32)
    out = factor_invariants(Reduce("sum", body, (j,), torch.float32))
    # the sum over j no longer contains the j-invariant denominator
    inner = [n for n in walk(out) if isinstance(n, Reduce) and n.dims == (j,) and n is not denom]
    assert any(not any(x == denom for x in walk(r.body)) for r in inner)


def test_hand_written_softmax_fuses_like_torch_softmax():
    def manual(q, k, v, bias):
        s = q @ k.transpose(-1, -2) + bias
        e = torch.exp(s - s.amax(-1, keepdim=True))
        return (e / e.sum(-1, keepdim=True)) @ v

    args = _inputs(2)
    report = flashlight.explain(manual, *args)
    assert len(report.kernels) == 1 and report.fallback_ops == []
    out = flashlight.compile(manual)(*args)
    ref = manual(*(a.double() for a in args))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_a_sum_that_is_not_exp_shifted_is_not_made_online(caplog):
    # sum_j tanh(s - max_j s) depends on the max through tanh: no single online pass
    # exists, so the max is kept separate: one kernel for the row max, a second for the
    # sum that reads it (two passes over the keys; the scores are never materialised)
    def shifted_sum(q, k):
        s = q @ k.transpose(-1, -2)
        return torch.tanh(s - s.amax(-1, keepdim=True)).sum(-1)

    q, k = rand(2, 9, 8, seed=3), rand(2, 9, 8, seed=4)
    with settings.override(debug=2):
        report = flashlight.explain(shifted_sum, q, k)
    (backoff,) = [r.getMessage() for r in caplog.records if "backoff" in r.getMessage()]
    assert "exp(c * (x - max))" in backoff and "_max separate" in backoff
    assert len(report.kernels) == 2 and report.fallback_ops == []
    first, second = report.kernels
    assert "amax.default" in first.aten_ops and "tanh.default" not in first.aten_ops
    assert "tanh.default" in second.aten_ops and "bmm.default" in second.aten_ops
    out = flashlight.compile(shifted_sum)(q, k)
    torch.compiler.reset()
    torch.testing.assert_close(out.double(), shifted_sum(q.double(), k.double()), rtol=1e-5, atol=1e-5)


def test_a_sum_linear_in_the_max_splits_into_online_terms():
    # sum_j (s_j - max s) = sum_j s_j - L * max s: a loop max and two loop sums
    def shifted_sum(q, k):
        s = q @ k.transpose(-1, -2)
        return (s - s.amax(-1, keepdim=True)).sum(-1)

    q, k = rand(2, 9, 8, seed=3), rand(2, 9, 8, seed=4)
    _one_exact_kernel(shifted_sum, q, k)


def test_projection_feeding_attention_backs_off_and_stays_separate():
    # x @ w projections are reductions too; fusing K/V projections into the key loop
    # would recompute them for every row block, so they stay separate operations
    def projected(x, wq, wk, wv):
        q, k, v = x @ wq, x @ wk, x @ wv
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v

    x, wq, wk, wv = rand(2, 21, 16, seed=5), rand(16, 16, seed=6), rand(16, 16, seed=7), rand(16, 16, seed=8)
    report = flashlight.explain(projected, x, wq, wk, wv)
    assert len(report.kernels) == 1
    assert all(op.name.startswith(("mm", "bmm")) for op in report.fallback_ops)
    out = flashlight.compile(projected)(x, wq, wk, wv)
    ref = projected(*(a.double() for a in (x, wq, wk, wv)))
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


def test_softmax_written_with_exp2_of_log2e_scaled_scores_is_one_online_kernel():
    """FlashAttention kernels write softmax as ``exp2(s * log2(e) - max)``; with ``exp2``
    lowered as ``exp(x * log 2)`` that is the exponential of a positively scaled
    difference from the max, one online loop like ``torch.softmax``."""
    q, k, v, _ = _inputs(37, L=45)

    def exp2_softmax(q, k, v):
        s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 * math.log2(math.e))  # [B, H, L, L]
        e = torch.exp2(s - s.amax(-1, keepdim=True))
        return (e @ v) / e.sum(-1, keepdim=True)

    report = flashlight.explain(exp2_softmax, q, k, v)
    assert len(report.kernels) == 1 and report.fallback_ops == [], report
    torch.testing.assert_close(flashlight.compile(exp2_softmax)(q, k, v).double(),
                               exp2_softmax(q.double(), k.double(), v.double()), rtol=1e-5, atol=1e-5)


def test_log_space_softmax_and_logsumexp_fuse_by_algebra():
    """``exp(log_softmax(s)) @ v`` is one kernel (``exp(a - log b) = exp(a) / b``), and
    ``logsumexp`` of the scores runs as an online max/sum: next to the attention output
    the same kernel stores it, from the attention's own loop ([Note: several outputs]).
    A row whose scores are all ``-inf`` gives ``-inf``, as in PyTorch."""
    q, k, v, _ = _inputs(31, L=45)

    def log_space(q, k, v):
        return torch.exp(torch.log_softmax(q @ k.transpose(-1, -2), dim=-1)) @ v

    def with_lse(q, k, v):
        s = q @ k.transpose(-1, -2)
        L = s.shape[-1]
        keep = torch.arange(L)[None, :] < torch.arange(L)[:, None] - 20  # rows 0..20: no key
        s = s.masked_fill(~keep, float("-inf"))
        return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)

    report = flashlight.explain(log_space, q, k, v)
    assert len(report.kernels) == 1 and report.fallback_ops == [], report
    torch.testing.assert_close(flashlight.compile(log_space)(q, k, v).double(),
                               log_space(q.double(), k.double(), v.double()), rtol=1e-5, atol=1e-5)
    report = flashlight.explain(with_lse, q, k, v)
    assert len(report.kernels) == 1 and report.fallback_ops == [], report
    out, lse = flashlight.compile(with_lse)(q, k, v)
    ref_out, ref_lse = with_lse(q.double(), k.double(), v.double())
    assert torch.isneginf(ref_lse[..., :21]).all() and torch.isneginf(lse[..., :21]).all()
    assert torch.isnan(ref_out[..., :21, :]).all() and torch.isnan(out[..., :21, :]).all()  # 0 / 0
    torch.testing.assert_close(lse[..., 21:].double(), ref_lse[..., 21:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[..., 21:, :].double(), ref_out[..., 21:, :], rtol=1e-5, atol=1e-5)


def test_leaving_log_space_only_where_the_log_is_of_a_sum_of_exps():
    from flashlight.passes.online import leave_log_space

    j = Dim.fresh(8, "j")
    f32 = torch.float32
    x, y = Load("x", ((j,),), f32), Load("y", ((j,),), f32)
    total = Reduce("sum", Pointwise("exp", (x,), f32), (j,), f32)
    rewritten = leave_log_space(Pointwise("exp", (Pointwise("sub", (x, Pointwise("log", (total,), f32)), f32),), f32))
    assert rewritten == Pointwise("div", (Pointwise("exp", (x,), f32), total), f32)
    # log of a value that may be negative: NaN in eager, so the exponent stays as written
    kept = Pointwise("exp", (Pointwise("sub", (x, Pointwise("log", (y,), f32)), f32),), f32)
    assert leave_log_space(kept) == kept


@pytest.mark.parametrize("beta", [1.0, 0.0])
def test_baddbmm_scores_fuse(beta):
    """``baddbmm(bias, q, k^T, beta, alpha)`` (older Hugging Face attention) is a
    contraction plus a scaled bias, so the scores never leave the kernel."""
    g = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(6, 37, 8, generator=g) for _ in range(3))
    bias = torch.randn(6, 37, 37, generator=g)
    if beta == 0.0:
        bias[0, 0, 0] = float("nan")  # beta = 0 ignores the input, NaN included

    def fn(q, k, v, bias):
        s = torch.baddbmm(bias, q, k.transpose(1, 2), beta=beta, alpha=0.35)
        return torch.bmm(torch.softmax(s, dim=-1), v)

    report = flashlight.explain(fn, q, k, v, bias)
    assert len(report.kernels) == 1 and report.fallback_ops == [], report
    ref = fn(q.double(), k.double(), v.double(), bias.double())
    torch.testing.assert_close(flashlight.compile(fn)(q, k, v, bias).double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lq, lkv", [(1, 1), (1, 6), (6, 1)])
def test_masks_on_length_one_axes_fuse(lq, lkv):
    """Dynamo specialises size-1 lengths: ``arange(1)`` and ``tril`` over a unit axis
    still lower (index 0), so a causal mask at length 1 stays inside the kernel."""
    g = torch.Generator().manual_seed(lq * 10 + lkv)
    q, k, v = torch.randn(2, lq, 8, generator=g), torch.randn(2, lkv, 8, generator=g), torch.randn(2, lkv, 8, generator=g)

    def fn(q, k, v):
        s = q @ k.transpose(-1, -2)
        i, j = torch.arange(s.shape[-2]), torch.arange(s.shape[-1])
        s = s.masked_fill(j[None, :] > i[:, None] + (s.shape[-1] - s.shape[-2]), float("-inf"))
        keep = torch.tril(torch.ones_like(s, dtype=torch.bool), s.shape[-1] - s.shape[-2])  # the same mask
        return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v

    report = flashlight.explain(fn, q, k, v)
    assert len(report.kernels) == 1 and report.fallback_ops == [], report
    ref = fn(q.double(), k.double(), v.double())  # rows with no key (lq > lkv) are NaN, as in eager
    torch.testing.assert_close(flashlight.compile(fn)(q, k, v).double(), ref, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.isfinite(ref[:, -1]).all()


def test_scalar_constants_print_exactly():
    from flashlight.codegen_text import literal

    assert literal(float("-inf")) == 'float("-inf")'
    assert literal(1e9) == "1000000000.0"
    assert float(literal(math.pi)) == math.pi
    assert literal(True) == "1"


def _one_exact_kernel(fn, *inputs, rtol=1e-5):
    out, report = run_with_report(fn, inputs)
    assert len(report.kernels) == 1 and report.fallback_ops == [], report
    ref = fn(*[x.double() for x in inputs])
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=rtol)


def _prior_mix(q, k, v):  # a softmax mixed with a uniform prior
    return (0.8 * torch.softmax(q @ k.transpose(-1, -2), dim=-1) + 0.2 / k.shape[-2]) @ v


def _difference_inline(q, k, v):  # differential attention written as (p1 - lam * p2) @ v
    p1 = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
    p2 = torch.softmax((q * 0.5) @ (k - 1.0).transpose(-1, -2), dim=-1)
    return (p1 - 0.7 * p2) @ v


def _two_softmaxes_masked(q, k, v):
    s = q @ k.transpose(-1, -2)
    future = torch.ones(s.shape[-2:], dtype=torch.bool).triu(1)
    return (torch.softmax(s.masked_fill(future, float("-inf")), -1) + torch.softmax(-s, -1)) @ v


@pytest.mark.parametrize("fn", [_prior_mix, _difference_inline, _two_softmaxes_masked])
def test_sums_over_combined_probabilities_split_by_linearity(fn):
    """``sum_j (x_j + y_j) = sum_j x_j + sum_j y_j`` ([Note: online reduction]): each
    term of the expanded body is rescaled by its own max or by none."""
    q, k, v, _ = _inputs(41, L=37)
    _one_exact_kernel(fn, q, k, v)


def _entropy(q, k, v):  # a sum over keys of p log p: a second sum of the online loop
    p = torch.softmax(q @ k.transpose(-1, -2), -1)
    return -(p * torch.log(p + 1e-9)).sum(-1)


def _thresholded(q, k, v):  # a predicate on the normalised probability
    p = torch.softmax(q @ k.transpose(-1, -2), -1)
    return (p * (p > 0.05)) @ v


def _over_queries(q, k, v):  # the softmax over the query dim: each key column normalised
    return torch.softmax(q @ k.transpose(-1, -2), dim=-2) @ v


def _norm_epilogue_head_mean(q, k, v):  # reductions after the key loop, over features and heads
    o = F.layer_norm(torch.softmax(q @ k.transpose(-1, -2), -1) @ v, (q.shape[-1],))
    return o.mean(dim=1)


def _statistics_and_loop(fn, kernels: int):
    """``fn`` on interpreter-sized inputs: ``kernels`` Flashlight kernels, none of them
    storing a value per (query, key) pair, nothing left to PyTorch, exact against float64."""
    q, k, v, _ = _inputs(47, L=37)
    report = flashlight.explain(fn, q, k, v)
    assert len(report.kernels) == kernels and not report.fallback_ops, report
    plan = plan_of(fn, (q, k, v))
    for tiled in plan.kernels.values():
        # over rows ([2, 3, 37]) or rows and features ([2, 3, 37, 16]); never queries x keys
        assert sum(int(d.size) == 37 for d in tiled.kernel.dims) < 2, tiled.kernel
    ref = fn(q.double(), k.double(), v.double())
    torch.testing.assert_close(flashlight.compile(fn)(q, k, v).double(), ref, rtol=1e-5, atol=1e-5)


def test_a_softmax_over_the_query_dim_keeps_its_column_statistics():
    """A variant first tried after the catalog was written: each key column normalised
    over the queries, then ``@ v``. One kernel would compute every column's max and sum
    again in each program along the queries; they are two kernels over the key columns,
    then the loop reads them ([Note: row statistics are cut last])."""
    _statistics_and_loop(_over_queries, 3)


@pytest.mark.parametrize("fn", [_entropy, _thresholded])
def test_functions_of_the_final_probabilities_read_separate_row_statistics(fn):
    """A log of ``p + eps`` or a comparison of ``p`` needs the row's final sum while the
    loop visits the keys, which no online loop has: the row max and the sum of
    exponentials are kept separate (two kernels over the rows) and the loop reads them,
    with nothing over rows and keys in memory ([Note: row statistics are cut last])."""
    _statistics_and_loop(fn, 3)


@pytest.mark.parametrize("fn, kernels", [(_norm_epilogue_head_mean, 2)])
def test_probabilities_used_beyond_a_value_product(fn, kernels):
    """A layer norm and a mean over heads after the loop are a second kernel: the
    attention's output is kept separate, not its row statistics. Matches float64."""
    q, k, v, _ = _inputs(47, L=37)
    out, report = run_with_report(fn, (q, k, v))
    assert len(report.kernels) == kernels, report
    assert all(op.reason for op in report.fallback_ops), report
    ref = fn(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_a_sum_that_qualifies_as_written_is_not_split():
    (nest,) = [tk.kernel for tk in compile_graph(lower(capture(attention, *_inputs(0))), check=True).kernels.values()]
    assert sorted(red.op for red in nest.loop) == ["max", "sum", "sum"]


def test_contractions_over_padded_tile_dims_add_nothing_from_the_padding():
    """A head width of 24 is padded to a 32-wide tile; where neither operand of the
    contraction is a masked load (both are computed), the padding lanes must still
    contribute 0. Mixing 3 heads (a contraction over a 16-wide tile of heads) likewise."""
    g = torch.Generator().manual_seed(43)
    q, k, v = (torch.randn(2, 40, 24, generator=g) for _ in range(3))
    _one_exact_kernel(lambda q, k, v: torch.sigmoid((q + 1.0) @ k.exp().transpose(-1, -2) * 0.1) @ v, q, k, v)
    q, k, v = (torch.randn(2, 3, 40, 16, generator=g) for _ in range(3))
    mix = (torch.eye(3) + 0.1 * torch.rand(3, 3, generator=g)).float()

    def talking_heads(q, k, v, mix):
        p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)  # [B, H, L, L]
        return torch.einsum("gh,bhij->bgij", mix, p) @ v

    ref = talking_heads(q.double(), k.double(), v.double(), mix.double())
    torch.testing.assert_close(flashlight.compile(talking_heads)(q, k, v, mix).double(), ref, rtol=1e-5, atol=1e-5)


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _qk_rms_norm(q, k, v, w):  # QK normalisation, the norm written out
    return torch.softmax(_rms(q, w) @ _rms(k, w).transpose(-1, -2) * q.shape[-1] ** -0.5, -1) @ v


def _cosine(q, k, v, w):  # F.normalize: a vector norm clamped away from 0
    return torch.softmax(10.0 * F.normalize(q * w, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2), -1) @ v


def _neg_sq_distance(q, k, v, w):  # -|q - k|^2 = 2 q.k - |q|^2 - |k|^2
    d2 = (q * q).sum(-1, keepdim=True) - 2 * q @ k.transpose(-1, -2) + (k * k).sum(-1)[..., None, :]
    return torch.softmax(-d2 * w.mean(), -1) @ v


def _qk_layer_norm(q, k, v, w):  # F.layer_norm with a weight and a bias on q, plain on k
    d = q.shape[-1]
    return torch.softmax(F.layer_norm(q, (d,), w, w - 1.0) @ F.layer_norm(k, (d,)).transpose(-1, -2) * d ** -0.5, -1) @ v


@pytest.mark.parametrize("fn", [_qk_rms_norm, _cosine, _neg_sq_distance, _qk_layer_norm])
def test_norms_of_query_rows_and_key_rows_fuse(fn):
    """Reductions over the head dim: on the query side (a reduction over another extent
    than the loop's, using none of its reductions) once before the loop; on the key side
    kept separate and read along the loop where the norm is an op of its own (computed
    once, not again in every program: test_backoff_projections.py), else (F.layer_norm's
    statistics) inside the loop. Either way the attention is one kernel."""
    q, k, v, _ = _inputs(47, L=33, D=24)
    w = rand(24, seed=48).abs() + 0.5
    out, report = run_with_report(fn, (q, k, v, w))
    attention = [kr for kr in report.kernels if computes_softmax(kr.aten_ops)]
    assert len(attention) == 1 and sum(op.startswith("bmm") for op in attention[0].aten_ops) == 2, report
    assert not any(op.name.startswith(("bmm", *SOFTMAX_PARTS)) for op in report.fallback_ops), report
    ref = fn(*[x.double() for x in (q, k, v, w)])
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def _temperature_after_the_max(q, k, v):  # exp((s - max s) / T), normalised by hand
    s = q @ k.transpose(-1, -2)
    e = torch.exp((s - s.amax(-1, keepdim=True)) / 2.5)
    return e / e.sum(-1, keepdim=True) @ v


def _squared_softmax(q, k, v):  # p ** 2 renormalised: exp(2 (s - max)) / Z^2 / sum(...)
    p = torch.softmax(q @ k.transpose(-1, -2), dim=-1) ** 2
    return p / p.sum(-1, keepdim=True) @ v


@pytest.mark.parametrize("fn", [_temperature_after_the_max, _squared_softmax])
def test_sums_scaling_as_a_power_of_exp_of_the_max_run_online(fn):
    """A body proportional to ``exp(-c * max)`` with a constant ``c > 0`` is rescaled by
    ``exp(c * (m_old - m_new))`` ([Note: online reduction])."""
    q, k, v, _ = _inputs(53, L=41)
    _one_exact_kernel(fn, q, k, v)


@pytest.mark.parametrize("exponent", [4, -2, 1.5, 0.25])
def test_constant_powers_of_scores_fuse_with_the_sign_of_pytorch(exponent):
    """Integer powers are products (a negative base keeps its sign); other exponents go
    through exp(c * log x), NaN for a negative base as in PyTorch (the scores are taken
    by absolute value first there)."""
    q, k, v, _ = _inputs(59, L=23)

    def fn(q, k, v):
        s = q @ k.transpose(-1, -2) * 0.3
        s = s if float(exponent).is_integer() else s.abs() + 0.1
        return torch.softmax(torch.tanh(s ** exponent), dim=-1) @ v

    _one_exact_kernel(fn, q, k, v)


def _softmax_one(q, k, v):  # softmax with an extra zero logit: exp(s - m) / (exp(-m) + sum)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    m = s.amax(-1, keepdim=True).clamp_min(0.0)
    e = torch.exp(s - m)
    return e / (torch.exp(-m) + e.sum(-1, keepdim=True)) @ v


def _max_with_a_row_floor(q, k, v):  # the max floored by a value of the query row
    s = q @ k.transpose(-1, -2)
    m = torch.maximum(s.amax(-1, keepdim=True), q.sum(-1, keepdim=True))
    e = torch.exp(s - m)
    return e / (e.sum(-1, keepdim=True) + 0.5) @ v


@pytest.mark.parametrize("fn", [_softmax_one, _max_with_a_row_floor])
def test_a_max_clamped_from_below_is_a_loop_max_with_a_starting_value(fn):
    """``max(max_j s_j, r) = max_j max(s_j, r)`` for ``r`` free of ``j``: the running
    max starts at ``r`` ([Note: online reduction]); one kernel, exact."""
    q, k, v, _ = _inputs(59, L=45)
    _one_exact_kernel(fn, q, k, v)


def _activations(q, k, v):  # PyTorch's decompositions rewrite each into lowered ops
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    s = F.gelu(s) + F.softplus(-s) - F.logsigmoid(s) + 0.1 * F.elu(s) + F.hardtanh(F.leaky_relu(s, 0.1), -2.0, 2.0)
    return torch.softmax(s, dim=-1) @ (F.silu(v) + F.mish(v) - F.hardswish(v))


@pytest.mark.parametrize("fn", [_activations, _elementary_functions, _rounding_divisions])
def test_activations_elementary_functions_and_rounding_divisions_fuse(fn):
    q, k, v, _ = _inputs(61, L=35)
    _one_exact_kernel(fn, q, k, v)


def test_rounding_divisions_follow_python_on_negative_operands():
    """Triton's integer ``//`` and ``%`` truncate; PyTorch's floor division and remainder
    take the divisor's sign. Every sign combination, through a kernel's bias."""
    def fn(q, k, v, a):  # a: [L] integers of both signs
        b = a[None, :] + 0 * a[:, None]  # [L, L]
        bias = (torch.div(b, 4, rounding_mode="floor") + torch.remainder(b, 3) + torch.remainder(b, -3)
                + torch.div(b, -4, rounding_mode="floor") + torch.div(b, 4, rounding_mode="trunc")).float()
        return torch.softmax(q @ k.transpose(-1, -2) + 0.1 * bias, -1) @ v

    q, k, v, _ = _inputs(67, L=24)
    a = torch.arange(-12, 12)
    _one_exact_kernel(fn, q, k, v, a)


def _cdist_weights(q, k, v):  # the distance itself, normalised
    d = torch.cdist(q, k)
    return (d / d.sum(-1, keepdim=True)) @ v


@pytest.mark.parametrize("L", [20, 33])  # PyTorch's _cdist_forward below 25 rows, _euclidean_dist above
@pytest.mark.parametrize("fn", [_cdist_scores, _cdist_weights])
def test_cdist_fuses_as_a_contraction_and_two_row_norms(fn, L):
    q, k, v, _ = _inputs(71, L=L)
    _one_exact_kernel(fn, q, k, v)


def test_cdist_with_another_norm_falls_back_and_says_why():
    q, k, v, _ = _inputs(73, L=20)
    report = flashlight.explain(lambda q, k, v: torch.softmax(-torch.cdist(q, k, p=1.0), -1) @ v, q, k, v)
    assert any("p = 1.0" in op.reason for op in report.fallback_ops), report


def _temperature_attention(q, k, v, t):  # scores divided by a per-query temperature in the loop
    return torch.softmax((q @ k.transpose(-1, -2)) / t[:, None], dim=-1) @ v


def test_a_division_by_a_value_of_fewer_dims_is_one_reciprocal_per_row():
    """[Note: broadcast divisors]: the loop multiplies every score by the reciprocal of the
    query's temperature (computed once per row, before the loop); a division by a
    constant, or by a value over the same dims, stays as written."""
    from flashlight.ir import LoopReduction
    from flashlight.passes.divisors import hoist_divisors

    q, k, v, _ = _inputs(3)  # [2, 3, L, D]
    t = torch.rand(q.shape[-2], generator=torch.Generator().manual_seed(4)) + 0.5  # [L]: per query
    (tiled,) = plan_of(_temperature_attention, (q, k, v, t)).kernels.values()
    divisions = [n for red in tiled.kernel.loop for n in walk(red.body) if isinstance(n, Pointwise) and n.op == "div"]
    assert divisions and all(isinstance(n.args[0], Const) and n.args[0].value == 1.0 for n in divisions)
    matches_float64(_temperature_attention, (q, k, v, t))

    i, j = Dim.fresh(3, "i"), Dim.fresh(5, "j")
    tile, same, row = Load("p", ((i,), (j,)), torch.float32), Load("w", ((i,), (j,)), torch.float32), \
        Load("r", ((i,),), torch.float32)

    def hoisted(body):
        red = LoopReduction("sum", body, j, (), torch.float32)
        return hoist_divisors(dataclasses.replace(tiled.kernel, loop=(red,), unmasked=None, live=None,
                                                  full=None)).loop[0].body

    f32 = torch.float32
    assert hoisted(Pointwise("div", (tile, row), f32)) == Pointwise(
        "mul", (tile, Pointwise("div", (Const(1.0, f32), row), f32)), f32)
    for divisor in (Const(2.0, f32), same):
        assert hoisted(Pointwise("div", (tile, divisor), f32)) == Pointwise("div", (tile, divisor), f32)

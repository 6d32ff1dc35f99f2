"""Contraction operands ([Note: dot operands]): a product inside a sum, in whatever
association earlier passes left it, becomes the two operands of one ``tl.dot``
when its factors split by tile role, and is left alone when they do not."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import flashlight
from bench.new_forms import talking_heads  # scores mixed over heads before the softmax
from flashlight.ir import Dim, Kernel, Load, LoopReduction, LoopResult, Pointwise, Reduce
from flashlight.ir_check import check_kernel_invariants
from flashlight.passes.contractions import group_dot_operands
from tests.helpers import H200_SHARED_MEMORY, computes_softmax, plan_of, rand, shared_memory
from tests.helpers import matches_float64 as _matches_float64
from tests.test_backoff_projections import B, D, H, L, _assert_row_tiled, _plan
from tests.test_backoff_projections import _attention_kernel as _planned_attention

pytest.importorskip("triton")

F32 = torch.float32


def _weights(seed):
    return rand(D, seed=seed) + 1.5, rand(D, seed=seed + 1) + 1.5  # away from zero


def _qk_rms_norm_weighted(q, k, v, wq, wk):
    q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * wq  # [B, H, L, D]
    k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6) * wk
    return torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, -1) @ v


def _qk_rms_norm_functional(q, k, v, wq, wk):
    q, k = F.rms_norm(q, (D,), wq, eps=1e-6), F.rms_norm(k, (D,), wk, eps=1e-6)
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def _normalised_weighted_keys(q, k, v, wq, wk):
    k = F.normalize(k, dim=-1) * wk  # [B, H, L, D]: unit keys, one learned scale per feature
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


@pytest.mark.parametrize("fn", [_qk_rms_norm_weighted, _qk_rms_norm_functional, _normalised_weighted_keys])
def test_normalised_and_weighted_queries_and_keys_run_both_contractions_as_dots(fn):
    """Row and key scalars factored out of ``q . k`` leave weights along the contracted
    dim on both sides of it; the attention still tiles query rows with two ``tl.dot``s
    and matches float64 (it once ran a program per query, with no dot at all)."""
    args = (*(rand(B, H, L, D, seed=41 + k) for k in range(3)), *_weights(44))
    _assert_row_tiled(_plan(fn, args), dots=2)
    report = _matches_float64(fn, args)
    attention = [kr for kr in report.kernels if computes_softmax(kr.aten_ops)]
    assert len(attention) == 1 and attention[0].source.count("tl.dot(") >= 2, str(report)


def _gated_values(q, k, v, gv, bias):
    v = v * torch.sigmoid(gv)  # [B, H, L, D]: values gated per key and feature before P @ V
    return torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5 + bias, -1) @ v


def test_gated_values_keep_the_feature_tile_and_both_dots():
    """``sum_j p[i, j] v[j, f] g[j, f]``: the exponential reads the running max, which
    varies along the query rows, so it is one operand and the gated values the other
    (this once put the value features in the grid: a program per feature, no second
    dot); forward and every gradient match float64."""
    args = (*(rand(B, H, L, D, seed=51 + k) for k in range(4)), rand(L, L, seed=55))
    plan = _plan(_gated_values, args)
    _assert_row_tiled(plan, dots=2)
    assert _planned_attention(plan).tiling.feature is not None
    _matches_float64(_gated_values, args)
    leaves = [a.clone().requires_grad_() for a in args]
    exact = [a.double().requires_grad_() for a in args]
    grad_out = rand(B, H, L, D, seed=56)
    got = torch.autograd.grad(flashlight.compile(_gated_values)(*leaves), leaves, grad_out)
    torch.compiler.reset()
    want = torch.autograd.grad(_gated_values(*exact), exact, grad_out.double())
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4 * w.abs().max().item())


# ------------------------------------------------------------------------ the rewrite on IR


def _attention_kernel(scores_product):
    """out[i, f] = sum_j exp(sum_d scores_product(i, j, d)) v[j, f], and its tile roles."""
    i, j, d, f = Dim.fresh(L, "i"), Dim.fresh(L, "j"), Dim.fresh(D, "d"), Dim.fresh(D, "f")
    scores = Reduce("sum", scores_product(i, j, d), (d,), F32)
    body = _mul(Pointwise("exp", (scores,), F32), Load("v", ((j,), (f,)), F32))
    kernel = Kernel("attention", ((i,), (f,)), F32, (LoopReduction("sum", body, j, (), F32),),
                    LoopResult(0, F32), ("test",))
    return kernel, {i: "m", j: "n", d: "e0", f: "f"}


def _mul(*factors):
    out = factors[0]
    for factor in factors[1:]:
        out = Pointwise("mul", (out, factor), F32)
    return out


def _q(i, d):
    return Load("q", ((i,), (d,)), F32)


def _k(j, d):
    return Load("k", ((j,), (d,)), F32)


def test_factors_split_by_the_role_they_vary_along():
    """``((q w) k) w'`` summed over ``d``: q and both weights form the left operand, k the
    right, whatever the association; every factor is kept, and the loop's own
    contraction (``exp(s) . v``, already two operands) is unchanged."""
    def product(i, j, d):
        return _mul(_q(i, d), Load("wq", ((d,),), F32), _k(j, d), Load("wk", ((d,),), F32))

    kernel, roles = _attention_kernel(product)
    grouped = group_dot_operands(kernel, roles)
    check_kernel_invariants(grouped)
    exp_scores, v = grouped.loop[0].body.args
    assert v == kernel.loop[0].body.args[1]
    left, right = exp_scores.args[0].body.args
    assert sorted(x.base for x in _leaves(left)) == ["q", "wk", "wq"] and [x.base for x in _leaves(right)] == ["k"]


def test_a_factor_along_both_sides_leaves_the_product_as_written():
    """``q[i, d] k[j, d] g[i, j]`` summed over ``d`` is not one dot: nothing changes."""
    kernel, roles = _attention_kernel(lambda i, j, d: _mul(_q(i, d), _k(j, d), Load("g", ((i,), (j,)), F32)))
    assert group_dot_operands(kernel, roles) is kernel


def test_a_product_that_already_splits_is_kept():
    kernel, roles = _attention_kernel(lambda i, j, d: _mul(_q(i, d), _k(j, d)))
    assert group_dot_operands(kernel, roles) is kernel


def _leaves(expr):
    if isinstance(expr, Pointwise) and expr.op == "mul":
        return [f for a in expr.args for f in _leaves(a)]
    return [expr]


# ------------------------------------------------------------------------ any association

# what a factor varies along: query rows m, keys n, the contracted dim d
_ROLE_SETS = ("md", "nd", "d", "", "m", "n", "mn")


def _evaluate(expr, values):
    """A product of loads as a [rows, keys, d] float64 tensor (size 1 where a dim is absent)."""
    if isinstance(expr, Load):
        return values[expr.base]
    left, right = (_evaluate(a, values) for a in expr.args)
    return left * right


@settings(max_examples=80, deadline=None)
@given(order=st.lists(st.sampled_from(_ROLE_SETS), min_size=2, max_size=6),
       joins=st.lists(st.integers(min_value=0, max_value=10), max_size=6))
def test_regrouping_keeps_the_product_and_finds_a_dot_exactly_when_one_exists(order, joins):
    """Any product of factors over rows, keys and the contracted dim, in any association:
    regrouped, it has the same value, and it is two dot operands exactly when no factor
    varies along both rows and keys, the factors together vary along both, and each
    side (the key factors; the rest) has a factor along the contracted dim."""
    sizes = {"m": L, "n": L + 2, "d": D}
    loads = []

    def product(i, j, d):
        dims = {"m": i, "n": j, "d": d}
        loads.extend(Load(f"x{k}", tuple((dims[c],) for c in roles), F32) for k, roles in enumerate(order))
        pending = list(loads)
        for join in joins:  # join two neighbouring subtrees, in the drawn order
            if len(pending) > 1:
                at = join % (len(pending) - 1)
                pending[at:at + 2] = [_mul(pending[at], pending[at + 1])]
        return _mul(*pending)

    kernel, roles = _attention_kernel(product)
    grouped = group_dot_operands(kernel, roles)
    before, after = (k.loop[0].body.args[0].args[0].body for k in (kernel, grouped))

    generator = torch.Generator().manual_seed(len(order))
    values = {load.base: torch.randn([sizes[c] if c in r else 1 for c in "mnd"], generator=generator,
                                     dtype=torch.float64)
              for load, r in zip(loads, order)}
    torch.testing.assert_close(_evaluate(after, values), _evaluate(before, values))

    def sides_of(product):
        return [{c for x in _leaves(arg) for c in order[int(x.base[1:])]} for arg in product.args]

    def two_operands(sides):
        return all("d" in r and len(r - {"d"}) == 1 for r in sides) and sides[0] != sides[1]

    # a product written as two dot operands is kept (a factor along d alone may then sit
    # with the keys); else the regrouping puts the key factors on one side, the rest on
    # the other
    splittable = two_operands(sides_of(before)) or (
        "mn" not in order and {"m", "n"} <= set("".join(order))
        and ("md" in order or "d" in order) and "nd" in order)
    sides = sides_of(after)
    is_dot = two_operands(sides)
    assert is_dot == splittable, (order, sides)



def _widened_output(q, k, v):  # bf16 [B, H, L, D]; the probabilities' matmul asked for in float32
    p = torch.softmax((q @ k.transpose(-1, -2)).float(), -1).to(q.dtype)
    return p.float() @ v.float()


def _float32_probabilities(q, k, v):  # the probabilities never rounded to 16 bits
    return torch.softmax((q @ k.transpose(-1, -2)).float(), -1) @ v.float()


@pytest.mark.parametrize("fn, pv_dtype", [(_widened_output, torch.bfloat16), (_float32_probabilities, F32)],
                         ids=["widened_from_bf16", "float32_factor"])
def test_a_float32_matmul_of_widened_16_bit_factors_runs_in_16_bits(fn, pv_dtype):
    """Widening is exact and ``tl.dot`` accumulates in float32, so a float32 product of
    two factors widened from bfloat16 (the backward's row term keeps the forward's
    matmul so: [Note: a row term from a rounded output]) goes into the tensor cores as
    bfloat16; a factor that was never 16-bit keeps the product in float32."""
    q, k, v = (rand(B, H, L, D, seed=s).bfloat16() for s in (1, 2, 3))
    plan = plan_of(fn, (q, k, v))
    (tiled,) = plan.kernels.values()
    dtypes = sorted(str(d.dtype) for d in tiled.plan.dots.values())
    assert dtypes == sorted(["torch.bfloat16", str(pv_dtype)]), dtypes


# -- [Note: inner loops]: heads mixed before the softmax

def _talking_heads(q, k, v, pre, post):  # mixed before the softmax and after it
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    p = torch.softmax(torch.einsum("bhij,hg->bgij", s, pre), -1)
    return torch.einsum("bgij,gh->bhij", p, post) @ v


def _mixing(heads, gen):
    return torch.eye(heads) + 0.5 * torch.randn(heads, heads, generator=gen)


@pytest.mark.parametrize("heads", [2, 5])
def test_scores_mixed_over_heads_loop_over_the_heads_in_the_kernel(heads, gen):
    """``sum_h W[h, g] (q_h . k_h)``: the head sum takes no tile but a loop of its own in
    the key loop, a ``tl.dot`` over the head width at each step, and the scores never
    reach memory: one kernel, nothing outside it, float64's values."""
    q, k, v = (torch.randn(2, heads, 37, 16, generator=gen) for _ in range(3))
    args = (q, k, v, _mixing(heads, gen))
    report = _matches_float64(talking_heads, args)
    assert len(report.kernels) == 1 and report.fallback_ops == [], str(report)
    source = report.kernels[0].source
    key_loops = source.count("for start_n in range(")  # the whole key tiles' loop apart, on tensor cores
    assert f"in range(0, {heads}):" in source and source.count("tl.dot(") == 2 * key_loops, source


def test_talking_heads_attention_is_one_kernel_in_float32_and_bfloat16(gen):
    """Heads mixed before and after the softmax (talking-heads attention): one kernel,
    against float64 (bf16: within 2e-2 of the largest value)."""
    q, k, v = (torch.randn(1, 3, 29, 16, generator=gen) for _ in range(3))
    args = (q, k, v, _mixing(3, gen), _mixing(3, gen))
    report = _matches_float64(_talking_heads, args)
    assert len(report.kernels) == 1 and report.fallback_ops == [], str(report)
    low = [a.bfloat16() for a in args]
    out = flashlight.compile(_talking_heads)(*low)
    torch.compiler.reset()
    ref = _talking_heads(*(a.double() for a in low))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert (out.double() - ref).abs().max() <= 2e-2 * ref.abs().max()


def test_more_heads_than_an_inner_loop_takes_leave_the_scores_to_a_matmul(gen):
    """Past ``MAX_INNER_LOOP`` heads the head sum is not a loop in the kernel: the scores
    are one matmul outside, the mixing and the attention one kernel, float64's values."""
    from flashlight.passes.tiling import MAX_INNER_LOOP

    heads = MAX_INNER_LOOP + 1
    q, k, v = (torch.randn(1, heads, 19, 16, generator=gen) for _ in range(3))
    args = (q, k, v, _mixing(heads, gen))
    report = _matches_float64(talking_heads, args)
    assert len(report.kernels) == 1 and [op.name for op in report.fallback_ops] == ["bmm.default"], str(report)


def test_heads_mixed_before_the_softmax_build_for_hopper_in_the_registers_of_two(gen):
    """Heads of width 64 in bfloat16 build for sm_90 within the H200's shared memory, and
    eight heads take the registers and shared memory two do: one head's tiles live at a
    time ([Note: inner loops])."""
    builds = []
    for heads in (2, 8):
        q, k, v = (torch.randn(1, heads, 64, 64, generator=gen).bfloat16() for _ in range(3))
        report = flashlight.explain(talking_heads, q, k, v, _mixing(heads, gen).bfloat16())
        assert len(report.kernels) == 1 and report.fallback_ops == [], str(report)
        # nothing assumed of either launch's sizes and strides, so only the head count differs
        builds.append(report.kernels[0].aot_compile(90, specialize=None))
    assert 0 < shared_memory(builds[1]) == shared_memory(builds[0]) <= H200_SHARED_MEMORY
    regs = [getattr(build, "n_regs", None) for build in builds]
    assert None in regs or regs[0] == regs[1], regs

"""Reductions over an output's features after the online loop ([Note: reductions over an
output's features] in ``passes/features.py``): attention followed by a norm or a softmax
over the head width is one kernel, the reduction taken over the feature tile of the
loop's results, matching float64 forward and backward; where the rename would not land on
what the output computes, nothing changes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashlight
from flashlight.ir import Dim, Load, Pointwise, Reduce
from flashlight.passes.features import features_from_results
from tests.helpers import rand

pytest.importorskip("triton")

F32 = torch.float32
B, H, L, D, DV = 1, 2, 70, 16, 24  # several key tiles; a value width that pads its tile


def _attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, -1) @ v  # [B, H, L, DV]


def rms_norm_per_head(q, k, v, w):
    o = _attention(q, k, v)
    return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def residual_layer_norm(q, k, v, w, b):
    return F.layer_norm(_attention(q, k, v) + v, (v.shape[-1],), w, b)


def softmax_over_features(q, k, v):
    return torch.softmax(3.0 * _attention(q, k, v), dim=-1)


def differential_with_norm(q1, k1, q2, k2, v, lam, w):
    # the Differential Transformer's head: two softmaxes over one v, then an RMS norm per head
    o = _attention(q1, k1, v) - lam * _attention(q2, k2, v)
    return F.rms_norm(o, (v.shape[-1],), w, eps=1e-5) * 0.2


def _inputs(fn, seed):
    qkv = [rand(B, H, L, D, seed=seed), rand(B, H, L, D, seed=seed + 1), rand(B, H, L, DV, seed=seed + 2)]
    extra = {rms_norm_per_head: [rand(DV, seed=seed + 3)],
             residual_layer_norm: [rand(DV, seed=seed + 3), rand(DV, seed=seed + 4)],
             softmax_over_features: []}
    if fn is differential_with_norm:
        q2, k2 = rand(B, H, L, D, seed=seed + 5), rand(B, H, L, D, seed=seed + 6)
        return [qkv[0], qkv[1], q2, k2, qkv[2], torch.tensor(0.7), rand(DV, seed=seed + 3)]
    return qkv + extra[fn]


CASES = [rms_norm_per_head, residual_layer_norm, softmax_over_features, differential_with_norm]


def _close(got, want, rtol):
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=rtol * want.abs().max().item())


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_a_reduction_over_the_head_width_joins_the_attention_kernel(fn):
    args = _inputs(fn, 70)
    report = flashlight.explain(fn, *args)
    assert len(report.kernels) == 1 and not report.fallback_ops, str(report)
    assert "tl.sum(" in report.kernels[0].source and "axis=1)" in report.kernels[0].source
    leaves = [a.clone().requires_grad_() for a in args]
    exact = [a.double().requires_grad_() for a in args]
    out = flashlight.compile(fn)(*leaves)
    torch.compiler.reset()
    want = fn(*exact)
    _close(out, want, 1e-5)
    grad_out = torch.randn(want.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    got = torch.autograd.grad(out, leaves, grad_out.float())
    torch.compiler.reset()
    for g, w in zip(got, torch.autograd.grad(want, exact, grad_out), strict=True):
        _close(g, w, 1e-4)


def test_bfloat16_and_the_hopper_build():
    args = _inputs(rms_norm_per_head, 80)
    report = flashlight.explain(rms_norm_per_head, *args)
    assert report.kernels[0].aot_compile(90).shared > 0
    out = flashlight.compile(rms_norm_per_head)(*(a.bfloat16() for a in args))
    torch.compiler.reset()
    _close(out, rms_norm_per_head(*(a.double() for a in args)), 2e-2)


def test_a_centred_variance_is_not_expanded_into_cancelling_terms():
    """Values far from zero with a small spread: the layer norm's variance computed as
    ``E[x^2] - E[x]^2`` would cancel; the kernel keeps the centred form and is as close
    to float64 as eager float32 is."""
    args = _inputs(residual_layer_norm, 90)
    args[2] = args[2] * 0.01 + 300.0  # v: [B, H, L, DV], mean 300, spread 0.01
    out = flashlight.compile(residual_layer_norm)(*args)
    torch.compiler.reset()
    want = residual_layer_norm(*(a.double() for a in args))
    err = ((out.double() - want).abs().max() / want.abs().max()).item()
    eager = ((residual_layer_norm(*args).double() - want).abs().max() / want.abs().max()).item()
    assert torch.isfinite(out).all() and err <= 2 * eager + 1e-6, (err, eager)


# ------------------------------------------------------------------------- the rename on IR


def _key_sum(i, j, f):
    return Reduce("sum", Pointwise("mul", (Load("p", ((i,), (j,)), F32), Load("v", ((j,), (f,)), F32)), F32), (j,), F32)


def test_a_sum_over_features_of_key_sums_is_rebound_to_the_output_feature_dim():
    i, j, f, c = Dim.fresh(L, "i"), Dim.fresh(L, "j"), Dim.fresh(DV, "f"), Dim.fresh(DV, "c")
    norm = Reduce("sum", Pointwise("mul", (_key_sum(i, j, c), _key_sum(i, j, c)), F32), (c,), F32)
    body = Pointwise("mul", (_key_sum(i, j, f), norm), F32)
    out = features_from_results(body, (i, f))
    rebound = out.args[1]
    assert rebound.dims == (f,) and rebound.body == Pointwise("mul", (_key_sum(i, j, f),) * 2, F32)
    assert out.args[0] == body.args[0]


def test_nothing_is_rebound_where_the_output_does_not_read_those_sums():
    """The output reads other sums at its feature dim (or its dims differ in size): a
    rename would add loop reductions the output does not need, so none is made."""
    i, j, f, c = Dim.fresh(L, "i"), Dim.fresh(L, "j"), Dim.fresh(DV, "f"), Dim.fresh(DV, "c")
    other = Reduce("sum", Pointwise("mul", (Load("p", ((i,), (j,)), F32), Load("u", ((j,), (f,)), F32)), F32), (j,), F32)
    norm = Reduce("sum", _key_sum(i, j, c), (c,), F32)
    body = Pointwise("mul", (other, norm), F32)
    assert features_from_results(body, (i, f)) is body
    wide = Dim.fresh(DV + 1, "f")
    body = Pointwise("mul", (_key_sum(i, j, wide), norm), F32)
    assert features_from_results(body, (i, wide)) is body

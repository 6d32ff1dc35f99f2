"""Reductions and slices through a concatenation ([Note: reductions through a
concatenation] in ``flashlight/concatenations.py``): a sink logit concatenated as an
extra key column (gpt-oss's form) is one attention kernel; the rewrite keeps every value
some other user reads, and leaves concatenations no reduction reads alone."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flashlight
from flashlight.backend import make_backend
from flashlight.concatenations import split_concatenations
from flashlight.report import ExplainReport
from tests.helpers import capture, rand

pytest.importorskip("triton")

B, H, L, D = 2, 3, 19, 16


def sink_column(q, k, v, sinks):
    # a learned logit per head as one more key column, dropped after the softmax; causal
    n = q.shape[-2]
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # [B, H, L, L]
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    s = torch.cat([s, sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, n, 1)], dim=-1)  # [B, H, L, L + 1]
    return torch.softmax(s, dim=-1)[..., :-1] @ v


def probabilities_too(q, k, v, sinks):
    # the whole softmax over L + 1 columns is also returned: it must stay as computed
    s = torch.cat([q @ k.transpose(-1, -2), sinks.reshape(1, -1, 1, 1).expand(*q.shape[:3], 1)], dim=-1)
    p = torch.softmax(s, dim=-1)
    return p[..., :-1] @ v, p


def pieces_reduced(a, b):
    # a max and a sum over a concatenation of two score blocks, then their combination
    x = torch.cat([a, 2.0 * b], dim=-1)
    return x.amax(-1) + torch.exp(x - x.amax(-1, keepdim=True)).sum(-1)


def logsumexp_with_sink(q, k, v, sinks):
    # the log-sum-exp over the scores and the sink column, then exp(s - lse) @ v; the
    # first row's scores all -inf (only the sink remains)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    s = s.masked_fill(torch.arange(q.shape[-2], device=q.device)[:, None] == 0, float("-inf"))
    lse = torch.logsumexp(torch.cat([s, sinks.reshape(1, -1, 1, 1).expand(*q.shape[:3], 1)], dim=-1), dim=-1)
    return torch.exp(s - lse[..., None]) @ v


def _inputs(seed, n=L):
    return [rand(B, H, n, D, seed=seed + k) for k in range(3)] + [rand(H, seed=seed + 3)]


def _close(got, want, tol):
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())


def test_a_sink_column_is_one_attention_kernel():
    args = _inputs(10)
    report = flashlight.explain(sink_column, *args)
    assert len(report.kernels) == 1 and not report.fallback_ops, str(report)
    assert "cat.default" not in report.kernels[0].aten_ops
    assert report.rewrites and "rewrite: 1 concatenation(s)" in str(report)
    out = flashlight.compile(sink_column)(*args)
    torch.compiler.reset()
    _close(out, sink_column(*(a.double() for a in args)), 1e-5)
    out = flashlight.compile(sink_column)(*(a.bfloat16() for a in args))
    torch.compiler.reset()
    _close(out, sink_column(*(a.double() for a in args)), 2e-2)


def test_other_lengths_and_gradients_match_float64():
    """Lengths that make the graph dynamic (symbolic slice ends and piece sizes) compile
    to one kernel per graph; under autograd the joint graph is rewritten too: every
    gradient matches float64 and nothing the size of the scores is saved."""
    report = ExplainReport()
    compiled = torch.compile(sink_column, backend=make_backend(report=report))
    with torch.no_grad():
        for n in (L, 23, 31):
            args = _inputs(20 + n, n)
            _close(compiled(*args), sink_column(*(a.double() for a in args)), 1e-5)
    assert len(report.kernels) == 2 and not report.fallback_ops, str(report)  # static, then dynamic
    torch.compiler.reset()
    args = [a.requires_grad_() for a in _inputs(60)]
    exact = [a.detach().double().requires_grad_() for a in args]
    grad_out = rand(B, H, L, D, seed=64)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = flashlight.compile(sink_column)(*args)
    assert saved and max(saved) < B * H * L * L, saved  # q, k, v, the output and row statistics
    got = torch.autograd.grad(out, args, grad_out)
    torch.compiler.reset()
    for g, w in zip(got, torch.autograd.grad(sink_column(*exact), exact, grad_out.double()), strict=True):
        _close(g, w, 1e-4)


def test_a_log_sum_exp_over_a_sink_column_runs_in_kernels():
    """``logsumexp`` combines its pieces with PyTorch's guard on an infinite max, which
    the online algebra does not read as its own: the max is a kernel of its own, the rest
    one more, nothing outside them; a row whose scores are all masked keeps the sink."""
    args = _inputs(110)
    report = flashlight.explain(logsumexp_with_sink, *args)
    assert len(report.kernels) == 2 and not report.fallback_ops, str(report)
    out = flashlight.compile(logsumexp_with_sink)(*args)
    torch.compiler.reset()
    _close(out, logsumexp_with_sink(*(a.double() for a in args)), 1e-5)


def test_values_other_users_read_stay_as_they_were():
    args = _inputs(70)
    outs = flashlight.compile(probabilities_too)(*args)
    torch.compiler.reset()
    for got, want in zip(outs, probabilities_too(*(a.double() for a in args)), strict=True):
        _close(got, want, 1e-5)


def test_a_max_and_a_sum_over_a_concatenation_combine_their_pieces():
    a, b = rand(B, H, L, 7, seed=80), rand(B, H, L, 5, seed=81)
    gm = capture(pieces_reduced, a, b)
    assert split_concatenations(gm) == 1
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.cat.default" not in ops and "aten.maximum.default" in ops, ops
    out = flashlight.compile(pieces_reduced)(a, b)
    torch.compiler.reset()
    _close(out, pieces_reduced(a.double(), b.double()), 1e-5)


def test_a_concatenation_no_reduction_reads_is_left_alone():
    """Rotary embeddings concatenate halves of the head width that a matmul contracts:
    no reduction over the concatenated dim, no rewrite."""
    def rotated(q, k):
        half = q.shape[-1] // 2
        q = torch.cat([-q[..., half:], q[..., :half]], dim=-1)
        return q @ k.transpose(-1, -2)

    args = (rand(B, H, L, D, seed=90), rand(B, H, L, D, seed=91))
    gm = capture(rotated, *args)
    before = str(gm.graph)
    assert split_concatenations(gm) == 0 and str(gm.graph) == before


def biased_after_concatenation(q, k, v, sinks, bias):
    # a bias over all L + 1 columns added after the concatenation: sliced to each piece
    s = torch.cat([q @ k.transpose(-1, -2), sinks.reshape(1, -1, 1, 1).expand(*q.shape[:3], 1)], dim=-1)
    return torch.softmax(s + bias, dim=-1)[..., :-1] @ v


def test_a_value_along_the_concatenated_dim_is_sliced_to_each_piece():
    """The bias is sliced to each piece's range and the graph fuses into one kernel, at
    a static length and at a dynamic one, whose range bounds are nodes adding up the
    pieces' sizes, read from the graph's inputs (never from the scores, which would then
    be computed for their size)."""
    report = ExplainReport()
    compiled = torch.compile(biased_after_concatenation, backend=make_backend(report=report))
    with torch.no_grad():
        for n in (L, 23):
            args = _inputs(100 + n, n) + [rand(n, n + 1, seed=104 + n)]
            _close(compiled(*args), biased_after_concatenation(*(a.double() for a in args)), 1e-5)
            assert not report.fallback_ops, str(report)
            assert "slice.Tensor" in report.kernels[-1].aten_ops
    torch.compiler.reset()
    assert len(report.kernels) == 2, str(report)  # the static graph's, the dynamic graph's


# ------------------------------------------------------------------ the rewrite's algebra

_KINDS = ("softmax", "amax", "sum_of_exp", "logsumexp")


def _reduced_over_concatenation(sizes, dim, kind, along, keep):
    """cat of pieces of ``sizes`` along ``dim``, times a weight varying along it or not,
    reduced as ``kind``; with ``keep`` (softmax) the slice covering piece 1."""
    def fn(*xs):
        x = torch.cat(xs[:-1], dim=dim) * xs[-1]
        if kind == "softmax":
            p = torch.softmax(x, dim=dim)
            return p.narrow(dim, sizes[0], sizes[1]) if keep else p.sum(dim)
        if kind == "amax":
            return x.amax(dim, keepdim=keep) - x.sum(dim, keepdim=keep)
        if kind == "logsumexp":
            return torch.logsumexp(x, dim, keepdim=keep)
        return torch.exp(x - x.amax(dim, keepdim=True)).sum(dim)

    return fn


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=2, max_size=3), dim=st.sampled_from([1, 2]),
       kind=st.sampled_from(_KINDS), along=st.booleans(), keep=st.booleans(), seed=st.integers(0, 2**16))
def test_the_rewritten_graph_computes_what_the_graph_did(sizes, dim, kind, along, keep, seed):
    """Any split into pieces, weights along the dim or broadcast, a max, a sum, a softmax
    and a slice of one piece: the rewritten ATen graph gives the original's values."""
    shape = [2, 3, 5]
    pieces = [rand(*shape[:dim], n, *shape[dim + 1:], seed=seed + k) for k, n in enumerate(sizes)]
    weight_shape = [1, 1, 1]
    if along:
        weight_shape[dim] = sum(sizes)
    args = (*pieces, rand(*weight_shape, seed=seed + 9))
    fn = _reduced_over_concatenation(sizes, dim, kind, along, keep)
    gm = capture(fn, *args)
    with torch.no_grad():
        before = gm(*args)
        assert split_concatenations(gm) == 1
        assert not any(n.target is torch.ops.aten.cat.default for n in gm.graph.nodes if n.users), str(gm.graph)
        after = gm(*args)
    for a, b in zip(before, after, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def memory_tokens(q, k, v, k_memory, v_memory):
    # learned memory tokens per head [1, H, M, D] before the keys and values
    k = torch.cat([k_memory.expand(k.shape[0], -1, -1, -1), k], dim=-2)  # [B, H, M + L, D]
    v = torch.cat([v_memory.expand(v.shape[0], -1, -1, -1), v], dim=-2)
    return torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, dim=-1) @ v


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_each_piece_is_read_inside_its_own_range(dynamic):
    """Keys concatenated after memory tokens: at key position ``t`` the kernel reads the
    memory at ``t`` only where ``t < M`` and the keys at ``t - M`` only past it; no read
    leaves its tensor (the kernels check every load's bounds). Under ``dynamic=True``
    the memory's count ``M`` is a symbolic size that no load names alone (the memory is
    read at the concatenation's index): the runtime reads it from the memory's own
    shape, and the loop's extent ``M + L`` is computed from it ([Note: sizes used as
    values] in ``flashlight/indexing.py``). One kernel, float64-exact, at two lengths."""
    from flashlight import settings

    report = ExplainReport()
    compiled = torch.compile(memory_tokens, backend=make_backend(report=report), dynamic=dynamic)
    with settings.override(check_bounds=True), torch.no_grad():
        for n in (L, 23):
            q, k, v = _inputs(140 + n, n)[:3]
            args = (q, k, v, rand(1, H, 5, D, seed=145), rand(1, H, 5, D, seed=146))
            _close(compiled(*args), memory_tokens(*(a.double() for a in args)), 1e-5)
            assert len(report.kernels) in (1, 2) and not report.fallback_ops, str(report)
    torch.compiler.reset()

"""Several outputs of one loop in one kernel ([Note: several outputs] in
``passes/outputs.py``): a function returning the attention output and its row
statistics (log-sum-exp, max, sum), however it spells them, compiles to one kernel
storing all of them, each matching float64 eager; no ATen arithmetic runs besides the
kernel (checked with the profiler, not only by ``explain()``); outputs that cannot come
from one loop stay separate kernels, and correct."""
from __future__ import annotations

import math

import pytest
import torch

import flashlight
from flashlight.backend import make_backend
from flashlight.ir import Const, Dim, Kernel, Load, LoopReduction, LoopResult
from flashlight.passes.outputs import NotShared, merge_outputs
from flashlight.report import ExplainReport
from tests.helpers import aten_outside_kernels


def _scores(q, k):
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def out_and_logsumexp(q, k, v):
    s = _scores(q, k)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def out_and_lse_by_hand(q, k, v):
    s = _scores(q, k)
    m = s.amax(-1, keepdim=True)
    lse = (m + torch.log(torch.exp(s - m).sum(-1, keepdim=True))).squeeze(-1)
    return torch.softmax(s, -1) @ v, lse


def out_max_and_sum(q, k, v):  # the statistics the output itself is computed from
    s = _scores(q, k)
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    return (e / l) @ v, m, l


def lse_first_then_out(q, k, v):  # the statistics returned first, the output from them
    s = _scores(q, k)
    lse = torch.logsumexp(s, -1, keepdim=True)
    return lse, torch.exp(s - lse) @ v


def masked_out_and_lse(q, k, v):  # a causal mask; the lse of the masked scores
    L = q.shape[-2]
    s = _scores(q, k).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def out_and_score_energy(q, k, v):  # a statistic the softmax's loop lacks joins that loop
    s = _scores(q, k)
    return torch.softmax(s, -1) @ v, (s * s).sum(-1)


SPELLINGS = [out_and_logsumexp, out_and_lse_by_hand, out_max_and_sum, lse_first_then_out,
             masked_out_and_lse, out_and_score_energy]


def _inputs(gen, dtype=torch.float32, L=37, D=16):
    return [torch.randn(2, 3, L, D, generator=gen).to(dtype) for _ in range(3)]


def _check(outs, wants, dtype):
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    assert len(outs) == len(wants)
    for out, want in zip(outs, wants):
        assert out.dtype == dtype and out.shape == want.shape
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), want.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("fn", SPELLINGS, ids=lambda f: f.__name__)
def test_outputs_of_one_loop_are_one_kernel(fn, gen):
    args = _inputs(gen)
    report = ExplainReport()
    compiled = torch.compile(fn, backend=make_backend(report=report))
    torch.compiler.reset()
    with torch.no_grad():
        outs = compiled(*args)
        assert len(report.kernels) == 1, str(report)
        assert not report.fallback_ops, str(report)
        assert aten_outside_kernels(compiled, args) == []
    torch.compiler.reset()
    _check(outs, fn(*(a.double() for a in args)), torch.float32)
    want = [o.to(torch.float32) for o in fn(*args)]  # eager's own float32 values, as a second check
    _check(outs, want, torch.float32)


def test_bf16_outputs_keep_eager_dtypes_and_build_for_sm90(gen):
    args = _inputs(gen, torch.bfloat16)
    report = flashlight.explain(out_and_logsumexp, *args)
    assert len(report.kernels) == 1, str(report)
    assert report.kernels[0].aot_compile(90).shared > 0  # builds for Hopper, every output stored
    outs = flashlight.compile(out_and_logsumexp)(*args)
    torch.compiler.reset()
    wants = out_and_logsumexp(*(a.double() for a in args))
    _check(outs, [w.to(torch.bfloat16) for w in wants], torch.bfloat16)


def out_over_two_value_dims_and_logsumexp(q, k, v):  # v: [B, H, L, C, D], two value dims
    s = _scores(q, k)
    return torch.einsum("bhij,bhjcd->bhicd", torch.softmax(s, -1), v), torch.logsumexp(s, -1)


def test_statistics_of_a_grid_of_value_columns_are_stored_once(gen):
    """Values over two feature dims: one is the tile's, the other's positions are in the
    grid; the row statistics do not vary along it, so only its first position's programs
    store them, under a scalar guard (which Triton's interpreter accepts where a block
    mask joined with a scalar condition is refused) that builds for Hopper too."""
    q, k = (torch.randn(1, 1, 13, 16, generator=gen) for _ in range(2))
    v = torch.randn(1, 1, 13, 3, 20, generator=gen)
    report = flashlight.explain(out_over_two_value_dims_and_logsumexp, q, k, v)
    assert len(report.kernels) == 1, str(report)
    source = report.kernels[0].source
    assert "if (g" in source and "== 0):" in source, source
    assert report.kernels[0].aot_compile(90).shared > 0
    outs = flashlight.compile(out_over_two_value_dims_and_logsumexp)(q, k, v)
    torch.compiler.reset()
    _check(outs, out_over_two_value_dims_and_logsumexp(q.double(), k.double(), v.double()), torch.float32)


def test_values_wider_than_a_tile_are_left_to_pytorch(gen):
    """Values wider than one tile could only spread one column per program, each running
    the key loop again: no kernel for the attention; PyTorch computes it, correctly."""
    q, k = (torch.randn(1, 1, 13, 16, generator=gen) for _ in range(2))
    v = torch.randn(1, 1, 13, 260, generator=gen)
    report = flashlight.explain(out_and_logsumexp, q, k, v)
    assert any("260-wide dim" in op.reason for op in report.fallback_ops), str(report)
    outs = flashlight.compile(out_and_logsumexp)(q, k, v)
    torch.compiler.reset()
    _check(outs, out_and_logsumexp(q.double(), k.double(), v.double()), torch.float32)


def test_a_second_length_reuses_one_kernel(gen):
    report = ExplainReport()
    compiled = torch.compile(out_and_logsumexp, backend=make_backend(report=report))
    torch.compiler.reset()
    for L in (21, 30, 45):
        args = _inputs(gen, L=L)
        with torch.no_grad():
            outs = compiled(*args)
        _check(outs, out_and_logsumexp(*(a.double() for a in args)), torch.float32)
    assert len(report.kernels) == 2, str(report)  # static, then one symbolic kernel
    assert all(len(k.aten_ops) > 4 for k in report.kernels)
    torch.compiler.reset()


def probabilities_and_out(q, k, v):  # p has the key dim: no loop over keys can store it
    p = torch.softmax(_scores(q, k), -1)
    return p, p @ v


def two_attentions(q, k, v):  # the second reads the first's output: it cannot be in its loop
    o = torch.softmax(_scores(q, k), -1) @ v
    return o, torch.logsumexp(_scores(o, k), -1)


@pytest.mark.parametrize("fn", [probabilities_and_out, two_attentions], ids=lambda f: f.__name__)
def test_outputs_of_different_loops_stay_apart(fn, gen):
    args = _inputs(gen, L=21)
    report = flashlight.explain(fn, *args)
    assert len(report.kernels) >= 2, str(report)
    outs = flashlight.compile(fn)(*args)
    torch.compiler.reset()
    _check(outs, fn(*(a.double() for a in args)), torch.float32)


def test_inductor_remainder_takes_every_output(gen):
    def fn(q, k, v):  # scans have no Flashlight lowering: Inductor compiles them
        out, lse = out_and_logsumexp(q, k, v)
        return out.cumsum(-1), lse.cumsum(-1)

    args = _inputs(gen, L=19)
    report = ExplainReport()
    compiled = torch.compile(fn, backend=make_backend(report=report, remainder="inductor"))
    torch.compiler.reset()
    with torch.no_grad():
        outs = compiled(*args)
    torch.compiler.reset()
    assert len(report.kernels) == 1 and not report.errors, str(report)
    assert report.inductor_ops == ["cumsum.default"] * 2, str(report)
    _check(outs, fn(*(a.double() for a in args)), torch.float32)


def _loop_kernel(name, size_j, rows):
    i, j = Dim(f"{name}_i", rows), Dim(f"{name}_j", size_j)
    red = LoopReduction("max", Load("s", ((i,), (j,)), torch.float32), j, (), torch.float32)
    return Kernel(name, ((i,),), torch.float32, (red,), LoopResult(0, torch.float32), (name,))


def test_merge_renames_dims_and_refuses_other_extents():
    a, b = _loop_kernel("a", 9, 5), _loop_kernel("b", 9, 5)
    merged = merge_outputs([a, b])
    assert len(merged.loop) == 1 and len(merged.outputs()) == 2
    assert merged.extra_outputs[0].axes == a.axes
    with pytest.raises(NotShared):
        merge_outputs([a, _loop_kernel("c", 10, 5)])
    wider = Kernel("w", a.axes, torch.float32, a.loop, Const(1.0, torch.float32), ("w",))
    other = _loop_kernel("o", 9, 5)
    shifted = LoopReduction("max", Load("t", ((other.dims[0],), (other.loop[0].dim,)), torch.float32),
                            other.loop[0].dim, (), torch.float32)
    with pytest.raises(NotShared):  # reads a tensor the primary's loop does not: nothing names its dims
        merge_outputs([wider, Kernel("o", other.axes, torch.float32, (shifted,), other.epilogue, ("o",))])


def test_every_output_store_is_in_bounds(gen):
    """With bounds checks on (and the IR checked after every pass), each output's
    stores stay inside its own tensor, at a length that leaves partial tiles."""
    from flashlight import settings

    args = _inputs(gen, L=23)
    with settings.override(check_bounds=True, check_ir=True):
        outs = flashlight.compile(out_max_and_sum)(*args)
    torch.compiler.reset()
    _check(outs, out_max_and_sum(*(a.double() for a in args)), torch.float32)

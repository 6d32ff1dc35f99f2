"""Gathers by a computed index ([Note: gathers] in ``flashlight/lower_gather.py``): a
relative-position bias looked up from a small ``[H, buckets]`` table by a clamped
distance of the query and key indices, however it is spelled (indexing, ``embedding``,
``index_select``, ``gather``, T5's log buckets, negative indices, a cast table), fuses
into the attention kernel as a load at a computed address: one kernel, no ATen index
arithmetic or lookup left (checked with the profiler), results matching float64."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bench.new_forms import disentangled  # DeBERTa's scores, looked up by distance
from flashlight.backend import make_backend
from flashlight.report import ExplainReport
from tests.helpers import aten_outside_kernels

H, D, B = 3, 16, 6  # heads, head width, largest distance told apart


def _scores(q, k):
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def _distance(L):
    i = torch.arange(L)
    return i[None, :] - i[:, None]  # [L, L]: key minus query


def clamped_index(q, k, v, table):  # table [H, 2B + 1]
    bucket = _distance(q.shape[-2]).clamp(-B, B) + B
    return torch.softmax(_scores(q, k) + table[:, bucket], -1) @ v


def negative_index(q, k, v, table):  # buckets -B..B read from the end of the table for < 0
    return torch.softmax(_scores(q, k) + table[:, _distance(q.shape[-2]).clamp(-B, B)], -1) @ v


def embedding_lookup(q, k, v, table):  # the table as [buckets, H], heads last
    bucket = _distance(q.shape[-2]).clamp(-B, B) + B
    return torch.softmax(_scores(q, k) + F.embedding(bucket, table.t()).permute(2, 0, 1), -1) @ v


def index_select_lookup(q, k, v, table):
    L = q.shape[-2]
    bucket = (_distance(L).clamp(-B, B) + B).flatten()
    return torch.softmax(_scores(q, k) + table.index_select(1, bucket).view(H, L, L), -1) @ v


def gather_lookup(q, k, v, table):
    L = q.shape[-2]
    bucket = (_distance(L).clamp(-B, B) + B).expand(H, L, L)
    return torch.softmax(_scores(q, k) + table[:, None, :].expand(H, L, 2 * B + 1).gather(-1, bucket), -1) @ v


def t5_log_buckets(q, k, v, table):  # T5's bidirectional buckets: exact near, logarithmic far
    d = _distance(q.shape[-2])
    half = (2 * B + 1) // 2
    exact = half // 2
    side = (d > 0).long() * half
    n = d.abs()
    far = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(64 / exact) * (half - exact)).long()
    bucket = side + torch.where(n < exact, n, far.clamp(max=half - 1))
    return torch.softmax(_scores(q, k) + table[:, bucket], -1) @ v


def cast_table(q, k, v, table):  # the table in the scores' dtype, evaluated at the positions
    s = _scores(q, k)
    return torch.softmax(s + table.to(s.dtype)[:, _distance(q.shape[-2]).clamp(-B, B) + B], -1) @ v


def document_table_mask(q, k, v, table):  # which documents see which: a table of booleans
    L = q.shape[-2]
    doc = torch.arange(L) * 3 // L  # three documents
    sees = torch.ones(3, 3, dtype=torch.bool).tril()  # a document sees itself and earlier ones
    return torch.softmax(_scores(q, k).masked_fill(~sees[doc[:, None], doc[None, :]], -math.inf), -1) @ v


SPELLINGS = [clamped_index, negative_index, embedding_lookup, index_select_lookup, gather_lookup,
             t5_log_buckets, cast_table, document_table_mask]


def _inputs(gen, L, dtype=torch.float32):
    q, k, v = (torch.randn(2, H, L, D, generator=gen).to(dtype) for _ in range(3))
    return q, k, v, torch.randn(H, 2 * B + 1, generator=gen)


@pytest.mark.parametrize("fn", SPELLINGS, ids=lambda f: f.__name__)
def test_lookups_by_computed_index_fuse(fn, gen):
    args = _inputs(gen, L=29)
    report = ExplainReport()
    compiled = torch.compile(fn, backend=make_backend(report=report))
    torch.compiler.reset()
    with torch.no_grad():
        out = compiled(*args)
        assert len(report.kernels) == 1 and not report.fallback_ops, str(report)
        outside = aten_outside_kernels(compiled, args)  # index arithmetic, lookups, ... each counts
    torch.compiler.reset()
    assert outside == []
    want = fn(*(a.double() for a in args))
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_a_second_length_reuses_the_kernel(gen):
    report = ExplainReport()
    compiled = torch.compile(t5_log_buckets, backend=make_backend(report=report))
    torch.compiler.reset()
    for L in (17, 26, 40):
        args = _inputs(gen, L)
        with torch.no_grad():
            out = compiled(*args)
        torch.testing.assert_close(out.double(), t5_log_buckets(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)
    torch.compiler.reset()
    assert len(report.kernels) == 2, str(report)  # static, then symbolic lengths


def test_bf16_and_the_hopper_build(gen):
    args = _inputs(gen, L=23, dtype=torch.bfloat16)
    report = ExplainReport()
    with torch.no_grad():
        out = torch.compile(cast_table, backend=make_backend(report=report))(*args)
    torch.compiler.reset()
    assert len(report.kernels) == 1, str(report)
    assert report.kernels[0].aot_compile(90).shared > 0
    want = cast_table(*(a.double() for a in args))
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


def test_positions_outside_the_table_load_zero(gen):
    """PyTorch reports an index outside the table as an error; the kernel loads 0 there
    and never reads outside the table (bounds checked)."""
    from flashlight import settings

    def fn(q, k, v, table):
        return torch.softmax(_scores(q, k) + table[:, _distance(q.shape[-2]) + B], -1) @ v

    args = _inputs(gen, L=19)
    with settings.override(check_bounds=True):
        out = torch.compile(fn, backend=make_backend())(*args)
    torch.compiler.reset()
    assert torch.isfinite(out).all()


def test_lookups_in_a_contraction_read_its_stored_values(gen):
    """A lookup in a computed matrix (DeBERTa's ``q @ pos_k^T`` over the relative
    positions, gathered by distance) reads that matrix from memory at the computed
    positions inside the attention kernel: the two small products over the positions are
    computed first (``[..., L, 2B]`` each), and no ``L x L`` lookup result is made (it was
    two of them, then the kernel reading them as biases)."""
    q, k, v = (torch.randn(2, H, 29, D, generator=gen) for _ in range(3))
    args = (q, k, v, *(torch.randn(H, 2 * B, D, generator=gen) for _ in range(2)))
    report = ExplainReport()
    compiled = torch.compile(disentangled, backend=make_backend(report=report))
    torch.compiler.reset()
    with torch.no_grad():
        out = compiled(*args)
        (kernel,) = report.kernels
        assert sum(op == "gather.default" for op in kernel.aten_ops) == 2, str(report)
        assert sorted(op.name for op in report.fallback_ops) == ["bmm.default", "bmm.default"], str(report)
        outside = aten_outside_kernels(compiled, args)
    torch.compiler.reset()
    assert set(outside) <= {"aten::bmm", "aten::mm", "aten::matmul"}, outside
    want = disentangled(*(a.double() for a in args))
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)

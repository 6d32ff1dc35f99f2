"""Reductions over other dims feeding the attention: OpenFold's global column attention
written whole in plain PyTorch.

The query is a masked mean over the sequences of a column, the very dim the attention
then runs over; one key/value head is shared by the heads, a mask bias hides absent
sequences, and a gate per sequence multiplies the column's attention output before the
output projection. However it is spelled, the compiled function matches float64, the
attention (scores, softmax and the weighted sum of values) is one Flashlight kernel (no
softmax or exp runs in ATen, by the profiler; the projections may), and no kernel of the
plan computes a reduction again in every program of its grid or repeats its loop's work:
not the pooled mean in every head's program, nor the attention in a kernel with a
program per gated sequence, nor the scores materialized to avoid either (see
``_rows_by_keys``, ``_broadcast_loop_cut`` and ``_sharing_cut`` in ``flashlight/backoff.py``).
The gate, its product with the attention output and the output projection, a
contraction over the flattened heads, are a second kernel (where the projections are
matmuls; ``F.linear`` with a bias is ``addmm``, which stays with PyTorch).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flashlight.backend import make_backend
from flashlight.pipeline import recomputes_across_grid, repeats_loop_work
from flashlight.report import ExplainReport
from tests.helpers import aten_outside_kernels, computes_softmax, plan_of

pytest.importorskip("triton")

B, R, S, C, H, CH = 2, 5, 13, 16, 4, 8  # batch, residues (columns), sequences, channels, heads, head width
EPS, INF = 1e-10, 1e9


def openfold_spelling(m, mask, w_q, w_k, w_v, w_g, b_g, w_o, b_o):
    # m: [B, R, S, C]; mask: [B, R, S]; weights [in, out]: w_q [C, H*CH], w_k, w_v [C, CH],
    # w_g [C, H*CH], w_o [H*CH, C]; OpenFold's GlobalAttention line by line
    q = torch.sum(m * mask.unsqueeze(-1), dim=-2) / (torch.sum(mask, dim=-1)[..., None] + EPS)  # [B, R, C]
    q = (q @ w_q) * CH ** -0.5  # [B, R, H*CH]
    q = q.view(q.shape[:-1] + (H, CH))  # [B, R, H, CH]
    k, v = m @ w_k, m @ w_v  # [B, R, S, CH]
    bias = (INF * (mask - 1))[..., :, None, :]  # [B, R, 1, S]
    a = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) + bias, dim=-1)  # [B, R, H, S]
    o = torch.matmul(a, v)  # [B, R, H, CH]
    g = torch.sigmoid(m @ w_g + b_g).view(m.shape[:-1] + (H, CH))  # [B, R, S, H, CH]
    o = (o.unsqueeze(-3) * g).reshape(m.shape[:-1] + (H * CH,))  # [B, R, S, H*CH]
    return o @ w_o + b_o  # [B, R, S, C]


def einsum_spelling(m, mask, w_q, w_k, w_v, w_g, b_g, w_o, b_o):
    # the same through einsum, the count clamped instead of offset, nn.Linear-style F.linear
    n = mask.sum(-1, keepdim=True).clamp(min=1.0)  # [B, R, 1]
    pooled = torch.einsum("brsc,brs->brc", m, mask) / n  # [B, R, C]
    q = torch.einsum("brc,chd->brhd", pooled, w_q.view(C, H, CH)) / CH ** 0.5  # [B, R, H, CH]
    k, v = F.linear(m, w_k.t()), F.linear(m, w_v.t())  # [B, R, S, CH]
    s = torch.einsum("brhd,brsd->brhs", q, k) + torch.where(mask.bool(), 0.0, -INF)[:, :, None, :]
    o = torch.einsum("brhs,brsd->brhd", torch.softmax(s, -1), v)  # [B, R, H, CH]
    g = torch.sigmoid(F.linear(m, w_g.t(), b_g)).unflatten(-1, (H, CH))  # [B, R, S, H, CH]
    return F.linear(torch.einsum("brhd,brshd->brshd", o, g).flatten(-2), w_o.t(), b_o)  # [B, R, S, C]


def msa_layout_spelling(m, mask, w_q, w_k, w_v, w_g, b_g, w_o, b_o):
    # m in the MSA's own layout [B, S, R, C] (mask [B, S, R]): the mean over dim -3, the
    # attention per column on transposed views, the output in the MSA layout
    keep = mask[..., None]  # [B, S, R, 1]
    q = (m * keep).sum(-3) / (keep.sum(-3) + EPS)  # [B, R, C]
    q = (q @ w_q).unflatten(-1, (H, CH)) * CH ** -0.5  # [B, R, H, CH]
    k, v = ((m @ w).transpose(-2, -3) for w in (w_k, w_v))  # [B, R, S, CH]
    s = q @ k.transpose(-1, -2) - INF * (1 - mask.transpose(-1, -2))[..., None, :]  # [B, R, H, S]
    o = s.softmax(-1) @ v  # [B, R, H, CH]
    g = torch.sigmoid(m @ w_g + b_g).unflatten(-1, (H, CH))  # [B, S, R, H, CH]
    return (o.unsqueeze(-4) * g).flatten(-2) @ w_o + b_o  # [B, S, R, C]


SPELLINGS = [openfold_spelling, einsum_spelling, msa_layout_spelling]


def _inputs(gen):
    """m with a component shared by each column's sequences (so the pooled query is not
    near zero), a random 0/1 mask keeping at least one sequence per column, weights at
    nn.Linear's scale."""
    m = torch.randn(B, R, 1, C, generator=gen) + torch.randn(B, R, S, C, generator=gen)  # [B, R, S, C]
    mask = (torch.rand(B, R, S, generator=gen) > 0.3).float()
    mask[..., int(torch.randint(S, (), generator=gen))] = 1.0
    assert 0 < mask.mean() < 1

    def w(n_in, n_out):
        return torch.randn(n_in, n_out, generator=gen) * n_in ** -0.5

    return (m, mask, w(C, H * CH), w(C, CH), w(C, CH), w(C, H * CH), torch.randn(H * CH, generator=gen),
            w(H * CH, C), 0.1 * torch.randn(C, generator=gen))


@pytest.mark.parametrize("fn", SPELLINGS, ids=lambda f: f.__name__)
def test_global_attention_written_whole(fn, gen):
    args = _inputs(gen)
    if fn is msa_layout_spelling:
        args = (args[0].transpose(1, 2).contiguous(), args[1].transpose(1, 2).contiguous(), *args[2:])
    report = ExplainReport()
    compiled = torch.compile(fn, backend=make_backend(report=report))
    torch.compiler.reset()
    with torch.no_grad():
        out = compiled(*args)
        outside = aten_outside_kernels(compiled, args)  # the profiler's view, not explain()'s
    torch.compiler.reset()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), fn(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)

    attention = [k for k in report.kernels if computes_softmax(k.aten_ops)]
    assert len(attention) == 1, str(report)
    # the gate, its product with the attention output and the output projection: one
    # kernel looping over the flattened heads ([Note: a loop over several dims]), where
    # the projections are matmuls (F.linear with a bias arrives as addmm, left to PyTorch)
    if fn is not einsum_spelling:
        gated = [k for k in report.kernels if "sigmoid.default" in k.aten_ops]
        assert len(gated) == 1 and gated[0] is not attention[0], str(report)
        assert not any(op.name.startswith(("sigmoid", "mul")) for op in report.fallback_ops), str(report)
    assert not any(op.name.startswith(("_softmax", "exp", "amax")) for op in report.fallback_ops), str(report)
    assert not set(outside) & {"aten::_softmax", "aten::softmax", "aten::exp", "aten::amax", "aten::max"}, outside

    plan = plan_of(fn, args)
    assert plan.kernels, plan.rejected
    for node, tiled in plan.kernels.items():
        assert not recomputes_across_grid(tiled), (node, tiled.kernel.origins, tiled.tiling)
        assert not repeats_loop_work(tiled), (node, tiled.kernel.origins, tiled.tiling)
    # the scores and probabilities [B, R, H, S] never leave the attention kernel
    for nest in plan.graph.nests:
        if nest.name in plan.graph.materialized:
            assert sorted(d.size for d in nest.dims) != sorted((B, R, H, S)), (nest.name, nest.dims)

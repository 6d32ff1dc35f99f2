"""A softmax of values already less their row max ([Note: a softmax of scores less their
row max] in flashlight/shifts.py): the second max is known, the rewrite keeps every
value (infinities and NaNs included), and the attention is one kernel."""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import flashlight
from flashlight.decompositions import decompositions
from flashlight.shifts import drop_repeated_maxes


def _stable_softmax(s):  # the row max subtracted by hand (detached), then softmax
    return torch.softmax(s - s.amax(-1, keepdim=True).detach(), -1)


def _stable_log_softmax(s):  # max(...).values, then log_softmax
    return torch.log_softmax(s - s.max(-1, keepdim=True).values, -1)


def _other_dim(s):  # the max over another dim: not the softmax's own, left alone
    return torch.softmax(s - s.amax(-2, keepdim=True), -1)


def _rewritten(fn, x):
    gm = make_fx(fn, decomposition_table=decompositions(inference=True))(x)
    return gm, drop_repeated_maxes(gm)


def test_the_rewrite_keeps_every_value_including_non_finite_rows(gen):
    x = torch.randn(6, 9, generator=gen) * 4
    x[1] = float("-inf")  # every key masked
    x[2, 3] = float("inf")
    x[3, 5] = float("nan")
    x[4, ::2] = float("-inf")  # some keys masked
    for fn in (_stable_softmax, _stable_log_softmax):
        written = make_fx(fn, decomposition_table=decompositions(inference=True))(x)(x)
        gm, count = _rewritten(fn, x)
        assert count == 1
        assert sum(n.target is torch.ops.aten.amax.default for n in gm.graph.nodes) <= 1  # one max left
        # bit for bit the graph as written; NaN exactly where eager PyTorch has it
        torch.testing.assert_close(gm(x), written, equal_nan=True, rtol=0, atol=0)
        torch.testing.assert_close(gm(x), fn(x), equal_nan=True)
    assert _rewritten(_other_dim, x)[1] == 0


def test_attention_with_its_row_max_subtracted_is_one_kernel(gen):
    def attention(q, k, v):
        s = q @ k.transpose(-1, -2) * 0.25
        return _stable_softmax(s) @ v

    q, k, v = (torch.randn(2, 3, 29, 16, generator=gen) for _ in range(3))
    with torch.no_grad():
        report = flashlight.explain(attention, q, k, v)
        out = flashlight.compile(attention)(q, k, v)
    assert len(report.kernels) == 1 and report.fallback_ops == [], report
    assert any("row max" in r for r in report.rewrites)
    ref = attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)

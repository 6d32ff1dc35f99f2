"""Loads through slices and concatenations ([Note: gathers] in ``flashlight/lower_gather.py``):
rotary embeddings in rotate-half form, however the halves are taken (``chunk``, slices,
``split``, ``narrow``), and keys read flipped, rolled or padded (``F.pad``, with a
value or negative, cropping), fuse into the attention kernel
as loads at computed positions: one kernel, no ATen slicing, concatenation or
arithmetic left (checked with the profiler), results matching float64."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from flashlight.backend import make_backend
from flashlight.report import ExplainReport
from tests.helpers import aten_outside_kernels

H, D = 2, 16


def _attend(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v


def half_by_chunk(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def half_by_slices(x):
    d = x.shape[-1] // 2
    return torch.cat((-x[..., d:], x[..., :d]), -1)


def half_by_split(x):
    x1, x2 = x.split(x.shape[-1] // 2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def half_by_narrow(x):
    d = x.shape[-1] // 2
    return torch.cat((x.narrow(-1, d, d).neg(), x.narrow(-1, 0, d)), -1)


def _rotary(rotate_half):
    def fn(q, k, v, cos, sin):
        return _attend(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v)

    fn.__name__ = f"rotary_{rotate_half.__name__}"
    return fn


def keys_flipped(q, k, v, cos, sin):
    return _attend(q, k.flip(-2), v.flip(-2))


def keys_rolled(q, k, v, cos, sin):
    return _attend(q, torch.roll(k, 3, -2), v) + torch.roll(q, -2, -1)[..., :1]


def uneven_split(q, k, v, cos, sin):  # three pieces, reassembled in another order
    a, b, c = q.split([4, 4, 8], -1)
    return _attend(torch.cat((c, 2 * a, b), -1), k, v)


def widths_padded(q, k, v, cos, sin):  # q and k widened to 24 with values that are not 0
    return _attend(F.pad(q, (0, 8), value=1.0), F.pad(k, (4, 4), value=0.5), v)


def widths_cropped(q, k, v, cos, sin):  # negative pads: q's first 12 features against k's middle 12
    return _attend(F.pad(q, (0, -4)), F.pad(k, (-2, -2)), v)


def keys_padded_and_masked(q, k, v, cos, sin):  # 3 padding keys (values 2.0), masked off by position
    L = k.shape[-2]
    k, v = F.pad(k, (0, 0, 0, 3)), F.pad(v, (0, 0, 0, 3), value=2.0)
    real = F.pad(torch.ones(L, dtype=torch.bool), (0, 3), value=False)  # [L + 3]
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~real, float("-inf"))
    return torch.softmax(s, -1) @ v


SPELLINGS = [_rotary(f) for f in (half_by_chunk, half_by_slices, half_by_split, half_by_narrow)]
SPELLINGS += [keys_flipped, keys_rolled, uneven_split, widths_padded, widths_cropped, keys_padded_and_masked]


def _inputs(gen, L):
    q, k, v = (torch.randn(2, H, L, D, generator=gen) for _ in range(3))
    angle = torch.arange(L)[:, None] * torch.rand(D // 2, generator=gen).repeat(2)[None, :]
    return q, k, v, torch.cos(angle), torch.sin(angle)


@pytest.mark.parametrize("fn", SPELLINGS, ids=lambda f: f.__name__)
def test_slices_and_concatenations_fuse(fn, gen):
    args = _inputs(gen, L=27)
    report = ExplainReport()
    compiled = torch.compile(fn, backend=make_backend(report=report))
    torch.compiler.reset()
    with torch.no_grad():
        out = compiled(*args)
        assert len(report.kernels) == 1 and not report.fallback_ops, str(report)
        outside = aten_outside_kernels(compiled, args)  # slicing, cat, neg, mul, ... each counts
    torch.compiler.reset()
    assert outside == []
    torch.testing.assert_close(out.double(), fn(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)


def test_rotary_at_a_second_length(gen):
    fn = SPELLINGS[0]
    report = ExplainReport()
    compiled = torch.compile(fn, backend=make_backend(report=report))
    torch.compiler.reset()
    for L in (19, 33):
        args = _inputs(gen, L)
        with torch.no_grad():
            out = compiled(*args)
        torch.testing.assert_close(out.double(), fn(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)
    torch.compiler.reset()
    assert len(report.kernels) == 2 and not report.fallback_ops, str(report)

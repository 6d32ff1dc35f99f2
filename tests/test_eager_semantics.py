"""Semantics like eager: where eager PyTorch raises, the compiled function raises an
error of the same type; mixed-dtype elementwise work in the scores has the dtypes and
values PyTorch's promotion gives ([Note: integer and boolean arithmetic] in
``flashlight/lower.py``): integer arithmetic wraps in its own width, scalars wrap into
an integer dtype and round into a 16-bit float one where PyTorch compares in it, bool
sums and products are logical. Last, comparisons whose result jumps at a last-bit
difference: a score compared with a threshold taken from the stored scores, or with a
16-bit row max another kernel stored, sees the value eager would hold."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import flashlight
from flashlight.backend import make_backend
from flashlight.report import ExplainReport

L, D = 21, 16


def _scores(q, k):
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def _attend(s, v):
    return torch.softmax(s, -1) @ v.to(s.dtype)


# ------------------------------------------------------------------------ errors

RAISING = {
    "fp32 scores @ bf16 values": lambda q, k, v, m: torch.softmax(_scores(q.float(), k.float()), -1) @ v.bfloat16(),
    "where with an integer condition": lambda q, k, v, m: _attend(torch.where(m, _scores(q, k), -math.inf), v),
    "masked_fill with a float mask": lambda q, k, v, m: _attend(_scores(q, k).masked_fill(m.float(), -math.inf), v),
    "bmm of two dtypes": lambda q, k, v, m: torch.bmm(q, k.transpose(1, 2).bfloat16()),
    "sdpa of two dtypes": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v.bfloat16()),
    "softmax of integers": lambda q, k, v, m: torch.softmax(m * 2, -1),
    "bool minus bool": lambda q, k, v, m: _attend(_scores(q, k) + ((m > 0) - (m > 1)), v),
}


@pytest.mark.parametrize("name", list(RAISING))
def test_compiled_raises_where_eager_raises(name, gen):
    fn = RAISING[name]
    args = (*[torch.randn(2, L, D, generator=gen) for _ in range(3)], torch.randint(0, 3, (L, L), generator=gen))
    with pytest.raises(Exception) as eager:
        fn(*args)
    torch.compiler.reset()
    with pytest.raises(type(eager.value)):
        flashlight.compile(fn)(*args)
    torch.compiler.reset()


# --------------------------------------------------------------------- promotion


def _bias_cases():
    """(bias of the integer tensor m and the float scores s, extra args' dtypes)."""
    return {
        "bf16 scores + fp32 bias": lambda s, m, b: s + b,
        "fp16 bias + bf16 scores": lambda s, m, b: s + b.half(),
        "int mask * float scores": lambda s, m, b: s * (m % 3),
        "int / int is a true division": lambda s, m, b: s + m / (m.abs() + 2),
        "int // int": lambda s, m, b: s + (m * 7) // 3 * 0.05,
        "bool + int": lambda s, m, b: s + ((m > 0) + m) * 0.05,
        "bool + bool is or": lambda s, m, b: s + ((m > 0) + (m > 10)).to(s.dtype),
        "bool * bool is and": lambda s, m, b: s + ((m > 0) * (m < 10)).to(s.dtype),
        "int32 + python float": lambda s, m, b: s + (m.int() + 3) * 0.05,
        "uint8 wraps": lambda s, m, b: s + (m.abs().to(torch.uint8) - 100).to(s.dtype) * 0.05,
        "int8 wraps": lambda s, m, b: s + (m.to(torch.int8) * 3).to(s.dtype) * 0.05,
        "int8 scalar out of range": lambda s, m, b: s + (m.to(torch.int8) - 200).to(s.dtype) * 0.05,
        "abs of int8 -128": lambda s, m, b: s + (m.to(torch.int8) * 0 - 128).abs().to(s.dtype) * 0.01,
        "int16 wraps": lambda s, m, b: s + (m.to(torch.int16) * 1000).to(s.dtype) * 1e-4,
        "int32 wraps": lambda s, m, b: s + ((m.int() * 1073741824) % 7).to(s.dtype),
        "uint8 floor division of a wrapped value": lambda s, m, b: s + ((m.abs().to(torch.uint8) - 5) // 2).to(s.dtype) * 0.05,
        "int compared with a float scalar": lambda s, m, b: s + (m < 0.5).to(s.dtype),
        "int8 compared with an out-of-range scalar": lambda s, m, b: s + (m.to(torch.int8) < 200).to(s.dtype),
        "fp16 threshold rounds the scalar": lambda s, m, b: s.masked_fill(b.half() < 0.1, -1e4).float(),
    }


def _one_kernel(fn, args):
    """``fn(*args)`` compiled by Flashlight, checked to be one kernel with nothing left to
    PyTorch."""
    report = ExplainReport()
    torch.compiler.reset()
    with torch.no_grad():
        out = torch.compile(fn, backend=make_backend(report=report))(*args)
    torch.compiler.reset()
    assert len(report.kernels) == 1 and not report.fallback_ops, str(report)
    return out


@pytest.mark.parametrize("name", list(_bias_cases()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mixed_dtypes_in_scores_promote_as_eager(name, dtype, gen):
    bias = _bias_cases()[name]

    def fn(q, k, v, m, b):
        return _attend(bias(_scores(q, k), m, b), v)

    q, k, v = (torch.randn(2, L, D, generator=gen).to(dtype) for _ in range(3))
    m = torch.randint(-120, 120, (L, L), generator=gen)
    b = torch.randn(L, L, generator=gen)
    b[0, :3] = torch.tensor(0.1, dtype=torch.float16).float()  # 0.1 in fp16: whether the scalar is rounded decides
    b[1, :3] = 0.09995  # below 0.1 in fp32, 0.1 once rounded to fp16: whether b.half() rounds decides
    args = (q, k, v, m, b)
    out = _one_kernel(fn, args)
    want = fn(*args)
    assert out.dtype == want.dtype and out.shape == want.shape
    ref = fn(q.double(), k.double(), v.double(), m, b.double())
    # a kernel computes floats in float32: a 16-bit dtype anywhere (an input, a cast) bounds
    # the agreement with float64 eager by its rounding
    sixteen_bit = dtype != torch.float32 or want.dtype != torch.float32 or "fp16" in name or "bf16" in name
    tol = 2e-2 if sixteen_bit else 1e-5
    torch.testing.assert_close(out.double(), ref.to(torch.float64), rtol=tol, atol=tol)


def test_dtypes_without_a_kernel_type_stay_with_pytorch():
    from flashlight.codegen_text import TL_DTYPES
    from flashlight.ir import Dim, Load, Nest
    from flashlight.lower import inexact_reason
    from flashlight.vocabulary import KERNEL_DTYPES

    assert KERNEL_DTYPES <= set(TL_DTYPES)  # every dtype a kernel may use prints
    i = Dim("i", 4)
    nest = Nest("n", ((i,),), Load("x", ((i,),), torch.uint16), torch.float32, ("n",))
    assert "uint16" in inexact_reason(nest)


# ------------------------------------------------------------------ 16-bit outputs


def _gated_projection(o, m, w_g, w_o):
    """A gate and an output projection over flattened heads: every step of the kernel
    runs in float32, only the output is rounded."""
    g = torch.sigmoid(m @ w_g.t()).unflatten(-1, o.shape[-2:])  # [R, S, H, C]
    return (o.unsqueeze(-3) * g).flatten(-2) @ w_o.t()  # [R, S, F]


def test_bf16_outputs_round_to_nearest_as_on_the_gpu(gen):
    """A bfloat16 output is the kernel's float32 value rounded to nearest, as a GPU build
    and PyTorch round it, also under Triton's interpreter, whose own cast drops the low
    bits ([Note: bfloat16 rounding under the interpreter] in flashlight/codegen.py)."""
    o = torch.randn(9, 4, 8, generator=gen).bfloat16()
    m = torch.randn(9, 6, 16, generator=gen).bfloat16()
    w_g = (torch.randn(32, 16, generator=gen) / 4).bfloat16()
    w_o = (torch.randn(24, 32, generator=gen) / 4).bfloat16()
    args = (o, m, w_g, w_o)
    out = _one_kernel(_gated_projection, args)
    exact = _gated_projection(*(a.double() for a in args))  # [9, 6, 24]
    # half a unit in the last place of bfloat16 (8 significant bits) at each value,
    # widened by what float32 arithmetic in another order may move the value before it is
    # rounded: a sum's rounding error scales with the sum of its terms' magnitudes, not with
    # its value, which cancellation can make small (32 terms, about 2^-24 each)
    half_ulp = torch.exp2(torch.floor(torch.log2(exact.abs())) - 8)
    magnitudes = _gated_projection(o.double().abs(), m.double(), w_g.double(), w_o.double().abs())
    float32_slack = 32 * 2.0**-24 * magnitudes
    err = (out.double() - exact).abs()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert (err <= half_ulp + float32_slack).all(), ((err - float32_slack) / half_ulp).max()
    # and it is rounded to nearest, not toward zero: errors fall on both sides
    toward_zero = ((out.double().abs() < exact.abs()) & (err > 0)).float().mean()
    assert 0.2 < toward_zero < 0.8, toward_zero


# ------------------------------------------------- a value compared with its copy


def _top_k_attention(q, k, v):
    """Each row attends to its 6 largest scores: the threshold is computed outside
    Flashlight (``topk`` has no lowering) from the materialized scores."""
    s = _scores(q, k)
    kth = s.topk(6, dim=-1).values[..., -1:]
    return _attend(s.masked_fill(s < kth, -math.inf), v)


def _kth_value_gate(q, k, v):
    """Keys at or above each row's median score kept, by ``kthvalue`` and ``ge``."""
    s = _scores(q, k)
    median = s.kthvalue(s.shape[-1] // 2, dim=-1, keepdim=True).values
    return _attend(torch.where(s >= median, s, -math.inf), v)


@pytest.mark.parametrize("fn", [_top_k_attention, _kth_value_gate], ids=["topk", "kthvalue"])
def test_scores_compared_with_a_threshold_taken_from_them_are_read_not_recomputed(fn, gen):
    """[Note: a value compared with its copy]: the kernel compares the very scores the
    threshold was taken from, so every row keeps exactly the keys eager keeps (a
    recomputed copy one unit in the last place lower dropped the threshold's own key
    from every row: 0.2 relative error). Gradients too."""
    q, k, v = (torch.randn(2, 3, L, D, generator=gen) for _ in range(3))
    with torch.no_grad():
        out = flashlight.compile(fn)(q, k, v)
    ref = fn(q.double(), k.double(), v.double())
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    report = _trains_as_float64(fn, (q, k, v), gen)
    assert report.kernels, str(report)


def _trains_as_float64(fn, args, gen) -> ExplainReport:
    """One training step of ``fn`` compiled by Flashlight: every input's gradient finite
    and within 1e-4 of float64 eager's; returns what was compiled."""
    leaves = [x.clone().requires_grad_() for x in args]
    report = ExplainReport()
    out = torch.compile(fn, backend=make_backend(report=report))(*leaves)
    grad_out = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad(out, leaves, grad_out)
    exact = [x.detach().double().requires_grad_() for x in args]
    refs = torch.autograd.grad(fn(*exact), exact, grad_out.double())
    for got, want in zip(grads, refs, strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    return report


def _hard_attention(q, k, v):
    """Each row averages the values of its highest-scoring keys: a score equal to the
    row max, which a kernel of its own computes and stores."""
    s = _scores(q, k)
    hit = (s == s.amax(-1, keepdim=True)).to(v.dtype)
    return (hit / hit.sum(-1, keepdim=True)) @ v


def _near_the_max(q, k, v):
    """Keys within 0.5 of the row's max score."""
    s = _scores(q, k)
    return _attend(s.masked_fill(s < s.amax(-1, keepdim=True) - 0.5, -math.inf), v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_comparisons_see_16_bit_scores_as_eager_holds_them(dtype, gen):
    """[Note: a comparison sees 16-bit values rounded]: keys within 0.5 of the row max,
    the max stored by one kernel and the scores recomputed by another, are the keys eager
    selects once each score is rounded as eager rounds it (unrounded, the bfloat16 output
    moved by 2 where a key sat at the threshold). Against eager in the same dtype."""
    q, k, v = (torch.randn(2, 3, L, D, generator=gen).to(dtype) for _ in range(3))
    with torch.no_grad():
        report = flashlight.explain(_near_the_max, q, k, v)
        out = flashlight.compile(_near_the_max)(q, k, v)
        want = _near_the_max(q, k, v)
    assert report.kernels and not report.fallback_ops, str(report)
    assert torch.isfinite(out).all()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_tie_with_the_row_max_is_compared_by_pytorch(dtype, gen):
    """[Note: ties between recomputed values]: ``s == s.amax(-1)`` hangs on the last bit
    of every score; recomputed in another tiling (a backward kernel's, transposed) no key
    matched the max in some rows and the values' gradient was 0.7 off. The comparison
    runs in PyTorch on the stored scores and their stored max: forward and gradients
    as eager's."""
    q, k, v = (torch.randn(2, 3, L, D, generator=gen).to(dtype) for _ in range(3))
    with torch.no_grad():
        report = flashlight.explain(_hard_attention, q, k, v)
        out = flashlight.compile(_hard_attention)(q, k, v)
        want = _hard_attention(q, k, v)
    assert any("tie" in op.reason for op in report.fallback_ops if op.name.startswith("eq")), str(report)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5  # the selected keys are eager's: rounding only
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = torch.compile(_hard_attention, backend=make_backend())(*leaves)
    grad_out = torch.randn(out.shape, generator=gen).to(dtype)
    got = torch.autograd.grad(out, leaves[2], grad_out)[0]
    eager = [x.clone().requires_grad_() for x in (q, k, v)]
    want = torch.autograd.grad(_hard_attention(*eager), eager[2], grad_out)[0]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def _max_subtracted(q, k, v):
    """The row max subtracted by hand, not detached, before the exponentials."""
    s = _scores(q, k)
    e = (s - s.amax(-1, keepdim=True)).exp()
    return (e / e.sum(-1, keepdim=True)) @ v.to(e.dtype)


def _max_normalised(q, k, v):
    """Non-negative scores divided by their row max: a gradient flows through the max."""
    s = torch.relu(_scores(q, k))
    return (s / s.amax(-1, keepdim=True).clamp_min(1e-3)) @ v


@pytest.mark.parametrize("fn", [_max_subtracted, _max_normalised], ids=["subtracted", "normalised"])
def test_a_row_max_saved_for_the_backward_is_one_of_the_scores_it_recomputes(fn, gen):
    """[Note: ties between recomputed values]: the backward sends the max's gradient to
    the keys equal to the forward's saved max and divides by their count; a max taken
    from a kernel's own recomputed scores matched none of the backward's, and every
    gradient of q and k was NaN (0 / 0). Gradients of every input against float64."""
    q, k, v = (torch.randn(2, 3, L, D, generator=gen) for _ in range(3))
    report = _trains_as_float64(fn, (q, k, v), gen)
    assert len(report.kernels) >= 2, str(report)  # forward and backward kernels, not PyTorch alone


def _exp_log_softmax(q, k, v):
    """Probabilities as the exponential of a log-softmax (its bfloat16 value rounded)."""
    return torch.log_softmax(q @ k.transpose(-1, -2), -1).exp() @ v


def test_a_rounded_log_softmax_keeps_its_max_inside_the_rounding(gen):
    """[Note: rounding keeps the max inside] (flashlight/passes/online.py): in bfloat16,
    exp(log_softmax(s)) @ v is at least as close to float64 as eager's bfloat16 on each
    draw, in RMS error (0.5-0.85x eager's; with the max moved out of the rounding 1.6-2.7x).
    The max error of 1536 elements is too noisy for a per-draw rule (up to 1.6x eager's
    on one draw in twelve with the fix in place)."""
    for _ in range(3):
        q, k, v = (torch.randn(2, 2, 24, 16, generator=gen) for _ in range(3))
        want = _exp_log_softmax(q.double(), k.double(), v.double())
        low = [t.bfloat16() for t in (q, k, v)]
        with torch.no_grad():
            out = flashlight.compile(_exp_log_softmax)(*low)
        torch.compiler.reset()
        assert torch.isfinite(out).all()
        err = (out.double() - want).pow(2).mean().sqrt()
        eager_err = (_exp_log_softmax(*low).double() - want).pow(2).mean().sqrt()
        assert err <= eager_err, f"RMS {err:.3g} from float64 against eager's {eager_err:.3g}"

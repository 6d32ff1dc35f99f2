"""Backing off fusion: when a fused nest cannot become one online kernel, the cut is
made where the failing part starts, and kernels that feed each other are chained."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashlight
from bench.new_forms import latent  # absorbed multi-head latent attention
from flashlight import settings
from flashlight.backoff import repeats_loop_work
from tests.helpers import SOFTMAX_PARTS, computes_softmax, gated_attention_block, plan_of, rand
from tests.helpers import matches_float64 as _matches_float64

pytest.importorskip("triton")


def _qkv(seed, L=29, D=16):
    return tuple(rand(2, 3, L, D, seed=seed + k) for k in range(3))


def _check(fn, args, kernels: int):
    """``fn`` runs as ``kernels`` Flashlight kernels and nothing else, matching float64."""
    report = _matches_float64(fn, args)
    assert len(report.kernels) == kernels, str(report)
    assert report.fallback_ops == [], str(report)
    return report


def test_chained_attentions_become_one_kernel_each():
    """The second attention's queries are the first one's output: one fused nest would
    nest one softmax inside another's loop, which no online rewrite covers. The cut is
    the first attention's output (not its scores), and the second kernel reads the
    first kernel's output rather than an eager recomputation of it."""
    q, k, v = _qkv(3)

    def chained(q, k, v):
        o = torch.softmax(q @ k.transpose(-1, -2) * 0.25, dim=-1) @ v
        return torch.softmax(o @ k.transpose(-1, -2) * 0.25, dim=-1) @ v

    report = _check(chained, (q, k, v), kernels=2)
    for kernel in report.kernels:  # each kernel is a whole attention: both matmuls and the softmax
        assert sum(op.startswith("bmm") for op in kernel.aten_ops) == 2, kernel.aten_ops
        assert computes_softmax(kernel.aten_ops), kernel.aten_ops


def test_a_reduction_after_the_attention_does_not_unfuse_it():
    """``attention / (|q| + 1)``: the norm reduces the inputs alone over the head width,
    a dim that fits one tile, so it joins the attention's kernel after its loop (it
    used to be a kernel of its own, the attention one online kernel beside it); either
    way the scores are never materialised."""
    q, k, v = _qkv(11)

    def normalised(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v / (q.norm(dim=-1, keepdim=True) + 1)

    report = _check(normalised, (q, k, v), kernels=1)
    attention = [kr for kr in report.kernels if computes_softmax(kr.aten_ops)]
    assert len(attention) == 1 and sum(op.startswith("bmm") for op in attention[0].aten_ops) == 2


def test_a_few_features_summed_beside_a_contraction_join_its_kernel():
    """Scores less a distance summed over a few groups, ``q k^T - t.sum(-1)`` (t
    ``[B, H, L, L, 3]``): two sums over different extents at the top of one nest. The
    contraction over the head width is the loop, and the small sum of the inputs alone
    runs after it, in the same kernel (the contraction used to be cut out and left to
    PyTorch, which rounds it in 16 bits where the fused forward did not)."""
    q, k, _ = _qkv(41)
    t = rand(2, 3, 29, 29, 3, seed=45)

    def shifted(q, k, t):
        return q @ k.transpose(-1, -2) * 0.35 - t.sum(-1)

    report = _check(shifted, (q, k, t), kernels=1)
    assert {"bmm.default", "sum.dim_IntList"} <= set(report.kernels[0].aten_ops), str(report)


def test_the_backoff_is_logged(caplog):
    q, k, v = _qkv(21)

    def chained(q, k, v):
        o = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        return torch.softmax(o @ k.transpose(-1, -2), dim=-1) @ v

    with settings.override(debug=2):
        flashlight.explain(chained, q, k, v)
    backoffs = [r.getMessage() for r in caplog.records if "backoff" in r.getMessage()]
    assert len(backoffs) == 1 and "keeping" in backoffs[0], backoffs


@pytest.mark.parametrize("after", ["output_projection", "mean_over_heads"])
def test_what_cannot_join_the_attention_runs_after_its_kernel(after):
    """An output projection over the merged heads (a contraction over two dims) or a
    mean over heads cannot share the attention's loop: the attention stays one kernel and
    what follows runs as PyTorch runs it, on the kernel's output, with the reason
    reported. (With the keys few enough to fit one tile, the mean over heads once fused
    as a loop over heads around whole softmax rows, recomputed in a program per output
    feature, and left the value matmul outside.) A layer norm over the head width joins
    the kernel: tests/test_feature_reductions.py."""
    q, k, v = _qkv(31)
    B, H, L, D = q.shape
    w = rand(H * D, 8, seed=40) * 0.2

    def output_projection(q, k, v, w):
        o = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        return o.transpose(1, 2).reshape(B, L, H * D) @ w

    def mean_over_heads(q, k, v, w):
        return (torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v).mean(1)

    fn = {"output_projection": output_projection, "mean_over_heads": mean_over_heads}[after]
    report = flashlight.explain(fn, q, k, v, w)
    (kernel,) = report.kernels
    assert sum(op.startswith("bmm") for op in kernel.aten_ops) == 2 and computes_softmax(kernel.aten_ops)
    left = {op.name for op in report.fallback_ops}
    assert left and not any(op.startswith(("bmm", *SOFTMAX_PARTS)) for op in left), left
    assert all(op.reason for op in report.fallback_ops)
    out = flashlight.compile(fn)(q, k, v, w)
    torch.compiler.reset()
    ref = fn(*(a.double() for a in (q, k, v, w)))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_a_gate_before_an_output_projection_runs_fused_with_it():
    """``(attention * sigmoid(x @ w_gate)) @ w_out``: the output projection contracts two
    dims (heads and width), one loop over their product ([Note: a loop over several
    dims]); the attention's output is kept separate (its row statistics depend on the
    head alone), and the gate's projection, the sigmoid, the product and the output
    projection are one kernel next to the attention's: nothing runs in PyTorch."""
    q, k, v = _qkv(61)
    B, H, L, D = q.shape
    x = rand(B, H, L, 12, seed=65)
    w_gate, w_out = rand(12, D, seed=66) * 0.3, rand(H * D, 8, seed=67) * 0.2

    def gated_projected(q, k, v, x, w_gate, w_out):
        o = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v * torch.sigmoid(x @ w_gate)
        return o.transpose(1, 2).reshape(B, L, H * D) @ w_out

    args = (q, k, v, x, w_gate, w_out)
    report = _matches_float64(gated_projected, args)
    assert not report.fallback_ops and len(report.kernels) == 2, str(report)
    gated = [kr for kr in report.kernels if "sigmoid.default" in kr.aten_ops]
    assert len(gated) == 1 and gated[0].aten_ops.count("mm.default") == 2, str(report)  # gate, output
    assert any(sum(op.startswith("bmm") for op in kr.aten_ops) == 2 for kr in report.kernels), str(report)


def test_a_whole_gated_attention_block_is_not_left_to_pytorch():
    """Projections, attention, a sigmoid gate and an output projection in one function:
    the output projection fails (a contraction over two dims) and no single cut rescues
    it, so the back-off keeps its operand and goes on from there, rather than running
    the whole block eagerly: the softmax and the gate run in kernels, and only matmuls
    are left to PyTorch."""
    B, L, H, D, C = 2, 29, 3, 8, 24
    args = (rand(B, L, C, seed=71), *(rand(C, H * D, seed=72 + i) * 0.3 for i in range(4)),
            rand(H * D, C, seed=79) * 0.3)
    report = _matches_float64(gated_attention_block, args)
    fused = [op for kr in report.kernels for op in kr.aten_ops]
    assert computes_softmax(fused) and "sigmoid.default" in fused, str(report)
    assert all(op.name == "mm.default" for op in report.fallback_ops), str(report)


def test_a_value_over_three_tile_dims_is_never_handed_to_codegen():
    """The mean over heads plus a scalar becomes a kernel of its own, looping over heads;
    a tiling whose loop reads ``o[b, h, q, d]`` as a ``[batch, heads, queries]`` tile
    (three tile dims, not a contraction) is rejected when tiling, not left for the code
    printer to fail on, and the kernel is tiled another way."""
    q, k, v = _qkv(51)
    w = rand(5, 4, seed=55)

    def mean_plus_scalar(q, k, v, w):
        return (torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v).mean(1) + w.sum()

    report = flashlight.explain(mean_plus_scalar, q, k, v, w)
    attention, head_mean = sorted(report.kernels, key=lambda kr: "mean.dim" in kr.aten_ops)
    assert sum(op.startswith("bmm") for op in attention.aten_ops) == 2
    assert "mean.dim" in head_mean.aten_ops and "add.Tensor" in head_mean.aten_ops
    out = flashlight.compile(mean_plus_scalar)(q, k, v, w)
    torch.compiler.reset()
    ref = mean_plus_scalar(*(a.double() for a in (q, k, v, w)))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spread", [
    lambda s: s.var(-1, keepdim=True),
    lambda s: s.std(-1, keepdim=True, correction=0),
    lambda s: torch.var(s, -1, unbiased=False, keepdim=True),
], ids=["var", "std_correction_0", "var_biased"])
def test_scores_scaled_by_their_own_spread_are_three_online_kernels(spread):
    """A variance needs its mean before its sum of squares, both over the key loop, and
    the softmax then needs the variance: no single online loop computes that. Decomposed
    into a mean and a sum (flashlight.decompositions), the back-off keeps each separate:
    a row-mean kernel, a squared-deviation kernel reading it, and the attention kernel."""
    q, k, v = _qkv(11)

    def fn(q, k, v):
        s = q @ k.transpose(-1, -2)  # [B, H, L, L]
        return torch.softmax(s / (spread(s) + 1).sqrt(), -1) @ v

    _check(fn, (q, k, v), kernels=3)


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
def test_scores_layer_normed_over_the_keys_are_three_online_kernels(affine):
    """``F.layer_norm`` of the scores over the keys is the case above as one ATen node,
    whose mean and variance the back-off could not keep separate: every operation was
    left to PyTorch. Written out ([Note: a layer norm written out]), it is three kernels."""
    q, k, v = _qkv(17)
    w, b = rand(29, seed=23), rand(29, seed=24)  # a learned gain and bias over the keys

    def fn(q, k, v, w, b):
        s = q @ k.transpose(-1, -2)  # [B, H, L, L]
        return torch.softmax(F.layer_norm(s, (s.shape[-1],), *((w, b) if affine else ())), -1) @ v

    report = _check(fn, (q, k, v, w, b), kernels=3)
    assert any("layer norm" in r for r in report.rewrites), str(report)


def test_a_float64_layer_norm_of_the_scores_stays_in_float64():
    """Written out, a layer norm computes in float32 only for 16-bit values, as the node
    does: float64 scores (left to PyTorch) keep float64's precision."""
    q, k, v = (x.double() for x in _qkv(19))

    def fn(q, k, v):
        s = q @ k.transpose(-1, -2)
        return torch.softmax(F.layer_norm(s, (s.shape[-1],)), -1) @ v

    with torch.no_grad():
        out = flashlight.compile(fn)(q, k, v)
    torch.testing.assert_close(out, fn(q, k, v), rtol=1e-12, atol=1e-12)


def test_nan_to_num_of_the_scores_fuses_and_replaces_every_non_finite_value():
    q, k, v = _qkv(13)
    bias = rand(3, 29, 29, seed=17)  # [H, L, L]
    pick = torch.rand(bias.shape, generator=torch.Generator().manual_seed(19))
    bias = bias.masked_fill(pick < 0.1, float("nan")).masked_fill(pick > 0.93, float("inf"))
    bias = bias.masked_fill((pick > 0.5) & (pick < 0.55), float("-inf"))

    def fn(q, k, v, bias):
        s = torch.nan_to_num(q @ k.transpose(-1, -2) + bias, nan=0.5, posinf=4.0, neginf=-4.0)
        s = s - 0.25 * torch.isinf(bias)  # [H, L, L] bool, as 0 or 1
        return torch.softmax(s, -1) @ v

    assert bias.isnan().any() and bias.isposinf().any() and bias.isneginf().any()
    _check(fn, (q, k, v, bias), kernels=1)


def test_work_repeated_along_two_row_dims_is_cut_along_both():
    """Attention over a pair representation with its layer norm, projections and a bias
    from the same normed pairs, written as one function: the key and value projections
    do not depend on the query (repeated along the queries) and the bias does not depend
    on the batch row (repeated along the rows). Neither row's cuts alone relieve the
    kernel; together they do, so the attention is tiled over its queries and repeats no
    loop work, rather than running a program per query that recomputes the keys."""
    L, C, H, D = 11, 8, 2, 4

    def pair_attention(z, wq, wk, wv, wb):  # z: [L, L, C]
        x = torch.nn.functional.layer_norm(z, (C,))
        q, k, v = ((x @ w).view(L, L, H, D).transpose(1, 2) for w in (wq, wk, wv))  # [i, h, j, d]
        bias = (x @ wb).permute(2, 0, 1)  # [h, j, k]
        s = q @ k.transpose(-1, -2) * D ** -0.5 + bias  # [i, h, j, k]
        return torch.softmax(s, -1) @ v

    args = (rand(L, L, C, seed=91), *(rand(C, H * D, seed=92 + i) * 0.5 for i in range(3)), rand(C, H, seed=96))
    plan = plan_of(pair_attention, args)
    softmax_kernels = [t for t in plan.kernels.values() if t.kernel.loop and any(
        red.op == "max" for red in t.kernel.loop)]
    assert softmax_kernels and not any(repeats_loop_work(t) for t in plan.kernels.values()), plan.kernels
    _matches_float64(pair_attention, args)


@pytest.mark.parametrize("L, C", [(29, 24), (12, 48)])
def test_latent_keeps_its_output_not_a_term_of_its_scores(L, C):
    """Absorbed multi-head latent attention, its output projected per head: the query's
    latent projection, both terms of the scores and the softmax are one kernel, and the
    projection of its output runs after it. Of the cuts that are kernels themselves, the
    back-off keeps the attention's output, never the latent term of the scores
    ``(q W) c^T`` (which made it two kernels, the scores in memory between them), also
    where that term writes fewer values than the output (fewer keys than the latent
    width, as DeepSeek's 512 at up to 511 keys)."""
    B, H, D, R = 2, 3, 16, 8
    args = (rand(B, H, L, D, seed=60), rand(B, H, L, R, seed=61), rand(B, L, C, seed=62), rand(B, L, R, seed=63),
            0.2 * rand(H, D, C, seed=64), 0.2 * rand(H, C, D, seed=65))
    report = _matches_float64(latent, args)
    (kernel,) = report.kernels
    assert computes_softmax(kernel.aten_ops) and sum(op.startswith("bmm") for op in kernel.aten_ops) == 4, str(report)
    assert [op.name for op in report.fallback_ops] == ["bmm.default"], str(report)


def test_a_loop_that_would_run_once_per_position_of_a_dim_wider_than_a_tile_is_left_to_pytorch():
    """Latent attention over a latent width wider than one tile (320 > 256): the values'
    features could only spread one per program, each running the whole key loop again
    (on the H200, 11 ms where the unfused graph took 0.23). That kernel is never made:
    its operations run in PyTorch, with the reason, and the function stays correct."""
    from bench.new_forms import _inputs

    args = _inputs("latent", (1, 2, 8, 40), torch.float32, torch.device("cpu"))
    report = _matches_float64(latent, args)
    reasons = {op.name: op.reason for op in report.fallback_ops}
    assert "amax.default" in reasons and "320-wide dim" in reasons["amax.default"], str(report)
    assert not any(computes_softmax(kernel.aten_ops) for kernel in report.kernels), str(report)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary(q, k, v, cos, sin):
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin  # read along the keys only: a key-side prologue
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v


def _gated_keys(q, k, v, gate):
    k = k * torch.sigmoid(gate)  # two reads per element: cheap enough to stay fused
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v


@pytest.mark.parametrize("L, outside", [(200, False), (300, True)])
def test_a_key_side_prologue_is_computed_once_where_the_rows_span_several_tiles(L, outside):
    """[Note: key-side prologues computed once]: rotary embeddings of the keys read the
    keys three times and two tables per element; with the rows wider than two row tiles
    they are computed once outside the kernel (which then loads the rotated keys), below
    that inside its loop. Either way one kernel, matching float64; a gate on the keys
    (two reads) stays in the loop at every length."""
    q, k, v = (rand(1, 2, L, 16, seed=60 + n) for n in range(3))
    angle = torch.arange(L, dtype=torch.float32)[:, None] * torch.linspace(0.1, 1.0, 8)[None, :]
    cos, sin = torch.cat((angle, angle), -1).cos(), torch.cat((angle, angle), -1).sin()  # [L, 16]
    report = _matches_float64(_rotary, (q, k, v, cos, sin))
    assert len(report.kernels) == 1, str(report)
    left = {op.name for op in report.fallback_ops}
    assert (("cat.default" in left and "add.Tensor" in left) if outside else not left), str(report)
    _check(_gated_keys, (q, k, v, rand(1, 2, L, 16, seed=70)), kernels=1)


def test_gradients_flow_through_a_key_side_prologue_computed_once():
    """The rotated keys computed outside the kernel (rows over two row tiles) still
    carry the gradients of q, k and v, matching float64."""
    L = 300
    q, k, v = (rand(1, 1, L, 16, seed=80 + n) for n in range(3))
    angle = torch.arange(L, dtype=torch.float32)[:, None] * torch.linspace(0.1, 1.0, 8)[None, :]
    cos, sin = torch.cat((angle, angle), -1).cos(), torch.cat((angle, angle), -1).sin()
    grad_out = rand(1, 1, L, 16, seed=90)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    flashlight.compile(_rotary)(*leaves, cos, sin).backward(grad_out)
    exact = [t.double().requires_grad_(True) for t in (q, k, v)]
    _rotary(*exact, cos.double(), sin.double()).backward(grad_out.double())
    for got, want in zip(leaves, exact, strict=True):
        assert torch.isfinite(got.grad).all()
        torch.testing.assert_close(got.grad.double(), want.grad, rtol=1e-4, atol=1e-4 * want.grad.abs().max().item())

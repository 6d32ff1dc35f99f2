"""The online loop in base 2 and its lazy rescaling (``passes/base2.py``).

[Note: base-2 online softmax] and [Note: lazy rescaling] say what is proved; here:
the IR and source the pass leaves (the scale folded into one multiply, ``exp2``, the
max an epilogue reads kept in the program's own rounding), and results against float64
eager on scores whose row maxima grow across key tiles (the interpreter runs 16 keys per
tile), rescaled on every step as the pipeline does and lazily: small steps the lazy
loop does not rescale for, jumps it must rescale for (where skipping them would overflow
float32), rows that start empty, several exp powers, and epilogues that need the sums
relative to the true max (a logsumexp).
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import flashlight
from flashlight import pipeline
from flashlight.backoff import search
from flashlight.codegen import generate
from flashlight.decompositions import decompositions
from flashlight.ir import Const, LoopResult, Pointwise, dim_names, walk
from flashlight.lower import lower
from flashlight.passes.base2 import DEFAULT_THRESHOLD, LOG2E, RESCALE_THRESHOLD, to_base2
from flashlight.aot import aot_compile
from flashlight.runtime import Launcher
from tests.helpers import plan_of

KEYS = 80  # five key tiles of the interpreter's 16
TILE = 16


def _scaled_attention(q, k, v, bias):
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias
    return torch.softmax(s, dim=-1) @ v


def _scaled_lse(q, k):
    return torch.logsumexp(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)


def _biased_lse(q, k, bias):
    return torch.logsumexp(q @ k.transpose(-1, -2) * 0.25 + bias, dim=-1)


def _tempered(q, k, v, bias):  # exp((s - max) / T): power 1 / T = 2 in the max
    s = q @ k.transpose(-1, -2) + bias
    e = torch.exp((s - s.amax(-1, keepdim=True)) / 0.5)
    return (e / e.sum(-1, keepdim=True)) @ v


def _causal_scaled(q, k, v):
    L = q.shape[-2]
    s = (q @ k.transpose(-1, -2) / 4.0).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _floored(q, k, v):  # softmax with an extra zero logit: the max starts from 0
    s = q @ k.transpose(-1, -2) * 0.25
    e = torch.exp(s - torch.clamp_min(s.amax(-1, keepdim=True), 0.0))
    return (e / (e.sum(-1, keepdim=True) + torch.exp(-torch.clamp_min(s.amax(-1, keepdim=True), 0.0)))) @ v


def _qkv(gen, rows=40, keys=KEYS, d=16):
    q = torch.randn(1, 2, rows, d, generator=gen)
    return q, torch.randn(1, 2, keys, d, generator=gen), torch.randn(1, 2, keys, d, generator=gen)


def _growing_bias(kind: str, gen, rows=40, keys=KEYS) -> torch.Tensor:
    """``[rows, keys]`` biases whose row maxima grow (or not) from key tile to key tile."""
    j = torch.arange(keys, dtype=torch.float32)
    noise = torch.randn(rows, keys, generator=gen)
    if kind == "small steps":  # +4 per tile: under the threshold, then over it after two tiles
        return 0.25 * j + noise
    if kind == "jump":  # +300 after the first tile, then flat: exp(300) overflows float32
        return 300.0 * (j >= TILE) + noise
    if kind == "staircase":  # a large rise on every tile
        return 40.0 * (j // TILE) + noise
    if kind == "falling":
        return -0.5 * j + noise
    if kind == "mixed rows":  # rows that jump next to rows that stay flat, in one row tile
        slope = torch.where(torch.arange(rows) % 2 == 0, 60.0, 0.0)
        return slope[:, None] * (j // TILE)[None, :] + noise
    if kind == "late start":  # row i sees nothing before tile i % 5 (its first tiles are empty)
        start = (torch.arange(rows) % (keys // TILE)) * TILE
        return torch.where(j[None, :] < start[:, None], float("-inf"), 10.0 * (j // TILE) + noise)
    raise ValueError(kind)


KINDS = ["small steps", "jump", "staircase", "falling", "mixed rows", "late start"]


def _close(out: torch.Tensor, ref: torch.Tensor, scores: float) -> bool:
    """Within float32 rounding of scores as large as ``scores`` (exponents round at
    ``|s| * eps``, in eager float32 as here)."""
    tol = 1e-5 + 4e-7 * scores
    return bool(torch.isfinite(out).all()) and torch.allclose(out.double(), ref, rtol=tol, atol=tol)


def _compiled(fn, args, threshold):
    """``fn``'s kernel with the base-2 pass at ``threshold`` (None: rescaling every step),
    the graph it came from and its input tensors in argument order."""
    gm = make_fx(fn, decomposition_table=decompositions(inference=True))(*args)
    lowered = lower(gm)
    passes = tuple(dataclasses.replace(p, run=lambda k, _: to_base2(k, threshold)) if p.name == "to_base2" else p
                   for p in pipeline.KERNEL_PASSES)
    compiler = dataclasses.replace(pipeline.pipeline_for(lowered, check=True), kernel_passes=passes)
    with dim_names(lowered.next_dim_id):
        plan = search(lowered, compiler, lambda *_: None)
    ((_, tiled),) = plan.kernels.items()
    tensor_of = dict(zip([n.name for n in gm.graph.nodes if n.op == "placeholder"], args))
    return tiled, [tensor_of[name] for name, _ in tiled.plan.inputs]


def _run(fn, args, threshold):
    """``fn``'s kernel at ``threshold``, run by the interpreter, in the shape of ``fn``'s
    result (the graph around the kernel only views its output)."""
    tiled, tensors = _compiled(fn, args, threshold)
    out = Launcher(tiled, generate(tiled, None, "ieee", interpret=True), autotune=False)(*tensors)
    return out.reshape(fn(*args).shape)


THRESHOLDS = [pytest.param(None, id="every step"), pytest.param(RESCALE_THRESHOLD, id="lazy")]


# ------------------------------------------------------------------ what the pass leaves


def _constant_factors(expr) -> list:
    return [n for n in walk(expr) if isinstance(n, Pointwise) and n.op in ("mul", "div")
            and any(isinstance(a, Const) for a in n.args)]


def test_the_scale_folds_into_one_multiply_of_the_scores_and_exp2(gen):
    q, k, v = _qkv(gen)
    bias = torch.randn(40, KEYS, generator=gen)
    (tiled,) = plan_of(_scaled_attention, (q, k, v, bias)).kernels.values()
    kernel = tiled.kernel
    (mx,) = [r for r in kernel.loop if r.op == "max"]
    # the max runs over the scores as written (0.25 * q.k + bias: no constant factor), in base 2
    assert mx.base2 is not None and mx.base2.log2_scale == LOG2E
    assert mx.base2.threshold == DEFAULT_THRESHOLD is None  # the pipeline rescales on every step
    for red in kernel.loop:
        ops = {n.op for n in walk(red.body) if isinstance(n, Pointwise)}
        assert "exp" not in ops and ("exp2" in ops) == (red.op == "sum")
    src = generate(tiled, None, "tf32", interpret=False).source
    assert "tl.exp2(" in src and "tl.exp(" not in src
    # no branch on the data (a lazy rescale's); the one on INDEX_BITS is resolved when compiling
    assert [line for line in src.splitlines() if line.lstrip().startswith("if ")] == ["    if INDEX_BITS == 64:"]
    assert f"* {LOG2E!r})" in src  # scores and the running max, each times log2(e) once


def test_a_constant_factor_of_the_scores_leaves_the_max_and_joins_log2e(gen):
    q, k, v = _qkv(gen, rows=KEYS)
    (tiled,) = plan_of(_causal_scaled, (q, k, v)).kernels.values()
    kernel = tiled.kernel
    (mx,) = [r for r in kernel.loop if r.op == "max"]
    assert mx.base2.log2_scale == pytest.approx(LOG2E / 4.0, rel=1e-15)
    # through the -inf mask: max_j where(m, -inf, x / 4) = max_j where(m, -inf, x) / 4
    assert not _constant_factors(mx.body)
    assert kernel.unmasked is not None  # the loop on full tiles agrees
    (mx_full,) = [r for r in kernel.unmasked if r.op == "max"]
    assert mx_full.base2 == mx.base2
    src = generate(tiled, None, "tf32", interpret=False).source
    assert f"* {LOG2E / 4.0!r})" in src and "/ 4.0)" not in src


def test_the_max_an_epilogue_reads_is_rounded_as_the_program_wrote_it(gen):
    q, k, _ = _qkv(gen)
    tiled, _ = _compiled(_scaled_lse, (q, k), RESCALE_THRESHOLD)
    kernel = tiled.kernel
    (index,) = [i for i, r in enumerate(kernel.loop) if r.op == "max"]
    mx = kernel.loop[index]
    # the loop's max is of q.k; the epilogue's M = max / 4, as eager rounds max(q.k / 4)
    assert not _constant_factors(mx.body)
    reads = [n for n in walk(kernel.epilogue) if isinstance(n, Pointwise) and LoopResult(index, mx.dtype) in n.args]
    assert reads and all(n.op == "div" and n.args[1] == Const(4.0, n.dtype) for n in reads)
    # logsumexp = M + log(l) reads M: a lazy loop settles the sums to the true max after it
    assert mx.base2.settle and mx.base2.log2_scale == pytest.approx(LOG2E / 4.0, rel=1e-15)
    for threshold in (None, RESCALE_THRESHOLD):
        out = _run(_scaled_lse, (q, k), threshold)
        torch.testing.assert_close(out.double(), _scaled_lse(q.double(), k.double()), rtol=1e-5, atol=1e-5)


def test_attention_needs_no_settling_and_a_floor_keeps_its_constant_factor(gen):
    q, k, v = _qkv(gen)
    bias = torch.randn(40, KEYS, generator=gen)
    tiled, _ = _compiled(_scaled_attention, (q, k, v, bias), RESCALE_THRESHOLD)
    (mx,) = [r for r in tiled.kernel.loop if r.op == "max"]
    assert mx.base2.threshold == RESCALE_THRESHOLD and not mx.base2.settle  # acc / l: degree 0
    tiled, _ = _compiled(_floored, (q, k, v), RESCALE_THRESHOLD)
    (mx,) = [r for r in tiled.kernel.loop if r.base2 is not None]
    assert mx.init is not None and mx.base2.log2_scale == LOG2E  # 0 / 0.25 would be exact, r / k is not
    assert mx.base2.settle  # the epilogue adds exp(-M) to the sum: it needs the sums at the true max
    ref = _floored(q.double(), k.double(), v.double())
    for threshold in (None, RESCALE_THRESHOLD):
        torch.testing.assert_close(_run(_floored, (q, k, v), threshold).double(), ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ growing maxima, numerically


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("kind", KINDS)
def test_growing_row_maxima_match_float64(kind, threshold, gen):
    q, k, v = _qkv(gen)
    bias = _growing_bias(kind, gen)
    out = _run(_scaled_attention, (q, k, v, bias), threshold)
    ref = _scaled_attention(q.double(), k.double(), v.double(), bias.double())
    assert _close(out, ref, float(bias[torch.isfinite(bias)].abs().max()))


def test_the_compiled_function_matches_float64_on_growing_maxima(gen):
    q, k, v = _qkv(gen)
    bias = _growing_bias("jump", gen)
    out = flashlight.compile(_scaled_attention)(q, k, v, bias)
    torch.compiler.reset()
    assert _close(out, _scaled_attention(q.double(), k.double(), v.double(), bias.double()), 310.0)


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("kind", ["small steps", "jump", "mixed rows", "late start"])
def test_a_logsumexp_over_growing_maxima_matches_float64(kind, threshold, gen):
    q, k, _ = _qkv(gen)
    bias = _growing_bias(kind, gen)
    out = _run(_biased_lse, (q, k, bias), threshold)
    ref = _biased_lse(q.double(), k.double(), bias.double())
    assert _close(out, ref, float(bias[torch.isfinite(bias)].abs().max()))


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("kind", ["small steps", "staircase", "mixed rows"])
def test_an_exp_power_of_two_halves_the_threshold(kind, threshold, gen):
    q, k, v = _qkv(gen)
    bias = _growing_bias(kind, gen)
    tiled, _ = _compiled(_tempered, (q, k, v, bias), threshold)
    (mx,) = [r for r in tiled.kernel.loop if r.op == "max"]
    assert mx.base2.threshold == (None if threshold is None else threshold / 2)  # terms stay below 2 ** 8
    out = _run(_tempered, (q, k, v, bias), threshold)
    ref = _tempered(q.double(), k.double(), v.double(), bias.double())
    assert _close(out, ref, 2 * float(bias.abs().max()))


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_causal_tiles_with_growing_maxima_match_float64(threshold, gen):
    q, k, v = _qkv(gen, rows=KEYS)
    scale = (4.0 * (torch.arange(KEYS) // TILE)).to(torch.float32)  # keys of later tiles score higher
    k = k * (1.0 + scale[:, None])
    out = _run(_causal_scaled, (q, k, v), threshold)
    ref = _causal_scaled(q.double(), k.double(), v.double())
    assert _close(out, ref, float((q @ k.transpose(-1, -2)).abs().max() / 4.0))


def test_the_threshold_is_what_keeps_the_lazy_loop_finite(gen):
    """The inputs can tell: never rescaling after the first tile overflows at the jump."""
    q, k, v = _qkv(gen)
    bias = _growing_bias("jump", gen)
    ref = _scaled_attention(q.double(), k.double(), v.double(), bias.double())
    assert _close(_run(_scaled_attention, (q, k, v, bias), 1.0), ref, 310.0)
    broken = _run(_scaled_attention, (q, k, v, bias), math.inf)
    assert not torch.isfinite(broken).all()


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_rows_without_any_key_stay_nan_as_in_eager(threshold, gen):
    q, k, v = _qkv(gen)
    bias = _growing_bias("late start", gen)
    bias[3] = float("-inf")  # a row that never sees a key: 0 / 0
    out = _run(_scaled_attention, (q, k, v, bias), threshold)
    ref = _scaled_attention(q.double(), k.double(), v.double(), bias.double())
    assert torch.isnan(ref[..., 3, :]).all() and torch.isnan(out[..., 3, :]).all()
    keep = torch.ones(40, dtype=torch.bool)
    keep[3] = False
    assert _close(out[..., keep, :], ref[..., keep, :], float(bias[torch.isfinite(bias)].abs().max()))


def test_the_lazy_loop_builds_for_hopper(gen):
    """The branch on the tile's growth must also pass Triton's GPU compiler (sm_90, no GPU
    needed), at a 128-row, 8-warp, 3-stage tile."""
    q, k, v = _qkv(gen)
    bias = _growing_bias("small steps", gen)
    tiled, tensors = _compiled(_scaled_attention, (q, k, v, bias), RESCALE_THRESHOLD)
    src = generate(tiled, None, "ieee", interpret=False)
    assert "if tl.max(" in src.source
    built = aot_compile(src, [t.dtype for t in tensors], tiled.kernel.dtype, 90, block_m=128, block_n=64,
                        num_warps=8, num_stages=3)
    assert built.shared > 0 and built.num_warps == 8


def test_recomputed_probabilities_fold_log2e_into_the_scale_and_the_saved_max(gen):
    """[Note: recomputed probabilities in base 2] (``passes/exponentials.py``): outside an
    online loop, ``exp(where(mask, -inf, s / c) - m)`` becomes ``exp2`` of the scores times
    ``log2(e) / c`` minus ``m * log2(e)``, the mask still ``-inf``; an exponent with no
    constant to absorb ``log2(e)`` is left as ``exp``."""
    from flashlight.ir import Dim, Iota, Load
    from flashlight.passes.exponentials import _base2_form

    i, j = Dim.fresh(8, "d"), Dim.fresh(8, "j")
    f32 = torch.float32
    s = Load("s", ((i,), (j,)), f32)
    m = Load("m", ((i,),), f32)
    masked = Pointwise("gt", (Iota((j,), torch.int64), Iota((i,), torch.int64)), torch.bool)
    scaled = Pointwise("div", (s, Const(8.0, f32)), f32)
    scores = Pointwise("where", (masked, Const(float("-inf"), f32), scaled), f32)
    out = _base2_form(Pointwise("exp", (Pointwise("sub", (scores, m), f32),), f32))
    assert out.op == "exp2"
    diff = out.args[0]
    assert diff.op == "sub" and diff.args[1] == Pointwise("mul", (m, Const(LOG2E, f32)), f32)
    where = diff.args[0]
    assert where.op == "where" and where.args[1] == Const(float("-inf"), f32)
    assert where.args[2] == Pointwise("mul", (s, Const(LOG2E / 8.0, f32)), f32)
    assert _base2_form(Pointwise("exp", (Pointwise("sub", (s, m), f32),), f32)) is None


def test_a_causal_backward_recomputes_its_probabilities_with_exp2(gen):
    """The backward kernels of causal attention recompute the probabilities from the saved
    statistics with ``exp2`` and the scale folded ([Note: recomputed probabilities in base
    2]); the gradients match float64 eager."""
    from tests.test_backward import _check_variant, _small_shape

    _, _, _, report = _check_variant("causal_tril", gen, shape={**_small_shape("causal_tril"), "L": 37})
    backward = [k for k in report.kernels if k.source.count("tl.dot(") >= 3]
    assert backward, str(report)
    for kernel in backward:
        assert "tl.exp2(" in kernel.source and "tl.exp(" not in kernel.source, kernel.source


def _dtype_min_mask(q, k, v, keep):
    # Hugging Face's padding mask: the dtype's most negative value where a key is padding
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s + (1.0 - keep[:, None, None, :].to(s.dtype)) * torch.finfo(s.dtype).min
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_mask_of_the_dtypes_most_negative_value_keeps_its_gradients_finite(gen, dtype):
    """[Note: constants that absorb a factor]: ``finfo.min * log2(e)`` is beyond the
    dtype's range, so the recomputed probabilities keep the mask's multiply (the backward
    printed ``-inf - keep * -inf``, NaN for every kept key, and every gradient was NaN;
    in float16 the product overflowed at the cast to float16 on the way); the gradients
    match float64 over several key tiles."""
    from flashlight.ir import Dim, Load
    from flashlight.passes.exponentials import _base2_form

    j = Dim.fresh(8, "j")
    f32 = torch.float32
    keep = Load("keep", ((j,),), f32)
    mask = Pointwise("mul", (Pointwise("sub", (Const(1.0, f32), keep), f32), Const(torch.finfo(f32).min, f32)), f32)
    out = _base2_form(Pointwise("exp", (Pointwise("sub", (mask, Load("m", ((), ), f32)), f32),), f32))
    # nothing but the mask to fold into: left as exp (it printed a -4.9e38 constant)
    assert out is None or all(math.isfinite(node.value) for node in walk(out) if isinstance(node, Const))

    leaves = [torch.randn(2, 2, 37, 16, generator=gen).to(dtype).requires_grad_() for _ in range(3)]
    keep_keys = (torch.rand(2, 37, generator=gen) > 0.3).float()
    keep_keys[:, 0] = 1.0
    torch.compiler.reset()
    out = torch.compile(_dtype_min_mask, backend="flashlight")(*leaves, keep_keys)
    grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
    exact = [x.detach().double().requires_grad_() for x in leaves]
    ref = _dtype_min_mask(*exact, keep_keys.double())
    refs = torch.autograd.grad(ref, exact, torch.ones_like(ref))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    for got, want in zip(grads, refs):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, rtol=10 * tol, atol=10 * tol * float(want.abs().max()))


def _filled_with_dtype_min(q, k, v, keep):
    s = (q @ k.transpose(-1, -2) * 0.25).masked_fill(~keep[:, None, None, :], torch.finfo(q.dtype).min)
    return torch.softmax(s, -1) @ v


def test_a_padding_filled_with_the_dtypes_min_folds_to_the_infinity_the_kernel_computes(gen):
    """``masked_fill(pad, finfo.min)`` in bf16: the recomputed probabilities' selection
    takes ``finfo.min * log2(e)`` as the ``-inf`` a float32 kernel computes ([Note:
    constants that absorb a factor]); it printed the product as a float64 literal, which
    broke the backward under the interpreter. Gradients match float64 within bf16's
    tolerance."""
    leaves = [torch.randn(2, 2, 37, 16, generator=gen).bfloat16().requires_grad_() for _ in range(3)]
    keep = torch.rand(2, 37, generator=gen) > 0.3
    keep[:, 0] = True
    torch.compiler.reset()
    out = torch.compile(_filled_with_dtype_min, backend="flashlight")(*leaves, keep)
    grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
    exact = [x.detach().double().requires_grad_() for x in leaves]
    ref = _filled_with_dtype_min(*exact, keep)
    refs = torch.autograd.grad(ref, exact, torch.ones_like(ref))
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    for got, want in zip(grads, refs):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))

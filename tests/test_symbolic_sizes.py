"""Graphs whose sizes are all symbolic: Dynamo makes every size of a tensor symbolic
when its rank changes between calls (a batch dim added), head widths included.

- sizes are products of positive integer symbols, so a reshape merging two symbolic
  dims lines up (``indexing.sym``);
- the sizes a tile must know (head widths) are fixed by a guard and the graph lowered
  again ([Note: sizes a tile must know] in ``passes/tiling.py``);
- a scale computed from a symbolic size (``1 / sqrt(d)``) is a constant of the kernel
  once that size is fixed (``flashlight.constants``).
"""
from __future__ import annotations

import math

import pytest
import torch

from flashlight.backend import compile_count, make_backend
from flashlight.indexing import sizes_equal, sym
from flashlight.integrations.openfold_core import attention_core
from flashlight.constants import fold_constants
from flashlight.ir import Const, Pointwise
from flashlight.report import ExplainReport

HEADS, WIDTH = 2, 16


def _triangle_inputs(gen, batch, length, width=WIDTH):
    """Triangle attention's core inputs: q, k, v ``[*, I, H, J, C]``, the mask bias
    ``[*, I, 1, 1, J]`` (no row fully masked), the triangle bias ``[*, 1, H, J, J]`` and the gate ``[*, I, J, H, C]``."""
    qkv = [torch.randn(*batch, length, HEADS, length, width, generator=gen) for _ in range(3)]
    masked = torch.rand(*batch, length, 1, 1, length, generator=gen) < 0.2
    # every row keeps a key, as OpenFold's masks keep the residue's own: with all keys at
    # -1e9 the float32 sum loses the triangle bias (eager float32 too: 0.9 off float64)
    masked[..., 0] = False
    mask_bias = 1e9 * masked.float().neg()
    triangle_bias = torch.randn(*batch, 1, HEADS, length, length, generator=gen)
    gate = torch.randn(*batch, length, length, HEADS, width, generator=gen)
    return (*qkv, mask_bias, triangle_bias, gate)


def _compute_ops(report: ExplainReport) -> list[str]:
    views = ("view", "transpose", "permute", "expand", "unsqueeze", "squeeze", "alias", "clone")
    return [op.name for op in report.fallback_ops if not any(v in op.name for v in views)]


def _beyond_the_scale(report: ExplainReport) -> list[str]:
    """The compute ops outside the kernels but the scale ``d ** -0.5`` of a symbolic
    head width: a scalar computed in float64 (as Python computes it) and cast."""
    return [op for op in _compute_ops(report) if not op.startswith(("scalar_tensor", "pow", "prims.convert"))]


def test_attention_core_stays_one_kernel_after_a_rank_change(gen):
    """Shapes (), L 7; (), L 9 (the length symbolic); then batch (2,), L 11: every size
    symbolic. Each compile is one kernel with nothing left outside it; a later call of the
    new rank reuses it; another head width compiles again, correctly."""
    fn = attention_core(2, True)
    report = ExplainReport()
    compiled = torch.compile(fn, backend=make_backend(report=report), dynamic=None)
    torch.compiler.reset()
    calls = [((), 7), ((), 9), ((2,), 11), ((3,), 6)]
    kernels_before = []
    for batch, length in calls:
        args = _triangle_inputs(gen, batch, length)
        kernels_before.append(compile_count())
        report.fallback_ops.clear()
        with torch.no_grad():
            out = compiled(*args)
        want = fn(*(a.double() for a in args))
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
        assert not _compute_ops(report), str(report)
    assert len(report.kernels) == 3, str(report)
    assert all("bmm.default" in k.aten_ops and "sigmoid.default" in k.aten_ops for k in report.kernels)
    assert compile_count() == kernels_before[-1]  # the last call launched the symbolic kernel
    args = _triangle_inputs(gen, (2,), 5, width=8)  # another head width: a guard fails
    with torch.no_grad():
        out = compiled(*args)
    torch.testing.assert_close(out.double(), fn(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)
    assert len(report.kernels) == 4, str(report)
    torch.compiler.reset()


def test_products_of_symbols_are_integers():
    merged = sym("s0*s1*s2")
    assert (merged / sym("s0")).is_integer
    assert sizes_equal("s1*s0", "s0*s1")
    assert not (sym("s1") / sym("s0")).is_integer
    assert sym("s3").free_symbols.pop().is_positive


def test_reshape_merging_symbolic_dims_fuses(gen):
    """A view merging batch and heads, both symbolic, into the bmm's batch dim."""

    def fn(q, k, v):
        b, h, n, d = q.shape
        s = torch.bmm(q.reshape(b * h, n, d), k.reshape(b * h, n, d).transpose(1, 2))
        return torch.bmm(torch.softmax(s / math.sqrt(d), -1), v.reshape(b * h, n, d)).view(b, h, n, d)

    report = ExplainReport()
    compiled = torch.compile(fn, backend=make_backend(report=report), dynamic=True)
    args = [torch.randn(2, 3, 9, 16, generator=gen) for _ in range(3)]
    with torch.no_grad():
        out = compiled(*args)
    torch.compiler.reset()
    torch.testing.assert_close(out.double(), fn(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)
    assert len(report.kernels) == 1 and not _beyond_the_scale(report), str(report)


@pytest.mark.parametrize("value, dtype", [(16, torch.float64), (7, torch.float32), (3, torch.bfloat16)])
def test_constants_fold_as_eager_computes_them(value, dtype):
    expr = Pointwise("cast", (Pointwise("sqrt", (Const(value, torch.float64),), torch.float64),), dtype)
    folded = fold_constants(Pointwise("div", (Const(1.0, dtype), expr), dtype))
    want = (1.0 / torch.tensor(value, dtype=torch.float64).sqrt().to(dtype)).to(dtype)
    assert folded == Const(want.item(), dtype)
    assert fold_constants(Pointwise("exp", (Pointwise("neg", (Const(2, torch.int64),), torch.int64),),
                                    torch.float32)).value == pytest.approx(math.exp(-2))



@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32])
def test_constants_round_into_their_dtype_as_pytorch_does(dtype, gen):
    from flashlight.constants import rounded

    values = torch.randn(200, generator=gen, dtype=torch.float64) * 300
    # a double just above a float16 tie: PyTorch rounds it through float32, onto the tie
    values[:5] = torch.tensor([0.1, 65519.0, 1e6, -2.5, 111.78125020774384], dtype=torch.float64)
    for value in values.tolist():
        value = value if dtype.is_floating_point else int(value)
        want = torch.tensor(value, dtype=torch.float64 if dtype.is_floating_point else torch.int64).to(dtype).item()
        assert rounded(value, dtype) == want, (value, dtype)


def test_a_length_summed_inside_a_loop_is_not_fixed(gen):
    """A query pooled over the sequences (a sum over a symbolic length, inside the
    attention's loop once fused) leaves the length symbolic: the third length compiles
    nothing, and the results match float64."""
    from torch._dynamo.utils import counters

    def fn(x, k, v):
        q = x.sum(-2, keepdim=True) / x.shape[-1]
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

    compiled = torch.compile(fn, backend=make_backend())
    torch.compiler.reset()
    graphs = []
    for n in (5, 7, 9):
        args = [torch.randn(2, n, 16, generator=gen) for _ in range(3)]
        with torch.no_grad():
            out = compiled(*args)
        graphs.append(int(counters["stats"]["unique_graphs"]))
        torch.testing.assert_close(out.double(), fn(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)
    torch.compiler.reset()
    assert graphs[2] == graphs[1], graphs


def test_a_function_of_the_probabilities_at_a_symbolic_length_stores_no_rows_by_keys(gen):
    """Softmax is decomposed over a symbolic length too (a backed size is at least 2
    under the graph's guards): an entropy of the attention probabilities compiles to the
    same kernels at the second length (symbolic) as at the first, nothing outside them,
    and matches float64 at both."""
    def entropy_weighted(q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return (p @ v) * -(p * torch.log(p + 1e-9)).sum(-1, keepdim=True)

    report = ExplainReport()
    compiled = torch.compile(entropy_weighted, backend=make_backend(report=report))
    kernels = []
    with torch.no_grad():
        for length in (20, 33):
            q, k, v = (torch.randn(2, length, 16, generator=gen) for _ in range(3))
            before = len(report.kernels)
            out = compiled(q, k, v)
            kernels.append(len(report.kernels) - before)
            ref = entropy_weighted(q.double(), k.double(), v.double())
            torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert kernels[0] == kernels[1] > 1 and report.fallback_ops == [], str(report)


def _scaled_by_width(q, k, v):
    s = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # a symbolic width: a host scalar
    return torch.softmax(s, dim=-1) @ v


def test_host_scalars_reach_the_kernel_through_a_copy_to_its_device():
    """[Note: host scalars]: a 0-dim CPU input of a kernel computing on another device is
    copied there before the kernel; its other inputs are untouched."""
    import torch.fx as fx

    from flashlight.backend import _on_kernel_device, _unsupported_graph

    gm = fx.symbolic_trace(lambda x, s: x * s)
    x, s, out = list(gm.graph.nodes)[:3]  # the two placeholders and the product
    x.meta["val"] = torch.empty(4, device="meta")
    s.meta["val"] = torch.tensor(0.25)
    out.meta["val"] = torch.empty(4, device="meta")
    # the scalar does not count as a second device (meta, here, is refused on its own)
    assert _unsupported_graph(gm, [x.meta["val"], s.meta["val"]]).startswith("tensors on meta:")
    with gm.graph.inserting_before(out):
        inputs = _on_kernel_device(gm, (x, s), out)
    assert inputs[0] is x and inputs[1] is not s
    assert inputs[1].target is torch.ops.aten._to_copy.default and inputs[1].args == (s,)
    assert inputs[1].kwargs["device"] == torch.device("meta")
    assert "copied to its device" in inputs[1].meta["flashlight_reason"]  # what explain() says
    assert _on_kernel_device(gm, (x, s), s) == (x, s)  # a kernel on the CPU reads it where it is


def test_a_second_head_width_runs_one_kernel(gen):
    """The second width makes the width symbolic and its scale a computed scalar (a host
    scalar on a CUDA device, [Note: host scalars]): still one kernel, exact."""
    import flashlight
    from flashlight.integrations.openfold_testing import count_launches

    compiled = flashlight.compile(_scaled_by_width)
    for width in (32, 16):
        q, k, v = (torch.randn(2, 3, 40, width, generator=gen) for _ in range(3))
        with count_launches() as launches:
            out = compiled(q, k, v)
        assert len(launches) == 1, width
        ref = _scaled_by_width(q.double(), k.double(), v.double())
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, shapes", [
    ("gqa", ((1, 4, 2, 13, 8), (2, 6, 3, 11, 8))),
    # one key head (repeat_interleave), unmasked: the repeats' loop runs around the query
    # loop ([Note: the repeats outside the key loop]), its count a size argument
    ("mqa", ((1, 4, 1, 13, 8), (2, 6, 1, 11, 8))),
])
def test_grouped_query_training_with_every_size_symbolic_saves_no_scores(gen, name, shapes):
    """Under ``dynamic=True`` grouped-query attention's repeated key heads ``h * (H // h)``
    equal the query heads ``H`` only by a guard's fact (``h`` divides ``H``: [Note: sizes
    divisible by a guard] in ``flashlight/indexing.py``), and the head width is symbolic
    until the forward's compile fixes it. With both handled, the forward saves neither
    the scores nor the repeated keys (its largest saved tensor is the queries) and the
    gradients match float64 at two shapes (another head grouping, another length). The
    keys' and values' gradients sum the repeats inside their kernel, in a loop of a
    symbolic count ([Note: a small sum inside the loop] in ``passes/online.py``): no sum
    runs outside the kernels."""
    from bench import variants_lm

    fn = getattr(variants_lm, name)
    report = ExplainReport()
    compiled = torch.compile(fn, backend=make_backend(report=report), dynamic=True)
    for batch, heads, kv_heads, length, width in shapes:
        q = torch.randn(batch, heads, length, width, generator=gen, requires_grad=True)
        k, v = (torch.randn(batch, kv_heads, length, width, generator=gen, requires_grad=True) for _ in range(2))
        saved: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            out = compiled(q, k, v)
        grad_out = torch.randn(out.shape, generator=gen)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
        want = fn(*exact)
        want_grads = torch.autograd.grad(want, exact, grad_out.double())
        assert max(saved) <= q.numel() < batch * heads * length * length, saved
        for got, ref in zip((out, *grads), (want, *want_grads)):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    assert not [op for op in report.fallback_ops if op.name.startswith("sum")], str(report)
    repeats_summed = [k for k in report.kernels if k.aten_ops.count("sum.dim_IntList") == 2
                      and k.aten_ops.count("bmm.default") == 4]
    assert len(repeats_summed) == 2, str(report)  # one per compiled shape


@pytest.mark.parametrize("name", ["rotary", "sink_column", "relative_bias"])
def test_training_with_every_size_symbolic_saves_no_scores(gen, name):
    """Variants under ``dynamic=True`` whose graphs hold sizes as nodes: rotary's
    ``rotate_half`` splits the head width in pieces of size ``D // 2``; the sink column's
    joint graph slices the concatenated gradient at ``L`` and ``L + 1``; the relative
    bias clamps distances to ``(T - 1) // 2`` of a table of ``T`` buckets and looks them
    up along that symbolic dim. The lowering reads such nodes as sizes (a size used as a
    value: [Note: sizes used as values] in ``flashlight/indexing.py``) and the
    concatenation rewrite ([Note: reductions through a concatenation]) compares them as
    sizes, so the partition's analysis lowers the forward and the backward recomputes
    the scores: nothing larger than an input is saved, gradients (every floating
    input's) match float64 at two lengths."""
    from bench.variants import VARIANTS
    from bench.variants_base import as_outputs

    variant = VARIANTS[name]
    compiled = torch.compile(variant.fn, backend=make_backend(), dynamic=True)
    for length in (13, 16):
        shape = {**variant.default_shape, "B": 1, "H": 2, "L": length, "D": 8}
        args = [x.requires_grad_() if x.is_floating_point() else x
                for x in variant.make_inputs(shape, torch.float32, "cpu", gen)]
        leaves = [x for x in args if x.requires_grad]
        saved: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            out = as_outputs(compiled(*args))[0]
        grad_out = torch.randn(out.shape, generator=gen)
        grads = torch.autograd.grad(out, leaves, grad_out)
        exact = [x.detach().double().requires_grad_() if x.requires_grad else x.double() for x in args]
        want = as_outputs(variant.fn(*exact))[0]
        want_grads = torch.autograd.grad(want, [x for x in exact if x.requires_grad], grad_out.double())
        assert max(saved) <= max(x.numel() for x in args) < shape["H"] * length * length * 2, saved
        for got, ref in zip((out, *grads), (want, *want_grads)):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def _bottom_right_causal(q, k, v):
    # the queries are the keys' last rows (a step over a cache): query i sees keys
    # j <= i + (Lk - Lq), an offset that is a size
    q_len, k_len = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # [B, H, Lq, Lk]
    i = torch.arange(q_len, device=q.device)[:, None]
    j = torch.arange(k_len, device=q.device)[None, :]
    return torch.softmax(s.masked_fill(j > i + (k_len - q_len), -math.inf), dim=-1) @ v


def test_a_mask_offset_by_a_size_is_one_kernel_that_skips_dead_tiles(gen):
    """``Lk - Lq`` under ``dynamic=True`` is a size used as a value: the kernel takes it
    as a size argument computed at launch from the inputs' lengths, the mask stays in
    the kernel (one kernel, nothing computed outside it but the scale) and, being
    bounded at launch, still proves key tiles dead ([Note: tile skipping]): a NaN in the
    last key's value reaches the last row only, as no tile of the first 128 rows reads
    it (eager: 0 * NaN everywhere)."""
    report = ExplainReport()
    compiled = torch.compile(_bottom_right_causal, backend=make_backend(report=report), dynamic=True)
    for q_len, k_len in ((40, 90), (300, 600)):
        q = torch.randn(1, 2, q_len, WIDTH, generator=gen)
        k, v = (torch.randn(1, 2, k_len, WIDTH, generator=gen) for _ in range(2))
        with torch.no_grad():
            out = compiled(q, k, v)
        ref = _bottom_right_causal(q.double(), k.double(), v.double())
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    v[..., -1, :] = float("nan")
    with torch.no_grad():
        out = compiled(q, k, v)
    assert torch.isfinite(out[..., :128, :]).all() and torch.isnan(out[..., -1, :]).all()
    assert len(report.kernels) == 1 and not _beyond_the_scale(report), str(report)


def test_size_texts_evaluate_as_integer_arithmetic_only():
    from flashlight.indexing import Unsupported, evaluate_size, size_formula, size_value

    assert evaluate_size("((s3 - 1)//2)", {"s3": 65}) == 32
    assert evaluate_size("s1 - s0", {"s0": 40, "s1": 90}) == 50
    assert size_formula("2*s0*s1 + s2 % 3")[1] == ("s0", "s1", "s2")
    for text in ("Max(s0, s1)", "s0/2", "__import__('os')", "s0.real", "s0 if s1 else s2"):
        with pytest.raises(Unsupported):
            size_formula(text)
    with pytest.raises(ValueError):
        evaluate_size("s0**-1", {"s0": 2})
    assert size_value(7) == Const(7, torch.int64)


def _squared_relu_causal(q, k, v):
    # no softmax: relu(s)^2 weights, causal, averaged over the keys' count (a size)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # [B, H, L, L]
    n = s.shape[-1]
    p = torch.relu(s).square().masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), 0)
    return p @ v / n


def test_an_attention_with_one_loop_reduction_fixes_its_head_width(gen):
    """``relu(q . k)^2 @ v`` has one loop reduction, which varies along every output dim,
    the value width included; that width is the head width's symbol (equal sizes share
    one), so it is a width to fix, not a length ([Note: sizes a tile must know] in
    ``passes/tiling.py``). Under ``dynamic=True`` the graph is one kernel at two
    lengths, its scores never leaving it."""
    report = ExplainReport()
    compiled = torch.compile(_squared_relu_causal, backend=make_backend(report=report), dynamic=True)
    for length in (13, 21):
        q, k, v = (torch.randn(2, HEADS, length, WIDTH, generator=gen) for _ in range(3))
        with torch.no_grad():
            out = compiled(q, k, v)
        ref = _squared_relu_causal(q.double(), k.double(), v.double())
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert len(report.kernels) == 1 and not _beyond_the_scale(report), str(report)


def _baddbmm_scaled(q, k, v):
    # older Hugging Face attention: baddbmm of a zero bias with alpha = 1 / sqrt(d), a
    # Python float of a symbolic size passed as a keyword argument
    b, h, n, d = q.shape
    s = torch.baddbmm(q.new_zeros(b * h, n, n), q.reshape(b * h, n, d), k.reshape(b * h, n, d).transpose(1, 2),
                      beta=0.0, alpha=1 / math.sqrt(d))
    return torch.bmm(torch.softmax(s, -1), v.reshape(b * h, n, d)).view(b, h, n, d)


def _decoupled_rotary(q, k, v, q_rope, k_rope):
    # queries and keys concatenated with a rotary part (one shared key head): the
    # contracted width is a sum of two symbolic sizes
    qf = torch.cat([q, q_rope], -1)
    kf = torch.cat([k, k_rope.expand(-1, q.shape[1], -1, -1)], -1)
    return torch.softmax(qf @ kf.transpose(-2, -1) / math.sqrt(qf.shape[-1]), -1) @ v


def _weights_averaged_over_heads(q, k, v):
    # nn.MultiheadAttention with need_weights: the output and the probabilities' mean over heads
    p = torch.softmax(q @ k.transpose(-2, -1) * 0.25, -1)
    return p @ v, p.mean(dim=1)


@pytest.mark.parametrize("fn, extra", [(_baddbmm_scaled, 0), (_decoupled_rotary, 2), (_weights_averaged_over_heads, 0)])
def test_scales_widths_and_counts_of_symbolic_sizes_stay_in_the_kernels(gen, fn, extra):
    """Under ``dynamic=True``: a float of sizes in a keyword argument (``baddbmm``'s
    ``alpha``; it was printed into the kernel as a variable that does not exist), a
    contracted width that is a sum of two sizes (both fixed; the scores were computed
    outside), and a mean over a symbolic count of heads (read at launch; it ran outside,
    the probabilities with it). Each matches float64 at two lengths, nothing but the
    scale's scalars outside the kernels."""
    report = ExplainReport()
    compiled = torch.compile(fn, backend=make_backend(report=report), dynamic=True)
    for length in (13, 21):
        args = [torch.randn(2, HEADS, length, WIDTH, generator=gen) for _ in range(3)]
        args += [torch.randn(2, heads, length, 8, generator=gen) for heads in (HEADS, 1)[:extra]]
        with torch.no_grad():
            outs = compiled(*args)
        refs = fn(*(a.double() for a in args))
        for out, ref in zip(*(o if isinstance(o, tuple) else (o,) for o in (outs, refs)), strict=True):
            assert torch.isfinite(out).all()
            torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert not _beyond_the_scale(report), str(report)


def _latent_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv):
    # multi-head latent attention with its key and value up-projections absorbed: the
    # queries meet a shared latent c_kv [B, L, R] through w_uk [H, C, R], a rotary part
    # meets one shared key k_rope [B, L, P]; the latent is the values too, then w_uv [R, F]
    q_latent = q_nope @ w_uk  # [B, H, L, R]
    s = q_latent @ c_kv[:, None].transpose(-1, -2) + q_rope @ k_rope[:, None].transpose(-1, -2)
    return (torch.softmax(s * 0.2, -1) @ c_kv[:, None]) @ w_uv  # [B, H, L, F]


def test_chained_contractions_fix_the_widths_their_attention_contracts(gen):
    """``(p @ c_kv) @ w_uv`` is one fused nest but no one loop (two contractions over
    different extents): the back-off cuts the attention out of it. Under ``dynamic=True``
    the widths that attention contracts (the latent, the rotary part) are fixed all the
    same (``nested_product_sizes``), so it is one kernel whose scores stay inside it,
    forward and backward: nothing larger than an input is saved, at two lengths. The
    backward's gradient of ``w_uk`` sums over the batch of inputs whose batch and heads
    are merged, two symbolic sizes no input gives apart: that kernel is left out
    (``UnreadableSizes``), the rest of the graph keeps its kernels."""
    compiled = torch.compile(_latent_attention, backend=make_backend(), dynamic=True)
    for length in (13, 18):
        args = [torch.randn(3, HEADS, length, 12, generator=gen), torch.randn(3, HEADS, length, 4, generator=gen),
                torch.randn(3, length, 10, generator=gen), torch.randn(3, length, 4, generator=gen),
                torch.randn(HEADS, 12, 10, generator=gen) / 3, torch.randn(10, 6, generator=gen) / 3]
        leaves = [a.requires_grad_() for a in args]
        saved: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            out = compiled(*leaves)
        grad_out = torch.randn(out.shape, generator=gen)
        grads = torch.autograd.grad(out, leaves, grad_out)
        exact = [a.detach().double().requires_grad_() for a in args]
        want = _latent_attention(*exact)
        want_grads = torch.autograd.grad(want, exact, grad_out.double())
        assert max(saved) <= max(a.numel() for a in args) < 3 * HEADS * length * length, saved
        for got, ref in zip((out, *grads), (want, *want_grads)):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def test_repeats_around_the_key_loop_only_where_each_pass_is_one_dot():
    """``sum_i sum_r exp(s[r, i, j]) * sum_d g[r, i, d] w[f, d]`` with ``r`` a symbolic
    count and ``j`` a grid dim: each ``(r, i)`` term is a vector over keys times a tile,
    no ``tl.dot``, so the sum over ``r`` runs as an inner loop inside the key loop. The
    loop around the key loop ([Note: the repeats outside the key loop]) would add every
    ``r`` term in each of its ``r`` passes (a gradient of latent attention's values under
    ``dynamic=True`` came out doubled with two heads)."""
    from flashlight.ir import Dim, Kernel, Load, LoopReduction, LoopResult, Reduce
    from flashlight.passes.tiling import tile

    f32 = torch.float32
    i, j, r, d, f = Dim.fresh(13, "i"), Dim.fresh("s1", "j"), Dim.fresh("s0", "r"), Dim.fresh(16, "d"), Dim.fresh(8, "f")
    p = Pointwise("exp", (Load("s", ((r,), (i,), (j,)), f32),), f32)
    dp = Reduce("sum", Pointwise("mul", (Load("g", ((r,), (i,), (d,)), f32), Load("w", ((f,), (d,)), f32)), f32),
                (d,), f32)
    body = Reduce("sum", Pointwise("mul", (p, dp), f32), (r,), f32)
    kernel = Kernel("k", ((j,), (f,)), f32, (LoopReduction("sum", body, i, (), f32),), LoopResult(0, f32), ("test",))
    tiling = tile(kernel).tiling
    assert tiling.inner_loops == (r,) and j in tiling.grid and not tiling.outer_loop


def _ending_node_einsum(z, mask, w_q, w_k, w_v, w_b):
    # triangle attention around the ending node, heads last, projections by einsum:
    # z [B, I, J, C], its transpose attends along the first residue axis
    z_t = z.transpose(-2, -3)  # [B, J, I, C]
    heads = w_b.shape[1]
    width = w_q.shape[1] // heads  # a head width split off the projection: (H c) // H
    q, k, v = (torch.einsum("bjic,cd->bjid", z_t, w).unflatten(-1, (heads, width)) for w in (w_q, w_k, w_v))
    bias = torch.einsum("bjic,ch->bhji", z_t, w_b)  # [B, H, J, I]
    s = torch.einsum("bjqhc,bjkhc->bjhqk", q, k) * width ** -0.5 + bias[:, None] \
        + (1e9 * (mask.transpose(-1, -2) - 1))[:, :, None, None, :]
    o = torch.einsum("bjhqk,bjkhc->bjqhc", torch.softmax(s, -1), v)
    return o.flatten(-2).transpose(-2, -3)  # [B, I, J, H c]


def test_a_head_width_split_off_a_projection_is_fixed_and_the_projections_stay_out(gen):
    """Under ``dynamic=True`` the head width is ``(H c) // H``, a quotient of two symbols
    (the heads a row dim of the first fusion): both are fixed, so the scores tile as
    they do static and the back-off keeps the query, key and value projections out of
    the kernel, where the first fusion had each program (one per query and feature)
    compute them again for every key tile (minutes under the interpreter). The same
    kernel as the static compile, matching float64 at two lengths."""
    channels, width = 8, 8

    def inputs(length):
        z = torch.randn(1, length, length, channels, generator=gen)
        mask = (torch.rand(1, length, length, generator=gen) > 0.2).float()
        weights = [torch.randn(channels, HEADS * width, generator=gen) / 3 for _ in range(3)]
        return [z, mask, *weights, torch.randn(channels, HEADS, generator=gen) / 3]

    kernels = {}
    for dynamic in (False, True):
        report = ExplainReport()
        compiled = torch.compile(_ending_node_einsum, backend=make_backend(report=report), dynamic=dynamic)
        for length in ((9,) if not dynamic else (9, 12)):
            args = inputs(length)
            with torch.no_grad():
                out = compiled(*args)
            ref = _ending_node_einsum(*(a.double() for a in args))
            assert torch.isfinite(out).all()
            torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
        kernels[dynamic] = [sorted(op for op in k.aten_ops if "convert" not in op) for k in report.kernels]
        assert sum(op.name == "bmm.default" for op in report.fallback_ops) == 3, str(report)  # q, k, v
    assert kernels[True] == kernels[False]

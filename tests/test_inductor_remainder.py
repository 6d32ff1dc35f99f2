"""The remainder through Inductor: a function mixing attention with layer norm, linear
layers and a gate compiles to Flashlight kernels inside an Inductor graph (C++ on the
CPU around interpreted kernels) that matches float64 eager, at changing lengths without
recompiling; the opaque launch op's fake implementation gives the kernel's shape; the
eager remainder stays available; an internal error falls back with a warning.

Inductor builds C++ on the CPU, so this file compiles few, small graphs."""
from __future__ import annotations

import unittest.mock

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import flashlight
import flashlight.backend
import flashlight.inductor
from flashlight import ops, settings
from flashlight.api import ExplainReport
from flashlight.backend import compile_count, make_backend
from tests.helpers import computes_softmax

D = 16


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def block(x, wq, wk, wv, wg, wo):
    """Pre-norm gated self-attention with a residual: x [B, L, D], weights [D, D]."""
    h = F.layer_norm(x, (x.shape[-1],))
    q, k, v = h @ wq, h @ wk, h @ wv
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    o = torch.softmax(s, dim=-1) @ v
    o = o * torch.sigmoid(h @ wg)
    return o @ wo + x


def _block_inputs(L, seed):
    return [rand(2, L, D, seed=seed)] + [rand(D, D, seed=seed + i) / D ** 0.5 for i in range(1, 6)]


def _double(args):
    return [a.double() for a in args]


@pytest.fixture(scope="module")
def compiled_block():
    """``block`` compiled with the Inductor remainder and called at three lengths:
    (report, {length: (output, inputs)}, launches compiled, graphs Dynamo compiled,
    the graphs handed to Inductor)."""
    report = ExplainReport()
    torch.compiler.reset()
    before = compile_count(), counters["stats"]["unique_graphs"]
    fn = torch.compile(block, backend=make_backend(report=report, remainder="inductor"))
    outputs = {}
    spy = unittest.mock.patch.object(flashlight.inductor, "compile_remainder", wraps=flashlight.inductor.compile_remainder)
    with settings.override(on_error="raise"), torch.no_grad(), spy as handed:
        for L in (9, 14, 21):  # static, then symbolic lengths serve 14 and 21
            args = _block_inputs(L, seed=L)
            outputs[L] = (fn(*args), args)
    graphs = [call.args[0] for call in handed.call_args_list]
    yield report, outputs, compile_count() - before[0], counters["stats"]["unique_graphs"] - before[1], graphs
    torch.compiler.reset()


def test_the_remainder_goes_through_inductor_and_matches_eager(compiled_block):
    report, outputs, _, _, graphs = compiled_block
    for L, (out, args) in outputs.items():
        assert not out.isnan().any()
        torch.testing.assert_close(out.double(), block(*_double(args)), rtol=1e-5, atol=1e-5)
    assert len(graphs) == 2  # both graphs went to Inductor
    # which nodes went where: attention in Flashlight kernels; the rest to Inductor, the
    # gate's projection and sigmoid too (a single contraction: [Note: what Flashlight
    # keeps when Inductor compiles the rest])
    kernel_ops = {op for kernel in report.kernels for op in kernel.aten_ops}
    assert computes_softmax(kernel_ops) and "bmm.default" in kernel_ops and "sigmoid.default" not in kernel_ops
    assert any(op.name == "sigmoid.default" and "left to Inductor" in op.reason for op in report.fallback_ops)
    assert report.inductor_ops and len(report.inductor_ops) == len(report.fallback_ops)
    assert all(op.runs == "inductor" for op in report.fallback_ops)
    assert "compiled by Inductor" in str(report) and not report.errors


def test_changing_lengths_compile_once_more_then_never(compiled_block):
    _, _, launches, graphs, _ = compiled_block
    # the static graph at L=9, then one graph with symbolic lengths for 14 and 21
    assert graphs == 2
    assert launches <= 2 * 2  # two kernels per graph, none for the third length


def test_the_launch_ops_fake_gives_the_kernels_shape_for_symbolic_sizes(compiled_block):
    """In the graph with symbolic lengths, each launch's value (from the fake) has the
    symbolic length of the input it came from, and is contiguous; Inductor's own size and
    stride asserts then held for the real launches at lengths 14 and 21."""
    _, outputs, _, _, graphs = compiled_block
    dynamic = graphs[1]
    launches = [n for n in dynamic.graph.nodes if n.target is flashlight.inductor.LAUNCH]
    assert launches
    x_length = next(n for n in dynamic.graph.nodes if n.op == "placeholder"
                    and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim() == 3).meta["val"].shape[1]
    assert isinstance(x_length, torch.SymInt)
    for node in launches:
        value = node.meta["val"]
        assert value.is_contiguous() and value.dtype == torch.float32
        assert any(isinstance(s, torch.SymInt) and s.node.expr == x_length.node.expr for s in value.shape), value.shape
        key = node.args[0]
        assert ops.launcher_of(key) is ops._REGISTRY[key]
    with pytest.raises(RuntimeError, match="no Flashlight kernel"):
        torch.ops.flashlight.launch("flashlight_unknown", [outputs[9][0]])


def test_the_eager_remainder_is_kept_on_request():
    args = _block_inputs(11, seed=90)
    report = ExplainReport()
    torch.compiler.reset()
    spy = unittest.mock.patch.object(flashlight.inductor, "compile_remainder", wraps=flashlight.inductor.compile_remainder)
    with settings.override(remainder="inductor", on_error="raise"), torch.no_grad(), spy as handed:
        out = torch.compile(block, backend=make_backend(report=report, remainder="eager"))(*args)
    torch.compiler.reset()
    assert not handed.called
    torch.testing.assert_close(out.double(), block(*_double(args)), rtol=1e-5, atol=1e-5)
    assert report.kernels and report.fallback_ops and not report.inductor_ops
    assert "compiled by Inductor" not in str(report)
    with pytest.raises(ValueError, match="remainder='jit'"):
        flashlight.compile(block, remainder="jit")


def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) * 0.5, dim=-1) @ v


def _attention_inputs(seed):
    return [rand(2, 3, 12, 8, seed=seed + i) for i in range(3)]


@pytest.mark.parametrize("remainder", ["eager", "inductor"])
def test_an_internal_error_falls_back_with_a_warning_and_the_reason(remainder):
    args = _attention_inputs(100)
    boom = RuntimeError("boom in codegen")
    with settings.override(remainder=remainder, on_error="fallback"), \
            unittest.mock.patch.object(flashlight.backend, "generate", side_effect=boom):
        with pytest.warns(UserWarning, match=r"Flashlight failed \(RuntimeError: boom in codegen\)"):
            report = flashlight.explain(attention, *args)
        with pytest.warns(UserWarning, match="boom in codegen"):
            torch.compiler.reset()
            out = flashlight.compile(attention)(*args)
            torch.compiler.reset()
    torch.testing.assert_close(out.double(), attention(*_double(args)), rtol=1e-5, atol=1e-5)
    assert not report.kernels and report.errors == ["Flashlight failed (RuntimeError: boom in codegen)"]
    assert report.fallback_ops and all("boom in codegen" in op.reason for op in report.fallback_ops)
    assert all(op.runs == remainder for op in report.fallback_ops)  # the whole graph to the remainder
    assert "error: Flashlight failed" in str(report)


def test_on_error_raise_raises():
    args = _attention_inputs(110)
    with settings.override(remainder="eager", on_error="raise"), \
            unittest.mock.patch.object(flashlight.backend, "generate", side_effect=RuntimeError("boom in codegen")):
        torch.compiler.reset()
        with pytest.raises(Exception, match="boom in codegen"):
            flashlight.compile(attention)(*args)
        torch.compiler.reset()


def test_the_settings_name_a_bad_value(monkeypatch):
    monkeypatch.setenv("FLASHLIGHT_ON_ERROR", "ignore")
    with pytest.raises(ValueError, match="FLASHLIGHT_ON_ERROR='ignore': expected one of fallback, raise"):
        settings.get("on_error")


def test_gradients_through_the_inductor_remainder_match_eager():
    """Training graphs: the forward saves views of one tensor for the backward (a
    softmax and its detached copy), so Inductor must not reuse their memory."""
    args = _block_inputs(10, seed=3)
    weights = [a.requires_grad_() for a in args[1:]]
    torch.compiler.reset()
    with settings.override(on_error="raise"):
        out = flashlight.compile(block, remainder="inductor")(*args)
        out.square().sum().backward()
    torch.compiler.reset()
    ref_args = [a.detach().double().requires_grad_() for a in args]
    ref = block(*ref_args)
    ref.square().sum().backward()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for w, r in zip(weights, ref_args[1:]):
        torch.testing.assert_close(w.grad.double(), r.grad, rtol=1e-4, atol=1e-4)


def _written_out_softmax(q, k, v):
    """A softmax written out in the inputs' dtype: its max's derivative compares the
    scores with their max for equality."""
    s = q @ k.transpose(-1, -2) * 0.35  # [B, H, L, L]
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p @ v) / p.sum(-1, keepdim=True)


def test_a_comparison_of_rounded_floats_in_the_remainder_finds_its_ties():
    """The backward of a softmax written out in bfloat16 counts the scores equal to
    their max in Inductor; kept unrounded in one kernel and rounded in another, none was
    equal, the count zero and most gradients NaN ([Note: exact comparisons in the
    remainder] in flashlight/inductor.py). Finite, and within 2e-2 of float64 relative
    to each gradient's largest value."""
    gen = torch.Generator().manual_seed(7)
    inputs = [torch.randn(2, 2, 13, 8, generator=gen) for _ in range(3)]
    args = [x.to(torch.bfloat16).requires_grad_() for x in inputs]
    grad_out = torch.randn(2, 2, 13, 8, generator=gen, dtype=torch.float64)
    torch.compiler.reset()
    with settings.override(on_error="raise"):
        out = flashlight.compile(_written_out_softmax, remainder="inductor")(*args)
        got = torch.autograd.grad(out, args, grad_out.to(out.dtype))
    torch.compiler.reset()
    reference = [x.double().requires_grad_() for x in inputs]
    want = torch.autograd.grad(_written_out_softmax(*reference), reference, grad_out)
    for what, g, w in zip("qkv", got, want, strict=True):
        assert torch.isfinite(g).all(), f"d{what}: non-finite values"
        assert (g.double() - w).abs().max() <= 2e-2 * w.abs().max(), f"d{what}"


def _banded(q, k, v):
    # a band of width 3 from aranges; masked scores replaced by a tensor constant
    i = torch.arange(q.shape[-2], device=q.device)
    near = (i[:, None] - i[None, :]).abs() <= 3
    s = torch.where(near, q @ k.transpose(-1, -2) * 0.25, torch.tensor(float("-inf"), device=q.device))
    return torch.softmax(s, -1) @ v


def test_a_tensor_constant_read_by_a_kernel_reaches_inductor_as_a_fake_tensor():
    """A constant the function makes (``torch.tensor(-inf)``) is an attribute of the
    training graphs; where a kernel reads it, Inductor's trace of the remainder hands the
    launch a fake tensor for it (it handed it the real one, failed, and the whole
    remainder ran eagerly). Values and gradients match float64."""
    gen = torch.Generator().manual_seed(7)
    leaves = [torch.randn(2, 2, 11, 16, generator=gen, requires_grad=True) for _ in range(3)]
    torch.compiler.reset()
    with settings.override(on_error="raise"):
        out = flashlight.compile(_banded, remainder="inductor")(*leaves)
        grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
    torch.compiler.reset()
    exact = [x.detach().double().requires_grad_() for x in leaves]
    ref = _banded(*exact)
    ref_grads = torch.autograd.grad(ref, exact, torch.ones_like(ref))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def attention_only(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def test_a_graph_fused_whole_skips_inductor():
    """Views around one kernel: Inductor would only add host time to each call."""
    q, k, v = (rand(2, 8, D, seed=s) for s in (21, 22, 23))
    fail = unittest.mock.patch.object(flashlight.inductor, "compile_remainder",
                                      side_effect=AssertionError("Inductor was called"))
    with settings.override(remainder="inductor", on_error="raise"), torch.no_grad(), fail:
        torch.compiler.reset()
        out = flashlight.compile(attention_only, remainder="inductor")(q, k, v)
    torch.compiler.reset()
    want = attention_only(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-6)


def gated_product_then_attention(a, b, ga, gb, q, k):
    """A gated contraction over a shared dim (as a triangle multiplication computes one),
    used as the values of an attention: x [L, L, C] = sum_k (a * sigmoid(ga))[i, k] *
    (b * sigmoid(gb))[j, k]."""
    x = torch.einsum("ikc,jkc->ijc", a * torch.sigmoid(ga), b * torch.sigmoid(gb))  # [L, L, C]
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # [L, L, L]
    return torch.softmax(s, dim=-1) @ x


@pytest.mark.parametrize("remainder", ["eager", "inductor"])
def test_single_contractions_are_left_to_inductor_and_attention_is_kept(remainder):
    """[Note: what Flashlight keeps when Inductor compiles the rest]: with the Inductor
    remainder the gated contraction runs in Inductor, with the reason, and only the
    attention is a Flashlight kernel; with the eager remainder both are kernels."""
    L, C = 9, 8
    args = [rand(L, L, C, seed=40 + i) for i in range(4)] + [rand(L, L, C, seed=50 + i) for i in range(2)]
    report = ExplainReport()
    torch.compiler.reset()
    with settings.override(on_error="raise"), torch.no_grad():
        out = torch.compile(gated_product_then_attention,
                            backend=make_backend(report=report, remainder=remainder))(*args)
    torch.compiler.reset()
    torch.testing.assert_close(out.double(), gated_product_then_attention(*_double(args)), rtol=1e-5, atol=1e-5)
    kernels = [set(kernel.aten_ops) for kernel in report.kernels]
    assert any(computes_softmax(ops_) for ops_ in kernels), str(report)
    contraction_kernels = [ops_ for ops_ in kernels if "sigmoid.default" in ops_]
    if remainder == "eager":
        assert contraction_kernels, str(report)
    else:
        assert not contraction_kernels, str(report)
        assert any("left to Inductor" in op.reason and op.runs == "inductor" for op in report.fallback_ops), str(report)


def test_a_graph_without_kernels_is_compiled_as_torch_compile_compiles_it():
    """[Note: a graph Flashlight fuses nothing in]: Inductor's ``compile_fx`` receives the
    graph Dynamo captured (not Flashlight's ATen graph), the result matches float64, and
    the report says Inductor ran every operation."""
    from torch._inductor import compile_fx

    def no_attention(x, w):
        return torch.tanh(x @ w).cumsum(-1) * 0.5 + x

    x, w = rand(3, 5, 8, seed=120), rand(8, 8, seed=121)
    torch.compiler.reset()
    with settings.override(remainder="inductor"), \
            unittest.mock.patch.object(compile_fx, "compile_fx", wraps=compile_fx.compile_fx) as whole:
        report = flashlight.explain(no_attention, x, w)
        with torch.no_grad():
            out = flashlight.compile(no_attention)(x, w)
    torch.compiler.reset()
    assert whole.call_count >= 1
    graph = whole.call_args.args[0]
    assert not any(str(node.target).startswith("aten.") for node in graph.graph.nodes)  # Dynamo's, not ATen
    torch.testing.assert_close(out.double(), no_attention(*_double([x, w])), rtol=1e-5, atol=1e-5)
    assert not report.kernels and report.fallback_ops
    assert all(op.runs == "inductor" for op in report.fallback_ops), str(report)



P_DROP = 0.25


def dropped_block(x, wq, wk, wv, wg, wo):
    """``block`` with dropout on the attention's update before the residual, as
    OpenFold applies it."""
    h = F.layer_norm(x, (x.shape[-1],))
    o = attention_only(h @ wq, h @ wk, h @ wv) * torch.sigmoid(h @ wg)
    return F.dropout(o @ wo, P_DROP, training=True) + x


def test_dropout_compiles_in_the_inductor_remainder_and_its_gradient_uses_the_same_mask():
    """[Note: random numbers in the remainder]: a graph with dropout compiles through
    Inductor (it failed Inductor's lowering and ran eagerly before); about ``P_DROP`` of
    the values are dropped; the gradients are those of the mask the forward drew (read
    from its output: a dropped value leaves the residual alone); a restored generator
    state draws the same mask again, as activation checkpointing needs."""
    args = _block_inputs(12, seed=31)
    weights = [a.requires_grad_() for a in args[1:]]
    torch.compiler.reset()
    fn = flashlight.compile(dropped_block, remainder="inductor")
    spy = unittest.mock.patch.object(flashlight.inductor, "compile_remainder", wraps=flashlight.inductor.compile_remainder)
    with settings.override(on_error="raise"), spy as remainder:
        state = torch.get_rng_state()
        out = fn(*args)
        out.square().sum().backward()
        torch.set_rng_state(state)
        with torch.no_grad():
            again = fn(*args)
    torch.compiler.reset()
    assert [c.args[2] for c in remainder.call_args_list] == ["forward", "backward", "inference"]
    torch.testing.assert_close(again, out.detach(), rtol=0, atol=0)
    x = args[0]
    kept = ((out.detach() - x) != 0).double()  # [B, L, D]
    assert 0.1 < 1 - kept.mean().item() < 0.4, "about P_DROP of the values are dropped"
    ref_args = [a.detach().double().requires_grad_() for a in args]
    h = F.layer_norm(ref_args[0], (D,))
    o = attention_only(h @ ref_args[1], h @ ref_args[2], h @ ref_args[3]) * torch.sigmoid(h @ ref_args[4])
    ref = (o @ ref_args[5]) * kept / (1 - P_DROP) + ref_args[0]
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    ref.square().sum().backward()
    for w, r in zip(weights, ref_args[1:]):
        torch.testing.assert_close(w.grad.double(), r.grad, rtol=1e-4, atol=1e-4)

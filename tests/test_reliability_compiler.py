"""The compiler on inputs it must not get wrong: integer and float64 graphs (exact in
their dtype, or left to PyTorch with the reason), zero-size dims (at compile time and
at run time, through a kernel compiled for symbolic sizes) and tensors on devices
Flashlight kernels cannot run on. Every case gives what eager PyTorch gives, and
``flashlight.explain`` names the reason for what it leaves to PyTorch."""
from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

import flashlight
from bench.variants import VARIANTS
from flashlight import settings
from flashlight.backend import build
from flashlight.decompositions import decompositions
from flashlight.ir import Const, Dim, Load, Pointwise, walk
from flashlight.lower import lower
from flashlight.runtime import COMPILE_EVENTS, Launcher
from tests.test_compiler import capture


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _big_ints(*shape, dtype=torch.int64, seed=0):
    """Integers around 1e7, where float32 (24-bit mantissa) sums are not exact."""
    return torch.randint(10**7 - 10**5, 10**7, shape, generator=_gen(seed)).to(dtype)


def _randn(*shape, dtype=torch.float32, seed=0, device="cpu"):
    return torch.randn(*shape, generator=_gen(seed), dtype=dtype).to(device)


def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) * 0.3, dim=-1) @ v


def _compiled(fn, *args):
    torch.compiler.reset()
    with torch.no_grad():
        return torch.compile(fn, backend="flashlight")(*args)


def _same(out, ref, exact: bool, rtol=1.3e-6, atol=1e-5):
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.device == ref.device
    if exact:
        assert torch.equal(out, ref), (out, ref)
    else:
        torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, equal_nan=True)


def _reasons(report) -> str:
    return "\n".join(f"{op.name}: {op.reason}" for op in report.fallback_ops)


# --------------------------------------------------------- integers and float64


def _int_sum(x):
    return (x * 2).sum(-1)


def _cumulative_mix(x):
    return torch.cumsum(x, -1) + (x * 3).sum(-1, keepdim=True)


def _int_matmul(a, b):
    return (a @ b) * 2 + 1


def _odd_max(x):
    return (x * 2 + 1).amax(-1)


def _true_count(x):
    return ((x % 3) == 0).sum(-1)


INTEGER_CASES = {
    "int64 sum": (_int_sum, lambda: (_big_ints(3, 31),)),
    "int32 sum": (_int_sum, lambda: (_big_ints(3, 31, dtype=torch.int32),)),
    "cumulative mix": (_cumulative_mix, lambda: (_big_ints(2, 3, 17),)),
    "int matmul": (_int_matmul, lambda: (torch.randint(-3000, 3000, (2, 5, 24), generator=_gen(1)),
                                         torch.randint(-3000, 3000, (2, 24, 6), generator=_gen(2)))),
    "int max": (_odd_max, lambda: (_big_ints(3, 20) * 2,)),  # odd values above 2**24
    "bool count": (_true_count, lambda: (_big_ints(4, 40),)),
}


@pytest.mark.parametrize("case", INTEGER_CASES)
def test_integer_reductions_are_exact_and_left_to_pytorch_with_the_reason(case):
    fn, make = INTEGER_CASES[case]
    args = make()
    _same(_compiled(fn, *args), fn(*args), exact=True)
    report = flashlight.explain(fn, *args)
    assert not report.kernels, str(report)
    assert "values (Flashlight kernels accumulate in float32)" in _reasons(report), str(report)


FLOAT64_CASES = {
    "float64 attention": (attention, lambda: tuple(_randn(2, 3, 24, 8, dtype=torch.float64, seed=s) for s in range(3))),
    "float64 sum": (lambda x: (x * 0.5).exp().sum(-1), lambda: (_randn(3, 40, dtype=torch.float64),)),
}


@pytest.mark.parametrize("case", FLOAT64_CASES)
def test_float64_is_computed_in_float64(case):
    fn, make = FLOAT64_CASES[case]
    args = make()
    # float32 arithmetic would be off by ~1e-7 relative
    _same(_compiled(fn, *args), fn(*args), exact=False, rtol=1e-12, atol=1e-12)
    report = flashlight.explain(fn, *args)
    assert "float64 values (Flashlight kernels compute in float32)" in _reasons(report), str(report)


def test_float32_attention_still_fuses_when_its_result_is_cast_to_float64():
    def fn(q, k, v):
        return attention(q, k, v).double() * 3.0

    q, k, v = (_randn(2, 24, 8, seed=s) for s in range(3))
    _same(_compiled(fn, q, k, v), fn(q, k, v), exact=False)
    report = flashlight.explain(fn, q, k, v)
    assert len(report.kernels) == 1 and "float64 values" in _reasons(report), str(report)


def test_float64_inputs_cast_to_float32_first_still_fuse():
    def fn(x):
        return (x.float() * 0.5).exp().sum(-1)

    x = _randn(3, 40, dtype=torch.float64)
    _same(_compiled(fn, x), fn(x), exact=False)
    assert len(flashlight.explain(fn, x).kernels) == 1


@pytest.mark.parametrize("name", ["document_mask", "cross_attention"])
def test_integer_and_boolean_masks_still_fuse(name):
    # document ids (int64 loads compared for equality) and a padding mask (bool loads)
    variant = VARIANTS[name]
    small = {"document_mask": {"L": 24, "D": 8}, "cross_attention": {"Lq": 9, "Lkv": 20, "D": 8}}[name]
    args = variant.make_inputs({**variant.default_shape, **small}, torch.float32, "cpu", _gen(3))
    report = flashlight.explain(variant.fn, *args)
    assert len(report.kernels) == 1 and not report.fallback_ops, str(report)
    ref = variant.fn(*(a.double() if a.is_floating_point() else a for a in args))
    torch.testing.assert_close(_compiled(variant.fn, *args).double(), ref, rtol=1e-5, atol=1e-5)


def test_the_reason_is_logged_at_debug_level_one(caplog):
    with settings.override(debug=1), caplog.at_level(logging.WARNING, logger="flashlight"):
        _compiled(_int_sum, _big_ints(3, 31))
    assert any("sum.dim_IntList" in r.message and "accumulate in float32" in r.message for r in caplog.records)


def test_integer_elementwise_ops_are_lowered_to_integer_arithmetic():
    def fn(x, m):
        return torch.relu(x) * 3 + torch.floor(x) + x.masked_fill(m, 7)

    lowered = lower(capture(fn, _big_ints(3, 8) - 10**7 + 10**5 // 2, torch.rand(3, 8, generator=_gen(4)) > 0.5))
    assert not lowered.opaque, lowered.opaque
    ops = {node.op for nest in lowered.graph.nests for node in walk(nest.body) if isinstance(node, Pointwise)}
    assert "relu" not in ops and "floor" not in ops  # relu is max(x, 0) in int64; floor is x


@pytest.mark.parametrize("fn, why", [
    (lambda x, m: x.masked_fill(m, 2.5) + 1, "with a float operand"),
    (lambda x, m: torch.logical_and(x, m) | m, "a logical and of integers"),
])
def test_integer_ops_the_kernels_would_print_in_float32_are_left_to_pytorch(fn, why):
    x, m = _big_ints(3, 8), torch.rand(3, 8, generator=_gen(5)) > 0.5
    lowered = lower(capture(fn, x, m))
    assert any(why in reason for reason in lowered.opaque.values()), lowered.opaque
    _same(_compiled(fn, x, m), fn(x, m), exact=True)


def test_numerics_check_flags_float64_loads_not_cast_once_to_float32():
    from flashlight.ir import Nest
    from flashlight.lower import inexact_reason

    d = Dim.fresh(4)
    x64 = Load("x", ((d,),), torch.float64)
    cast = Pointwise("cast", (x64,), torch.float32)
    assert inexact_reason(Nest("a", ((d,),), Pointwise("exp", (cast,), torch.float32), torch.float32, ())) is None
    bf16 = Pointwise("cast", (x64,), torch.bfloat16)  # rounded twice through float32
    assert "float64" in inexact_reason(Nest("b", ((d,),), bf16, torch.bfloat16, ()))
    as_int = Pointwise("cast", (x64,), torch.int64)
    assert "float64" in inexact_reason(Nest("c", ((d,),), as_int, torch.int64, ()))
    ok = Pointwise("add", (Load("i", ((d,),), torch.int64), Const(1, torch.int64)), torch.int64)
    assert inexact_reason(Nest("d", ((d,),), ok, torch.int64, ())) is None


# ------------------------------------------------------------------ zero sizes


def _qkv(B, Lq, Lk, D, seed=0):
    return _randn(B, Lq, D, seed=seed), _randn(B, Lk, D, seed=seed + 1), _randn(B, Lk, D, seed=seed + 2)


def _softmax_scores(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2), dim=-1)


def _exp_sum(x):
    return (x * 0.5).exp().sum(-1)


def _lse(q, k, v):
    return torch.logsumexp(q @ k.transpose(-1, -2), dim=-1)


ZERO_CASES = {
    "zero L": (attention, lambda: _qkv(2, 0, 0, 8)),
    "zero batch": (attention, lambda: _qkv(0, 6, 6, 8)),
    "zero head width": (attention, lambda: _qkv(2, 6, 6, 0)),
    "zero keys": (attention, lambda: _qkv(2, 6, 0, 8)),  # zeros, as eager gives
    "softmax over zero keys": (_softmax_scores, lambda: _qkv(2, 6, 0, 8)),
    "logsumexp over zero keys": (_lse, lambda: _qkv(2, 6, 0, 8)),  # -inf
    "sum over an empty dim": (_exp_sum, lambda: (_randn(3, 0),)),
}


@pytest.mark.parametrize("case", ZERO_CASES)
def test_zero_size_graphs_give_what_eager_gives(case):
    fn, make = ZERO_CASES[case]
    args = make()
    _same(_compiled(fn, *args), fn(*args), exact=False)
    report = flashlight.explain(fn, *args)
    assert not report.kernels and "a zero-size tensor" in _reasons(report), str(report)


RUNTIME_ZERO_CASES = {
    "zero keys": (attention, lambda L: _qkv(2, 6, L, 8), [1, 2]),
    "softmax over zero keys": (_softmax_scores, lambda L: _qkv(2, 6, L, 8), [1, 2]),
    "sum over an empty dim": (_exp_sum, lambda L: (_randn(3, L),), [0]),
}


@pytest.mark.parametrize("case", RUNTIME_ZERO_CASES)
def test_a_kernel_for_symbolic_sizes_launched_at_size_zero_gives_what_eager_gives(case):
    fn, make, symbolic = RUNTIME_ZERO_CASES[case]

    def unbacked(args):  # no 0/1 specialization: the same kernel serves length 0
        for k in symbolic:
            torch._dynamo.decorators.mark_unbacked(args[k], 1)
        return args

    compiled = torch.compile(fn, backend="flashlight")
    with torch.no_grad():
        compiled(*unbacked(make(8)))
        loaded = len(COMPILE_EVENTS)
        args = unbacked(make(0))
        out = compiled(*args)
    assert len(COMPILE_EVENTS) == loaded  # no new kernel: the symbolic one was launched
    _same(out, fn(*args), exact=False)


def _dynamic_launcher(fn, *argsets):
    """The one launcher of the graph the backend built for the last of ``argsets``, and
    which argument of ``fn`` each of its inputs is."""
    built, calls = [], []

    def fw(gm, example_inputs):
        graph = build(gm, example_inputs, None, {})
        built.append(graph)
        return lambda *args: calls.append(args) or graph(*args)

    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=fw, decompositions=decompositions(inference=True)))
    with torch.no_grad():
        for args in argsets:
            compiled(*args)
    graph, passed = built[-1], calls[-1]
    placeholders = [n.name for n in graph.graph.nodes if n.op == "placeholder"]
    position = {name: next(k for k, a in enumerate(argsets[-1]) if a is value)
                for name, value in zip(placeholders, passed) if isinstance(value, torch.Tensor)}
    (launcher,) = [n.target for n in graph.graph.nodes if isinstance(n.target, Launcher)]
    return graph, launcher, [position[name] for name in launcher.src.inputs]


def test_a_launcher_for_dynamic_lengths_reads_sizes_for_its_eager_form():
    # after a second length Dynamo marks it dynamic: sizes are graph inputs (SymInts)
    graph, launcher, order = _dynamic_launcher(attention, _qkv(2, 8, 6, 8), _qkv(2, 16, 12, 8))
    assert any(isinstance(n.meta.get("val"), torch.SymInt) for n in graph.graph.nodes if n.op == "placeholder")
    assert launcher.eager is not None
    # at sizes of neither capture (the graph's backed sizes are at least 2, so its
    # decomposed softmax always has a key; length 0 needs unbacked sizes, tested above)
    args = _qkv(2, 5, 3, 8)
    _same(launcher.eager(*(args[k] for k in order)), attention(*args), exact=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_kernels_unfused_graph_runs_pytorchs_softmax(dtype):
    """What autotuning times the kernel against, and runs where it loses, computes the
    softmax as PyTorch's one operation (the decomposed parts, in float32 between two
    casts for 16-bit scores, read and write the scores five times over), with eager's
    values."""
    argsets = [tuple(t.to(dtype) for t in _qkv(2, Lq, Lk, 8, seed=Lq)) for Lq, Lk in ((8, 6), (16, 12))]
    _, launcher, order = _dynamic_launcher(attention, *argsets)
    targets = [n.target for n in launcher.eager.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten._softmax.default) == 1, targets
    assert not {torch.ops.aten.amax.default, torch.ops.aten.exp.default, torch.ops.aten._to_copy.default} & set(targets)
    args = tuple(t.to(dtype) for t in _qkv(2, 5, 3, 8, seed=11))
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    _same(launcher.eager(*(args[k] for k in order)), attention(*args), exact=False, **tol)


def test_a_launcher_without_an_eager_form_names_the_zero_size_in_one_line():
    _, launcher, order = _dynamic_launcher(attention, _qkv(2, 8, 6, 8), _qkv(2, 16, 12, 8))
    launcher.eager = None
    args = _qkv(2, 5, 0, 8)
    with pytest.raises(RuntimeError, match="zero-size dim") as raised:
        launcher(*(args[k] for k in order))
    assert "\n" not in str(raised.value)
    args = _qkv(2, 0, 7, 8)
    assert launcher(*(args[k] for k in order)).shape == (2, 0, 8)  # an empty result needs no eager form


# --------------------------------------------------------------------- devices


def test_meta_tensors_run_as_pytorch_runs_them():
    args = tuple(_randn(2, 6, 8, seed=s, device="meta") for s in range(3))
    out = _compiled(attention, *args)
    assert out.device.type == "meta" and out.shape == attention(*args).shape
    report = flashlight.explain(attention, *args)
    assert not report.kernels and "tensors on meta" in _reasons(report), str(report)


def test_cpu_tensors_without_the_interpreter_run_as_pytorch_runs_them():
    args = _qkv(2, 6, 6, 8)
    with settings.override(interpret=False), pytest.warns(UserWarning, match="TRITON_INTERPRET"):
        out = _compiled(attention, *args)
        report = flashlight.explain(attention, *args)
    _same(out, attention(*args), exact=False)
    assert not report.kernels and "CPU tensors without the Triton interpreter" in _reasons(report), str(report)


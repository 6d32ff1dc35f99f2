"""Traced capture ([Note: traced capture] in flashlight/traced.py): compiling a pure
function without Dynamo, its guards, its graphs kept on disk for a later process, and
its fall-backs (gradients, functions that cannot be traced, damaged cache files)."""
from __future__ import annotations

import os
import pickle

import pytest
import torch

import flashlight
from flashlight import settings
from flashlight.codegen import fp32_precision
from flashlight.traced import TracedFunction
from tests.helpers import aten_outside_kernels


def gated(q, k, v, mask_bias, pair_bias, g):
    """Gated attention with two broadcast biases (OpenFold's MSA row attention core)."""
    s = (q / q.shape[-1] ** 0.5) @ k.transpose(-1, -2) + mask_bias + pair_bias
    return (torch.softmax(s, -1) @ v).transpose(-2, -3) * torch.sigmoid(g)


def cross(q, k, v, bias):
    """Attention of ``Q`` queries over ``K`` keys with a key-mask bias."""
    return torch.softmax(q @ k.transpose(-1, -2) + bias, -1) @ v


def gated_inputs(gen, n, length, heads=2, width=8):
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return (r(n, heads, length, width), r(n, heads, length, width), r(n, heads, length, width),
            r(n, 1, 1, length), r(1, heads, length, length), r(n, length, heads, width))


def assert_matches_float64(fn, out, args):
    ref = fn(*(a.double() for a in args))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.fixture
def cache_dir(tmp_path):
    with settings.override(cache_dir=str(tmp_path)):
        yield tmp_path


def test_static_then_symbolic_capture_and_one_kernel(gen, cache_dir):
    traced = flashlight.compile(gated, capture="trace")
    assert isinstance(traced, TracedFunction)
    with torch.no_grad():
        for n, length in [(3, 12), (3, 12), (2, 17), (4, 9)]:
            args = gated_inputs(gen, n, length)
            assert_matches_float64(gated, traced(*args), args)
        # one static capture, then one symbolic capture serving every later length
        assert traced.captures == 2
        assert [e.signature is None for e in traced._entries] == [False, True]
        assert aten_outside_kernels(traced, args) == []


@pytest.mark.parametrize("dynamic, captures", [(True, 1), (False, 3)])
def test_dynamic_as_torch_compile_means_it(gen, cache_dir, dynamic, captures):
    """``dynamic=True``: sizes symbolic from the first capture; ``False``: one per shape."""
    traced = flashlight.compile(gated, capture="trace", dynamic=dynamic)
    with torch.no_grad():
        for n, length in [(3, 12), (2, 17), (4, 9)]:
            args = gated_inputs(gen, n, length)
            assert_matches_float64(gated, traced(*args), args)
    assert traced.captures == captures
    assert all((e.signature is None) == dynamic for e in traced._entries)


def test_a_later_process_loads_the_graphs_instead_of_tracing(gen, cache_dir):
    first = flashlight.compile(gated, capture="trace")
    shapes = [(3, 12), (2, 17)]
    with torch.no_grad():
        for n, length in shapes:
            first(*gated_inputs(gen, n, length))
    assert first.captures == 2 and len(os.listdir(cache_dir / "graphs")) == 1
    # a new TracedFunction of the same function reads what the first one wrote
    later = flashlight.compile(gated, capture="trace")
    with torch.no_grad():
        for n, length in [*shapes, (5, 21)]:
            args = gated_inputs(gen, n, length)
            assert_matches_float64(gated, later(*args), args)
    assert later.captures == 0
    # another version of the code it calls, or the cache switched off: traced again
    other = flashlight.compile(gated, capture="trace", version="2")
    with torch.no_grad():
        other(*gated_inputs(gen, 3, 12))
    assert other.captures == 1
    with settings.override(graph_cache=False), torch.no_grad():
        off = flashlight.compile(gated, capture="trace")
        off(*gated_inputs(gen, 3, 12))
        assert off.captures == 1


def test_a_preload_runs_the_kept_static_graphs_before_the_first_call(gen, cache_dir, monkeypatch):
    """[Note: preloading kept graphs]: a later process's preload loads the kept graphs and
    runs the static one on zeros of its exact signature (here a view at an offset), so
    the first real call of that signature is served at once and computes the right
    values; graphs of other devices and inputs over the size limit are left alone."""
    from flashlight import traced as traced_module

    qkv = torch.randn(3, 2, 12, 24, generator=gen)  # q, k, v: views of one buffer
    bias = torch.randn(3, 1, 1, 12, generator=gen)
    args = (qkv[..., 8:16], qkv[..., :8], qkv[..., 16:], bias)
    with torch.no_grad():
        flashlight.compile(cross, capture="trace")(*args)
    later = flashlight.compile(cross, capture="trace")
    assert later.preload(devices=("cuda",)) == 0 and later._by_signature == {}  # a CPU graph
    assert later.preload(devices=("cpu",), max_bytes=100) == 0  # its inputs take more
    ran = []
    real_zeros = traced_module._zeros_of
    monkeypatch.setattr(traced_module, "_zeros_of", lambda *a: ran.append(1) or real_zeros(*a))
    assert later.preload(devices=("cpu",)) == 1 and ran == [1]
    assert list(later._by_signature) == [(traced_module.call_signature(list(args)), fp32_precision())]
    monkeypatch.setattr(traced_module.TracedFunction, "_entry_for",
                        lambda *a: pytest.fail("a preloaded signature is a dictionary look-up"))
    with torch.no_grad():
        assert_matches_float64(cross, later(*args), args)
    assert later.captures == 0
    assert later.preload(devices=("cpu",)) == 0  # already served: not run again


def test_a_preload_never_tunes_a_kernel_without_a_recorded_choice():
    """Inside ``known_choices_only`` a first GPU launch whose launch settings no process
    recorded raises instead of autotuning (the preload then leaves it to the first call)."""
    from flashlight import runtime

    class Unknown:
        __name__ = "k"
        _known_choice = staticmethod(lambda device, sizes, eager_ok: (None, None))

    with pytest.raises(runtime.NoKnownChoice):
        runtime.Launcher._check_known(Unknown(), torch.device("cpu"), (4,), tune=True)
    with pytest.raises(runtime.NoKnownChoice):  # untuned: it would compile its first candidate
        runtime.Launcher._check_known(Unknown(), torch.device("cpu"), (4,), tune=False)
    Unknown._known_choice = staticmethod(lambda device, sizes, eager_ok: ({"BLOCK_M": 64}, "tuning cache"))
    runtime.Launcher._check_known(Unknown(), torch.device("cpu"), (4,), tune=True)


def test_inputs_laid_out_otherwise_are_captured_static_again(gen, cache_dir):
    """The same sizes with other strides (the pair bias of triangle attention around the
    ending node: the transposed pair representation) is a second static capture, as
    torch.compile recompiles for it, not a symbolic one whose every size its guard pins."""
    traced = flashlight.compile(gated, capture="trace")
    args = list(gated_inputs(gen, 3, 12))
    with torch.no_grad():
        assert_matches_float64(gated, traced(*args), args)
        args[4] = torch.randn(1, 2, 12, 12, generator=gen).transpose(-1, -2)
        assert_matches_float64(gated, traced(*args), args)
    assert traced.captures == 2 and all(e.signature is not None for e in traced._entries)


def test_guards_reject_inputs_the_graph_did_not_see(gen, cache_dir):
    """A symbolic capture leaves the sizes that changed symbolic and guards the others:
    a call with a bias that no longer broadcasts the same way must not be served by it."""
    traced = flashlight.compile(cross, capture="trace")
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    calls = [(10, 10, (2, 1, 1, 10)), (13, 13, (2, 1, 1, 13)),  # static, then symbolic lengths
             (7, 11, (2, 1, 1, 11)),  # Q != K: the same symbolic graph
             (7, 11, (2, 2, 7, 11))]  # a bias per head and query: captured again
    with torch.no_grad():
        for queries, keys, bias in calls:
            args = (r(2, 2, queries, 8), r(2, 2, keys, 8), r(2, 2, keys, 8), r(*bias))
            assert_matches_float64(cross, traced(*args), args)
    assert traced.captures == 3


def test_views_at_other_offsets_are_served_correctly(gen, cache_dir):
    """Slices of one buffer (as fused projections give) differ only in storage offset."""
    traced = flashlight.compile(cross, capture="trace")
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    qkv = r(2, 2, 9, 24)
    bias = r(2, 1, 1, 9)
    with torch.no_grad():
        for order in ((0, 1, 2), (2, 0, 1)):
            q, k, v = (qkv[..., 8 * i:8 * (i + 1)] for i in order)
            assert_matches_float64(cross, traced(q, k, v, bias), (q, k, v, bias))


def test_gradients_go_through_dynamo(gen, cache_dir):
    traced = flashlight.compile(gated, capture="trace")
    args = [a.requires_grad_() for a in gated_inputs(gen, 2, 9)]
    traced(*args).square().sum().backward()
    grads = [a.grad for a in args]
    ref_args = [a.detach().double().requires_grad_() for a in args]
    gated(*ref_args).square().sum().backward()
    for grad, ref in zip(grads, ref_args):
        torch.testing.assert_close(grad.double(), ref.grad, rtol=1e-4, atol=1e-4)
    assert traced.captures == 0


def value_dependent(q, k, v, bias):
    """Python control flow on a tensor's value: not a pure graph, so it cannot be traced."""
    if bool(bias.sum() > 0):
        bias = bias * 2
    return cross(q, k, v, bias)


def test_a_function_that_cannot_be_traced_falls_back_to_dynamo(gen, cache_dir):
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    args = (r(2, 2, 9, 8), r(2, 2, 9, 8), r(2, 2, 9, 8), r(2, 1, 1, 9))
    with settings.override(on_error="raise"), torch.no_grad(), pytest.raises(Exception):
        flashlight.compile(value_dependent, capture="trace")(*args)
    traced = flashlight.compile(value_dependent, capture="trace")
    with settings.override(on_error="fallback"), torch.no_grad():
        out = traced(*args)
    assert_matches_float64(value_dependent, out, args)
    assert traced.captures == 0 and not os.path.exists(cache_dir / "graphs")


def test_a_damaged_cache_file_is_ignored(gen, cache_dir, caplog):
    args = gated_inputs(gen, 3, 12)
    with torch.no_grad():
        flashlight.compile(gated, capture="trace")(*args)
    (path,) = (cache_dir / "graphs").iterdir()
    path.write_bytes(pickle.dumps("not a list of entries")[:5])
    later = flashlight.compile(gated, capture="trace")
    with torch.no_grad():
        assert_matches_float64(gated, later(*args), args)
    assert later.captures == 1 and "ignoring the traced graphs" in caplog.text


def test_keyword_and_non_tensor_arguments_go_through_dynamo(gen, cache_dir):
    traced = flashlight.compile(cross, capture="trace")
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    args = (r(2, 2, 9, 8), r(2, 2, 9, 8), r(2, 2, 9, 8))
    bias = r(2, 1, 1, 9)
    with torch.no_grad():
        assert_matches_float64(cross, traced(*args, bias=bias), (*args, bias))
        assert_matches_float64(cross, traced(*args, 0.5), (*args, torch.tensor(0.5)))
    assert traced.captures == 0


def test_unknown_capture_is_an_error():
    with pytest.raises(ValueError, match="capture"):
        flashlight.compile(gated, capture="jit")


def attention_then_cumsum(q, k, v, w):
    """A layer norm feeding attention, and a cumulative sum after it that no kernel fuses:
    the remainder has work for Inductor."""
    q = torch.nn.functional.layer_norm(q, q.shape[-1:]) * w
    o = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    return o.cumsum(-2) + 1.0, o


def test_inductor_compiles_the_remainder_of_a_traced_graph(gen, cache_dir):
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    traced = flashlight.compile(attention_then_cumsum, capture="trace")
    with settings.override(remainder="inductor"), torch.no_grad():
        for length in (16, 24):
            args = (r(2, 2, length, 8), r(2, 2, length, 8), r(2, 2, length, 8), r(8))
            outs = traced(*args)
            refs = attention_then_cumsum(*(a.double() for a in args))
            assert isinstance(outs, tuple) and len(outs) == 2
            for out, ref in zip(outs, refs):
                torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # Inductor's compiled graphs stay in this process: nothing written to disk
    assert traced.captures == 2 and all(e.graph is None for e in traced._entries)
    assert not (cache_dir / "graphs").exists()


def causal_out_and_lse(q, k, v):
    """Two outputs of one loop (the output and the scores' log-sum-exp), with a mask made
    inside the function: one kernel with several outputs, its items read by the graph."""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
    s = s.masked_fill(future, float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def test_a_kernel_with_several_outputs_is_kept_and_reloaded(gen, cache_dir):
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    args = (r(2, 2, 21, 8), r(2, 2, 21, 8), r(2, 2, 21, 8))
    refs = causal_out_and_lse(*(a.double() for a in args))
    for process in range(2):
        traced = flashlight.compile(causal_out_and_lse, capture="trace")
        with torch.no_grad():
            outs = traced(*args)
        for out, ref in zip(outs, refs):
            torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
        assert traced.captures == (1 if process == 0 else 0)
        assert aten_outside_kernels(traced, args) == []


def test_a_capture_waits_for_the_steps_it_uses_and_a_compile_for_all(monkeypatch):
    """[Note: a process's one-time costs]: a capture starts once the thread's first steps
    are done, while its later (Triton) steps still run; a compile waits for every step."""
    import threading

    from flashlight import prepare

    release = threading.Event()

    def run():
        try:
            for name in prepare.CAPTURE:
                prepare._step(name, lambda: None)
            prepare._step("triton_key", release.wait)
        finally:
            prepare._done.set()

    monkeypatch.setattr(prepare, "_done", threading.Event())
    monkeypatch.setattr(prepare, "_steps_done", {})
    monkeypatch.setattr(prepare, "TIMES", {})
    thread = threading.Thread(target=run, daemon=True)
    monkeypatch.setattr(prepare, "_thread", thread)
    thread.start()
    prepare.wait(prepare.CAPTURE)
    assert set(prepare.CAPTURE) <= set(prepare.TIMES) and thread.is_alive() and not prepare._done.is_set()
    waiter = threading.Thread(target=prepare.wait)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # the whole thread's work is not done
    release.set()
    waiter.join(5)
    assert not waiter.is_alive() and prepare._done.is_set() and "triton_key" in prepare.TIMES


def test_the_preparing_thread_runs_once_and_the_compile_path_waits_for_it(gen, cache_dir, monkeypatch):
    """[Note: a process's one-time costs]: the thread starts once, a traced capture waits
    for it, it leaves ``nn.Module.__call__`` alone while it runs (the caller runs its
    model meanwhile), it draws no numbers from the global generator (a fold seeds its
    weights from it meanwhile), and FLASHLIGHT_PREPARE=0 starts nothing."""
    import threading

    from flashlight import prepare

    monkeypatch.setattr(prepare, "_thread", None)
    monkeypatch.setattr(prepare, "_done", threading.Event())
    monkeypatch.setattr(prepare, "_steps_done", {})
    monkeypatch.setattr(prepare, "TIMES", {})
    with settings.override(prepare=False):
        assert prepare.start() is False and prepare._thread is None
    rng = torch.random.get_rng_state()
    module_call = torch.nn.Module.__call__
    assert prepare.start() is True
    first = prepare._thread
    while first.is_alive():  # no FX tracer patching the modules that this thread runs
        assert torch.nn.Module.__call__ is module_call
    assert prepare.start() is True and prepare._thread is first  # once per process
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    args = (r(3, 7, 4), r(3, 9, 4), r(3, 9, 4), r(3, 1, 9))
    out = TracedFunction(cross, {}, name="prepared")(*args)  # waits for the thread's trace first
    assert prepare.TIMES["trace"] > 0
    assert "modules" in prepare.TIMES  # the launch operators' registration, imported on the thread
    prepare.wait()
    assert prepare._done.is_set() and not first.is_alive()
    assert torch.equal(torch.random.get_rng_state(), rng)  # the caller's seeded numbers stay its own
    assert_matches_float64(cross, out, args)


@pytest.fixture
def restore_tf32():
    before = torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def test_a_graph_kept_on_disk_serves_only_the_settings_it_was_compiled_with(gen, cache_dir):
    """A setting that changes the generated code (bounds checks, here) is part of what a
    kept graph serves: another process with it set compiles again, one without it
    loads the kept graph."""
    args = gated_inputs(gen, 3, 12)
    with torch.no_grad():
        flashlight.compile(gated, capture="trace")(*args)
        with settings.override(check_bounds=True):
            checked = flashlight.compile(gated, capture="trace")
            assert_matches_float64(gated, checked(*args), args)
        assert checked.captures == 1  # not the graph kept without the checks
        again = flashlight.compile(gated, capture="trace")
        again(*args)
    assert again.captures == 0


def test_a_graph_compiled_with_tf32_never_serves_a_call_without_it(gen, cache_dir, restore_tf32):
    """Generated kernels print the float32 product precision into their ``tl.dot`` s, so
    ``allow_tf32`` is part of what an entry serves: flipping it captures again (in this
    process and from the disk cache of another), flipping it back finds the first graph."""
    args = gated_inputs(gen, 3, 12)
    first = flashlight.compile(gated, capture="trace")
    with torch.no_grad():
        for allow, captures in [(False, 1), (True, 2), (False, 2), (True, 2)]:
            torch.backends.cuda.matmul.allow_tf32 = allow
            assert_matches_float64(gated, first(*args), args)
            assert first.captures == captures
    assert sorted(e.family[-1] for e in first._entries) == ["tf32", "tf32x3"]
    later = flashlight.compile(gated, capture="trace")
    with torch.no_grad():
        later(*args)  # TF32 still on: the kept TF32 graph
    assert later.captures == 0

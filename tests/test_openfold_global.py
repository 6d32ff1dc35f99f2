"""The extra-MSA stack's global column attention, patched, against its stock twin.

``MSAColumnGlobalAttention`` (its ``GlobalAttention``): a mean-pooled masked query per
column, one key/value head shared by the heads, a per-sequence gate. Modules have every
parameter drawn; masks are random with some fully masked columns and sequences. Kernels
run through the Triton interpreter (tests/conftest.py).

Tolerances, relative to the largest output magnitude: float32 1e-4 against stock
float32; bfloat16 2e-2 against stock bfloat16. Against a float64 stock run, the patched
module's error stays within twice the stock module's own error (plus 2e-6 in float32,
2e-3 in bfloat16).
"""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("openfold")

from openfold.model.msa import MSAColumnGlobalAttention  # noqa: E402

import flashlight  # noqa: E402
from flashlight import pipeline  # noqa: E402
from flashlight.integrations import openfold as ofp  # noqa: E402
from flashlight.integrations import openfold_core  # noqa: E402
from flashlight.integrations import openfold_testing as oft  # noqa: E402

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
FLOOR = {torch.float32: 2e-6, torch.bfloat16: 2e-3}
C_IN, C_HIDDEN, HEADS = 16, 8, 8  # AF2's extra MSA: c_e 64, c 8, H 8
H200_SHARED_MEMORY = 227 * 1024
KERNELS = 2  # the attention; the gate with the output projection


pytestmark = pytest.mark.usefixtures("fresh_openfold_warnings")


def _twins(gen, dtype=torch.float32):
    """(patched, stock, stock in float64) with identical random weights."""
    stock = MSAColumnGlobalAttention(C_IN, C_HIDDEN, HEADS).eval()
    oft.randomize_(stock, gen)
    reference = copy.deepcopy(stock).double()
    stock = stock.to(dtype)
    patched = copy.deepcopy(stock)
    report = flashlight.patch_openfold(patched)
    assert report.counts == {"other": {"msa_global_column_attention": 1}}
    assert report.paths == ["global_attention"]
    return patched, stock, reference


def _inputs(gen, n_seq=7, n_res=11, dtype=torch.float32):
    """``m [S, R, C_in]`` and a random 0/1 mask with a fully masked column and sequence."""
    m = torch.randn(n_seq, n_res, C_IN, generator=gen)
    mask = (torch.rand(n_seq, n_res, generator=gen) > 0.3).float()
    mask[:, int(torch.randint(n_res, (), generator=gen))] = 0.0  # a column of padding
    mask[-1] = 0.0  # a padding sequence
    assert 0 < mask.mean() < 1
    return {"m": m.to(dtype), "mask": mask.to(dtype)}


def _check(out, want, exact, dtype):
    assert out.shape == want.shape and out.dtype == want.dtype
    assert torch.isfinite(out).all()
    scale = exact.abs().max().item()
    diff = (out.double() - want.double()).abs().max().item()
    assert diff <= TOL[dtype] * scale, f"patched vs stock: {diff:.3g} (scale {scale:.3g})"
    err, err_stock = (out.double() - exact).abs().max().item(), (want.double() - exact).abs().max().item()
    assert err <= 2 * err_stock + FLOOR[dtype] * scale, f"vs float64: patched {err:.3g}, stock {err_stock:.3g}"


def _run(module, kwargs, **flags):
    with torch.no_grad():
        return module(**kwargs, **flags)


def _double(kwargs):
    return {k: v.double() for k, v in kwargs.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_matches_stock_with_partial_and_empty_masks(dtype, gen):
    patched, stock, reference = _twins(gen, dtype)
    kwargs = _inputs(gen, dtype=dtype)
    exact = _run(reference, _double(kwargs))
    with oft.count_launches() as launches:
        out = _run(patched, kwargs)
    assert len(launches) == KERNELS, [launcher.src.name for launcher in launches]
    _check(out, _run(stock, kwargs), exact, dtype)
    # without a mask the owner passes ones: every sequence is pooled
    no_mask = {"m": kwargs["m"]}
    _check(_run(patched, no_mask), _run(stock, no_mask), _run(reference, _double(no_mask)), dtype)


def test_chunked_call_is_one_launch_and_batch_dims(gen):
    patched, stock, reference = _twins(gen)
    kwargs = _inputs(gen, n_seq=5, n_res=10)
    with oft.count_launches() as launches:
        out = _run(patched, kwargs, chunk_size=3)
        out_lma = _run(patched, kwargs, chunk_size=3, use_lma=True)
    assert len(launches) == 2 * KERNELS
    want = _run(stock, kwargs, chunk_size=3)
    exact = _run(reference, _double(kwargs), chunk_size=3)
    _check(out, want, exact, torch.float32)
    _check(out_lma, want, exact, torch.float32)
    batched = {k: torch.stack([v, v.flip(0)]) for k, v in kwargs.items()}  # [2, S, R, ...]
    _check(_run(patched, batched), _run(stock, batched), _run(reference, _double(batched)), torch.float32)


@pytest.mark.parametrize("n_seq", [7, 37])
def test_core_is_two_kernels_that_compute_nothing_twice(gen, n_seq):
    """The attention over the sequences is one kernel, with a program per column, and the
    gate with the output projection a second (nothing of ``[R, S, H * C]`` written); no
    reduction repeated along a grid, fewer or more sequences than channels; both build for
    sm_90."""
    patched, _, _ = _twins(gen)
    kwargs = _inputs(gen, n_seq=n_seq)
    m = patched.layer_norm_m(kwargs["m"].transpose(-2, -3))
    mask = kwargs["mask"].transpose(-1, -2)
    fn, args = ofp.global_core_call(patched.global_attention, m, mask, gated=True)
    assert fn is openfold_core.gated_global_attention
    report = flashlight.explain(fn, *args)
    assert len(report.kernels) == KERNELS, str(report)
    assert not [op for op in report.fallback_ops if "view" not in op.name], str(report)
    for kernel in report.kernels:
        shared = getattr(kernel.aot_compile(90), "shared", None)
        assert shared is not None and 0 <= shared <= H200_SHARED_MEMORY, shared
    fn, args = ofp.global_core_call(patched.global_attention, m, mask, compiled=True, gated=True)
    with torch.no_grad(), oft.count_launches() as launches:
        out = fn(*args)
    assert len(launches) == KERNELS
    for launch in launches:
        assert not pipeline.recomputes_across_grid(launch.tiled)
        assert not pipeline.repeats_loop_work(launch.tiled)
    torch.testing.assert_close(out, openfold_core.gated_global_attention(*args), rtol=1e-4, atol=1e-5)


def test_autograd_runs_the_kernels_and_stock_runs_on_cpu_and_for_float64(gen):
    patched, stock, _ = _twins(gen)
    kwargs = _inputs(gen)
    want = _run(stock, kwargs)
    with oft.count_launches() as launches:
        out = patched(**kwargs, chunk_size=4)
        weight = torch.randn(out.shape, generator=gen)
        (out * weight).sum().backward()
    reference = stock(**kwargs, chunk_size=4)
    (reference * weight).sum().backward()
    assert launches, "under autograd the patched module runs Flashlight's kernels"
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4 * reference.abs().max().item())
    grads = {name: p.grad for name, p in stock.named_parameters()}
    scale = max(g.abs().max().item() for g in grads.values())
    for name, p in patched.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=1e-5 * scale, msg=name)
    with flashlight.settings.override(interpret=False), pytest.warns(RuntimeWarning, match="TRITON_INTERPRET"):
        assert torch.equal(_run(patched, kwargs), want)
    patched64, stock64 = copy.deepcopy(patched).double(), copy.deepcopy(stock).double()
    with oft.count_launches() as launches, pytest.warns(RuntimeWarning, match="float64"):
        out = _run(patched64, _double(kwargs))
    assert not launches and torch.equal(out, _run(stock64, _double(kwargs)))


def test_unpatch_restores_stock_exactly(gen):
    patched, stock, _ = _twins(gen)
    kwargs = _inputs(gen)
    assert ofp.is_patched(patched) and ofp.is_patched(patched.global_attention)
    assert flashlight.unpatch_openfold(patched) == 1
    assert not any("forward" in vars(m) or hasattr(m, "_flashlight_openfold") for m in patched.modules())
    assert torch.equal(_run(patched, kwargs, chunk_size=4), _run(stock, kwargs, chunk_size=4))
    # and patched again, it runs the kernel
    flashlight.patch_openfold(patched, kinds="msa_global_column_attention")
    with oft.count_launches() as launches:
        _run(patched, kwargs, chunk_size=4)
    assert len(launches) == KERNELS


def test_a_hooked_output_projection_runs_as_a_layer(gen):
    """A forward hook on ``linear_o`` keeps the gate and the output projection as the
    module's layers (the hook sees its call); only the attention is a kernel."""
    patched, stock, reference = _twins(gen)
    calls = []
    patched.global_attention.linear_o.register_forward_hook(lambda *_: calls.append(1))
    kwargs = _inputs(gen)
    with oft.count_launches() as launches:
        out = _run(patched, kwargs)
    assert len(launches) == 1 and calls == [1]
    _check(out, _run(stock, kwargs), _run(reference, _double(kwargs)), torch.float32)


def test_modules_of_another_width_share_the_compiled_core(gen):
    """Global attentions with the same heads but another MSA width share one compiled
    core, captured again with symbolic sizes: among them the sequences, which in the
    gate's kernel only the flattened rows of its projection's input carry (the launch
    reads them from that axis); both kernels run and match stock."""
    for c_in, n_seq in ((C_IN, 6), (24, 5)):
        stock = MSAColumnGlobalAttention(c_in, C_HIDDEN, HEADS).eval()
        oft.randomize_(stock, gen)
        reference = copy.deepcopy(stock).double()
        patched = copy.deepcopy(stock)
        flashlight.patch_openfold(patched)
        m = torch.randn(n_seq, 9, c_in, generator=gen)
        kwargs = {"m": m, "mask": (torch.rand(n_seq, 9, generator=gen) > 0.3).float()}
        with oft.count_launches() as launches:
            out = _run(patched, kwargs)
        assert len(launches) == KERNELS
        _check(out, _run(stock, kwargs), _run(reference, _double(kwargs)), torch.float32)

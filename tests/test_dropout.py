"""Dropout on attention probabilities inside the kernels ([Note: dropout inside a kernel]
in ``flashlight/random_ops.py``).

``F.dropout(softmax(s), p) @ v`` compiles to one forward kernel whose mask is computed
from a seed and each element's position, and the backward recomputes the same mask in
its kernels: nothing of the scores' size is written or saved. The seed is drawn from
PyTorch's generator when the graph runs (the remainder runs eagerly in these tests), so
a test draws it again from the same generator state, computes the mask with the op's
own implementation, and checks the kernels against float64 eager with that mask.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashlight
from flashlight.random_ops import SEED_HIGH, draw_seed
from flashlight.report import ExplainReport

P = 0.3
B, H, L, D = 2, 3, 21, 8


def attention_dropout(q, k, v, bias):
    # [B, H, L, D] x3, [1, H, L, L] -> [B, H, L, D]
    s = q @ k.transpose(-1, -2) * D ** -0.5 + bias
    return F.dropout(torch.softmax(s, -1), P, training=True) @ v


def _inputs(gen, dtype=torch.float32):
    shapes = [(B, H, L, D)] * 3 + [(1, H, L, L)]
    return [torch.randn(s, generator=gen).to(dtype) for s in shapes]


def _mask(state: torch.Tensor, shape) -> torch.Tensor:
    """The mask the compiled graph drew from generator state ``state``."""
    torch.set_rng_state(state)
    return torch.ops.flashlight.uniform(draw_seed("cpu"), list(shape)) >= P


def _reference(args, keep):
    q, k, v, bias = args
    s = q @ k.transpose(-1, -2) * D ** -0.5 + bias
    return (torch.softmax(s, -1) * keep / (1 - P)) @ v


def _compiled(args, report):
    torch.compiler.reset()
    state = torch.get_rng_state()
    out = torch.compile(attention_dropout, backend=flashlight.backend.make_backend(report=report))(*args)
    return out, state


def test_uniform_draws_each_element_from_its_position_and_the_seed():
    seed = torch.tensor(123456789, dtype=torch.int64)
    u = torch.ops.flashlight.uniform(seed, [2, 3, 40, 50])
    assert u.dtype == torch.float32 and ((u >= 0) & (u < 1)).all()
    assert torch.equal(u, torch.ops.flashlight.uniform(seed, [2, 3, 40, 50]))
    assert not torch.equal(u, torch.ops.flashlight.uniform(seed + 1, [2, 3, 40, 50]))
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    # every [X, Y] slice has its own stream
    slices = u.flatten(0, 1)
    assert all(not torch.equal(slices[0], slices[j]) for j in range(1, 6))


@pytest.mark.parametrize("seed", [0, 123456789012345, SEED_HIGH - 1])
def test_the_kernels_draws_are_philox_bit_for_bit(seed):
    """The op's Triton kernel (the interpreter here) against Philox-4x32-10 written in
    PyTorch arithmetic (what runs on CPU tensors without the interpreter)."""
    from flashlight.random_ops import philox_uniform

    s = torch.tensor(seed, dtype=torch.int64)
    for shape in ([1000], [3, 5, 7], [2, 2, 33, 40]):
        assert torch.equal(torch.ops.flashlight.uniform(s, shape), philox_uniform(s, shape)), shape


def test_the_forward_is_one_kernel_and_matches_float64_with_the_mask_drawn(gen):
    args = _inputs(gen)
    report = ExplainReport()
    with torch.no_grad():
        out, state = _compiled(args, report)
    keep = _mask(state, (B, H, L, L))
    assert abs(keep.float().mean().item() - (1 - P)) < 0.05
    [kernel] = report.kernels
    assert "flashlight.uniform.default" in kernel.aten_ops and "bmm.default" in kernel.aten_ops
    assert [op.name for op in report.fallback_ops] == ["randint.low"], str(report)
    want = _reference([a.double() for a in args], keep)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_gradients_match_float64_with_the_same_mask_and_nothing_score_sized_is_saved(gen):
    args = [a.requires_grad_() for a in _inputs(gen)]
    saved = []
    report = ExplainReport()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out, state = _compiled(args, report)
    grad_out = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad(out, args, grad_out)
    keep = _mask(state, (B, H, L, L))
    ref_args = [a.detach().double().requires_grad_() for a in args]
    want = _reference(ref_args, keep)
    want_grads = torch.autograd.grad(want, ref_args, grad_out.double())
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    for got, exact in zip(grads, want_grads, strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), exact, rtol=1e-4, atol=1e-4 * exact.abs().max().item())
    assert saved and max(saved) < B * H * L * L, saved
    assert all("uniform" not in op.name for op in report.fallback_ops), str(report)
    assert any("flashlight.uniform.default" in k.aten_ops and "bmm.default" in k.aten_ops
               for k in report.kernels[1:]), "the backward recomputes the mask in a kernel"
    # the forward is one kernel (the output and its row statistics); the softmax backward's
    # row term comes from the output, not from a pass over the keys
    assert "flashlight.uniform.default" in report.kernels[0].aten_ops
    assert not any("amax.default" in k.aten_ops for k in report.kernels[1:])
    assert any(sorted(set(k.aten_ops)) == ["mul.Tensor", "sum.dim_IntList"] for k in report.kernels), str(report)


def test_the_mask_is_not_eagers_and_p_zero_or_eval_is_no_dropout(gen):
    """Other draws than eager's dropout, the same keep probability; ``training=False``
    compiles the plain attention."""
    args = _inputs(gen)
    with torch.no_grad():
        out, state = _compiled(args, ExplainReport())
        torch.set_rng_state(state)
        eager = attention_dropout(*args)
        plain = torch.compile(lambda q, k, v, b: torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5 + b, -1) @ v,
                              backend="flashlight")(*args)
    torch.compiler.reset()
    assert not torch.allclose(out, eager)
    want = _reference([a.double() for a in args], torch.ones(B, H, L, L, dtype=torch.bool)) * (1 - P)
    torch.testing.assert_close(plain.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_p_zero_and_one_are_pytorchs(p, gen):
    args = _inputs(gen)

    def fn(q, k, v, bias):
        return F.dropout(torch.softmax(q @ k.transpose(-1, -2) + bias, -1), p, training=True) @ v

    with torch.no_grad():
        torch.compiler.reset()
        got = torch.compile(fn, backend="flashlight")(*args)
        torch.compiler.reset()
    torch.testing.assert_close(got, fn(*args), rtol=1e-5, atol=1e-5)


def test_bfloat16_at_changing_lengths(gen):
    """bf16 inputs, a second length (a graph of symbolic sizes): the mask drawn at each
    call, the gradients within bf16's tolerance of float64 with it."""
    compiled = torch.compile(attention_dropout, backend=flashlight.backend.make_backend(report=ExplainReport()))
    torch.compiler.reset()
    for length in (13, 30):
        shapes = [(B, H, length, D)] * 3 + [(1, H, length, length)]
        args = [torch.randn(s, generator=gen).to(torch.bfloat16).requires_grad_() for s in shapes]
        state = torch.get_rng_state()
        out = compiled(*args)
        grad_out = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
        grads = torch.autograd.grad(out, args, grad_out)
        keep = _mask(state, (B, H, length, length))
        ref_args = [a.detach().double().requires_grad_() for a in args]
        want = _reference(ref_args, keep)
        want_grads = torch.autograd.grad(want, ref_args, grad_out.double())
        for got, exact in zip((out, *grads), (want, *want_grads), strict=True):
            assert torch.isfinite(got).all()
            assert (got.double() - exact).abs().max().item() <= 2e-2 * exact.abs().max().item()
    torch.compiler.reset()


def test_the_kernels_compile_for_hopper(gen):
    """Triton's compiler for sm_90 (not the interpreter) accepts the Philox code in the
    forward and backward kernels."""
    args = [a.requires_grad_() for a in _inputs(gen)]
    report = ExplainReport()
    out, _ = _compiled(args, report)
    out.sum().backward()
    torch.compiler.reset()
    drawn = [k for k in report.kernels if "flashlight.uniform.default" in k.aten_ops]
    assert len(drawn) >= 3, str(report)
    for kernel in drawn:
        assert 0 < kernel.aot_compile(90, block_m=64, block_n=32, num_warps=4, num_stages=2).shared <= 227 * 1024

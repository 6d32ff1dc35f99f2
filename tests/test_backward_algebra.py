"""Fewer passes in the backward: the softmax backward's row term computed from the output
([Note: the softmax backward's row term] in ``flashlight/backward_algebra.py``; rewritten
where the algebra allows, exact in float64, left alone where it does not apply), and the
keys' and values' gradients from one loop."""
from __future__ import annotations

import pytest
import torch
from functorch.compile import make_boxed_compiler
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import default_partition

import flashlight
from flashlight.backward_algebra import rewrite_row_terms
from flashlight.decompositions import decompositions
from flashlight.report import ExplainReport


def _gated(q, k, v, bias, g):
    # [B, H, L, D] x3, [1, H, L, L], [B, H, L, D] -> [B, H, L, D]
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias
    return (torch.softmax(s, -1) @ v) * torch.sigmoid(g)


def _over_queries(q, k, v, bias, g):
    # the softmax over the queries: its row term is not a sum over the matmul's keys
    s = q @ k.transpose(-1, -2) + bias
    return torch.softmax(s, -2) @ v * g


def _masked_scaled(q, k, v, bias, g):
    # the probabilities times a mask and a scale before the matmul, as dropout writes them
    s = q @ k.transpose(-1, -2) + bias
    return (torch.softmax(s, -1) * (g[..., :1] > 0).transpose(-1, -2) * 1.5) @ v + g


def _inputs(gen, dtype=torch.float64, B=2, H=2, L=11, D=5):
    shapes = [(B, H, L, D)] * 3 + [(1, H, L, L), (B, H, L, D)]
    return [torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in shapes]


def _aot_gradients(fn, args, grad_out):
    """Gradients of ``fn`` through AOTAutograd with the rewrite in its partition (eager
    graphs), and how many row terms were rewritten."""
    counts = []

    def partition(joint, joint_inputs, **kwargs):
        counts.append(rewrite_row_terms(joint))
        return default_partition(joint, joint_inputs, **kwargs)

    nop = make_boxed_compiler(lambda gm, _: gm)
    out = aot_function(fn, fw_compiler=nop, bw_compiler=nop, partition_fn=partition,
                       decompositions=decompositions(inference=False))(*args)
    return torch.autograd.grad(out, args, grad_out), counts


@pytest.mark.parametrize("fn, rewritten", [(_gated, 1), (_over_queries, 0), (_masked_scaled, 1)],
                         ids=["last_dim", "another_dim", "masked_and_scaled"])
def test_the_row_term_is_exact_in_float64_and_rewritten_only_over_the_keys(fn, rewritten, gen):
    """Over the matmul's keys the rewrite applies and is exact; a softmax over another
    dim is left as written."""
    args = _inputs(gen)
    grad_out = torch.randn(args[0].shape, generator=gen, dtype=torch.float64)
    got, counts = _aot_gradients(fn, args, grad_out)
    want = torch.autograd.grad(fn(*args), args, grad_out)
    assert counts == [rewritten]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_backward_kernels_run_fewer_dots(gen):
    """Without the rewrite the row term is a kernel of its own with two matmuls per key
    tile (the scores again and ``dp``), and the keys' and values' gradients, both sums
    over the queries, are two kernels that each compute the probabilities again: forward
    and backward absorbed 14 ``bmm`` in all. Now the two gradients come from one loop
    ([Note: several outputs]), placed after the row term it reads."""
    args = [a.detach().float().requires_grad_() for a in _inputs(gen)]
    report = ExplainReport()
    torch.compiler.reset()
    out = torch.compile(_gated, backend=flashlight.backend.make_backend(report=report))(*args)
    grads = torch.autograd.grad(out, args, torch.ones_like(out))
    torch.compiler.reset()
    assert all(torch.isfinite(g).all() for g in grads)
    dots = [sum(op == "bmm.default" for op in kernel.aten_ops) for kernel in report.kernels]
    assert sum(dots) <= 11 and 4 in dots, str(report)


def test_bfloat16_rows_one_key_dominates(gen):
    """Each query matches one key: ``dp - D`` cancels in every row, so ``D`` from the
    bfloat16 output would lose the gradient's digits. The forward keeps its matmul in
    float32 for the row term ([Note: a row term from a rounded output]) and the
    gradients stay within bfloat16's tolerance of float64 computed on the same bfloat16
    values (the rounding of the inputs themselves is not the kernel's error: eager
    PyTorch in bfloat16 lands 3% off the unrounded inputs' gradients for some draws)."""
    q, k, v, bias, g = (a.detach() for a in _inputs(gen, B=4, H=4, L=16, D=8))
    q = 3 * k[:, :, torch.randperm(16, generator=gen)] + 0.3 * q  # one dominant key per query
    args = [a.bfloat16().requires_grad_() for a in (q, k, v, bias, g)]
    grad_out = torch.randn(q.shape, generator=gen, dtype=torch.float64).bfloat16()
    torch.compiler.reset()
    out = torch.compile(_gated, backend="flashlight")(*args)
    got = torch.autograd.grad(out, args, grad_out)
    torch.compiler.reset()
    exact = [a.detach().double().requires_grad_() for a in args]
    want = torch.autograd.grad(_gated(*exact), exact, grad_out.double())
    for n, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.isfinite(a).all()
        err = (a.double() - b).abs().max().item()
        assert err <= 2e-2 * b.abs().max().item(), f"input {n}: error {err:.3g} of {b.abs().max().item():.3g}"

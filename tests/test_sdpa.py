"""``F.scaled_dot_product_attention`` decomposed during capture: every form (float and
bool masks, is_causal, scale, grouped-query heads) fuses into one kernel and matches
eager SDPA in float64, with a gate; dropout and graphs that need gradients keep SDPA."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashlight
from flashlight import settings
from tests.helpers import computes_softmax

B, H, L, S, E = 2, 4, 10, 13, 8


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _qkv(seed, heads_k=H):
    return rand(B, H, L, E, seed=seed), rand(B, heads_k, S, E, seed=seed + 1), rand(B, heads_k, S, E, seed=seed + 2)


def _bool_mask(seed):
    mask = rand(B, 1, L, S, seed=seed) > 0  # [B, 1, L, S]: heads broadcast
    mask[0, 0, 3] = False  # a row the mask removes whole: SDPA gives 0 there
    return mask


def _float_mask(seed):
    mask = rand(L, S, seed=seed)
    mask[:, 5] = float("-inf")
    return mask


def float_mask(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def bool_mask(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def scaled(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, scale=0.3)


def grouped(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)


def gated(q, k, v, gate):
    return F.scaled_dot_product_attention(q, k, v) * torch.sigmoid(gate)


def prologue_and_gate(q, k, v, wq, gate):
    q = q * torch.sigmoid(wq)  # a query prologue
    return F.scaled_dot_product_attention(q, k, v, is_causal=True) * torch.sigmoid(gate)


CASES = {
    "float mask": (float_mask, lambda: (*_qkv(0), _float_mask(3))),
    "bool mask": (bool_mask, lambda: (*_qkv(10), _bool_mask(13))),
    "is_causal": (causal, lambda: _qkv(20)),
    "scale": (scaled, lambda: _qkv(30)),
    "enable_gqa": (grouped, lambda: _qkv(40, heads_k=2)),
    "sigmoid gate": (gated, lambda: (*_qkv(50), rand(B, H, L, E, seed=53))),
    "prologue and gate": (prologue_and_gate, lambda: (*_qkv(60), rand(B, H, L, E, seed=63), rand(B, H, L, E, seed=64))),
}


def _double(args):
    return [a.double() if a.is_floating_point() else a for a in args]


@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_fuses_into_one_kernel_and_matches_eager(case):
    fn, make = CASES[case]
    args = make()
    with settings.override(remainder="eager"):
        report = flashlight.explain(fn, *args)
        torch.compiler.reset()
        with torch.no_grad():
            out = flashlight.compile(fn)(*args)
        torch.compiler.reset()
    assert len(report.kernels) == 1, str(report)
    assert not [op for op in report.fallback_ops if "getitem" not in op.name], str(report)
    ops = report.kernels[0].aten_ops
    assert "bmm.default" in ops and computes_softmax(ops)
    # the gate (and the query prologue's sigmoid) inside the kernel
    assert ops.count("sigmoid.default") == {"sigmoid gate": 1, "prologue and gate": 2}.get(case, 0)
    ref = fn(*_double(args))
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_dropout_leaves_what_it_cannot_fuse_to_pytorch_with_a_reason():
    """SDPA with dropout: its fused op runs in PyTorch (on a GPU), or on the CPU PyTorch's
    math form arrives, whose ``_safe_softmax`` Flashlight does not lower; the dropout
    itself fuses ([Note: dropout inside a kernel] in flashlight/random_ops.py). Either
    way what runs in PyTorch says why."""
    def dropped(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    q, k, v = _qkv(60)
    with settings.override(remainder="eager"):
        report = flashlight.explain(dropped, q, k, v)
    names = [op.name for op in report.fallback_ops]
    assert any("softmax" in name or "scaled_dot_product" in name for name in names), str(report)
    assert all(op.reason for op in report.fallback_ops), str(report)


def test_sdpa_with_dropout_in_its_kernel_op_keeps_the_op_and_says_why():
    from flashlight.decompositions import decompositions
    from flashlight.sdpa import left_to_pytorch

    aten = torch.ops.aten
    q, k, v = _qkv(70)
    table = decompositions(inference=True)
    op = aten._scaled_dot_product_flash_attention_for_cpu.default
    assert table[op](q, k, v, 0.5) is NotImplemented  # dropout: not decomposed
    out, _ = table[op](q, k, v, 0.0, True, scale=0.5)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5),
                               rtol=1e-5, atol=1e-5)
    graph = torch.fx.Graph()
    node = graph.call_function(op, (*(graph.placeholder(n) for n in "qkv"), 0.25))
    assert "dropout_p=0.25" in left_to_pytorch(node)


def test_graphs_that_need_gradients_keep_sdpa():
    q, k, v = (t.requires_grad_() for t in _qkv(80))
    with settings.override(remainder="eager"):
        torch.compiler.reset()
        out = flashlight.compile(causal)(q, k, v)
        torch.compiler.reset()
    weights = rand(B, H, L, E, seed=83)
    (out * weights).sum().backward()  # SDPA's own backward
    grads = [t.grad for t in (q, k, v)]
    ref_q, ref_k, ref_v = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = causal(ref_q, ref_k, ref_v)
    (ref * weights.double()).sum().backward()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for grad, ref_t in zip(grads, (ref_q, ref_k, ref_v)):
        torch.testing.assert_close(grad.double(), ref_t.grad, rtol=1e-4, atol=1e-5)


def test_each_sdpa_kernels_decomposition_gives_sdpas_value_and_its_outputs():
    """The CUDA kernels' decompositions too (pure math, checked here on CPU tensors)."""
    from flashlight.sdpa import SDPA_DECOMPOSITIONS

    q, k, v = _qkv(90)
    bias = rand(B, H, L, S, seed=93)
    assert len(SDPA_DECOMPOSITIONS) == 4
    for op, decompose in SDPA_DECOMPOSITIONS.items():
        names = [a.name for a in op._schema.arguments]
        mask_name = "attn_mask" if "attn_mask" in names else "attn_bias" if "attn_bias" in names else None
        kwargs = {mask_name: bias} if mask_name else {"is_causal": True}
        if "compute_log_sumexp" in names:
            kwargs["compute_log_sumexp"] = False
        outputs = decompose(q, k, v, **kwargs)
        assert len(outputs) == len(op._schema.returns), op
        ref = F.scaled_dot_product_attention(*_double((q, k, v)), attn_mask=bias.double() if mask_name else None,
                                             is_causal=not mask_name)
        torch.testing.assert_close(outputs[0].double(), ref, rtol=1e-5, atol=1e-5)
        assert decompose(q, k, v, **kwargs, dropout_p=0.1) is NotImplemented

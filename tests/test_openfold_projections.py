"""A patched OpenFold attention computes its projections of one input as one GEMM.

See [Note: fused projections] in ``flashlight.integrations.openfold_forward``: q, k, v
and the gate of a self-attention (one input) come from one ``F.linear`` with the layers'
weights stacked; when the queries and the keys come from different tensors (an
``Attention`` called with ``q_x`` other than ``kv_x``), q and the gate from one GEMM and
k and v from another. The
stacked weights follow the layers: an in-place update, a loaded state dict or a copy of
the module gives the stock module's result with the new weights. ``F.linear`` calls are
counted with a ``TorchFunctionMode``; kernels run through the Triton interpreter.

Tolerance: float32 1e-4 of the largest output magnitude against the stock module, and
against a float64 stock run at most twice the stock float32 error plus 2e-6 of it.
"""
from __future__ import annotations

import copy
import io

import pytest
import torch
from torch.overrides import TorchFunctionMode

pytest.importorskip("openfold")

from openfold.model.msa import MSARowAttentionWithPairBias  # noqa: E402

import flashlight  # noqa: E402
from flashlight.integrations import openfold_testing as oft  # noqa: E402

N_SEQ, N_RES, N_KEYS, C_M, C_Z = 5, 9, 7, 32, 16

pytestmark = pytest.mark.usefixtures("fresh_openfold_warnings")


class _CountLinear(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.nn.functional.linear
        return func(*args, **(kwargs or {}))


class _Cross(torch.nn.Module):
    """Calls an MSA row attention's ``Attention`` with queries and keys from two tensors."""

    def __init__(self):
        super().__init__()
        self.owner = MSARowAttentionWithPairBias(C_M, C_Z, 16, 2)
        self.mha = self.owner.mha

    def forward(self, q_x, kv_x, bias):
        return self.mha(q_x, kv_x, biases=[bias])


def _msa_row(gen):
    module = MSARowAttentionWithPairBias(C_M, C_Z, 16, 2)
    inputs = {"m": torch.randn(N_SEQ, N_RES, C_M, generator=gen),
              "z": torch.randn(N_RES, N_RES, C_Z, generator=gen),
              "mask": oft.random_mask((N_SEQ, N_RES), gen)}
    return module, inputs


def _cross(gen):
    inputs = {"q_x": torch.randn(N_SEQ, N_RES, C_M, generator=gen),
              "kv_x": torch.randn(N_SEQ, N_KEYS, C_M, generator=gen),
              "bias": torch.randn(N_SEQ, 2, N_RES, N_KEYS, generator=gen)}
    return _Cross(), inputs


# name -> (module and inputs, F.linear calls stock, F.linear calls patched)
CASES = {
    "self_attention": (_msa_row, 6, 3),  # linear_z, q, k, v, g, o -> linear_z, qkvg, o
    "cross_attention": (_cross, 5, 3),  # q, k, v, g, o -> qg, kv, o
}


def _twins(make, gen):
    stock, inputs = make(gen)
    oft.randomize_(stock.eval(), gen)
    patched = copy.deepcopy(stock)
    flashlight.patch_openfold(patched)
    return patched, stock, inputs


def _check(out, stock, inputs):
    with torch.no_grad():
        want = stock(**inputs)
        exact = copy.deepcopy(stock).double()(**{k: v.double() for k, v in inputs.items()})
    scale = exact.abs().max().item()
    assert torch.isfinite(out).all()
    diff = (out.double() - want.double()).abs().max().item()
    assert diff <= 1e-4 * scale, f"patched vs stock: {diff:.3g} (scale {scale:.3g})"
    err, err_stock = (out.double() - exact).abs().max().item(), (want.double() - exact).abs().max().item()
    assert err <= 2 * err_stock + 2e-6 * scale, f"vs float64: patched {err:.3g}, stock {err_stock:.3g}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_projections_of_one_input_are_one_gemm(name, gen):
    make, stock_calls, patched_calls = CASES[name]
    patched, stock, inputs = _twins(make, gen)
    with torch.no_grad():
        with _CountLinear() as counted_stock:
            stock(**inputs)
        with _CountLinear() as counted:
            out = patched(**inputs)
    assert (counted_stock.calls, counted.calls) == (stock_calls, patched_calls)
    _check(out, stock, inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_stacked_weights_follow_the_layers(name, gen):
    make, _, _ = CASES[name]
    patched, stock, inputs = _twins(make, gen)
    with torch.no_grad():
        patched(**inputs)  # stacks the weights
        for module in (stock, patched):
            module.mha.linear_k.weight.mul_(1.7)  # in place: the version counter moves
            module.mha.linear_q.weight.add_(0.05)
        _check(patched(**inputs), stock, inputs)
        other, _ = make(gen)
        oft.randomize_(other, gen)
        stock.load_state_dict(other.state_dict())
        patched.load_state_dict(other.state_dict())
        _check(patched(**inputs), stock, inputs)
        buffer = io.BytesIO()
        torch.save(patched, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        _check(copy.deepcopy(patched)(**inputs), stock, inputs)
        _check(loaded(**inputs), stock, inputs)


def test_hooked_projection_keeps_its_own_call(gen):
    patched, stock, inputs = _twins(_msa_row, gen)
    seen = []
    patched.mha.linear_v.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with torch.no_grad():
        out = patched(**inputs)
    assert seen == [torch.Size([N_SEQ, N_RES, 32])]  # the hook saw its layer run
    _check(out, stock, inputs)

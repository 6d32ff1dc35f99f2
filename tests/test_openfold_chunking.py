"""A patched OpenFold attention ignores ``chunk_size``: one Flashlight kernel launch per call.

OpenFold's owner modules split their batch into ``chunk_size`` chunks before calling
``Attention``; patched owners call their class's forward with ``chunk_size=None`` while
the attention runs fused, and chunk as asked when it runs the stock code. Kernel
launches are counted by ``openfold_testing.count_launches`` (it wraps Flashlight's own
``Launcher``), calls of the attention module by a forward pre-hook (OpenFold calls it
once per chunk). Kernels run through the Triton interpreter (tests/conftest.py).

Tolerances: float32 1e-4 of the largest output magnitude against the stock module
chunked alike; against a float64 stock run, at most twice the stock float32 error plus
2e-6 of the magnitude.
"""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("openfold")

from openfold.model.msa import MSAColumnAttention, MSARowAttentionWithPairBias  # noqa: E402
from openfold.model.triangular_attention import TriangleAttention  # noqa: E402

import flashlight  # noqa: E402
from flashlight.integrations import openfold as ofp  # noqa: E402
from flashlight.integrations import openfold_testing as oft  # noqa: E402

N_SEQ, N_RES, C_M, C_Z = 6, 11, 32, 16


pytestmark = pytest.mark.usefixtures("fresh_openfold_warnings")


def _msa(gen):
    return {
        "m": torch.randn(N_SEQ, N_RES, C_M, generator=gen),
        "mask": oft.random_mask((N_SEQ, N_RES), gen),
    }


def _pair(gen):
    return {
        "x": torch.randn(N_RES, N_RES, C_Z, generator=gen),
        "mask": oft.random_mask((N_RES, N_RES), gen),
    }


# name -> (module factory, inputs, the attention inside, rows chunked over)
CASES = {
    "msa_row": (
        lambda: MSARowAttentionWithPairBias(C_M, C_Z, 32, 2),
        lambda gen: {**_msa(gen), "z": torch.randn(N_RES, N_RES, C_Z, generator=gen)},
        lambda module: module.mha,
        N_SEQ,
    ),
    "msa_column": (
        lambda: MSAColumnAttention(C_M, 32, 2),
        _msa,
        lambda module: module._msa_att.mha,
        N_RES,
    ),
    "triangle_start": (
        lambda: TriangleAttention(C_Z, 32, 2, starting=True),
        _pair,
        lambda module: module.mha,
        N_RES,
    ),
    "triangle_end": (
        lambda: TriangleAttention(C_Z, 32, 2, starting=False),
        _pair,
        lambda module: module.mha,
        N_RES,
    ),
}


def _twins(name, gen):
    factory, inputs, attention_of, rows = CASES[name]
    stock = factory().eval()
    oft.randomize_(stock, gen)
    patched = copy.deepcopy(stock)
    flashlight.patch_openfold(patched)
    return patched, stock, inputs(gen), attention_of, rows


def _calls_of(module) -> list:
    calls: list = []
    module.register_forward_pre_hook(lambda m, args: calls.append(1))
    return calls


def _check(out, want, exact):
    scale = exact.abs().max().item()
    assert torch.isfinite(out).all()
    diff = (out.double() - want.double()).abs().max().item()
    assert diff <= 1e-4 * scale, f"patched vs stock chunked: {diff:.3g} (scale {scale:.3g})"
    err, err_stock = (out.double() - exact).abs().max().item(), (want.double() - exact).abs().max().item()
    assert err <= 2 * err_stock + 2e-6 * scale, f"vs float64: patched {err:.3g}, stock {err_stock:.3g}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_chunked_call_is_one_launch_and_matches_stock_chunked(name, gen):
    patched, stock, kwargs, attention_of, rows = _twins(name, gen)
    reference = copy.deepcopy(stock).double()
    calls = _calls_of(attention_of(patched))
    stock_calls = _calls_of(attention_of(stock))
    with torch.no_grad():
        want = stock(**kwargs, chunk_size=4)
        exact = reference(**{k: v.double() for k, v in kwargs.items()}, chunk_size=4)
        with oft.count_launches() as launches:
            out = patched(**kwargs, chunk_size=4)
    assert len(stock_calls) == -(-rows // 4) > 1  # the stock module did chunk
    assert len(calls) == 1 and len(launches) == 1, (calls, launches)
    _check(out, want, exact)


def test_positional_chunk_size_flags_and_unknown_keywords(gen):
    patched, stock, kwargs, attention_of, _ = _twins("triangle_start", gen)
    calls = _calls_of(attention_of(patched))
    with torch.no_grad():
        want = stock(kwargs["x"], kwargs["mask"], 3)
        with oft.count_launches() as launches:
            # x, mask, chunk_size, use_memory_efficient_kernel, use_lma by position
            out = patched(kwargs["x"], kwargs["mask"], 3, False, True)
            out_kw = patched(**kwargs, chunk_size=3, use_lma=True, inplace_safe=True)
            with pytest.warns(RuntimeWarning, match="TriangleAttention ignores the unknown argument 'use_some_future_kernel'"):
                out_unknown = patched(**kwargs, chunk_size=3, use_some_future_kernel=True)
    assert len(calls) == len(launches) == 3
    for got in (out, out_kw, out_unknown):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_stock_fallback_keeps_chunking(gen):
    """On the CPU without the interpreter the stock path chunks as asked; under autograd
    the patched path runs, unchunked."""
    patched, stock, kwargs, attention_of, rows = _twins("msa_row", gen)
    calls = _calls_of(attention_of(patched))
    with torch.no_grad():
        want = stock(**kwargs, chunk_size=2)
        with flashlight.settings.override(interpret=False), pytest.warns(RuntimeWarning):
            out = patched(**kwargs, chunk_size=2)
    assert torch.equal(out, want)
    assert len(calls) == -(-rows // 2)
    calls.clear()
    with oft.count_launches() as launches:
        out = patched(**kwargs, chunk_size=2)
    assert len(calls) == 1 and len(launches) == 1, (calls, launches)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_unpatching_the_attention_alone_restores_chunking(gen):
    patched, stock, kwargs, attention_of, rows = _twins("msa_column", gen)
    assert ofp.is_patched(patched._msa_att)  # the owner of the column attention
    flashlight.unpatch_openfold(attention_of(patched))
    calls = _calls_of(attention_of(patched))
    with torch.no_grad():
        out = patched(**kwargs, chunk_size=4)
        want = stock(**kwargs, chunk_size=4)
    assert torch.equal(out, want) and len(calls) == -(-rows // 4)
    assert flashlight.unpatch_openfold(patched) == 0  # the owner is restored, no attention left
    assert not any("forward" in vars(m) for m in patched.modules())

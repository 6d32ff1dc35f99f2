"""Patched OpenFold attention modules against their stock twins, on fresh random inputs.

Each test draws a new seed (printed; set FLASHLIGHT_TEST_SEED to replay one). Modules
have every parameter redrawn (OpenFold zero-initialises the output projections), masks
have zeros, and lengths are not multiples of any tile size. Kernels run through the
Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1).

Tolerances, relative to the largest output magnitude: float32 1e-4 against stock
float32; bfloat16 2e-2 against stock bfloat16. Against a float64 run of the stock
module, the patched module's error must stay within twice the stock module's own error
(plus a small floor).
"""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("openfold")

from openfold.model.msa import MSAColumnAttention, MSARowAttentionWithPairBias  # noqa: E402
from openfold.model.triangular_attention import (  # noqa: E402
    TriangleAttentionEndingNode,
    TriangleAttentionStartingNode,
)

import flashlight  # noqa: E402
from flashlight.integrations import openfold as ofp  # noqa: E402
from flashlight.integrations import openfold_testing as oft  # noqa: E402

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
FLOOR = {torch.float32: 2e-6, torch.bfloat16: 2e-3}


pytestmark = pytest.mark.usefixtures("fresh_openfold_warnings")


# -- module factories: (module, inputs(gen, batch, n_seq, n_res) -> kwargs) -------------

C_M, C_Z, C_T = 32, 16, 16


def row_attention():
    # AF2: H 8, c 32; fewer heads keep the interpreter fast
    return MSARowAttentionWithPairBias(c_m=C_M, c_z=C_Z, c_hidden=32, no_heads=2, inf=1e9)


def column_attention():
    return MSAColumnAttention(c_m=C_M, c_hidden=32, no_heads=2, inf=1e9)


def triangle_start():
    return TriangleAttentionStartingNode(C_Z, 32, 2, inf=1e9)


def triangle_end():
    return TriangleAttentionEndingNode(C_Z, 32, 2, inf=1e9)


def template_triangle_start():
    # template pair stack: c_t 64, c 16, H 4 in AF2
    return TriangleAttentionStartingNode(C_T, 16, 2, inf=1e9)


def _msa_inputs(gen, batch, n_seq, n_res, dtype, pair=True):
    m = torch.randn(batch + (n_seq, n_res, C_M), generator=gen)
    mask = oft.random_mask(batch + (n_seq, n_res), gen)
    kwargs = {"m": m.to(dtype), "mask": mask.to(dtype)}
    if pair:
        kwargs["z"] = torch.randn(batch + (n_res, n_res, C_Z), generator=gen).to(dtype)
    return kwargs


def _pair_inputs(gen, batch, n_seq, n_res, dtype, channels=C_Z):
    x = torch.randn(batch + (n_res, n_res, channels), generator=gen)
    mask = oft.random_mask(batch + (n_res, n_res), gen)
    return {"x": x.to(dtype), "mask": mask.to(dtype)}


MODULES = {
    "msa_row_attention_with_pair_bias": (row_attention, _msa_inputs),
    "msa_column_attention": (column_attention, lambda *a: _msa_inputs(*a, pair=False)),
    "triangle_attention_start": (triangle_start, _pair_inputs),
    "triangle_attention_end": (triangle_end, _pair_inputs),
    "template_triangle_attention_start": (
        template_triangle_start,
        lambda *a: _pair_inputs(*a, channels=C_T),
    ),
}


def make_twins(name, gen, dtype):
    """(patched, stock, stock in float64) with identical weights."""
    factory, _ = MODULES[name]
    stock = factory().eval()
    oft.randomize_(stock, gen)
    reference = copy.deepcopy(stock).double()
    stock = stock.to(dtype)
    patched = copy.deepcopy(stock)
    report = ofp.patch_openfold(patched)
    assert report.total == 1
    return patched, stock, reference


def run(module, kwargs, **flags):
    with torch.no_grad():
        return module(**kwargs, **flags)


def _as(kwargs, dtype):
    return {k: v.to(dtype) for k, v in kwargs.items()}


def check_against_stock(patched, stock, reference, kwargs, dtype, **flags):
    out = run(patched, kwargs, **flags)
    want = run(stock, kwargs, **flags)
    exact = run(reference, _as(kwargs, torch.float64), **flags)
    assert out.shape == want.shape and out.dtype == want.dtype
    assert torch.isfinite(out).all()
    scale = exact.abs().max().item()
    diff = (out.double() - want.double()).abs().max().item()
    assert diff <= TOL[dtype] * scale, f"patched vs stock: {diff:.3g} (scale {scale:.3g})"
    err_patched = (out.double() - exact).abs().max().item()
    err_stock = (want.double() - exact).abs().max().item()
    assert err_patched <= 2 * err_stock + FLOOR[dtype] * scale, (
        f"error vs float64: patched {err_patched:.3g}, stock {err_stock:.3g}"
    )
    return out


# -- tests ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_matches_stock(name, dtype, gen):
    patched, stock, reference = make_twins(name, gen, dtype)
    n_seq = int(torch.randint(5, 8, (), generator=gen))
    n_res = int(torch.randint(11, 14, (), generator=gen))
    kwargs = MODULES[name][1](gen, (), n_seq, n_res, dtype)
    check_against_stock(patched, stock, reference, kwargs, dtype)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_chunked_matches_stock(name, gen):
    """With chunk_size the owner flattens and slices the batch before calling Attention."""
    patched, stock, reference = make_twins(name, gen, torch.float32)
    kwargs = MODULES[name][1](gen, (), 6, 13, torch.float32)
    check_against_stock(patched, stock, reference, kwargs, torch.float32, chunk_size=4)


@pytest.mark.parametrize(
    "name", ["msa_row_attention_with_pair_bias", "msa_column_attention", "triangle_attention_end"]
)
def test_extra_batch_dims(name, gen):
    patched, stock, reference = make_twins(name, gen, torch.float32)
    kwargs = MODULES[name][1](gen, (2,), 5, 11, torch.float32)
    check_against_stock(patched, stock, reference, kwargs, torch.float32)
    # the same, chunked: the pair bias is then expanded over the batch by OpenFold
    check_against_stock(patched, stock, reference, kwargs, torch.float32, chunk_size=6)


def _graph_count() -> int:
    """Graphs the patched modules' cores have traced so far."""
    from flashlight.integrations import openfold_core

    return openfold_core.capture_count()


def test_lengths_change_without_a_compile_per_length(gen):
    from flashlight.integrations import openfold_core

    openfold_core.clear_compiled()
    patched, stock, reference = make_twins("msa_row_attention_with_pair_bias", gen, torch.float32)
    graphs = []
    with flashlight.settings.override(graph_cache=False):  # every graph traced here
        for n_seq, n_res in [(5, 11), (7, 13), (6, 12), (5, 13)]:
            kwargs = _msa_inputs(gen, (), n_seq, n_res, torch.float32)
            check_against_stock(patched, stock, reference, kwargs, torch.float32)
            graphs.append(_graph_count())
    # the first two lengths compile (static, then symbolic); later ones reuse that
    assert graphs == [1, 2, 2, 2], f"graphs traced after each call: {graphs}"


def test_triangle_start_and_end_share_one_compiled_core(gen):
    """Around the ending node OpenFold transposes the mask before making its bias; the
    patch passes that bias contiguous, so both triangle attentions run one compiled core."""
    from flashlight.integrations import openfold_core

    openfold_core.clear_compiled()  # compiles of earlier tests would serve these calls
    graphs = []
    kwargs = _pair_inputs(gen, (), 0, 14, torch.float32)
    with flashlight.settings.override(graph_cache=False):
        for name in ("triangle_attention_start", "triangle_attention_end"):
            patched, stock, reference = make_twins(name, gen, torch.float32)
            check_against_stock(patched, stock, reference, kwargs, torch.float32)
            graphs.append(_graph_count())
    openfold_core.clear_compiled()
    assert graphs == [1, 1], f"graphs traced after each module: {graphs}"


def test_a_later_process_loads_the_cores_from_disk(gen, tmp_path):
    """The cores' compiled graphs are kept on disk ([Note: traced capture]): a process
    that patches the same modules again (here: after forgetting every compiled core)
    traces nothing and matches stock."""
    kwargs = _pair_inputs(gen, (), 0, 13, torch.float32)
    traced = _traced_by_two_processes("triangle_attention_start", gen, kwargs, cache_dir=str(tmp_path))
    assert traced == [1, 0], f"graphs traced by each process: {traced}"


def test_a_later_process_preloads_the_listed_cores(gen, tmp_path):
    """[Note: preloading the cores]: the cache folder lists each compiled core; a later
    process preloads the listed ones matching its patched modules (heads, width, dtype),
    so the first forward finds its call signature served, and matches stock."""
    from flashlight import prepare
    from flashlight.integrations import openfold_core

    kwargs = _pair_inputs(gen, (), 0, 11, torch.float32)
    with flashlight.settings.override(cache_dir=str(tmp_path), prepare=True, preload=True):
        openfold_core.clear_compiled()
        patched, stock, reference = make_twins("triangle_attention_start", gen, torch.float32)
        check_against_stock(patched, stock, reference, kwargs, torch.float32)
        listed = openfold_core._listed_cores()
        assert [(c["kind"], c["n_biases"], c["heads"], c["width"], c["dtype"]) for c in listed] == \
            [("core", 2, patched.mha.no_heads, patched.mha.c_hidden, "float32")]
        openfold_core.clear_compiled()  # a new process
        heads, width = patched.mha.no_heads, patched.mha.c_hidden
        assert openfold_core.preload_listed({(heads, width + 1, torch.float32)}, devices=("cpu",)) == 0
        with flashlight.settings.override(preload=False):  # FLASHLIGHT_PRELOAD=0
            assert openfold_core.preload_listed({(heads, width, torch.float32)}, devices=("cpu",)) == 0
        assert openfold_core.preload_listed({(heads, width, torch.float32)}, devices=("cpu",)) == 1
        prepare.wait_preloads()
        core = openfold_core.compiled_core(2, True, heads, width, torch.float32)
        assert len(core._by_signature) == 1 and core.captures == 0
        patched, stock, reference = make_twins("triangle_attention_start", gen, torch.float32)
        check_against_stock(patched, stock, reference, kwargs, torch.float32)
        assert core.captures == 0 and len(core._by_signature) == 1  # the preloaded signature served it
    openfold_core.clear_compiled()


def _traced_by_two_processes(name, gen, kwargs, **settings) -> list[int]:
    """Graphs traced by each of two "processes" patching module ``name`` (every compiled
    core forgotten before each) under ``settings``, each call checked against stock."""
    from flashlight.integrations import openfold_core

    traced = []
    with flashlight.settings.override(**settings):
        for _ in range(2):
            openfold_core.clear_compiled()
            patched, stock, reference = make_twins(name, gen, torch.float32)
            check_against_stock(patched, stock, reference, kwargs, torch.float32)
            traced.append(_graph_count())
    openfold_core.clear_compiled()
    return traced


def test_a_single_sequence_column_attention_is_kept_on_disk_too(gen, tmp_path):
    """One sequence leaves MSA column attention a single key, and its kernel no loop;
    with Inductor compiling remainders (the default) the core still runs Flashlight's
    kernel with the eager remainder, so it is kept on disk and a later process traces
    nothing ([Note: the cores' remainder])."""
    kwargs = _msa_inputs(gen, (), 1, 9, torch.float32, pair=False)
    traced = _traced_by_two_processes("msa_column_attention", gen, kwargs, cache_dir=str(tmp_path),
                                      remainder="inductor")
    assert traced == [1, 0], f"graphs traced by each process: {traced}"


def test_inplace_safe_and_mask_none(gen):
    patched, stock, reference = make_twins("triangle_attention_start", gen, torch.float32)
    kwargs = _pair_inputs(gen, (), 0, 12, torch.float32)
    kwargs_no_mask = {"x": kwargs["x"]}
    check_against_stock(patched, stock, reference, kwargs_no_mask, torch.float32)
    check_against_stock(
        patched, stock, reference, kwargs, torch.float32, chunk_size=5, inplace_safe=True
    )


def test_memory_efficient_and_lma_flags_are_ignored(gen):
    """The fused kernel replaces OpenFold's alternative kernels: same result as stock."""
    patched, stock, reference = make_twins("msa_row_attention_with_pair_bias", gen, torch.float32)
    kwargs = _msa_inputs(gen, (), 5, 12, torch.float32)
    want = run(stock, kwargs)
    for flags in [
        {"use_memory_efficient_kernel": True},
        {"use_lma": True},
        {"use_memory_efficient_kernel": True, "chunk_size": 2},
    ]:
        out = run(patched, kwargs, **flags)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_use_flash_mask_becomes_a_mask_bias(gen):
    """MSA column attention with use_flash: the key mask is applied as OpenFold's bias."""
    patched, stock, reference = make_twins("msa_column_attention", gen, torch.float32)
    kwargs = _msa_inputs(gen, (), 6, 11, torch.float32, pair=False)
    want = run(stock, kwargs)  # stock without use_flash (FlashAttention is not installed)
    out = run(patched, kwargs, use_flash=True)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_upstream_flags_reach_attention_and_are_ignored(gen):
    """OpenFold 2.x passes more flags to Attention.forward; unknown ones warn once."""
    patched, stock, reference = make_twins("triangle_attention_start", gen, torch.float32)
    mha, stock_mha = patched.mha, stock.mha
    x = torch.randn(12, 12, C_Z, generator=gen)
    mask = oft.random_mask((12, 12), gen)
    biases = [
        (1e9 * (mask - 1))[..., :, None, None, :],
        torch.randn(1, 2, 12, 12, generator=gen),
    ]
    with torch.no_grad():
        want = stock_mha(x, x, biases)
        out = mha(
            q_x=x,
            kv_x=x,
            biases=biases,
            use_memory_efficient_kernel=False,
            use_deepspeed_evo_attention=True,
            use_cuequivariance_attention=True,
            use_lma=False,
            lma_q_chunk_size=1024,
            lma_kv_chunk_size=4096,
        )
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
        # positional flags bind to the installed OpenFold's parameter names
        out = mha(x, x, biases, True, False)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
        with pytest.warns(RuntimeWarning, match="unknown argument 'use_some_future_kernel'"):
            out = mha(x, x, biases, use_some_future_kernel=True)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())

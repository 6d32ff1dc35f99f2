"""Row sums on the tensor core ([Note: row sums on the tensor core] in
flashlight/passes/tile_plan.py): the online loop's sum of a 16-bit ``p @ v``'s operand
runs as ``p @ [1, 0, ..., 0]`` beside it, where ``FLASHLIGHT_SUM_DOTS`` asks for it."""
from __future__ import annotations

import pytest
import torch

import flashlight
from bench.variants import VARIANTS
from flashlight import settings
from tests.helpers import H200_SHARED_MEMORY, shared_memory

pytest.importorskip("triton")

BF16 = torch.bfloat16


def _inputs(name, dtype, seed, **shape):
    variant = VARIANTS[name]
    return variant, variant.make_inputs({**variant.default_shape, **shape}, dtype, "cpu",
                                        torch.Generator().manual_seed(seed))


def _attention_kernel(report):
    kernels = [k for k in report.kernels if "amax.default" in k.aten_ops]
    assert len(kernels) == 1, str(report)
    return kernels[0]


def _close_to_float64(fn, args, out, rtol):
    ref = fn(*(a.double() if a.is_floating_point() else a for a in args))
    assert torch.isfinite(out).all()
    err = (out.double() - ref).abs().max().item()
    assert err <= rtol * ref.abs().max().item(), (err, ref.abs().max().item())


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("name,shape", [("evoformer_core", {"L": 45}), ("causal_tril", {}),
                                        ("msa_row_pair_bias", {})])
def test_a_bf16_row_sum_runs_on_the_tensor_core_and_matches_float64(name, shape, lazy):
    """The sum is a dot beside ``p @ v`` (also with lazy rescaling, whose branch rescales
    its accumulator), summed over its columns once after the loop; the output matches
    float64 at bf16's tolerance, also with a key tile cut short (45 keys)."""
    variant, args = _inputs(name, BF16, 7, **shape)
    with settings.override(sum_dots=True, lazy_rescale=lazy):
        report = flashlight.explain(variant.fn, *args)
        out = flashlight.compile(variant.fn)(*args)
        torch.compiler.reset()
    source = _attention_kernel(report).source
    assert source.count("ones") >= 3 and "tl.sum(acc" in source, source
    assert ("if tl.max(" in source) == lazy
    _close_to_float64(variant.fn, args, out, rtol=2e-2)


def test_without_the_setting_or_in_float32_the_sum_stays_on_the_cuda_cores():
    """Off by default; float32 operands keep their exact float32 sum (a TF32 or IEEE dot
    with the column would round ``p`` or run the CUDA cores' FMA loop)."""
    variant, args = _inputs("evoformer_core", BF16, 8)
    assert "ones" not in _attention_kernel(flashlight.explain(variant.fn, *args)).source
    variant, args = _inputs("evoformer_core", torch.float32, 8)
    with settings.override(sum_dots=True):
        assert "ones" not in _attention_kernel(flashlight.explain(variant.fn, *args)).source


def _weighted_numerator(q, k, v, w):
    # the numerator's operand is p * w, not p: the row sum is another value
    p = torch.softmax(q @ k.transpose(-1, -2), -1)  # [B, H, L, L]
    return (p * w) @ v


def test_a_sum_that_is_not_the_dots_operand_stays_on_the_cuda_cores():
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).to(BF16) for _ in range(3))
    w = (torch.rand(40, 40, generator=g) + 0.5).to(BF16)
    with settings.override(sum_dots=True):
        report = flashlight.explain(_weighted_numerator, q, k, v, w)
    assert "ones" not in _attention_kernel(report).source


@pytest.mark.parametrize("lazy", [False, True])
def test_row_sums_on_the_tensor_core_build_for_hopper(lazy):
    """Triton's sm_90 compiler (no GPU needed) takes the 16-wide dot and its accumulator,
    at the 128 x 64, 8-warp tile and a 64 x 32 one."""
    variant, args = _inputs("evoformer_core", BF16, 10, L=64)
    with settings.override(sum_dots=True, lazy_rescale=lazy):
        kernel = _attention_kernel(flashlight.explain(variant.fn, *args))
        for bm, bn, warps in ((128, 64, 8), (64, 32, 4)):
            built = kernel.aot_compile(90, block_m=bm, block_n=bn, num_warps=warps, num_stages=3)
            assert 0 < shared_memory(built) <= H200_SHARED_MEMORY

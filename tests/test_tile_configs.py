"""Tile configurations for Hopper: the space autotuning draws from, the cost model's prior
order for sm_90, and its shared-memory estimate against what Triton builds for sm_90
(ahead of time, no GPU; specialised as a launch on contiguous tensors is)."""
from __future__ import annotations

import pytest
import torch

from torch.fx.experimental.proxy_tensor import make_fx

from bench.variants import VARIANTS
from flashlight import aot, runtime, tile_configs, tuning
from flashlight.codegen import generate
from flashlight.decompositions import decompositions
from flashlight.lower import lower
from flashlight.pipeline import compile_graph
from tests.helpers import H200_SHARED_MEMORY

HOPPER = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3)]


def _core(dtype: torch.dtype, c: int, tf32: bool = False, L: int = 256, precision: str | None = None):
    """The Evoformer core's kernel (q, k, v [N, H, L, c], a mask and a pair bias): its
    launcher, GPU source, and its input tensors in argument order (keys for several tiles:
    a loop of one tile has no pipeline to stage)."""
    variant = VARIANTS["evoformer_core"]
    inputs = variant.make_inputs({"N": 2, "L": L, "H": 2, "c": c}, dtype, "cpu", torch.Generator().manual_seed(0))
    gm = make_fx(variant.fn, decomposition_table=decompositions(inference=True))(*inputs)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        (tiled,) = compile_graph(lower(gm)).kernels.values()
        src = generate(tiled, None, precision or ("tf32" if tf32 else "ieee"), interpret=False)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    tensor_of = dict(zip([n.name for n in gm.graph.nodes if n.op == "placeholder"], inputs))
    tensors = [tensor_of[name] for name in src.inputs]
    launcher = runtime.Launcher(tiled, src, autotune=True, input_dtypes=tuple(t.dtype for t in tensors))
    return launcher, src, tensors


def _built_shared(launcher, src, tensors, config) -> int:
    m, n, w, s = config
    built = aot.aot_compile(src, list(launcher.input_dtypes), launcher.kernel.dtype, 90, block_m=m, block_n=n,
                                num_warps=w, num_stages=s, specialize=aot.integer_arguments(launcher, tensors))
    return built.shared


@pytest.mark.parametrize("dtype, tf32", [(torch.bfloat16, False), (torch.float32, True)])
def test_tensor_core_kernels_draw_from_the_hopper_tiles(dtype, tf32):
    launcher, src, _ = _core(dtype, 32, tf32)
    space = tile_configs.config_space(src)
    assert set(HOPPER) <= set(space) and len(set(space)) == len(space)
    candidates = tile_configs.candidate_space(src, launcher.tiled)
    assert 3 <= len(candidates) <= tuning.MAX_CANDIDATES
    # 16-bit operands: FlexAttention's Hopper tile first, the 8-warp one next;
    # TF32: the earlier winners first, the 8-warp 3-stage tile among the few
    expected = [(128, 64, 4, 3), (128, 64, 8, 3)] if dtype == torch.bfloat16 else [(128, 64, 4, 2), (128, 64, 8, 3)]
    assert candidates[:2] == expected


def test_ieee_float32_kernels_keep_their_own_tiles():
    launcher, src, _ = _core(torch.float32, 32)
    assert src.fma_dots
    assert not set(tile_configs.TENSOR_CORE_CONFIGS) & set(tile_configs.config_space(src))
    assert tile_configs.candidate_space(src, launcher.tiled)[0] == tuning._FMA_PRIOR[0]


@pytest.mark.parametrize("dtype, tf32, c, config", [
    (torch.bfloat16, False, 32, (128, 64, 4, 3)),
    (torch.bfloat16, False, 64, (128, 128, 8, 3)),
    (torch.float32, True, 32, (128, 64, 8, 3)),
])
def test_the_shared_memory_estimate_follows_the_sm90_build(dtype, tf32, c, config):
    launcher, src, inputs = _core(dtype, c, tf32)
    estimate, _ = tuning.estimates(launcher.tiled, src.fma_dots, config)
    built = _built_shared(launcher, src, inputs, config)
    assert 0.85 * built <= estimate <= 1.35 * built, (estimate, built)


@pytest.mark.parametrize("c, config", [(32, (64, 64, 4, 2)), (128, (128, 32, 4, 2))])
def test_three_tf32_products_stage_split_operands_and_the_estimate_counts_them(c, config):
    """Float32 dots as three TF32 products (TF32 off) split their operands inside the loop
    and stage the parts in shared memory: the estimate follows the sm_90 build, and at head
    width 128 the 8-warp 128 x 64 tile, which the build puts past sm_90's shared memory per block,
    is not a candidate."""
    launcher, src, inputs = _core(torch.float32, c, precision="tf32x3")
    assert src.fp32_precision == "tf32x3" and not src.fma_dots
    estimate, _ = tuning.estimates(launcher.tiled, src.fma_dots, config, split=True)
    built = _built_shared(launcher, src, inputs, config)
    assert 0.85 * built <= estimate <= 1.35 * built, (estimate, built)
    assert estimate > tuning.estimates(launcher.tiled, src.fma_dots, config)[0]  # TF32's own is smaller
    if c == 128:
        assert (128, 64, 8, 2) not in tile_configs.candidate_space(src, launcher.tiled)
        assert tuning.estimates(launcher.tiled, src.fma_dots, (128, 64, 8, 2), split=True)[0] > H200_SHARED_MEMORY


def test_tiles_that_do_not_fit_in_shared_memory_are_left_out():
    """At head width 128 in bf16, a 3-stage pipeline of 128 x 128 tiles stages more than
    an H200 has; the estimate says so, and neither the few nor the full set try it."""
    launcher, src, inputs = _core(torch.bfloat16, 128)
    config = (128, 128, 8, 3)
    assert config in tile_configs.config_space(src)
    assert tuning.estimates(launcher.tiled, src.fma_dots, config)[0] > tuning.SHARED_MEMORY_BUDGET
    assert config not in tile_configs.candidate_space(src, launcher.tiled)
    full = tile_configs.candidate_space(src, launcher.tiled, "full")
    assert config not in full and (128, 64, 4, 3) in full
    assert _built_shared(launcher, src, inputs, config) > H200_SHARED_MEMORY
    fits = tuning.fitting(launcher.tiled, tile_configs.config_space(src), budget=1)  # none fits: all stay
    assert fits == tile_configs.config_space(src)


def test_a_reported_kernel_builds_as_the_jit_built_its_first_launch():
    """``KernelReport.aot_compile`` specializes the build on the kernel's first launch
    (strides of 1 constant, as Triton's JIT does): the key loop's tiles, known contiguous,
    are copied to shared memory ahead of use (software pipelining: more shared memory),
    where a build that assumes nothing of the strides loads them element by element."""
    import flashlight

    variant = VARIANTS["evoformer_core"]
    inputs = variant.make_inputs({"N": 2, "L": 128, "H": 2, "c": 32}, torch.bfloat16, "cpu",
                                 torch.Generator().manual_seed(0))
    (kernel,) = flashlight.explain(variant.fn, *inputs).kernels
    config = {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 3}
    as_launched = kernel.aot_compile(90, **config)
    assuming_nothing = kernel.aot_compile(90, specialize=None, **config)
    assert as_launched.shared > assuming_nothing.shared > 0, (as_launched, assuming_nothing)


def test_the_integer_arguments_predicted_for_a_launch_are_those_it_passes():
    """``aot.integer_arguments`` (sizes and strides, without launching) names and values
    the arguments the launch itself records (``Launcher.first_arguments``)."""
    launcher, _, tensors = _core(torch.float32, 32, L=64)
    predicted = aot.integer_arguments(launcher, tensors)
    launcher(*tensors)
    assert launcher.first_arguments == predicted

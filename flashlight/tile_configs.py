"""The tile configurations autotuning chooses from: (BLOCK_M, BLOCK_N, num_warps, num_stages).

:func:`config_space` is every configuration a kernel may run with, by the kind of its
dots; :func:`candidate_space` the few of them autotuning times on the GPU (a cost model's
pick, :func:`flashlight.tuning.pruned_space`, or all that fit with ``"full"``);
:func:`configs` those as Triton's ``Config`` objects for one launcher.
"""
from __future__ import annotations

from flashlight import tuning
from flashlight.codegen import KernelSource
from flashlight.ir import TiledKernel

GPU_CONFIGS = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    (64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 2),
    (64, 128, 4, 2), (128, 128, 8, 2), (64, 32, 4, 3),
]
# Added for kernels whose dots run on tensor cores, for Hopper (sm_90): 128-row tiles, also
# with 8 warps (two warpgroups), and deeper pipelines of the loop's loads (what does not
# fit in shared memory is left out: flashlight.tuning.fitting)
TENSOR_CORE_CONFIGS = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (128, 32, 4, 3)]
# Added for kernels whose dots run in IEEE float32 on CUDA cores (KernelSource.fma_dots):
# there the operand and product tiles live in registers, and at head widths of 64-128
# every configuration above spills thousands of bytes per thread to local memory on
# sm_90 (cuobjdump of the AOT build); these fewer rows per warp do not.
FMA_DOT_CONFIGS = [(64, 32, 8, 2), (32, 32, 8, 2), (64, 16, 8, 2), (32, 32, 4, 2)]
# Tried when no candidate above fits in the GPU's shared memory: operand tiles of 128-256
# float32 values per row (differential attention's keys and values at head widths
# 128 / 256 in TF32 asked for 320 KB on an H200, which has 227 KB). One pipeline stage
# and fewer rows and keys per step shrink what a program stages in shared memory.
SMALL_FOOTPRINT_CONFIGS = [(64, 32, 4, 1), (32, 32, 4, 1), (64, 16, 4, 1), (32, 16, 4, 1), (16, 16, 4, 1)]


# Left out for those kernels: key tiles of 128 spill the most there (9-12 KB per thread
# at head width 64), are among the slowest to build (causal attention for sm_90: 16.5 and
# 19.8 s, the slowest kept candidate 13.3 s; bench/results/build_times/) and were never
# the fastest in an IEEE float32 benchmark cell. Candidates are built in parallel
# (:func:`flashlight.tuning_cache.precompile`), so the slowest one bounds a kernel's first call.
FMA_DOT_MAX_BLOCK_N = 64


def config_space(src: KernelSource, fma_dots: bool | None = None) -> list[tuple[int, int, int, int]]:
    """The (BLOCK_M, BLOCK_N, num_warps, num_stages) configurations autotuning tries for
    ``src`` (``fma_dots``: for the GPU's form of an interpreter kernel, from its plan)."""
    if not (src.fma_dots if fma_dots is None else fma_dots):
        return GPU_CONFIGS + TENSOR_CORE_CONFIGS
    return [c for c in GPU_CONFIGS if c[1] <= FMA_DOT_MAX_BLOCK_N] + FMA_DOT_CONFIGS


def candidate_space(src: KernelSource, tiled: TiledKernel | None,
                    autotune: bool | str = True) -> list[tuple[int, int, int, int]]:
    """The configurations autotuning times on the GPU: the cost model's few
    (:func:`flashlight.tuning.pruned_space`), or all of :func:`config_space` that fit in
    shared memory (:func:`flashlight.tuning.fitting`) when ``autotune`` is ``"full"``
    (all of it when no tiled kernel is given)."""
    space = config_space(src)
    if tiled is None:
        return space
    split = src.fp32_precision == "tf32x3"  # float32 dots' operands split in the loop
    if autotune == "full":  # all that fit in shared memory
        return tuning.fitting(tiled, space, split=split)
    return tuning.pruned_space(tiled, src.fma_dots, space, split=split)


def configs(src: KernelSource, interpret: bool, autotune: bool | str, tiled: TiledKernel | None = None):
    """Triton's ``Config`` objects a launcher's autotuner runs over: one small
    configuration under the interpreter, the first candidate with ``autotune`` off."""
    if interpret:
        # unequal tiles under the interpreter, so a BLOCK_M / BLOCK_N mix-up cannot hide
        return triton_configs([(32, 16, 1, 1)])
    space = candidate_space(src, tiled, autotune)
    return triton_configs(space if autotune else space[:1])


def triton_configs(space):
    """``space``'s (BLOCK_M, BLOCK_N, num_warps, num_stages) as Triton ``Config`` objects."""
    import triton

    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in space]

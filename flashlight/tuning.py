"""What autotuning tries and keys on: a cost-model prior over tile configurations, a
structural signature of a kernel, size buckets, and the choice against the unfused graph.

Everything here is a pure function of a tiled kernel, its source and measured times,
so it is tested without a GPU; :mod:`flashlight.runtime` calls it.

- :func:`pruned_space`: the few configurations (at most :data:`MAX_CANDIDATES`) that
  autotuning tries by default, out of :func:`flashlight.tile_configs.config_space`. A prior
  order per kind of dot (:func:`prior`: 16-bit or TF32 operands on tensor cores, or IEEE
  float32 on CUDA cores), taken from the winners the H200 benchmarks recorded
  (``bench/results/*.csv``, column ``configs``) and Hopper's preferred tile shapes,
  then two estimates made from the kernel's loads: shared memory per program (the
  loop's tiles per pipeline stage and conversion scratch; candidates over
  :data:`SHARED_MEMORY_BUDGET` are dropped, :func:`fitting`) and float32 values per
  thread (candidates over the limit of their kind of dot go to the end of the order).
- :func:`kernel_signature` and :func:`size_bucket`: the key of the shipped tuned
  configurations (:mod:`flashlight.tuned_configs`), which does not depend on the exact
  source text: dtypes, fp32 precision, padded head widths, loop reductions, dots, the
  live-tile predicate, and the launch's rows, keys and grid rounded up to powers of two.
- :func:`choose`: the kernel or the unfused graph (:data:`EAGER`), from their times.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from flashlight.ir import Dim, Load, TiledKernel, free_dims, walk

Config = tuple  # (BLOCK_M, BLOCK_N, num_warps, num_stages)

EAGER = "eager"  # the choice of running the unfused graph (PyTorch) instead of the kernel
MAX_CANDIDATES = 4
# sm_90's shared memory per block (opt-in, bytes); GPUs with less reject the candidates
# that do not fit when they are timed, and the runtime falls back to smaller tiles
SHARED_MEMORY_BUDGET = 232448
# The unfused graph must be this much faster than the kernel to be chosen: timings are
# medians with some noise, and the kernel needs far less memory (no score matrix).
EAGER_MARGIN = 0.05
# Largest grid bucket. Kernels of one structure at one length can differ in the grid
# alone (MSA row attention, 512 rows x 8 heads = 4096 programs per row block; triangle
# attention, 256 x 4 = 1024), and their best tiles need not agree, so the buckets keep
# them apart up to sizes no Evoformer launch reaches.
GRID_BUCKET_CAP = 1 << 16

# Winners first. Tensor cores: 16-bit operands and TF32 rank apart on sm_90. 16-bit: 128-row
# tiles over 64 keys at 3 stages (FlexAttention's Hopper default at head widths up to 64,
# and the shape of the fastest kernels there), with 8 warps next (half the registers per
# thread: 122 against 209 in the sm_90 build of the Evoformer core at head width 32, so
# more programs per SM), then the 64x64 tiles that won the earlier bf16 cells. TF32:
# 128x64 / 128x32 at 4 warps and 128x64 at 8 warps won every earlier cell up to head
# width 64 (and 128x64 at 8 warps at 128); the 3-stage 8-warp tile follows them.
_HALF_PRIOR = [(128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 2), (128, 128, 8, 3),
               (128, 32, 4, 3), (128, 64, 8, 4), (128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 4, 2)]
_TF32_PRIOR = [(128, 64, 4, 2), (128, 64, 8, 3), (128, 32, 4, 2), (128, 64, 8, 2), (128, 64, 4, 3),
               (64, 64, 4, 3), (128, 32, 4, 3), (64, 32, 4, 3), (64, 64, 4, 2), (128, 128, 8, 2)]
# IEEE float32 dots on CUDA cores: 32x32 and 64x64 at 4 warps won most cells, 128x64 the
# Evoformer ones at head width 32, 64x32 the ones at 128.
_FMA_PRIOR = [(32, 32, 4, 2), (64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 4, 2), (64, 32, 4, 3), (64, 32, 8, 2),
              (128, 64, 8, 2), (32, 32, 8, 2), (128, 32, 4, 2), (64, 16, 8, 2)]
# Float32 values per thread above which a candidate goes to the end of the order: the
# largest a winner of its kind needed (tensor cores: 128x64 at 4 warps, head width 64;
# IEEE float32: 64x32 at 4 warps, head width 128, whose operand tiles sit in registers).
_VALUES_PER_THREAD = {False: 128, True: 224}


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _loads(tiled: TiledKernel) -> list[Load]:
    """The distinct tensor loads of the kernel's loop (bodies and initial values)."""
    found: dict[Load, None] = {}
    for red in tiled.kernel.loop:
        for expr in red.exprs():
            found.update((node, None) for node in walk(expr) if isinstance(node, Load))
    return list(found)


class _Footprint:
    """Per-program tile sizes of a kernel, in elements, as functions of BLOCK_M / BLOCK_N."""

    def __init__(self, tiled: TiledKernel, split_operands: bool = False):
        kernel, tiling = tiled.kernel, tiled.tiling
        padded = dict(tiling.padded)
        loop_dim = tiling.tiled_by_block_n(kernel.loop[0].dim)
        # per load: (reads the row dim, reads the BLOCK_N dim, padded width, bytes per element)
        self.loads: list[tuple[bool, bool, int, int]] = []
        for load in _loads(tiled):
            dims = {d for axis in load.index for d in axis}
            width = math.prod(padded.get(d, 1) for d in dims)
            self.loads.append((tiling.row in dims, loop_dim in dims, width, _bytes(load.dtype)))
        feature = padded.get(tiling.feature, 0) if tiling.feature is not None else 0
        accumulators = sum(1 for red in kernel.loop if tiling.feature in free_dims(red.body)) if feature else 0
        self.accumulated = feature * accumulators  # float32 values per row kept across the loop
        self.out_width = max(feature, 1)
        # float32 dot operands (TF32 or IEEE) are read from shared memory, 16-bit ones from registers
        self.fp32_operands = any(d.dtype == torch.float32 for d in tiled.plan.dots.values())
        # float32 dots as three TF32 products split their operands inside the loop
        self.split_operands = split_operands and self.fp32_operands

    def shared_bytes(self, config: Config) -> int:
        """Shared memory a program needs, estimated as Triton allocates it for sm_90 on a
        launch specialised for contiguous, 16-byte aligned tensors (fitted to builds of
        attention, the Evoformer core and triangle attention in bf16 and TF32 at head
        widths 32-128: exact for most, at most 11% below or 30% above the others):

        - every tile the loop loads (keys and values, and bias tiles over rows and keys:
          Triton's pipeliner stages those too), once per pipeline stage after the first;
        - conversion scratch: the output tile in float32, and where a tile has at least
          as many keys as rows, a key tile of the widest loop operand in 16 bits;
        - with float32 dot operands, the row tiles (the queries) too: float32 operands of
          Hopper's tensor-core instructions are read from shared memory;
        - with float32 dots as three TF32 products, the high and low parts of a key tile of
          the widest loop operand, staged for the tensor cores (fitted to builds of the core
          at head widths 32-128 in five configurations: exact in three, at most 8% above)."""
        block_m, block_n, _, stages = config
        per_stage = sum(width * block_n * (block_m if has_row else 1) * size
                        for has_row, has_loop, width, size in self.loads if has_loop)
        widest = max([width for _, has_loop, width, _ in self.loads if has_loop] or [1])
        scratch = 4 * block_m * self.out_width + (2 * block_n * widest if block_n >= block_m else 0)
        if self.fp32_operands:
            scratch += sum(4 * width * block_m for has_row, has_loop, width, _ in self.loads if has_row and not has_loop)
        if self.split_operands:
            scratch += 2 * 4 * widest * block_n
        return per_stage * max(1, stages - 1) + scratch

    def values_per_thread(self, config: Config, fma: bool) -> float:
        """Float32 values a thread holds: the score tile and the accumulators, and for IEEE
        float32 dots the operand tiles too (they stay in registers there)."""
        block_m, block_n, warps, _ = config
        values = block_m * (block_n + self.accumulated)
        if fma:
            values += sum(width * (block_m if has_row else 1) * (block_n if has_loop else 1)
                          for has_row, has_loop, width, _ in self.loads if has_row != has_loop)
        return values / (32 * warps)


def prior(tiled: TiledKernel, fma_dots: bool) -> list[Config]:
    """The prior order of configurations for ``tiled``'s kind of dot: IEEE float32 on CUDA
    cores, 16-bit operands on tensor cores, or TF32."""
    if fma_dots:
        return _FMA_PRIOR
    half = (torch.float16, torch.bfloat16)
    dots = list(tiled.plan.dots.values())
    return _HALF_PRIOR if dots and all(d.dtype in half for d in dots) else _TF32_PRIOR


def fitting(tiled: TiledKernel, space: Sequence[Config], budget: int = SHARED_MEMORY_BUDGET,
            split: bool = False) -> list[Config]:
    """The members of ``space`` whose shared memory (:meth:`_Footprint.shared_bytes`) fits
    ``budget``, in order; where none does, all of them (the runtime then falls back to
    smaller tiles when the GPU rejects them). ``split``: float32 dots run as three TF32
    products."""
    footprint = _Footprint(tiled, split)
    fit = [c for c in space if footprint.shared_bytes(c) <= budget]
    return fit or list(space)


def pruned_space(tiled: TiledKernel, fma_dots: bool, space: Sequence[Config],
                 budget: int = SHARED_MEMORY_BUDGET, limit: int = MAX_CANDIDATES, split: bool = False) -> list[Config]:
    """The candidates autotuning tries by default: a non-empty, ordered subset of ``space``
    (at most ``limit``), best first by the prior and the two estimates (module docstring);
    ``split``: float32 dots run as three TF32 products."""
    footprint = _Footprint(tiled, split)
    order = prior(tiled, fma_dots)
    rank = {c: k for k, c in enumerate(order)}
    ordered = sorted(space, key=lambda c: rank.get(tuple(c), len(order)))
    fit = [c for c in ordered if footprint.shared_bytes(c) <= budget]
    if not fit:  # nothing fits: the smallest, and the runtime's small-tile fallback
        return sorted(ordered, key=footprint.shared_bytes)[:limit]
    ceiling = _VALUES_PER_THREAD[fma_dots]
    light = [c for c in fit if footprint.values_per_thread(c, fma_dots) <= ceiling]
    heavy = [c for c in fit if c not in light]
    return (light + heavy)[:limit]


def estimates(tiled: TiledKernel, fma_dots: bool, config: Config, split: bool = False) -> tuple[int, float]:
    """(shared memory bytes, float32 values per thread) the cost model estimates for
    ``config`` (``split``: float32 dots as three TF32 products)."""
    footprint = _Footprint(tiled, split)
    return footprint.shared_bytes(config), footprint.values_per_thread(config, fma_dots)


# ------------------------------------------------------------------ split serial loops

# A split serial loop ([Note: split serial loops] in flashlight.passes.tiling) aims at this
# many programs per multiprocessor, counting 64 x 64 output tiles, and gives each program
# at least MIN_SPLIT_LEN loop positions (fewer would make the partial sums' buffer and
# their addition cost more than the parallelism gains).
SPLIT_PROGRAMS_PER_SM = 2
MIN_SPLIT_LEN = 16
NOMINAL_TILE = 64


def split_count(loop_extent: int, tiles: int, multiprocessors: int) -> tuple[int, int]:
    """(splits, positions per split) of a serial loop of ``loop_extent`` positions whose
    grid has ``tiles`` programs of :data:`NOMINAL_TILE`-square tiles: enough splits to give
    each multiprocessor :data:`SPLIT_PROGRAMS_PER_SM` programs, at most one per
    :data:`MIN_SPLIT_LEN` positions; (1, extent) when the tiles fill the GPU already."""
    wanted = -(-SPLIT_PROGRAMS_PER_SM * multiprocessors // max(tiles, 1))
    splits = max(1, min(wanted, loop_extent // MIN_SPLIT_LEN))
    length = -(-loop_extent // splits) if loop_extent else 1
    return -(-loop_extent // length) if loop_extent else 1, max(length, 1)


# ------------------------------------------------------------------ keys of shipped choices


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def kernel_signature(tiled: TiledKernel, fp32_precision: str, fma_dots: bool) -> str:
    """A kernel's structure, independent of its exact source: kernels that share it share
    tuned configurations. Output dtype, the floating dtypes of the operands the loop loads
    (tensors read along a head width; a bias's dtype does not count: OpenFold's may come
    in float32 next to bf16 operands), fp32 precision (when an operand is float32),
    padded head widths, loop reductions, ``tl.dot`` count, IEEE float32 dots, a live-tile
    predicate, and the number of tensors the loop loads."""
    kernel, tiling = tiled.kernel, tiled.tiling
    widths = dict(tiling.padded)
    loads = _loads(tiled)
    operands = [x for x in loads if any(d in widths for axis in x.index for d in axis)] or loads
    dtypes = sorted({_dtype_name(x.dtype) for x in operands if x.dtype.is_floating_point})
    precision = fp32_precision if "float32" in dtypes else "-"
    padded = ",".join(str(w) for w in sorted(widths.values())) or "-"
    return (f"out {_dtype_name(kernel.dtype)} | operands {','.join(dtypes) or '-'} | fp32 {precision} | "
            f"widths {padded} | loop {len(kernel.loop)} | dots {tiling.dots} | fma {int(fma_dots)} | "
            f"live {int(kernel.live is not None)} | tensors {len({x.base for x in loads})}")


def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def size_bucket(rows: int, keys: int, grid: int) -> str:
    """The launch's extents rounded up to powers of two (the grid capped at
    :data:`GRID_BUCKET_CAP`): folds of 250 and 256 residues share a bucket."""
    return (f"rows {next_power_of_two(rows)} | keys {next_power_of_two(keys)} | "
            f"grid {min(next_power_of_two(grid), GRID_BUCKET_CAP)}")


def extents(tiled: TiledKernel, values: dict[str, int]) -> tuple[int, int, int]:
    """(rows, keys, grid programs per row block) of a launch, from its size arguments."""
    tiling = tiled.tiling

    def size(d: Dim | None) -> int:
        if d is None:
            return 1
        return int(d.size) if d.is_static else int(values[d.size])

    return (size(tiling.row), size(tiling.tiled_by_block_n(tiled.kernel.loop[0].dim)),
            math.prod(size(d) for d in tiling.grid))


# ------------------------------------------------------------------ the kernel or the graph


def choose(kernel_ms: float | None, eager_ms: float | None, margin: float = EAGER_MARGIN) -> str:
    """``"kernel"`` or :data:`EAGER`, from the median times of the best kernel candidate and
    of the unfused graph (None or NaN: not measured, or it failed). The graph is chosen
    only when it is faster by more than ``margin``, or when the kernel has no time."""
    kernel_ok = kernel_ms is not None and math.isfinite(kernel_ms) and kernel_ms > 0
    eager_ok = eager_ms is not None and math.isfinite(eager_ms) and eager_ms > 0
    if not eager_ok:
        return "kernel"
    if not kernel_ok:
        return EAGER
    return EAGER if eager_ms * (1.0 + margin) < kernel_ms else "kernel"

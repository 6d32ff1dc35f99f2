"""The runtime's compilation of autotuning candidates on a thread pool."""
from __future__ import annotations

import threading

import pytest
import torch

triton = pytest.importorskip("triton")

from flashlight import runtime, settings  # noqa: E402


class _RecordingJit:
    """Stands in for a Triton JIT function: ``warmup`` hands a compilation to the active
    ``AsyncCompileMode`` the way Triton's JIT does, and records where it ran."""

    def __init__(self, failing_block_m: int | None = None):
        self.warmups: list[dict] = []
        self.compiled: dict[int, str] = {}  # BLOCK_M -> thread that compiled it
        self.failing_block_m = failing_block_m
        self.lock = threading.Lock()

    def warmup(self, *args, grid, **options):
        from triton.runtime._async_compile import active_mode

        self.warmups.append({"args": args, "grid": grid, **options})
        mode = active_mode.get()
        assert mode is not None, "warmup must run under AsyncCompileMode"
        block_m = options["BLOCK_M"]

        def compile_candidate():
            if block_m == self.failing_block_m:
                raise RuntimeError("this candidate does not compile")
            return threading.current_thread().name

        def finalize(thread_name):
            with self.lock:
                self.compiled[block_m] = thread_name

        return mode.submit(("candidate", block_m), compile_candidate, finalize, lambda future: None)


def _configs():
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": 32}, num_warps=w, num_stages=2)
            for m, w in ((16, 4), (32, 4), (64, 8), (128, 8))]


def test_candidates_compile_on_a_pool_with_the_options_the_autotuner_launches():
    jit = _RecordingJit()
    configs = _configs()
    grid = object()
    with settings.override(compile_threads=3):
        assert runtime.precompile(jit, configs, ("a", "b"), grid) == 3
    assert [w["BLOCK_M"] for w in jit.warmups] == [16, 32, 64, 128]
    for warmup, config in zip(jit.warmups, configs):
        assert warmup["args"] == ("a", "b") and warmup["grid"] is grid
        assert {k: warmup[k] for k in config.all_kwargs()} == config.all_kwargs()
    assert set(jit.compiled) == {16, 32, 64, 128}
    assert all(name.startswith("flashlight-compile") for name in jit.compiled.values()), jit.compiled


def test_a_candidate_that_fails_to_compile_leaves_the_others_compiled():
    jit = _RecordingJit(failing_block_m=32)
    with settings.override(compile_threads=2):
        runtime.precompile(jit, _configs(), (), None)
    assert set(jit.compiled) == {16, 64, 128}


def test_one_compile_thread_leaves_compilation_to_triton():
    jit = _RecordingJit()
    with settings.override(compile_threads=1):
        assert runtime.precompile(jit, _configs(), (), None) == 1
    assert jit.warmups == [] and jit.compiled == {}


def test_compile_threads_default_to_the_cores_and_never_exceed_the_candidates():
    with settings.override(compile_threads=0):
        assert 1 <= runtime.compile_threads(12) <= 12
        assert runtime.compile_threads(1) == 1
    with settings.override(compile_threads=64):
        assert runtime.compile_threads(5) == 5


def _attention(q, k, v):
    # [B, H, L, D] -> [B, H, L, D]
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, -1) @ v


@pytest.mark.parametrize("dtype, tf32, fma_dots", [(torch.float32, False, True), (torch.float32, True, False),
                                                   (torch.bfloat16, False, False)])
def test_ieee_float32_kernels_leave_out_the_wide_key_tiles(dtype, tf32, fma_dots):
    import flashlight

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).to(dtype) for _ in range(3))
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        report = flashlight.explain(_attention, q, k, v)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
        torch.compiler.reset()
    (kernel,) = report.kernels
    space = kernel.gpu_configs
    assert len(set(space)) == len(space)
    assert set(runtime._GPU_CONFIGS[:2]) <= set(space)  # the usual winners stay
    if fma_dots:
        assert max(block_n for _, block_n, _, _ in space) <= 64
        assert set(runtime._FMA_DOT_CONFIGS) <= set(space)
    else:
        assert space == tuple(runtime._GPU_CONFIGS)

"""The runtime's compilation of autotuning candidates on a thread pool."""
from __future__ import annotations

import threading

import pytest
import torch

triton = pytest.importorskip("triton")

from flashlight import runtime, settings, tile_configs, tuning_cache  # noqa: E402
from tests.helpers import FakeJit, FakeTuner  # noqa: E402


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
        assert tuning_cache.precompile(jit, configs, ("a", "b"), grid) == 3
    assert [w["BLOCK_M"] for w in jit.warmups] == [16, 32, 64, 128]
    for warmup, config in zip(jit.warmups, configs):
        assert warmup["args"] == ("a", "b") and warmup["grid"] is grid
        assert {k: warmup[k] for k in config.all_kwargs()} == config.all_kwargs()
    assert set(jit.compiled) == {16, 32, 64, 128}
    assert all(name.startswith("flashlight-compile") for name in jit.compiled.values()), jit.compiled


def test_a_candidate_that_fails_to_compile_leaves_the_others_compiled():
    jit = _RecordingJit(failing_block_m=32)
    with settings.override(compile_threads=2):
        tuning_cache.precompile(jit, _configs(), (), None)
    assert set(jit.compiled) == {16, 64, 128}


def test_one_compile_thread_leaves_compilation_to_triton():
    jit = _RecordingJit()
    with settings.override(compile_threads=1):
        assert tuning_cache.precompile(jit, _configs(), (), None) == 1
    assert jit.warmups == [] and jit.compiled == {}


def test_compile_threads_default_to_the_cores_and_never_exceed_the_candidates():
    with settings.override(compile_threads=0):
        assert 1 <= tuning_cache.compile_threads(12) <= 12
        assert tuning_cache.compile_threads(1) == 1
    with settings.override(compile_threads=64):
        assert tuning_cache.compile_threads(5) == 5


def _attention(q, k, v):
    # [B, H, L, D] -> [B, H, L, D]
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, -1) @ v


@pytest.mark.parametrize("dtype, tf32, fp32_dots, fma_dots", [
    (torch.float32, False, "ieee", True), (torch.float32, False, "tf32x3", False),
    (torch.float32, True, "ieee", False), (torch.bfloat16, False, "ieee", False)])
def test_ieee_float32_kernels_leave_out_the_wide_key_tiles(dtype, tf32, fp32_dots, fma_dots):
    """Only float32 dots on the CUDA cores (TF32 off, ``FLASHLIGHT_FP32_DOTS=ieee``) draw
    from the register-bound tiles; three TF32 products run on the tensor cores."""
    import flashlight

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).to(dtype) for _ in range(3))
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        with settings.override(fp32_dots=fp32_dots):
            report = flashlight.explain(_attention, q, k, v)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
        torch.compiler.reset()
    (kernel,) = report.kernels
    space = kernel.gpu_configs
    assert len(set(space)) == len(space)
    assert set(tile_configs.GPU_CONFIGS[:2]) <= set(space)  # the usual winners stay
    if fma_dots:
        assert max(block_n for _, block_n, _, _ in space) <= 64
        assert set(tile_configs.FMA_DOT_CONFIGS) <= set(space)
        assert not set(tile_configs.TENSOR_CORE_CONFIGS) & set(space)
    else:
        assert space == tuple(tile_configs.GPU_CONFIGS + tile_configs.TENSOR_CORE_CONFIGS)


# --------------------------------------------------------- autotuning choices kept on disk


def _kernel_source(body: str = "pass"):
    return runtime.KernelSource("flashlight_k", f"def flashlight_k(x):\n    {body}\n", ("x",), (1,), ("s0",), 1,
                                (), False, "ieee", False)


def _fake_launcher(src):
    launcher = object.__new__(runtime.Launcher)
    launcher.src, launcher._chosen, launcher._raw = src, {}, FakeJit()
    return launcher


def test_an_autotuning_choice_is_recorded_and_reused_by_another_process(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHLIGHT_CACHE_DIR", str(tmp_path))
    compiled = []
    monkeypatch.setattr(runtime, "precompile", lambda jit, configs, args, grid, extra=None: compiled.append(len(configs)))
    src, device = _kernel_source(), torch.device("cpu")
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": 32}, num_warps=4, num_stages=2) for m in (64, 128)]

    first, tuner = _fake_launcher(src), FakeTuner(configs)
    first._first_launch(tuner, ("args",), None, (96,), device, tune=True)
    assert compiled == [2] and len(tuner.launches) == 1 and first._raw.launches == []
    assert first.chosen_configs() == {(96,): (128, 32, 4, 2)}

    # a new process (new launcher, empty in-memory choices) launches without tuning
    again, tuner = _fake_launcher(src), FakeTuner(configs)
    again._first_launch(tuner, ("args",), None, (96,), device, tune=True)
    assert compiled == [2] and tuner.launches == []
    assert again._raw.launches[0]["BLOCK_M"] == 128 and again.chosen_configs() == first.chosen_configs()

    # other sizes, other source, or the cache switched off: tuned afresh
    other_source = _kernel_source("return")
    for launcher, sizes, env in ((_fake_launcher(src), (97,), "1"), (_fake_launcher(other_source), (96,), "1"),
                                 (_fake_launcher(src), (96,), "0")):
        monkeypatch.setenv("FLASHLIGHT_TUNING_CACHE", env)
        tuner = FakeTuner(configs)
        launcher._first_launch(tuner, ("args",), None, sizes, device, tune=True)
        assert len(tuner.launches) == 1 and launcher._raw.launches == []


def test_an_unreadable_tuning_record_means_tuning_again(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHLIGHT_CACHE_DIR", str(tmp_path))
    src, device = _kernel_source(), torch.device("cpu")
    choice = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "hook": object()}
    tuning_cache.remember_choice(src, device, (8,), choice)
    assert tuning_cache.recall_choice(src, device, (8,)) == {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4}
    (path,) = (tmp_path / "tuning").iterdir()
    path.write_text("{not json")
    assert tuning_cache.recall_choice(src, device, (8,)) is None
    path.write_text('{"cpu | anything": [1, 2]}')
    assert tuning_cache.recall_choice(src, device, (8,)) is None
    with settings.override(tuning_cache=False):
        tuning_cache.remember_choice(src, device, (9,), {"BLOCK_M": 64, "BLOCK_N": 32})
    assert tuning_cache.recall_choice(src, device, (9,)) is None
    blocked = tmp_path / "file"
    blocked.write_text("")
    with settings.override(cache_dir=str(blocked)):  # a file where the folder should be
        tuning_cache.remember_choice(src, device, (10,), {"BLOCK_M": 64, "BLOCK_N": 32})
        assert tuning_cache.recall_choice(src, device, (10,)) is None


def test_when_no_candidate_fits_the_gpu_smaller_tiles_are_tuned(tmp_path, monkeypatch):
    from triton.runtime.errors import OutOfResources

    monkeypatch.setenv("FLASHLIGHT_CACHE_DIR", str(tmp_path))
    compiled = []
    monkeypatch.setattr(runtime, "precompile", lambda jit, configs, args, grid, extra=None: compiled.append(len(configs)))

    class _TooBig(FakeTuner):
        def __getitem__(self, grid):
            def launch(*args):
                raise OutOfResources(327680, 232448, "shared memory")
            return launch

    src, device = _kernel_source(), torch.device("cpu")
    usual = [triton.Config({"BLOCK_M": 128, "BLOCK_N": n}, num_warps=8, num_stages=2) for n in (64, 128)]
    small = tile_configs.triton_configs(tile_configs.SMALL_FOOTPRINT_CONFIGS)
    launcher, fallback = _fake_launcher(src), FakeTuner(small)
    launcher._small_footprint_tuner = lambda: fallback
    launcher._first_launch(_TooBig(usual), ("args",), None, (96,), device, tune=True)
    assert compiled == [2, len(small)] and fallback.launches == [("args",)]
    assert launcher.chosen_configs() == {(96,): tile_configs.SMALL_FOOTPRINT_CONFIGS[-1]}  # the tuner's best
    assert all(stages == 1 for _, _, _, stages in tile_configs.SMALL_FOOTPRINT_CONFIGS)

    # any other error is the caller's to see, and so is running out without autotuning
    with pytest.raises(OutOfResources):
        _fake_launcher(src)._first_launch(_TooBig(usual), ("args",), None, (96,), device, tune=False)

    class _Broken(FakeTuner):
        def __getitem__(self, grid):
            def launch(*args):
                raise ValueError("not a resource problem")
            return launch

    with pytest.raises(ValueError):
        _fake_launcher(src)._first_launch(_Broken(usual), ("args",), None, (97,), device, tune=True)


class _Interrupted(BaseException):
    """Stands in for KeyboardInterrupt or a caller's time limit raised from a signal."""


def test_an_interrupted_precompile_drops_the_candidates_not_yet_started():
    """A signal raised while the candidates compile ends the call at once: candidates no
    thread has started are dropped, not compiled before the exception reaches the caller."""
    import signal
    import time

    started, dropped = [], []

    class _SlowJit(_RecordingJit):
        def warmup(self, *args, grid, **options):
            from triton.runtime._async_compile import active_mode

            def compile_candidate():
                started.append(options["BLOCK_M"])
                time.sleep(0.5)  # a slow candidate: IEEE float32 dots take seconds in ptxas

            return active_mode.get().submit(("candidate", options["BLOCK_M"]), compile_candidate,
                                            lambda kernel: None, lambda future: dropped.append(options["BLOCK_M"]))

    def interrupt(signum, frame):  # noqa: ARG001
        raise _Interrupted()

    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": 16}, num_warps=4, num_stages=2) for m in range(16, 16 + 12)]
    previous = signal.signal(signal.SIGALRM, interrupt)
    t0 = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with settings.override(compile_threads=2), pytest.raises(_Interrupted):
            tuning_cache.precompile(_SlowJit(), configs, (), None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    waited = time.monotonic() - t0
    time.sleep(1.2)  # the two compilations in flight end; nothing else may start
    assert waited < 1.0, waited  # not 12 candidates / 2 threads * 0.5 s = 3 s
    assert len(started) <= 2, started
    # the JIT's placeholder of every candidate never built is dropped (Triton's cleanup
    # hook), so a later launch in this process compiles it instead of failing
    assert sorted(dropped) == sorted(set(range(16, 16 + 12)) - set(started)), (dropped, started)

"""What autotuning leaves for later: the choice it made per kernel source, GPU model,
Triton version and sizes, kept on disk for the next process (:func:`recall_choice`,
:func:`remember_choice`, ``FLASHLIGHT_TUNING_CACHE``), and its candidates compiled on a
thread pool before they are timed (:func:`precompile`)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading

import torch

from flashlight import settings
from flashlight.codegen import KernelSource
from flashlight.tuning import EAGER

log = logging.getLogger("flashlight")


def tuning_file(src: KernelSource) -> str:
    digest = hashlib.sha1(src.source.encode()).hexdigest()[:16]
    return os.path.join(settings.get("cache_dir"), "tuning", f"{src.name}_{digest}.json")


def gpu_name(device: torch.device) -> str:
    """The GPU model (``NVIDIA H200``), or the device type off CUDA."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def gpu_capability(device: torch.device) -> str:
    """The GPU's compute capability as ``major.minor`` (``9.0``), or "" off CUDA."""
    if device.type != "cuda":
        return ""
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


def _tuning_key(device: torch.device, sizes: tuple[int, ...]) -> str:
    """What a choice holds for: the GPU model, Triton's version and the size arguments
    (the source, in the file name, fixes everything else: dtypes, static sizes)."""
    import triton

    return f"{gpu_name(device)} | triton {triton.__version__} | sizes {','.join(map(str, sizes))}"


def read_json(path: str, kind: type = dict):
    """The JSON value of type ``kind`` in ``path``; an empty ``kind()`` where there is none
    yet, or it is unreadable or of another type (what was kept is only an optimisation)."""
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return kind()
    return found if isinstance(found, kind) else kind()


def recall_choice(src: KernelSource, device: torch.device, sizes: tuple[int, ...]) -> dict | str | None:
    """The launch settings autotuning chose for ``src`` at ``sizes`` on this GPU model in
    an earlier process (``FLASHLIGHT_TUNING_CACHE``), ``"eager"`` where the unfused graph
    won, else None."""
    if not settings.get("tuning_cache"):
        return None
    choice = read_json(tuning_file(src)).get(_tuning_key(device, sizes))
    if choice == EAGER:
        return EAGER
    return dict(choice) if isinstance(choice, dict) and {"BLOCK_M", "BLOCK_N"} <= set(choice) else None


def remember_choice(src: KernelSource, device: torch.device, sizes: tuple[int, ...], choice: dict | str) -> None:
    """Record autotuning's ``choice`` for :func:`recall_choice` (written atomically; a
    concurrent writer's entry may be lost, never half-written)."""
    if not settings.get("tuning_cache"):
        return
    path = tuning_file(src)
    choices = read_json(path)
    choices[_tuning_key(device, sizes)] = EAGER if choice == EAGER else {
        k: v for k, v in choice.items() if isinstance(v, (int, float, str, bool)) or v is None}
    why = write_json(path, choices)
    if why is not None:  # the launch succeeded; only the next process tunes again
        log.warning("flashlight: could not record the autotuning choice in %s (%s)", path, why)


def write_json(path: str, value) -> OSError | None:
    """Write ``value`` as JSON to ``path`` atomically (a reader never sees part of it; a
    concurrent writer's value may be lost); returns the error where it could not."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(value, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as why:
        return why
    return None


def compile_threads(n_configs: int) -> int:
    """Threads that compile ``n_configs`` autotuning candidates (``FLASHLIGHT_COMPILE_THREADS``)."""
    wanted = int(settings.get("compile_threads"))
    if wanted <= 0:
        wanted = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(wanted, n_configs))


def precompile(jit_fn, configs, args: tuple, grid, extra: dict | None = None) -> int:
    """Compile every autotuning candidate of ``jit_fn`` for ``args`` on a thread pool.

    Triton's autotuner compiles its candidates one after another before timing each;
    compiling a candidate is CPU work (MLIR passes, then ``ptxas``) that does not hold
    the GIL, and a kernel whose dots run in IEEE float32 takes seconds per candidate.
    ``warmup`` under Triton's ``AsyncCompileMode`` hands each compilation to the pool
    and files the result in the JIT function's own cache under the key a launch with
    these arguments looks up, so the autotuner then finds every candidate compiled.
    A candidate that fails to compile is left out of the cache, and the autotuner meets
    the same error through its own path. Interrupted while it waits (Ctrl-C, a caller's
    time limit), it drops the candidates no thread has started instead of compiling
    them all first. ``extra``: launch arguments every candidate gets besides its own
    (the 64-bit offsets setting). Returns the number of threads used (1: nothing was
    done, Triton compiles as it always does).
    """
    import triton

    threads = compile_threads(len(configs))
    async_mode = getattr(triton, "AsyncCompileMode", None)
    if threads == 1 or async_mode is None:
        return 1
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="flashlight-compile")
    finished, handed_out = False, []
    try:
        with async_mode(pool, ignore_errors=True) as mode:
            for config in configs:
                try:
                    jit_fn.warmup(*args, grid=grid, **config.all_kwargs(), **(extra or {}))  # what the autotuner launches
                except Exception:  # noqa: BLE001 - the autotuner reports it when it compiles this candidate
                    continue
            handed_out = list(mode.future_kernels.values())
        finished = True
    finally:
        pool.shutdown(wait=finished, cancel_futures=not finished)
        for placeholder in handed_out:
            if placeholder.future is not None and placeholder.future.cancelled():
                placeholder.result(ignore_errors=True)  # drops it from the JIT cache: a later launch compiles
    return threads

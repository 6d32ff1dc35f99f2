"""Triton compiles in worker processes, for the warm-up's background compiles.

[Note: compiling in other processes]
A Triton compile run on a thread of the program's own process holds the interpreter
lock much of the time: Triton's front end walks the kernel's Python syntax tree and
drives its MLIR passes from Python; only ``ptxas`` and the launcher's C compiler run
outside it. The program's own thread and the compile then take turns.
``python -m bench.compile_interference`` measures it (``bench/results/compile_interference``):
on this project's 2-core CI machine, one flash-attention kernel compiled for sm_90 on a
thread took 1.28-1.35 s while a Python loop beside it ran at 0.89x its speed alone; in a
worker process the compile took 0.53-0.72 s and the loop ran at 0.96-1.03x. A fold's
warm-up compiles five kernels at once: sampling the main thread's stack during a cold
first call on an H200 host (16 cores) found it starved (1-13 samples per 100 ms where
an idle process gives 30), and the pass it issues is the warm-up's span.

Here the compile runs in separate processes, each with its own interpreter:

* **What to compile.** The parent asks Triton's JIT what it would compile for the launch,
  without compiling: Triton calls its ``jit_cache_hook`` knob before each compile with the
  launch's specialization (signature, constants, alignment attributes, options, target)
  serialised as text, and a hook that returns True skips that compile
  (:func:`specialization`; the hook is installed once, passes every other call on to a
  hook set before it, and answers only for the launch this thread asked about).
* **Where it is compiled.** A worker (``python -c`` running :data:`_WORKER_SOURCE`, which
  imports Triton and nothing of PyTorch) imports the kernel's generated module from its
  file under the same module name, rebuilds the specialization and calls
  ``triton.compile``, which writes the binary into Triton's on-disk cache (the parent's
  ``TRITON_*`` environment is passed with each job).
* **How the parent gets it.** The parent then compiles the same launch as before; the cache
  key (the kernel's source and specialization, the options, the target, Triton's own
  installation and its cache-relevant environment) is the one the worker filed its result
  under, so Triton loads the binary instead of compiling it (a different key only costs the
  compile the parent would have done anyway).

Workers start when :func:`start` is first called (``flashlight-fold`` calls
:func:`start_soon` before it builds its model, so that their start, about a second of
imports and a first compile each, overlaps the model's construction (seconds of OpenFold's
initialisation) and the feature processing; a background compile starts them otherwise),
one per CPU core this process may use, shared among the processes of a ``torchrun`` node
(``LOCAL_WORLD_SIZE``), at most 8 (``FLASHLIGHT_COMPILE_PROCESSES``; 0: compile on
threads as before); they exit with the
program (their input closes). Each says when its warm-up is done; a comparison of
variants (``flashlight-fold --compare``) waits for that before it times anything
(:func:`wait_ready`), so no variant's timing shares the CPU with their start. Anything
that goes wrong here (no CUDA device, a Triton without the hook, a worker that died)
leaves the compile to the parent, as before.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time
import types
from typing import Any

from flashlight import settings, triton_specializations

log = logging.getLogger("flashlight")

MAX_PROCESSES = 8

# Runs in each worker: jobs in, results out, as length-prefixed pickles on stdin/stdout.
_WORKER_SOURCE = r'''
import importlib.util, json, os, pickle, struct, sys, time
out = sys.stdout.buffer
sys.stdout = sys.stderr  # anything the compiler prints stays off the result channel
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

modules = {}


def warm_up(target):
    """Pay this process's one-time compile costs before the first job: the digest of
    Triton's installation in every cache key, and a first compile (MLIR and LLVM set up)."""
    import tempfile
    for where in ("triton.runtime.cache", "triton.compiler.compiler"):
        key = getattr(importlib.import_module(where), "triton_key", None)
        if key is not None:
            key()
            break
    if target is None:
        return
    saved = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory() as folder:
        os.environ["TRITON_CACHE_DIR"] = folder  # the warm-up's kernel is kept nowhere
        path = os.path.join(folder, "warm.py")
        with open(path, "w") as f:
            f.write("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                    "def warm(x, y, BLOCK: tl.constexpr):\n"
                    "    offs = tl.arange(0, BLOCK)\n"
                    "    tl.store(y + offs, tl.exp2(tl.load(x + offs)))\n")
        fn = load(path, "flashlight_compile_worker_warm").warm
        src = ASTSource(fn, {"x": "*fp32", "y": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 128}, {})
        try:
            triton.compile(src, target=GPUTarget(*target), options={"num_warps": 4})
        finally:
            if saved is None:
                del os.environ["TRITON_CACHE_DIR"]
            else:
                os.environ["TRITON_CACHE_DIR"] = saved


def load(path, name):
    if name not in modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        modules[name] = module
    return modules[name]


def compile_job(job):
    saved = {key: os.environ.get(key) for key in job["env"]}
    os.environ.update(job["env"])
    try:
        fn = getattr(load(job["path"], job["module"]), job["name"])
        reader = load(job["reader"], "flashlight_triton_specializations")
        src, target, options = reader.read(fn, job["specialization"], job["target"])
        triton.compile(src, target=target, options=options)
    finally:  # a job's environment (its own cache folder, say) is not the next job's
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def read():
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        return None
    return pickle.loads(sys.stdin.buffer.read(struct.unpack("<Q", head)[0]))


def send(result):
    blob = pickle.dumps(result)
    out.write(struct.pack("<Q", len(blob)) + blob)
    out.flush()


try:
    warm_up(json.loads(sys.argv[1]) if len(sys.argv) > 1 else None)
except Exception:
    pass  # only an optimisation: the first job pays it
send({"ready": True})
while (job := read()) is not None:
    start = time.perf_counter()
    try:
        compile_job(job)
        result = {"ok": True}
    except BaseException as error:
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"[:2000]}
    result["seconds"] = time.perf_counter() - start
    send(result)
'''


_job = threading.local()  # the phase times of the background compile job this thread runs


@contextlib.contextmanager
def job_phases(times: dict[str, float]):
    """Within the context, :func:`phase` adds this thread's phase durations to ``times``."""
    _job.times = times
    try:
        yield
    finally:
        _job.times = None


@contextlib.contextmanager
def phase(name: str):
    """Time the block as phase ``name`` (seconds, summed) of the job this thread runs
    inside :func:`job_phases`; nothing outside one."""
    start = time.perf_counter()
    try:
        yield
    finally:
        times = getattr(_job, "times", None)
        if times is not None:
            times[name] = round(times.get(name, 0.0) + time.perf_counter() - start, 4)


class WorkerError(RuntimeError):
    """A worker process died or answered nothing."""


class WorkerProcess:
    """One ``python -c`` process running :data:`_WORKER_SOURCE` (or ``source``: any program
    that says ``{"ready": True}`` once, then answers each job, in the same framing)."""

    def __init__(self, target: tuple | None = None, source: str | None = None, env: dict | None = None):
        env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, **(env or {})}
        argv = [sys.executable, "-c", source or _WORKER_SOURCE] + ([json.dumps(list(target))] if target else [])
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.ready = False  # its warm-up is done (it said so)
        self._ready_lock = threading.Lock()  # one reader of that message

    def _receive(self) -> dict:
        try:
            head = self.proc.stdout.read(8)  # blocks without the interpreter lock
            if len(head) < 8:
                raise WorkerError(f"the compile worker exited (status {self.proc.poll()})")
            return pickle.loads(self.proc.stdout.read(struct.unpack("<Q", head)[0]))
        except OSError as error:
            raise WorkerError(f"the compile worker is gone ({error})") from error

    def wait_ready(self) -> None:
        """Block until the worker has warmed up (it says so once, before any result)."""
        with self._ready_lock:
            if not self.ready:
                self._receive()
                self.ready = True

    def call(self, job: dict) -> dict:
        self.wait_ready()
        blob = pickle.dumps(job)
        try:
            self.proc.stdin.write(struct.pack("<Q", len(blob)) + blob)
            self.proc.stdin.flush()
        except OSError as error:
            raise WorkerError(f"the compile worker is gone ({error})") from error
        return self._receive()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass


class Pool:
    """Worker processes; :meth:`compile` hands a job to an idle one and waits for it."""

    def __init__(self, processes: int, target: tuple | None = None):
        self.processes = processes
        self.target = target  # (backend, arch, warp size) the workers warm up for, if known
        self._idle: queue.Queue[WorkerProcess] = queue.Queue()
        self._all: list[WorkerProcess] = []
        for _ in range(processes):
            worker = WorkerProcess(target)
            self._all.append(worker)
            self._idle.put(worker)
        self._lock = threading.Lock()
        self.jobs = 0
        self.failed = 0
        self.compile_s = 0.0  # seconds the workers spent compiling
        self.load_s = 0.0  # seconds the callers' own compiles took after a worker's

    def stats(self) -> dict:
        """Jobs, failed jobs, the workers' compile seconds and the callers' load seconds, for reports."""
        return {"processes": self.processes, "jobs": self.jobs, "failed": self.failed,
                "compile_s": round(self.compile_s, 3), "load_s": round(self.load_s, 3)}

    def compile(self, job: dict) -> dict:
        with phase("worker_wait_s"):
            worker = self._idle.get()
        try:
            with phase("worker_wait_s"):  # its warm-up, where it is still warming up
                worker.wait_ready()
            with phase("worker_s"):
                result = worker.call(job)
        except WorkerError:
            worker.close()
            self._idle.put(WorkerProcess(self.target))  # a fresh one in its place
            with self._lock:
                self.jobs += 1
                self.failed += 1
            raise
        self._idle.put(worker)
        with self._lock:
            self.jobs += 1
            self.failed += not result.get("ok")
            self.compile_s += result.get("seconds", 0.0)
        return result

    def wait_ready(self) -> None:
        """Block until every worker has warmed up (a worker that died is left to
        :meth:`compile` to replace)."""
        for worker in list(self._all):
            try:
                worker.wait_ready()
            except WorkerError:
                pass

    def note_load(self, seconds: float) -> None:
        with self._lock:
            self.load_s += seconds

    def close(self) -> None:
        for worker in self._all:
            worker.close()


_pool: Pool | None = None
_pool_lock = threading.Lock()


def wanted_processes() -> int:
    """Worker processes to start: ``FLASHLIGHT_COMPILE_PROCESSES`` (negative: one per CPU core
    this process may use, divided among ``torchrun``'s processes on the node, at most
    :data:`MAX_PROCESSES`; 0: none)."""
    wanted = int(settings.get("compile_processes"))
    if wanted < 0:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))  # torchrun's processes on this node
        wanted = max(1, min(MAX_PROCESSES, cores // ranks))
    return wanted


def start() -> Pool | None:
    """Start the worker processes once per process, where they are wanted and a CUDA
    device compiles Triton kernels; returns the pool (None: compiles stay in process)."""
    global _pool
    with _pool_lock:
        if _pool is None and _usable():
            n = wanted_processes()
            if n > 0:
                try:
                    _pool = Pool(n, _device_target())
                    _install_hook()
                except Exception as error:  # noqa: BLE001 - compiles stay in process
                    log.debug("flashlight: no compile workers (%s: %s)", type(error).__name__, error)
                    _pool = None
                else:
                    atexit.register(_pool.close)
        return _pool


def start_soon() -> None:
    """:func:`start` on a daemon thread (the caller does not wait for the processes to spawn)."""
    threading.Thread(target=start, name="flashlight-compile-workers", daemon=True).start()


def _device_target() -> tuple | None:
    """(backend, arch, warp size) of the current CUDA device as Triton names it, for the
    workers' warm-up compile (None on other devices: no warm-up compile)."""
    import torch

    if getattr(torch.version, "hip", None):
        return None
    major, minor = torch.cuda.get_device_capability()
    return ("cuda", 10 * major + minor, 32)


def stats() -> dict | None:
    """The running pool's :meth:`Pool.stats`, or None without one."""
    return None if _pool is None else _pool.stats()


def pool() -> Pool | None:
    """The running pool, if :func:`start` started one."""
    return _pool


def _usable() -> bool:
    if settings.get("interpret"):
        return False
    try:
        import torch
        import triton

        return torch.cuda.is_available() and hasattr(getattr(triton, "knobs", None), "runtime")
    except Exception:  # noqa: BLE001
        return False


# -- asking Triton what it would compile ---------------------------------------------------

_PROBE = threading.local()  # .jit_fn: the JIT function whose next compile this thread asks about
_previous_hook: Any = None
_hook_installed = False


def _hook(*args, **kwargs):
    """Triton's ``jit_cache_hook``: for the launch this thread asked about, keep its
    serialised specialization and skip the compile; any other call goes to the hook set
    before this one."""
    wanted = getattr(_PROBE, "jit_fn", None)
    info = kwargs.get("fn")
    if wanted is not None and info is not None and getattr(info, "jit_function", None) is wanted:
        _PROBE.found = kwargs["compile"]["specialization_data"]
        return True
    return _previous_hook(*args, **kwargs) if _previous_hook is not None else None


def _install_hook() -> None:
    global _previous_hook, _hook_installed
    if _hook_installed:
        return
    import triton

    _previous_hook = triton.knobs.runtime.jit_cache_hook
    triton.knobs.runtime.jit_cache_hook = _hook
    _hook_installed = True


def specialization(jit_fn, args: tuple, grid, options: dict) -> str | None:
    """Triton's serialised specialization of launching ``jit_fn`` on ``args`` with
    ``options`` (its compile skipped), or None where Triton would compile nothing (the
    kernel is already in its in-memory cache) or the hook is not installed."""
    if not _hook_installed:
        return None
    _PROBE.jit_fn, _PROBE.found = jit_fn, None
    try:
        jit_fn.warmup(*args, grid=grid, **options)
    finally:
        _PROBE.jit_fn = None
    return _PROBE.found


def compile_elsewhere(jit_fn, args: tuple, grid, options: dict) -> bool:
    """Compile the launch of ``jit_fn`` on ``args`` in a worker process, into Triton's
    on-disk cache, so that the caller's own compile of it only loads the binary ([Note:
    compiling in other processes]); False where it was not done (the caller compiles)."""
    workers = pool()
    if workers is None:
        return False
    start_s = time.perf_counter()
    try:
        with phase("specialize_s"):
            data = specialization(jit_fn, args, grid, options)
        if data is None:
            return False
        job = _job(jit_fn, data, None, {})
        launcher = build_launcher_beside(jit_fn, data, job["target"]) if settings.get("launcher_beside") else None
        try:
            result = workers.compile(job)
        finally:
            if launcher is not None:
                with phase("launcher_wait_s"):  # so that the caller's own compile loads it
                    launcher.join()
    except Exception as error:  # noqa: BLE001 - the caller compiles in process
        log.debug("flashlight: compile worker not used for %s (%s: %s)", getattr(jit_fn, "__name__", jit_fn),
                  type(error).__name__, error)
        return False
    if not result.get("ok"):
        log.debug("flashlight: a compile worker failed on %s (%s); compiling in process",
                  jit_fn.fn.__name__, result.get("error"))
        return False
    log.debug("flashlight: %s compiled in a worker in %.2f s (%.2f s in all)", jit_fn.fn.__name__,
              result.get("seconds", 0.0), time.perf_counter() - start_s)
    return True


def build_seconds(jit_fn, args: tuple, grid, configs, extra: dict | None = None) -> dict[tuple, float]:
    """Seconds a worker process takes to compile each of ``configs`` (Triton configs) for
    the launch of ``jit_fn`` on ``args`` from nothing, each in a Triton cache of its own
    so that nothing is loaded: what the candidate adds to a first call with empty caches
    ([Note: a choice that builds fast] in :mod:`flashlight.tuned_configs`). ``extra``:
    launch options every candidate gets. Keyed by
    :func:`flashlight.tuned_configs.config_key`; a candidate that could not be timed (no
    workers, already compiled in this process, a failed compile or worker) is left out."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from flashlight.tuned_configs import config_key

    workers = start()
    if workers is None:
        return {}

    def timed(job: dict) -> dict:
        try:
            return workers.compile(job)
        except WorkerError:
            return {"ok": False}

    try:
        with tempfile.TemporaryDirectory(prefix="flashlight-builds-") as folder:
            jobs = {}
            for k, config in enumerate(configs):
                options = {**config.all_kwargs(), **(extra or {})}
                data = specialization(jit_fn, args, grid, options)
                if data is not None:
                    jobs[config_key(options)] = _job(jit_fn, data, workers.target,
                                                     {"TRITON_CACHE_DIR": os.path.join(folder, str(k))})
            with ThreadPoolExecutor(max_workers=workers.processes) as threads:
                results = dict(zip(jobs, threads.map(timed, jobs.values())))
    except Exception as error:  # noqa: BLE001 - only a measurement: tuning goes on without it
        log.warning("flashlight: timing the candidates' builds failed (%s: %s)", type(error).__name__, error)
        return {}
    return {key: round(r["seconds"], 3) for key, r in results.items() if r.get("ok")}


def _job(jit_fn, data: str, target: tuple | None, env: dict) -> dict:
    """A worker's job compiling ``jit_fn`` for specialization ``data`` (``env`` on top of
    the caller's ``TRITON_*`` environment)."""
    import triton

    module = sys.modules[jit_fn.fn.__module__]
    target = (dict(zip(("backend", "arch", "warp_size"), target)) if target
              else dict(vars(triton.runtime.driver.active.get_current_target())))
    caller = {k: v for k, v in os.environ.items() if k.startswith("TRITON_") and k != "TRITON_INTERPRET"}
    return {"path": module.__file__, "module": module.__name__, "name": jit_fn.fn.__name__,
            "specialization": data, "target": target, "reader": triton_specializations.__file__,
            "env": {**caller, **env}}


# [Note: the launcher beside the compile]
# Triton 3.6 launches each compiled kernel through C code generated for the kernel's
# signature and built with the system's C compiler (0.2-0.37 s a kernel on an H100 host
# with empty caches), when the kernel's ``run`` is first read: after the binary exists.
# That code depends on the signature and the constants only, which the launch's
# specialization already holds, so the parent builds it on a thread of its own while a
# worker compiles the kernel (the C compiler runs in a subprocess, without the
# interpreter lock); Triton files it in its cache under a digest of the generated source,
# where the kernel's ``run`` then finds it. A failure costs nothing: ``run`` builds the
# launcher as before. Triton versions that launch every kernel through one generic
# launcher build nothing here. Off by default (``FLASHLIGHT_LAUNCHER_BESIDE=1`` turns it
# on): in two cold 256- and 512-residue folds on an H100 the launchers left the end of
# each job (0.16-0.31 s a kernel before, 0.001-0.06 now) but the workers' compiles
# took 0.12-0.26 s longer, on another machine than the run before, so the first call
# was no shorter (bench/results/fold_product_runs/README.md). On one H100, both settings
# one after the other (launcher_beside_ab_{0,1}.json, 256 residues, from empty caches),
# the first call went 1.24 -> 1.08 s and 1.21 -> 1.12 s on one sequence (fp32, bf16),
# 2.08 -> 2.24 s and 1.39 -> 1.27 s on a deep MSA: within what the order of two runs
# moves (0.05-0.3 s between two runs of one build), so it stays off.

_LAUNCHER_METADATA = dict(tensordesc_meta=None, num_ctas=1, global_scratch_size=0, global_scratch_align=1,
                          profile_scratch_size=0, profile_scratch_align=1, launch_cooperative_grid=False,
                          launch_pdl=False)  # what a launcher reads of a compile's metadata, none of it in its code


def _launcher_cls():
    import triton

    return triton.runtime.driver.active.launcher_cls


def build_launcher_beside(jit_fn, data: str, target: dict) -> threading.Thread:
    """Start building the launcher of the launch that ``data`` specializes on a thread
    ([Note: the launcher beside the compile]); the thread's seconds go to the calling
    job's ``launcher_beside_s``."""
    times = getattr(_job, "times", None)

    def build():
        start = time.perf_counter()
        try:
            src, _, _ = triton_specializations.read(jit_fn, data, target)
            _launcher_cls()(src, types.SimpleNamespace(**_LAUNCHER_METADATA))
        except Exception as error:  # noqa: BLE001 - the kernel's run builds it
            log.debug("flashlight: no launcher built beside the compile of %s (%s: %s)",
                      getattr(jit_fn, "__name__", jit_fn), type(error).__name__, error)
        if times is not None:
            times["launcher_beside_s"] = round(time.perf_counter() - start, 4)

    thread = threading.Thread(target=build, name="flashlight-launcher", daemon=True)
    thread.start()
    return thread


def wait_ready() -> None:
    """Block until the workers, if any were started, have warmed up: their start uses
    the CPU for about a second each, which a timing (a comparison's stock pass) must not
    share."""
    with _pool_lock:
        workers = _pool
    if workers is not None:
        workers.wait_ready()


def note_load(seconds: float) -> None:
    """Count ``seconds`` of a caller's own compile after a worker's (Triton loading the binary)."""
    if _pool is not None:
        _pool.note_load(seconds)

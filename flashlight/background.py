"""Compiling kernels on threads while their unfused graphs answer.

[Note: compiling in the background]
With empty caches, most of a first call is Triton compiling each new kernel (its MLIR
passes and ``ptxas``, a second or so per kernel), one after another where the program
first launches each, and then Triton's launcher for it (C code compiled for the kernel's
signature). Inside :func:`compiling_in_background`, the first launch of a kernel
whose launch configuration is already known (recorded by an earlier process or shipped
for this GPU, :mod:`flashlight.tuned_configs`) hands both, for that one configuration,
to a thread pool (whose threads hand Triton's compile itself to worker processes, which
do not hold this process's interpreter lock: [Note: compiling in other processes] in
:mod:`flashlight.compile_workers`) and computes its value with the kernel's unfused graph
(the PyTorch operations it replaces) instead; later launches at those sizes do the same
until the compile is done, then launch the kernel. Several kernels thus compile at once,
beside the program's own work, and on leaving the context every compile has finished, so
the calls after it launch compiled kernels only. Capture (Dynamo and AOTAutograd, or
``make_fx`` for traced capture, and Flashlight's passes) still runs on the caller's
thread: it holds the GIL, and on another thread it would only slow the caller down.

Where nothing is known yet, the autotuning candidates compile here too and their timing
on the GPU, which other work would disturb, waits for the context's settle or end ([Note:
autotuning in the background] in :mod:`flashlight.runtime`). Where the kernel has no
unfused graph, or where that graph's scores would take more than :data:`MEMORY_SHARE` of
the free GPU memory, the launch compiles in place as outside the context. Work that
must see compiled kernels (a timing of kernel against another implementation) can be
deferred to the context's end with :meth:`Compiles.after`. The context is meant for a
pass whose speed, not its exact floating-point results, matters: a warm-up.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Hashable, Iterator

from flashlight import compile_workers

log = logging.getLogger("flashlight")

MEMORY_SHARE = 0.25  # of the free GPU memory an unfused graph may take while its kernel compiles


def default_threads() -> int:
    """Compile threads: one per CPU core this process may use, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cores))


class Compiles:
    """The compile jobs of one :func:`compiling_in_background` context."""

    def __init__(self, threads: int):
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="flashlight-compile")
        self._jobs: dict[Hashable, Future] = {}
        self._after: dict[Hashable, Callable[[], object]] = {}
        self._installs: dict[Hashable, Callable[[], object]] = {}  # run once their job is done
        self._installed: set[Hashable] = set()  # installs already run
        self._ready: list[Hashable] = []  # installs whose jobs have finished, not run yet
        self._owner = threading.get_ident()  # the context's thread
        self._lock = threading.Lock()
        self._opened = time.perf_counter()
        self._times: dict[Hashable, dict[str, float]] = {}  # per job: seconds since the context opened
        self._ran: set[Hashable] = set()  # deferred calls already run (by settle())
        self.settle_s = 0.0  # seconds settle() waited for jobs
        self.wait_s = 0.0  # how long leaving the context waited for unfinished jobs

    def job(self, key: Hashable) -> Future | None:
        """The compile job of ``key``, or None where none was submitted."""
        return self._jobs.get(key)

    def submit(self, key: Hashable, compile_fn: Callable[[], object]) -> Future:
        """Run ``compile_fn`` on the pool, once per ``key``; returns its job."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                times = self._times[key] = {"submitted_s": self._since()}
                job = self._jobs[key] = self._pool.submit(self._timed, times, compile_fn)
            return job

    def add(self, key: Hashable, job: Future) -> Future:
        """Count ``job`` (run elsewhere, e.g. a capture in another process) among the
        context's jobs under ``key``: waiting points wait for it as for a compile."""
        with self._lock:
            if key in self._jobs:
                return self._jobs[key]
            times = self._times[key] = {"submitted_s": self._since()}
            self._jobs[key] = job
        job.add_done_callback(lambda _: times.setdefault("finished_s", self._since()))
        return job

    def install(self, key: Hashable, fn: Callable[[], object]) -> None:
        """Call ``fn`` on the context's thread once job ``key`` is done: at the next
        :meth:`run_ready` (each call of a traced function) or waiting point, before the
        deferred calls of :meth:`after`; a waiting point waits in turn for the jobs it
        submits (a captured graph run once, so that its kernels compile)."""
        with self._lock:
            self._installs.setdefault(key, fn)
            job = self._jobs.get(key)
        if job is not None:
            job.add_done_callback(lambda _: self._mark_ready(key))

    def _mark_ready(self, key: Hashable) -> None:
        with self._lock:
            self._ready.append(key)

    def run_ready(self) -> None:
        """On the context's thread, run the installs whose jobs have finished (a cheap
        check where none has: called on every call of a traced function)."""
        if not self._ready or threading.get_ident() != self._owner:
            return
        with self._lock:
            keys = [key for key in self._ready if key not in self._installed]
            self._ready.clear()
            self._installed.update(keys)
        for key in keys:
            self._run_install(key, self._installs[key])

    def _finish_jobs(self) -> None:
        """Wait for every job, run the installs whose jobs are done, and again while those
        submitted more."""
        while True:
            for job in self.jobs().values():
                try:
                    job.result()
                except Exception:  # noqa: BLE001 - reported by _wait; the launch compiles in place
                    pass
            with self._lock:
                pending = [(k, fn) for k, fn in self._installs.items() if k not in self._installed]
                self._installed.update(k for k, _ in pending)
            if not pending:
                return
            for key, fn in pending:
                self._run_install(key, fn)

    @staticmethod
    def _run_install(key: Hashable, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as error:  # noqa: BLE001 - the next call does it in place
            log.warning("flashlight: what follows the background job %s failed (%s: %s)",
                        key, type(error).__name__, error)

    def _since(self) -> float:
        return round(time.perf_counter() - self._opened, 4)

    def _timed(self, times: dict[str, float], compile_fn: Callable[[], object]) -> object:
        times["started_s"] = self._since()
        try:
            with compile_workers.job_phases(times):  # the job's phases, where it names them
                return compile_fn()
        finally:
            times["finished_s"] = self._since()

    def timeline(self) -> list[dict]:
        """When each job was submitted, started and finished, in seconds since the context
        opened, with its key's first element (the kernel's name) and the seconds of the
        phases it timed (``*_s``: waiting for the preparing thread, for a worker, the
        worker's compile, loading the binary, building the launcher), in submission order."""
        with self._lock:
            items = list(self._times.items())
        return [{"kernel": str(key[0] if isinstance(key, tuple) else key), **times} for key, times in items]

    def after(self, key: Hashable, fn: Callable[[], object]) -> None:
        """Call ``fn`` on the context's own thread once every job has finished (once per
        ``key``, the first ``fn`` given)."""
        with self._lock:
            self._after.setdefault(key, fn)

    def jobs(self) -> dict[Hashable, Future]:
        """Every job so far, by key."""
        with self._lock:
            return dict(self._jobs)

    def _wait(self) -> None:
        start = time.perf_counter()
        self._finish_jobs()
        self._pool.shutdown(wait=True)
        self.wait_s = time.perf_counter() - start
        for key, job in self.jobs().items():
            error = job.exception()
            if error is not None:  # the launch compiles in place later and reports it there
                log.warning("flashlight: compiling %s in the background failed (%s: %s)",
                            key, type(error).__name__, error)

    def settle(self) -> float:
        """Wait for every job submitted so far, then run the deferred calls registered so
        far; returns the seconds waited. The context stays open. For work that must hold
        compiled kernels before the context ends: a CUDA graph's recording keeps whatever
        the calls it records launch ([Note: compiling in the background during a fold's
        pass] in ``flashlight/structures/compile_pass.py``). A failed job is reported at the
        context's end."""
        start = time.perf_counter()
        self._finish_jobs()
        waited = time.perf_counter() - start
        self.settle_s += waited
        self._run_after()
        return waited

    def _run_after(self) -> None:
        """The deferred calls not run yet, each once, in registration order."""
        while True:
            with self._lock:
                pending = [(k, fn) for k, fn in self._after.items() if k not in self._ran]
                if not pending:
                    return
                key, fn = pending[0]
                self._ran.add(key)
            fn()

    def _cancel(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


_active: Compiles | None = None
_active_lock = threading.Lock()


@contextlib.contextmanager
def compiling_in_background(threads: int | None = None) -> Iterator[Compiles]:
    """Within the context, kernels with a known launch configuration compile on threads
    while their unfused graphs compute their values; on leaving it every compile has
    finished and the deferred calls have run ([Note: compiling in the background])."""
    global _active
    compile_workers.start()  # [Note: compiling in other processes]; flashlight-fold started them already
    with _active_lock:
        if _active is not None:
            raise RuntimeError("compiling_in_background() is already active")
        _active = compiles = Compiles(threads or default_threads())
    try:
        yield compiles
    except BaseException:
        compiles._cancel()
        raise
    else:
        compiles._wait()
    finally:
        with _active_lock:
            _active = None
    compiles._run_after()  # outside the context: launches there compile as usual


def active() -> Compiles | None:
    """The jobs of the open :func:`compiling_in_background` context, or None."""
    return _active


def settle() -> float:
    """:meth:`Compiles.settle` of the open context (seconds waited); 0.0 without one."""
    compiles = _active
    return compiles.settle() if compiles is not None else 0.0

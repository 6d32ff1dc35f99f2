"""Traced capture in another process, for the first pass of a fold.

[Note: capturing in another process]
Traced capture ([Note: traced capture] in :mod:`flashlight.traced`) runs ``make_fx`` and
Flashlight's passes where a function is first called with a new call signature. Inside
:func:`flashlight.background.compiling_in_background` the kernels then compile in worker
processes while their unfused graphs answer, but the capture itself stays on the
caller's thread: it cannot move to another thread, because an FX tracer replaces
``nn.Module.__call__`` for the whole process while it traces. Sampled on an H100 host,
the cold first fold of a single-sequence 256-residue record spent about 0.38 s of its
main thread tracing six attention cores (``bench/results/first_call``): half of what it
took beyond stock's first call.

So the capture of a *static* call signature (the first of each function, dtypes and
ranks) goes to a separate process started for it, which imports PyTorch and Flashlight
(never initialising CUDA: it traces on fake tensors of the call's exact layout, device
included) and returns the compiled graph in the form the graph cache keeps on disk
(:func:`flashlight.graph_store.dump_graph`); generated kernel sources land in the shared
cache folder. Until the graph is back, each call of that signature runs the function
eagerly (its plain PyTorch operations). The first call of *any* traced function after
it came back installs it (:meth:`flashlight.background.Compiles.run_ready`) and runs it
once on zeros of its call signature, so that its kernels start compiling at once in the
background, not at its own signature's next call (the extra-MSA stack's cores are not
called again in a one-iteration warm-up). Waiting points of the context (``settle``
before a CUDA graph records, and its end) wait for the captures, install what is left
and wait for those kernels, so nothing recorded or timed runs a graph still compiling.

The processes are used only where they were started before the first call and one has
finished its own start (:func:`start_soon`: ``flashlight-fold`` does it before building
its model, on CUDA devices, unless ``FLASHLIGHT_CAPTURE_PROCESS=0``): starting one takes
seconds (PyTorch's import), which a short warm-up would otherwise wait for. They see no
GPU (``CUDA_VISIBLE_DEVICES`` empty): PyTorch makes a CUDA context for the first fake
CUDA tensor where a device is visible, which a trace does not need. Symbolic captures (a
second shape), functions that cannot be imported by name in another process, options
that cannot be pickled, and any failure there are traced on the caller's thread as
before.

On by default on CUDA devices (``FLASHLIGHT_CAPTURE_PROCESS=0`` traces on the calling
thread). Measured on an H100 (torch 2.11, Triton 3.6), ``bench/run_all.sh
capture-process-ab-off capture-process-ab-on``: ``flashlight-fold --compare`` from empty
caches, 256 residues, the first call of the Flashlight fold in seconds, off / on: one
sequence fp32 1.56 / 1.25, bf16 1.52 / 1.29; deep MSA fp32 2.18 / 1.91, bf16 1.44 /
1.10 (``bench/results/fold_product_runs/capture_process_ab_{0,1}.json``). Runs in that
order on one machine; a later run of the same default build measured 1.24 / 1.21 / 2.08 /
1.39 (``launcher_beside_ab_0.json``), so on one sequence the gain is within what the
order of the runs moves, on a deep MSA it is 0.2-0.3 s beyond it. An earlier build,
which installed a returned graph only at its own signature's next call, was slower than
tracing in place (``h200_20261207_capture_trial.json``).

Up to :data:`MAX_PROCESSES` processes (one per two CPU cores) capture at once, in the
order the captures were asked for.
"""
from __future__ import annotations

import importlib
import inspect
import logging
import os
import pickle
import queue
import struct
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from flashlight import compile_workers, settings

log = logging.getLogger("flashlight")

KEY_PREFIX = "capture "  # the first element of a capture job's key in the background context

_SOURCE = "from flashlight.capture_worker import serve; serve()"

MAX_PROCESSES = 3  # captures at once: a fold's first pass meets about six cores at its start
_HIDDEN_GPUS = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}

_lock = threading.Lock()
_workers: list[compile_workers.WorkerProcess] = []  # every process started
_idle: queue.Queue | None = None  # the processes not working on a capture
_queue: ThreadPoolExecutor | None = None  # one thread per process
STATS = {"processes": 0, "captures": 0, "failed": 0, "seconds": 0.0, "device_touched": False}


def wanted() -> bool:
    """Whether capture processes are wanted here: ``FLASHLIGHT_CAPTURE_PROCESS`` on (the default), and a
    CUDA device (not the Triton interpreter), whose first pass they shorten."""
    if not settings.get("capture_process") or settings.get("interpret"):
        return False
    import torch

    return torch.cuda.is_available()


def wanted_processes() -> int:
    """One per two CPU cores this process may use, at least one, at most :data:`MAX_PROCESSES`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_PROCESSES, cores // 2))


def start(processes: int | None = None) -> bool:
    """Start the capture processes once (even where :func:`wanted` says no: tests use them
    under the interpreter); returns whether any is running."""
    global _idle, _queue
    with _lock:
        if not _workers:
            try:
                # no visible GPU: PyTorch would create a CUDA context for the first fake CUDA
                # tensor (seconds, and the GPU's memory), which tracing does not need
                for _ in range(processes or wanted_processes()):
                    _workers.append(compile_workers.WorkerProcess(source=_SOURCE, env=_HIDDEN_GPUS))
            except Exception as error:  # noqa: BLE001 - captures stay on the caller's thread
                log.debug("flashlight: no capture process (%s: %s)", type(error).__name__, error)
            if _workers:
                import atexit

                _idle = queue.Queue()
                for worker in _workers:
                    _idle.put(worker)
                    atexit.register(worker.close)
                    # its warm-up message is read as soon as it comes, so ready() can tell
                    threading.Thread(target=_ready_quietly, args=(worker,), name="flashlight-capture-ready",
                                     daemon=True).start()
                _queue = ThreadPoolExecutor(max_workers=len(_workers), thread_name_prefix="flashlight-capture")
                STATS["processes"] = len(_workers)
        return bool(_workers)


def start_soon() -> None:
    """:func:`start` on a daemon thread, where :func:`wanted`."""
    if wanted():
        threading.Thread(target=start, name="flashlight-capture-start", daemon=True).start()


def running() -> bool:
    """Whether capture processes were started (they may still be importing)."""
    return bool(_workers)


def ready() -> bool:
    """Whether a capture process has finished its own start: until one has, captures are
    made on the caller's thread, which would otherwise wait for it."""
    return any(worker.ready for worker in list(_workers))


def wait_ready() -> None:
    """Block until every started capture process has finished its own start (a timing
    must not share the CPU with them)."""
    for worker in list(_workers):
        _ready_quietly(worker)


def _ready_quietly(worker: compile_workers.WorkerProcess) -> None:
    try:
        worker.wait_ready()
    except compile_workers.WorkerError:
        pass


def is_capture(key: Any) -> bool:
    """Whether a background job's key is a capture's (not a kernel compile's)."""
    return isinstance(key, tuple) and bool(key) and isinstance(key[0], str) and key[0].startswith(KEY_PREFIX)


def request(fn: Callable, name: str, options: dict, version: str, dynamic: bool | None,
            signature: tuple, fp32_precision: str) -> dict | None:
    """The job that captures ``fn`` for ``signature`` elsewhere, or None where it cannot:
    ``fn`` not importable by its module and qualified name, or options that do not pickle."""
    plain = inspect.unwrap(fn)
    module, qualname = getattr(plain, "__module__", None), getattr(plain, "__qualname__", "")
    if not module or not qualname or "<" in qualname:
        return None
    try:
        if _resolve(module, qualname) is not plain:
            return None
        job = {"function": (module, qualname), "name": name, "options": dict(options), "version": version,
               "dynamic": dynamic, "signature": signature, "tf32": fp32_precision == "tf32",
               "settings": settings.current()}
        pickle.dumps(job)
    except Exception:  # noqa: BLE001 - not importable or not picklable: captured here
        return None
    return job


def submit(job: dict) -> Future:
    """Hand ``job`` to an idle capture process (in order of submission); the future's result is the
    process's answer: ``{"ok": True, "entry": (family, signature, guard, graph, single)}``
    or ``{"ok": False, "error": ...}``, the entry still pickled: unpickle it with
    :func:`entry_of` on the thread that runs the model ([Note: graphs unpickled without
    tracing] in flashlight.graph_store)."""
    if _queue is None:
        raise RuntimeError("no capture process was started")
    return _queue.submit(_call, job)


def _call(job: dict) -> dict:
    start = time.perf_counter()
    worker = None
    while worker is None:
        if not _workers:
            return {"ok": False, "error": "no capture process is left"}
        try:
            worker = _idle.get(timeout=0.5)
        except queue.Empty:
            pass
    try:
        result = worker.call(job)
    except compile_workers.WorkerError as error:
        result = {"ok": False, "error": str(error)}
        with _lock:  # that process is gone: the others go on, and with none, captures are here
            _workers.remove(worker)
    else:
        _idle.put(worker)
    with _lock:
        STATS["captures"] += 1
        STATS["failed"] += not result.get("ok")
        STATS["seconds"] = round(STATS["seconds"] + time.perf_counter() - start, 4)
        STATS["device_touched"] = STATS["device_touched"] or bool(result.get("device_touched"))
    return result


def entry_of(result: dict) -> tuple:
    """The entry of a successful capture's answer (:func:`submit`)."""
    return pickle.loads(result["entry"])


def stats() -> dict | None:
    """Captures made, failed and their seconds (None where no process was started)."""
    return dict(STATS) if _workers else None


def _resolve(module: str, qualname: str):
    value = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


# ---- in the capture process -------------------------------------------------------------


def serve() -> None:
    """The capture process's loop: jobs in, results out, as length-prefixed pickles on
    stdin and stdout."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed stays off the result channel
    try:
        _warm_up()
    except Exception:  # noqa: BLE001 - only an optimisation: the first job pays it
        pass
    _send(out, {"ready": True})
    while (job := _read()) is not None:
        start = time.perf_counter()
        try:
            result = {"ok": True, "entry": pickle.dumps(capture(job))}
        except BaseException as error:  # noqa: BLE001 - reported; the caller traces itself
            result = {"ok": False, "error": f"{type(error).__name__}: {error}"[:2000]}
        result["seconds"] = time.perf_counter() - start
        result["device_touched"] = _device_touched()
        _send(out, result)


def capture(job: dict) -> tuple:
    """Trace and compile ``job``'s function for its static call signature, on fake tensors
    of that layout; returns what the graph cache keeps of the entry."""
    import torch

    from flashlight.traced import TracedFunction, stand_ins

    fn = _resolve(*job["function"])
    torch.backends.cuda.matmul.allow_tf32 = job["tf32"]
    with settings.override(**job["settings"]):
        traced = TracedFunction(fn, job["options"], name=job["name"], version=job["version"],
                                dynamic=job["dynamic"])
        entry = traced.traced_entry(stand_ins(job["signature"]), job["signature"], None)
    if entry.graph is None:
        raise RuntimeError("the compiled graph cannot be kept")
    return entry.family, entry.signature, entry.guard_text, entry.graph, entry.single


def _device_touched() -> bool:
    """Whether this process initialised CUDA (it should not: a context costs the GPU's
    memory and seconds)."""
    import torch

    return bool(torch.cuda.is_initialized())


def _warm_up() -> None:
    """Pay the process's one-time tracing costs before its first job."""
    from flashlight import prepare
    import flashlight.backend  # noqa: F401 - the compile path's imports

    prepare._first_trace()
    prepare._compile_modules()


def _read() -> dict | None:
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        return None
    return pickle.loads(sys.stdin.buffer.read(struct.unpack("<Q", head)[0]))


def _send(out, result: dict) -> None:
    blob = pickle.dumps(result)
    out.write(struct.pack("<Q", len(blob)) + blob)
    out.flush()

"""Paying a process's one-time compile costs early, on a thread.

[Note: a process's one-time costs]
The first kernel a process compiles pays for more than its own compile. Profiled in a
fold's first call with empty caches (H200 host, ``bench/results/first_call``):

* the first ``make_fx`` trace under a ``FakeTensorMode`` with a shape environment
  imports and initialises PyTorch's fake-tensor, symbolic-shape and decomposition
  machinery (about 3 s for a two-op function on this project's 2-core CI machine,
  0.01-0.04 s for the second);
* the first capture imports Flashlight's launch operators, whose ``torch.library``
  registration reads source files (0.04 s on that machine);
* Triton's driver builds its C utilities (``cuda_utils``, compiled with the system's C
  compiler when Triton's cache is empty: 0.4 s) and hashes its own installation for
  the cache key of every compile (``triton_key``, 0.6 s, in every process);
* the first launch Triton is asked about (what it would compile, for a compile worker)
  pays for its launch path's set-up (0.10-0.14 s on an H100 host, 0.001-0.006 s for
  the launches after it; ``triton_launch``, where compile workers run).

None of it depends on the kernels, so :func:`start` runs it on a daemon thread as soon
as a user says Flashlight will be used (``patch_openfold``; ``flashlight-fold`` starts it
before it builds the model), while the program loads weights and builds inputs. It
traces nothing itself (an FX tracer patches ``nn.Module.__call__`` process-wide while it
runs), and it draws no random numbers. The
compile path waits for the steps it needs, where the thread has not finished them
(never longer than doing the work itself, and the same work never runs twice at once):
capture and lowering for the first two (:data:`CAPTURE`), asking Triton what a launch
would compile (for a compile worker) for the first three (:data:`DRIVER`), Triton's own
compile for all of them. A capture thus starts while the thread is still on Triton's
steps: in a cold single-sequence fold alone on an H200 host (256 residues), the first
kernel's compile was submitted 0.90-0.98 s into the warm-up pass when every wait was for
the whole thread, 0.21-0.35 s with these waits (``bench/results/fold_product_runs/``).
``FLASHLIGHT_PREPARE=0`` turns the thread off.
"""
from __future__ import annotations

import logging
import threading
import time

import torch

from flashlight import settings

log = logging.getLogger("flashlight")

_lock = threading.Lock()
_thread: threading.Thread | None = None
_done = threading.Event()  # every step
_steps_done: dict[str, threading.Event] = {}  # each step, once finished (or failed)
TIMES: dict[str, float] = {}  # seconds each step took on the thread
CAPTURE = ("trace", "modules")  # the steps a capture and its lowering use
DRIVER = CAPTURE + ("triton_driver",)  # and asking Triton for a launch's specialization


def start() -> bool:
    """Start the preparing thread once per process (a no-op after the first call, and
    with ``FLASHLIGHT_PREPARE=0``); returns whether a thread is running or has run."""
    global _thread
    if not settings.get("prepare"):
        return False
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_run, name="flashlight-prepare", daemon=True)
            _thread.start()
    return True


def state() -> dict:
    """Where the preparing thread stands: ``"off"`` (never started), ``"running"`` or
    ``"done"``, with the seconds each finished step took (for reports: a first pass that
    starts while it runs pays its remaining steps where it waits for them), and the
    preloads' (:func:`preload`) likewise, with how many graphs they ran."""
    status = "off" if _thread is None else ("done" if _done.is_set() else "running")
    loads = "off" if _preloader is None else ("running" if _preloader.is_alive() else "done")
    return {"thread": status, "steps_s": {name: round(seconds, 4) for name, seconds in TIMES.items()},
            "preload": loads, "preloaded": PRELOADED[0], "preload_s": round(PRELOADED[1], 4)}


_preloader: threading.Thread | None = None
PRELOADED = [0, 0.0]  # graphs run by preloads, and their seconds


def preload(jobs: list) -> bool:
    """Run ``jobs`` (callables returning how many graphs each ran, e.g. a traced
    function's ``preload``) one after another on a daemon thread, after the preparing
    steps ([Note: preloading kept graphs] in flashlight/traced.py); a no-op with
    ``FLASHLIGHT_PREPARE=0``, ``FLASHLIGHT_PRELOAD=0`` or nothing to do. Returns whether a
    thread started."""
    global _preloader
    if not jobs or not (settings.get("prepare") and settings.get("preload")):
        return False

    def run() -> None:
        wait()
        start = time.perf_counter()
        for job in jobs:
            try:
                PRELOADED[0] += int(job() or 0)
            except Exception as error:  # noqa: BLE001 - only an optimisation
                log.debug("flashlight: a preload failed (%s: %s)", type(error).__name__, error)
        PRELOADED[1] += time.perf_counter() - start

    with _lock:
        previous = _preloader
        _preloader = threading.Thread(target=lambda: (previous.join() if previous else None, run()),
                                      name="flashlight-preload", daemon=True)
        _preloader.start()
    return True


def wait_preloads() -> None:
    """Block until every :func:`preload` thread has finished (at once on that thread)."""
    thread = _preloader
    if thread is not None and thread is not threading.current_thread():
        thread.join()


def wait(steps: tuple[str, ...] | None = None) -> None:
    """Block until the preparing thread has finished ``steps`` (every step: None), where
    one was started (at once otherwise, and on the thread itself)."""
    thread = _thread
    if thread is None or thread is threading.current_thread():
        return
    for event in [_done] if steps is None else [_step_event(name) for name in steps]:
        while not (event.is_set() or _done.is_set()):
            # a process forked while the thread ran has no such thread: nothing to wait for
            if not thread.is_alive():
                return
            event.wait(0.05)


def _step_event(name: str) -> threading.Event:
    with _lock:
        return _steps_done.setdefault(name, threading.Event())


def _run() -> None:
    try:
        _step("trace", _first_trace)
        _step("modules", _compile_modules)
        if torch.cuda.is_available() and not settings.get("interpret"):
            _step("triton_driver", _triton_driver)
            _step("triton_launch", _triton_launch)
            _step("triton_key", _triton_key)
    finally:
        _done.set()


def _step(name: str, fn) -> None:
    start = time.perf_counter()
    try:
        fn()
    except Exception as error:  # noqa: BLE001 - only an optimisation: the compile path pays it later
        log.debug("flashlight: preparing %s failed (%s: %s)", name, type(error).__name__, error)
    TIMES[name] = time.perf_counter() - start
    _step_event(name).set()


def _first_trace() -> None:
    """Initialise what traced capture uses (fake tensors with a symbolic size, symbolic
    shapes, AOTAutograd's inference decompositions) by running a small attention on fake
    tensors. Not ``make_fx`` itself: an FX tracer replaces ``nn.Module.__call__`` for the
    whole process while it traces, so a trace on this thread would reroute the modules the
    caller runs meanwhile (after this, the first real trace takes 0.14 s instead of 2.9 s
    on the 2-core CI machine)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental import proxy_tensor  # noqa: F401 - imported, not run
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    from flashlight.decompositions import decompositions

    decompositions(inference=True)
    mode = FakeTensorMode(shape_env=ShapeEnv(duck_shape=False))
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC, DimDynamic.DYNAMIC, DimDynamic.STATIC])
    # only shapes matter; no random numbers (the caller's generator state stays as it was)
    q, k, bias = (mode.from_tensor(torch.empty(*shape), symbolic_context=context)
                  for shape in ((2, 5, 4), (2, 5, 4), (2, 5, 5)))  # q, k: [B, L, C]; bias: [B, L, L]
    with torch.no_grad(), mode:
        scores = torch.matmul(q, k.transpose(-1, -2)) * 0.5 + bias
        torch.softmax(scores, dim=-1) @ k * torch.sigmoid(q)


def _compile_modules() -> None:
    """Import the modules a first compile imports: the launch operators' registration
    (``torch.library``'s ``register_fake`` reads its caller's source, which walks every
    loaded module's file: 0.04 s on the 2-core CI machine, in the first capture otherwise)."""
    import flashlight.inductor  # noqa: F401 - registers flashlight::launch and launch_outputs


def _triton_driver() -> None:
    """Triton's active driver and its C utilities (built on first use)."""
    import triton

    triton.runtime.driver.active.utils  # noqa: B018 - the property builds or loads them


_PROBE_KERNEL = (
    "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
    "def flashlight_probe(x, y, BLOCK: tl.constexpr):\n"
    "    offs = tl.arange(0, BLOCK)\n"
    "    tl.store(y + offs, tl.load(x + offs))\n")


def _triton_launch() -> None:
    """Ask Triton once what a small kernel's launch would compile, compiling nothing
    (``flashlight.compile_workers.specialization``, what a compile worker's job asks
    first): the first such question in a process pays one-time costs of Triton's launch
    path (0.10-0.14 s on an H100 host, the ``specialize_s`` of a cold fold's first compile
    job, against 0.001-0.006 s for the jobs after it). Only where workers run (else
    nothing asks)."""
    import importlib.util
    import os
    import tempfile

    from flashlight import compile_workers

    if compile_workers.pool() is None:
        return
    with tempfile.TemporaryDirectory(prefix="flashlight-probe-") as folder:
        path = os.path.join(folder, "flashlight_probe.py")
        with open(path, "w") as f:
            f.write(_PROBE_KERNEL)
        spec = importlib.util.spec_from_file_location("flashlight_probe_kernel", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        x = _Pointer()  # no memory: nothing is launched, and no device context is made here
        compile_workers.specialization(module.flashlight_probe, (x, x), (1,), {"BLOCK": 16})


class _Pointer:
    """A float32 pointer as Triton's specialization sees one (an object with ``data_ptr``
    and ``dtype``), pointing nowhere."""

    dtype = torch.float32

    @staticmethod
    def data_ptr() -> int:
        return 0


def _triton_key() -> None:
    """The digest of Triton's installation in its compile cache keys (cached per process)."""
    from triton.runtime import cache

    key = getattr(cache, "triton_key", None)
    if key is not None:
        key()

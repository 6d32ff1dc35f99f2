"""Paying a process's one-time compile costs early, on a thread.

[Note: a process's one-time costs]
The first kernel a process compiles pays for more than its own compile. Profiled in a
fold's first call with empty caches (H200 host, ``bench/results/first_call``):

* the first ``make_fx`` trace under a ``FakeTensorMode`` with a shape environment
  imports and initialises PyTorch's fake-tensor, symbolic-shape and decomposition
  machinery (here about 3 s for a two-op function on this project's 2-core CI machine,
  0.01 s for the second);
* Triton's driver builds its C utilities (``cuda_utils``, compiled with the system's C
  compiler when Triton's cache is empty: 0.4 s) and hashes its own installation for
  the cache key of every compile (``triton_key``, 0.6 s, in every process).

None of it depends on the kernels, so :func:`start` runs it on a daemon thread as soon
as a user says Flashlight will be used (``patch_openfold``), while the program loads
weights and builds inputs. The compile path calls :func:`wait` before its first trace
and its first Triton compile: where the thread is still running, the caller waits for
it (never longer than doing the work itself), so the two never trace at once.
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
_done = threading.Event()
TIMES: dict[str, float] = {}  # seconds each step took on the thread


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


def wait() -> None:
    """Block until the preparing thread has finished, where one was started (at once
    otherwise, and on the thread itself)."""
    thread = _thread
    if thread is not None and thread is not threading.current_thread():
        _done.wait()


def _run() -> None:
    try:
        _step("trace", _first_trace)
        if torch.cuda.is_available() and not settings.get("interpret"):
            _step("triton_driver", _triton_driver)
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


def _first_trace() -> None:
    """Trace a small attention the way traced capture does (fake inputs with a symbolic
    size, AOTAutograd's inference decompositions)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    from flashlight.decompositions import decompositions

    def attention(q, k, bias):  # q, k: [B, L, C]; bias: [B, L, L]
        scores = torch.matmul(q, k.transpose(-1, -2)) * 0.5 + bias
        return (torch.softmax(scores, dim=-1) @ k * torch.sigmoid(q),)

    mode = FakeTensorMode(shape_env=ShapeEnv(duck_shape=False))
    sizes = [DimDynamic.STATIC, DimDynamic.DYNAMIC, DimDynamic.STATIC]
    context = StatelessSymbolicContext(dynamic_sizes=sizes)
    # only shapes matter; no random numbers (the caller's generator state stays as it was)
    inputs = [torch.empty(2, 5, 4), torch.empty(2, 5, 4), torch.empty(2, 5, 5)]
    fakes = [mode.from_tensor(t, symbolic_context=context) for t in inputs]
    with torch.no_grad(), mode:
        make_fx(attention, tracing_mode="real", decomposition_table=decompositions(inference=True))(*fakes)


def _triton_driver() -> None:
    """Triton's active driver and its C utilities (built on first use)."""
    import triton

    triton.runtime.driver.active.utils  # noqa: B018 - the property builds or loads them


def _triton_key() -> None:
    """The digest of Triton's installation in its compile cache keys (cached per process)."""
    from triton.runtime import cache

    key = getattr(cache, "triton_key", None)
    if key is not None:
        key()

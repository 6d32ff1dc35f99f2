"""Stock or kernel for one patched OpenFold attention call, chosen by measurement.

[Note: the faster of stock and patched attention]
A patched attention call costs the host a fixed amount more than OpenFold's own: its
compiled core goes through Dynamo's guard, AOTAutograd's wrapper, the launcher and
Triton's launch, where stock makes a few ATen calls. When a call computes few scores,
both are bound by the host, and that fixed cost decides: on an H200 the MSA row attention
of a single-sequence record (one sequence, 256 residues, 8 heads) took 0.70 ms per call
patched against 0.50 ms stock, while its column and triangle attentions were faster
patched (``bench/results/module_host_single_sequence.json``). A kernel that loses to the
code it replaces is a bug, and a threshold on sizes would be a guess per GPU and host, so
small calls are measured instead: the first call of each shape whose scores
(batch x heads x queries x keys) number at most :data:`SMALL_SCORES` times the patched and
the stock call back to back between two synchronisations (the cost of a call in a
pipelined pass, whichever of host or device bounds it) and keeps stock for that shape
only when it is clearly faster (:data:`MARGIN`); inside
``flashlight.background.compiling_in_background`` the timing waits for the context's end,
when the kernel is compiled. The choice is shared by every module
of the same signature (the 48 Evoformer blocks time once). Larger calls always run the
kernel: stock would materialize their scores, and there the kernel is several times
faster. Only CUDA calls outside autograd are timed; elsewhere the kernel runs as before.

[Note: choices kept for the next process]
Timing a key runs the module :data:`ROUNDS` x :data:`CALLS` times per variant between
synchronisations, in the first recycling iteration of every process: in a
single-sequence fold, whose calls are all small, that is a few milliseconds per key on
a pass bound by the host. A choice is therefore written to the cache folder (beside
autotuning's, under ``FLASHLIGHT_TUNING_CACHE``) keyed by the GPU model, the versions of
PyTorch, Triton and Flashlight, and the call key (module kind, heads, width, dtype,
shapes, strides), and a later process on the same machine reads it instead of timing
again. :func:`clear` forgets both.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Hashable

import torch

from flashlight import background, settings

log = logging.getLogger("flashlight")

SMALL_SCORES = 1 << 22  # batch x heads x queries x keys up to which a call is timed
MARGIN = 0.9  # stock is kept where it takes at most this fraction of the patched call's time
CALLS, ROUNDS = 5, 3  # back-to-back calls per timing, timings per variant (the best counts)
TIMED_DEVICES = ("cuda",)  # device types whose small calls are timed

_choices: dict[Hashable, str] = {}  # call key -> "stock" or "kernel"
_lock = threading.Lock()
TIMINGS: list[dict] = []  # every measurement made, for reports and tests
RECALLED: list[str] = []  # repr of each key whose choice an earlier process made
_kept: dict[str, str] | None = None  # the file's choices, read on first use
_not_kept: set = set()  # keys looked up in it and not found (each is looked up once)


def per_call_s(fn: Callable[[], object]) -> float:
    """Seconds per call of ``fn`` in back-to-back calls on the current CUDA device (best
    of :data:`ROUNDS` runs of :data:`CALLS` calls)."""
    best = float("inf")
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / CALLS)
    return best


def scores(q_x: torch.Tensor, kv_x: torch.Tensor, heads: int) -> int:
    """Scores one call computes: batch x heads x queries x keys (``q_x``: ``[*, Q, C]``)."""
    batch = 1
    for size in q_x.shape[:-2]:
        batch *= int(size)
    return batch * heads * int(q_x.shape[-2]) * int(kv_x.shape[-2])


def run(key: Hashable, n_scores: int, patched: Callable[[], torch.Tensor],
        stock: Callable[[], torch.Tensor], timer: Callable | None = None) -> torch.Tensor:
    """The output of ``patched()`` or ``stock()`` for a call of ``key`` (its signature and
    shapes), whichever was measured faster for it ([Note: the faster of stock and patched
    attention]); calls with more than :data:`SMALL_SCORES` scores run ``patched``."""
    if n_scores > SMALL_SCORES:
        return patched()
    choice = _choices.get(key)
    if choice is None:
        choice = _recall(key)
    if choice == "stock":
        return stock()
    if choice == "kernel":
        return patched()
    compiles = background.active()
    if compiles is not None:
        # the kernel may still be compiling ([Note: compiling in the background]): time
        # both once every compile is done
        compiles.after(("openfold_choice", key), lambda: _choose(key, n_scores, patched, stock, timer))
        return patched()
    return _choose(key, n_scores, patched, stock, timer)


def _choose(key: Hashable, n_scores: int, patched: Callable[[], torch.Tensor],
            stock: Callable[[], torch.Tensor], timer: Callable | None) -> torch.Tensor:
    """Time ``patched`` and ``stock`` for ``key`` and keep the faster; returns ``patched()``."""
    out = patched()  # compiles the kernel, so the timing below is of a warm call
    timer = timer or per_call_s
    kernel_s, stock_s = timer(patched), timer(stock)
    choice = "stock" if stock_s <= MARGIN * kernel_s else "kernel"
    with _lock:
        _choices[key] = choice
        TIMINGS.append({"key": repr(key), "scores": n_scores, "kernel_s": kernel_s, "stock_s": stock_s,
                        "choice": choice})
    _keep(key, choice)
    return out


def _path() -> str:
    return os.path.join(settings.get("cache_dir"), "choices", "openfold_attention.json")


def _disk_key(key: Hashable) -> str:
    """What a kept choice holds for ([Note: choices kept for the next process])."""
    from flashlight.traced import versions

    device = next((part for part in key if isinstance(part, torch.device)), None) \
        if isinstance(key, tuple) else None
    gpu = torch.cuda.get_device_name(device) if device is not None and device.type == "cuda" else "-"
    return " | ".join([gpu, *(f"{name} {v}" for name, v in sorted(versions().items())), repr(key)])


def _read() -> dict[str, str]:
    from flashlight.tuning_cache import read_json

    return {k: v for k, v in read_json(_path()).items() if v in ("stock", "kernel")}


def _recall(key: Hashable) -> str | None:
    """The choice an earlier process kept for ``key`` (None: none, or the cache is off)."""
    global _kept
    if key is None or key in _not_kept or not settings.get("tuning_cache"):
        return None
    with _lock:
        if _kept is None:
            _kept = _read()
        choice = _kept.get(_disk_key(key))
        if choice is None:
            _not_kept.add(key)
        else:
            _choices[key] = choice
            RECALLED.append(repr(key))
    return choice


def _keep(key: Hashable, choice: str) -> None:
    """Write ``choice`` for ``key`` to the cache folder (atomically; a failure to write
    only costs the next process a timing)."""
    if key is None or not settings.get("tuning_cache"):
        return
    from flashlight.tuning_cache import write_json

    with _lock:
        kept = _read()
        kept[_disk_key(key)] = choice
        why = write_json(_path(), kept)
    if why is not None:
        log.warning("flashlight: could not keep the attention choice in %s (%s)", _path(), why)


def choices() -> dict[Hashable, str]:
    """Call key -> the variant chosen for it so far."""
    with _lock:
        return dict(_choices)


def clear(disk: bool = True) -> None:
    """Forget every choice, in this process and (``disk``) in the cache folder: the next
    small call of each shape is timed again. ``disk=False`` forgets this process's only,
    as a new process starts."""
    global _kept
    with _lock:
        _choices.clear()
        TIMINGS.clear()
        RECALLED.clear()
        _not_kept.clear()
        _kept = None
        if disk:
            try:
                os.unlink(_path())
            except OSError:
                pass

"""Where one thread spends its wall time: its Python stack sampled on a timer.

cProfile counts calls, slows Python down 1.5-2x and charges a thread nothing while it
waits for another (the interpreter lock, a future, a CUDA synchronisation). A fold's first
pass is a race between its main thread and the compile threads, so what matters is where
the *main thread's wall time* goes: this samples that thread's stack every ``interval``
seconds from a daemon thread (``sys._current_frames``), and reports, per pass, the share of
samples in which each function was on the stack (inclusive) or on top (own).

    with StackSampler() as sampler:          # samples the thread that opened it
        run()
    for window in passes(sampler.samples, "run_within"):
        print(summary(window, top=30))

A sample costs the sampled thread one interpreter-lock hand-over (tens of microseconds at
the default 2 ms interval).
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time

Frame = str  # "file.py:function"
Sample = tuple[float, tuple[Frame, ...], tuple[int, ...]]  # (seconds since start, stack
# outermost first, each frame's id: two calls of one function are told apart by it, see
# [Note: frame ids that tell calls apart])

# [Note: frame ids that tell calls apart]
# A frame object's id is its address, which CPython hands to the next frame object once
# the old one is freed: two back-to-back calls of one function, at one depth, often get
# the same id. The sampler therefore holds the frames of its previous sample until it
# takes the next one: a call that began between two samples cannot get the address of a
# frame still held, so the ids of consecutive samples differ exactly when the calls do.
# A sample without the marker ends its window (``passes``), so samples further apart are
# never compared.


def _frame_name(frame) -> Frame:
    code = frame.f_code
    parts = code.co_filename.replace(os.sep, "/").split("/")
    return f"{'/'.join(parts[-2:])}:{code.co_name}"


class StackSampler:
    """Samples the stack of the thread that enters it (or ``ident``) until it exits."""

    def __init__(self, interval: float = 0.002, ident: int | None = None):
        self.interval = interval
        self.ident = ident
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0
        self._held: list = []  # the previous sample's frames: [Note: frame ids that tell calls apart]

    def __enter__(self) -> "StackSampler":
        self.ident = self.ident or threading.get_ident()
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._held = []

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.ident)
            stack, ids, frames = [], [], []
            while frame is not None:
                stack.append(_frame_name(frame))
                ids.append(id(frame))
                frames.append(frame)
                frame = frame.f_back
            self._held = frames
            self.samples.append((time.perf_counter() - self._start, tuple(reversed(stack)), tuple(reversed(ids))))


def passes(samples: list[Sample], marker: str) -> list[list[Sample]]:
    """The samples taken inside each call of the function named ``marker``, one list per
    call (told apart by the call's frame, [Note: frame ids that tell calls apart]), each
    stack trimmed to the frames below it."""
    windows: list[list[Sample]] = []
    last = None
    for t, stack, ids in samples:
        at = next((i for i, frame in enumerate(stack) if frame.endswith(":" + marker)), None)
        if at is None:
            last = None
            continue
        if ids[at] != last:
            windows.append([])
            last = ids[at]
        windows[-1].append((t, stack[at + 1:] or stack[at:], ids[at + 1:] or ids[at:]))
    return windows


def summary(window: list[Sample], top: int = 30, interval: float | None = None) -> str:
    """The window's length, and its functions by inclusive and by own share of samples."""
    if not window:
        return "(no samples)"
    n = len(window)
    inclusive: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    for _, stack, _ in window:
        inclusive.update(set(stack))
        own[stack[-1]] += 1
    span = window[-1][0] - window[0][0]
    lines = [f"{span:.3f} s, {n} samples" + (f" ({n * interval:.3f} s sampled)" if interval else "")]
    lines.append("  inclusive:")
    lines += [f"    {100 * c / n:5.1f}%  {name}" for name, c in inclusive.most_common(top)]
    lines.append("  own:")
    lines += [f"    {100 * c / n:5.1f}%  {name}" for name, c in own.most_common(top)]
    return "\n".join(lines)


def folded(window: list[Sample]) -> str:
    """The window as folded stacks (``a;b;c count`` lines, for flame-graph tools)."""
    counts = collections.Counter(";".join(stack) for _, stack, _ in window)
    return "\n".join(f"{stack} {count}" for stack, count in sorted(counts.items()))

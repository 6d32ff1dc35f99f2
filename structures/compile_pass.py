"""How a fold's pass compiles Flashlight's kernels: in the background, during the pass.

[Note: compiling in the background during a fold's pass]
A fold's output comes from one pass. A separate warm-up pass, where Flashlight compiles,
is work whose result is thrown away: on an H200 (256 residues, one sequence, empty
caches) the first fold took 2.9-3.3 s as a one-iteration warm-up (1.9-2.0 s) plus the
pass, against stock's 1.7-2.4 s (bench/results/fold_product_runs/, solo rows). So a
plain fold (no ``--compare``, one pass, no ``--warmup``) compiles inside its pass: its
first recycling iteration runs while the kernels compile in the background, their
unfused graphs answering; the stacks' CUDA graphs record on their second call (the
second iteration), and each recording first waits for the compiles and the timings
deferred to them (``flashlight.background.settle``), so that a graph holds the
compiled kernels and the stock-or-kernel choices, not the unfused graphs. The pass's
timing then includes the compile (``compiled_in_pass`` in ``latency.json``); its later
iterations are the steady state. ``--repeats N`` (N > 1) and ``--compare`` keep a
warm-up, so that every timed pass is the steady state. Measured the same way, the first
fold then took 2.3-2.4 s, and 3.5-4.0 s against 4.6-4.9 s with a 5632-row MSA.
"""
from __future__ import annotations

import contextlib
import logging

import torch

from flashlight import capture_worker, compile_workers, settings

log = logging.getLogger("flashlight.fold")


@contextlib.contextmanager
def compiling_in_background(first: bool, device: torch.device, report: dict):
    """By default (``FLASHLIGHT_WARMUP_COMPILE=background``), the first pass that
    compiles (the warm-up, or the fold's one pass where it runs none: [Note: compiling
    in the background during a fold's pass]) compiles new kernels on threads while their
    unfused graphs answer ([Note: compiling in the background] in
    ``flashlight.background``); its timing includes waiting for the last compile, and the
    score-sized buffers those graphs left in PyTorch's allocator cache are returned.
    With ``inline`` each kernel compiles where it is first launched. On an H200 (256
    residues, bf16) the background warm-up took a cold first call from 4.4-5.3 s to
    2.5-2.7 s, and with the stacks replayed as CUDA graphs the timed passes after it
    measured the same as after an inline one (bench/results/fold_product_runs/README.md).
    ``report`` receives the mode, the kernels compiled in the background, the seconds
    the pass waited for them at its end and before graph recordings (``settle_s``), each
    job's submission, start and end (seconds into the pass), and what the compile worker
    processes did ([Note: compiling in other processes]; None without them)."""
    from flashlight import background

    mode = settings.get("warmup_compile")
    if not first or mode != "background":
        report.setdefault("mode", mode)
        yield
        return
    with background.compiling_in_background() as compiles:
        yield
    kernels = sum(not capture_worker.is_capture(key) for key in compiles.jobs())
    captures = len(compiles.jobs()) - kernels
    report.update(mode=mode, kernels=kernels, captured_elsewhere=captures, wait_s=compiles.wait_s,
                  settle_s=round(compiles.settle_s, 4), workers=compile_workers.stats(),
                  capture_process=capture_worker.stats(), jobs=compiles.timeline())
    if compiles.jobs():
        log.info(f"  {kernels} kernel(s) compiled and {captures} core(s) traced in the background; the pass "
                 f"waited {compiles.wait_s + compiles.settle_s:.2f} s for them (timeline in latency.json)")
    if compiles.jobs() and device.type == "cuda":
        torch.cuda.empty_cache()


def run_within(context, model, batch):
    """``model(batch)`` inside ``context`` (whose exit the caller's timing includes)."""
    with context:
        return model(batch)

"""Launching a kernel Triton has compiled: by Triton's launcher, or PyTorch's static one.

[Note: the static launcher]
Triton 3.6 launches each compiled kernel through C code generated for that kernel's
signature, built with the system's C compiler the first time the kernel runs: 0.18-0.36 s
a kernel on an H100 host with empty caches, after the kernel's own compile and on the
path of a cold fold's first pass (``launcher_s`` in the compile timeline of
bench/results/fold_product_runs/: on one sequence the pass waited 0.59 s for its six
kernels, each a compile and then a launcher build). PyTorch ships a launcher compiled
once for every signature, the one Inductor launches its own Triton kernels through
(``StaticallyLaunchedCudaKernel``: the kernel's cubin loaded with the CUDA driver, each
argument converted by a one-letter code of its type). Turned on, Flashlight launches its
kernels through it where it can: a compiled kernel's cubin is loaded once per device (in the
background compile's job, where there is one), and a launch passes the JIT function's
arguments less those Triton specialised into constants (an integer equal to 1, for
instance), in order, with the tensors as their data pointers. Where it cannot (a PyTorch
without it, a kernel it does not take: scratch memory, clusters of CTAs, tensor
descriptors; Triton's launch hooks set, for a profiler; a load that fails), Triton's
launcher runs as before. On by default (``FLASHLIGHT_STATIC_LAUNCH=0``: Triton's launcher
everywhere). On an H100 (bench/results/h100_2026-12-07d) it took every launcher build
(0.18-0.36 s a kernel) out of a cold fold's compile jobs, checked against float64; in the
first two A/B pairs the first call was no shorter (the processes that ran with it were
slower throughout, in modules it does not touch too, as the host moved), in the third
(bench/results/fold_product_runs/static_launch_ab_h100_20261207c, the order off, on) it
was 0.20 s shorter in bf16 (1.41 -> 1.22 s) and 0.30 s in float32 (1.37 -> 1.07 s), its
compile jobs ending 0.2-0.4 s earlier: over the three pairs, three first calls shorter,
two longer, one level, and on every job the launcher's step left the critical path.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

import torch

from flashlight import settings

log = logging.getLogger("flashlight")

_lock = threading.Lock()
_static: dict[tuple[str, int], Any] = {}  # (Triton's hash of the kernel, device) -> loaded static kernel or None


def current_device() -> int:
    """The current CUDA device, as Triton's launches read it."""
    from triton.runtime import driver

    return driver.active.get_current_device()


def current_stream(device: int) -> int:
    """The current CUDA stream of ``device``, as Triton's launches read it."""
    from triton.runtime import driver

    return driver.active.get_current_stream(device)


def _hooks_set() -> bool:
    """Whether Triton's launch hooks are set (a profiler's): those launches go through
    Triton (its default hooks are empty chains)."""
    from triton import knobs

    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return any(hook is not None and getattr(hook, "calls", True) for hook in hooks)


class TritonLaunch:
    """A compiled kernel launched by Triton's own launcher for its signature."""

    def __init__(self, kernel, device: int, constexprs: tuple):
        self.kernel, self.device, self.constexprs = kernel, device, constexprs

    def launch(self, grid: tuple[int, ...], args: Sequence) -> bool:
        """Launch on ``args`` (the JIT function's arguments before its constexprs);
        False where the JIT function must launch instead."""
        if _hooks_set() or current_device() != self.device:
            return False
        g0, g1, g2 = (*grid, 1, 1)[:3]
        kernel = self.kernel
        run = kernel.run  # builds Triton's launcher and loads the binary the first time
        run(g0, g1, g2, current_stream(self.device), kernel.function, kernel.packed_metadata, None,
            None, None, *args, *self.constexprs)
        return True


class StaticLaunch:
    """A compiled kernel launched by PyTorch's static launcher ([Note: the static launcher])."""

    def __init__(self, static, device: int, kept: tuple[int, ...]):
        self.static, self.device, self.kept = static, device, kept

    def launch(self, grid: tuple[int, ...], args: Sequence) -> bool:
        if _hooks_set() or current_device() != self.device:
            return False
        g0, g1, g2 = (*grid, 1, 1)[:3]
        passed = [args[k] for k in self.kept]
        self.static.run(g0, g1, g2, current_stream(self.device),
                        *(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in passed))
        return True


class _CubinOnDisk:
    """The compiled kernel as PyTorch's static launcher reads it: every attribute the
    kernel's, and the path of its cubin in Triton's cache."""

    def __init__(self, kernel, cubin_path: str):
        self._kernel, self._cubin_path = kernel, cubin_path

    def __getattr__(self, name: str):
        return getattr(self._kernel, name)


def kept_arguments(kernel, count: int) -> tuple[int, ...] | None:
    """Positions among the JIT function's first ``count`` arguments that the compiled
    kernel takes (those Triton did not specialise into constants), or None where its
    signature does not say."""
    names = list(kernel.src.fn.arg_names)

    def position(key) -> int:  # Triton keys these by name, by (position,) or by position
        return names.index(key) if isinstance(key, str) else key[0] if isinstance(key, tuple) else key

    signature = {position(k): kind for k, kind in kernel.src.signature.items()}
    constants = {position(k) for k in (getattr(kernel.src, "constants", None) or {})}
    if any(k not in signature for k in range(count)):
        return None
    return tuple(k for k in range(count) if signature[k] != "constexpr" and k not in constants)


def static_kernel(kernel, device: int, count: int) -> StaticLaunch | None:
    """``kernel`` (Triton's compiled kernel, ``count`` arguments before its constexprs)
    loaded into PyTorch's static launcher on ``device``, once per kernel and device;
    None where it cannot launch there ([Note: the static launcher])."""
    if not settings.get("static_launch"):
        return None
    key = (str(kernel.hash), device)
    with _lock:
        if key in _static:
            return _static[key]
    launch = None
    try:
        launch = _load(kernel, device, count)
    except Exception as error:  # noqa: BLE001 - Triton's launcher runs it instead
        log.debug("flashlight: %s launches through Triton's launcher (%s: %s)",
                  getattr(kernel, "name", kernel), type(error).__name__, error)
    with _lock:
        return _static.setdefault(key, launch)


def launcher_class():
    """PyTorch's static launcher for CUDA kernels, or None where this PyTorch has none
    (its module is cheap to import: ``import flashlight`` has imported Inductor's)."""
    try:
        from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    except ImportError:  # its module's name before PyTorch 2.12
        try:
            from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel
        except ImportError:
            return None
    return StaticallyLaunchedCudaKernel


def _load(kernel, device: int, count: int) -> StaticLaunch | None:
    static_class = launcher_class()
    cubins = [path for name, path in getattr(kernel, "metadata_group", {}).items() if name.endswith(".cubin")]
    kept = kept_arguments(kernel, count)
    if static_class is None or len(cubins) != 1 or kept is None:
        return None
    static = static_class(_CubinOnDisk(kernel, cubins[0]))
    if len(static.arg_tys) != len(kept):
        return None
    static.load_kernel(device)
    return StaticLaunch(static, device, kept)


def compiled_launch(raw, args: Sequence, options: dict) -> TritonLaunch | StaticLaunch | None:
    """How to launch the kernel the JIT function ``raw`` compiles for ``args`` and
    ``options`` (compiling it, or finding it compiled), without launching it; None
    where Triton compiles nothing to launch (its interpreter)."""
    kernel = raw.warmup(*args, grid=(1,), **options)
    if not hasattr(kernel, "packed_metadata"):
        return None
    device = current_device()
    static = static_kernel(kernel, device, len(args))
    if static is not None:
        return static
    constexprs = tuple(options.get(p.name, p.default) for p in raw.params[len(args):])
    return TritonLaunch(kernel, device, constexprs)


def prepared(kernel, device: torch.device, count: int) -> None:
    """Make ``kernel``'s first launch on ``device`` find everything done: its static
    launch loaded, or else Triton's launcher built and the binary loaded (what reading
    its ``run`` does)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if static_kernel(kernel, index, count) is not None:
            return
    getattr(kernel, "run", None)


def compiles(args: Sequence) -> bool:
    """Whether launching on ``args`` runs a compiled kernel (CUDA tensors), not Triton's
    interpreter."""
    return bool(args) and isinstance(args[0], torch.Tensor) and args[0].device.type == "cuda"


def launch(raw, grid, args: Sequence, options: dict, known: dict, inputs: int) -> None:
    """Launch ``raw`` on ``args`` with ``options`` over ``grid`` (a tuple, or Triton's
    function of the launch options): through the compiled launch ``known`` holds for the
    alignment of the first ``inputs`` arguments (the input tensors; fresh outputs are
    always aligned), finding it the first time; through the JIT function where there is
    none or it declines."""
    aligned = tuple(args[k].data_ptr() % 16 == 0 for k in range(inputs))
    how = known.get(aligned)
    if how is None and compiles(args):
        how = compiled_launch(raw, args, options)
        if how is not None:
            known[aligned] = how
    if how is not None and how.launch(tuple(grid(options)) if callable(grid) else grid, args):
        return
    raw[grid](*args, **options)

"""Every environment variable Flashlight reads, declared once.

Values are read when first asked for, so tests and users can change them at
run time, and :func:`override` scopes a change to a ``with`` block::

    with settings.override(debug=2):
        fn(*args)   # prints the IR after each pass and the generated source

=====================  ==========  ==================================================
variable               default     meaning
=====================  ==========  ==================================================
FLASHLIGHT_DEBUG       0           1: log fusion decisions and fallbacks;
                                   2: also the IR after each pass and Triton source
FLASHLIGHT_CACHE_DIR   ~/.cache/   where generated kernel sources and autotuning
                       flashlight  choices are written
FLASHLIGHT_AUTOTUNE    1           autotune tile configurations on the GPU over a
                                   few candidates a cost model picks, and against
                                   the unfused graph (0: the first candidate only;
                                   full: every candidate, no shipped choices)
FLASHLIGHT_COMPILE_    0           threads compiling a kernel's autotuning candidates
THREADS                            before they are timed (0: one per CPU core, at most
                                   one per candidate; 1: one at a time, as Triton's
                                   autotuner does)
FLASHLIGHT_TUNING_     1           remember each kernel's autotuning choice per GPU,
CACHE                              Triton version and sizes in the cache folder, so
                                   a later process launches it without autotuning
                                   (and the OpenFold patch's timed choice of stock
                                   or kernel per small call shape)
FLASHLIGHT_TUNED_      (shipped)   data file of tuned choices per GPU model, Triton
CONFIGS                            version, kernel structure and size bucket,
                                   consulted after the tuning cache (empty: the one
                                   shipped in flashlight/data/; 0: none)
FLASHLIGHT_CHECK_      0           1: generated kernels assert that every load and
BOUNDS                             store stays inside its tensor (debugging; slow)
FLASHLIGHT_CHECK_IR    0           1: check the IR's invariants after every compiler
                                   pass, back-off trials included (tests; slower)
FLASHLIGHT_REMAINDER   inductor    what runs the graph's ops outside Flashlight
                                   kernels: inductor (compiled around the kernels,
                                   which it sees as opaque ops) or eager
FLASHLIGHT_ON_ERROR    fallback    an unexpected error inside Flashlight's compile
                                   steps: fallback (warn, and the graph runs without
                                   Flashlight kernels) or raise
FLASHLIGHT_WARMUP_     background  how a fold's warm-up pass compiles new kernels:
COMPILE                            background (on threads, while their unfused
                                   graphs answer) or inline (each where it is
                                   first launched)
FLASHLIGHT_GRAPH_      1           keep graphs compiled by traced capture in the
CACHE                              cache folder, so a later process loads them
                                   instead of tracing (flashlight.traced)
FLASHLIGHT_PREPARE     1           patch_openfold starts a thread that pays a
                                   process's one-time compile costs (PyTorch's
                                   tracing machinery, Triton's driver) early
                                   (flashlight.prepare; 0: off)
FLASHLIGHT_PRELOAD     1           patch_openfold also runs, on a thread, the compiled
                                   cores' graphs an earlier process kept, on zeros of
                                   their call signatures, so the first forward finds
                                   them loaded (flashlight.traced; 0: off)
FLASHLIGHT_COMPILE_    -1          worker processes that compile the warm-up's
PROCESSES                          kernels in the background (-1: one per CPU core,
                                   at most 8; 0: on threads of this process;
                                   flashlight.compile_workers)
FLASHLIGHT_CAPTURE_    1           a fold starts processes that trace the attention
PROCESS                            cores its first pass meets, while the pass runs
                                   them eagerly (0: traced on the calling thread;
                                   CUDA devices only; flashlight.capture_worker)
FLASHLIGHT_LAUNCHER_   0           1: build each kernel's launcher (Triton's C code per
BESIDE                             signature) on a thread while a worker compiles the
                                   kernel (0: after the compile, as Triton does;
                                   flashlight.compile_workers; measured mixed: 3 of 4
                                   first calls shorter, one longer)
FLASHLIGHT_STATIC_     1           1: launch compiled kernels through PyTorch's
LAUNCH                             launcher built for every signature, so that none
                                   waits for a C compile of Triton's own (0: Triton's
                                   launcher; flashlight.compiled_launch, [Note: the
                                   static launcher])
FLASHLIGHT_RECORD_     0           1: autotuning also times each candidate's build
BUILDS                             from nothing in a compile worker, for the shipped
                                   choices (bench/tune_configs.py sets it;
                                   [Note: a choice that builds fast])
FLASHLIGHT_GRAPH_      overlap     how patch_openfold's CUDA graphs are recorded:
CAPTURE                            overlap (captured while the device runs earlier
                                   work, where free memory allows) or drain (the
                                   device idle first, as torch.cuda.graph does;
                                   flashlight.integrations.openfold_graphs)
FLASHLIGHT_SUM_DOTS    0           1: attention's row sums on the tensor core beside a
                                   16-bit p @ v (0: summed on the CUDA cores;
                                   flashlight.passes.tile_plan; 1-10% slower on an
                                   H100: bench/results/core_terms)
FLASHLIGHT_LAZY_       0           1: the online loop rescales its sums only when a
RESCALE                            row's max grew by more than 2 ** 8
                                   (flashlight.passes.base2; 5-17% slower on an H100)
FLASHLIGHT_REPEATS_    1           0: the gradient of keys shared by several query
OUTSIDE                            heads sums the heads in a loop inside each step of
                                   the query loop, never around it (by default around
                                   it where tile skipping does not split it;
                                   flashlight.passes.tiling)
FLASHLIGHT_FP32_DOTS   tf32x3      float32 products where TF32 is off
                                   (torch.backends.cuda.matmul.allow_tf32 False):
                                   tf32x3: three TF32 tensor-core products per dot
                                   (each operand split into a high and a low part);
                                   ieee: on the CUDA cores, each product exact
                                   (flashlight.codegen.fp32_precision, [Note: float32
                                   products as three TF32 products])
TRITON_INTERPRET       0           Triton's own switch; when 1, generated kernels run
                                   on CPU tensors through the Triton interpreter
=====================  ==========  ==================================================
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Iterator


@dataclasses.dataclass(frozen=True)
class _Knob:
    env: str
    default: Any
    parse: Callable[[str], Any]


def _bool(text: str) -> bool:
    return text.strip().lower() not in ("", "0", "false", "no", "off")


def _autotune(text: str) -> bool | str:
    """``full`` (every candidate), else on or off."""
    return "full" if text.strip().lower() == "full" else _bool(text)


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value
    return parse


_KNOBS: dict[str, _Knob] = {
    "debug": _Knob("FLASHLIGHT_DEBUG", 0, int),
    "cache_dir": _Knob(
        "FLASHLIGHT_CACHE_DIR",
        os.path.join(os.path.expanduser("~"), ".cache", "flashlight"),
        str,
    ),
    "autotune": _Knob("FLASHLIGHT_AUTOTUNE", True, _autotune),
    "interpret": _Knob("TRITON_INTERPRET", False, _bool),
    "check_bounds": _Knob("FLASHLIGHT_CHECK_BOUNDS", False, _bool),
    "check_ir": _Knob("FLASHLIGHT_CHECK_IR", False, _bool),
    "compile_threads": _Knob("FLASHLIGHT_COMPILE_THREADS", 0, int),
    "tuning_cache": _Knob("FLASHLIGHT_TUNING_CACHE", True, _bool),
    "tuned_configs": _Knob("FLASHLIGHT_TUNED_CONFIGS", "", str),
    "remainder": _Knob("FLASHLIGHT_REMAINDER", "inductor", _choice("inductor", "eager")),
    "on_error": _Knob("FLASHLIGHT_ON_ERROR", "fallback", _choice("fallback", "raise")),
    "warmup_compile": _Knob("FLASHLIGHT_WARMUP_COMPILE", "background", _choice("background", "inline")),
    "graph_cache": _Knob("FLASHLIGHT_GRAPH_CACHE", True, _bool),
    "prepare": _Knob("FLASHLIGHT_PREPARE", True, _bool),
    "preload": _Knob("FLASHLIGHT_PRELOAD", True, _bool),
    "compile_processes": _Knob("FLASHLIGHT_COMPILE_PROCESSES", -1, int),
    "capture_process": _Knob("FLASHLIGHT_CAPTURE_PROCESS", True, _bool),
    "launcher_beside": _Knob("FLASHLIGHT_LAUNCHER_BESIDE", False, _bool),
    "static_launch": _Knob("FLASHLIGHT_STATIC_LAUNCH", True, _bool),
    "record_builds": _Knob("FLASHLIGHT_RECORD_BUILDS", False, _bool),
    "graph_capture": _Knob("FLASHLIGHT_GRAPH_CAPTURE", "overlap", _choice("drain", "overlap")),
    "sum_dots": _Knob("FLASHLIGHT_SUM_DOTS", False, _bool),
    "lazy_rescale": _Knob("FLASHLIGHT_LAZY_RESCALE", False, _bool),
    "repeats_outside": _Knob("FLASHLIGHT_REPEATS_OUTSIDE", True, _bool),
    "fp32_dots": _Knob("FLASHLIGHT_FP32_DOTS", "tf32x3", _choice("tf32x3", "ieee")),
}

_overrides: dict[str, Any] = {}


def get(name: str) -> Any:
    """The current value of setting ``name`` (override, else environment, else default)."""
    if name in _overrides:
        return _overrides[name]
    knob = _KNOBS[name]
    raw = os.environ.get(knob.env)
    if raw is None:
        return knob.default
    try:
        return knob.parse(raw)
    except ValueError as error:
        raise ValueError(f"{knob.env}={raw!r}: {error}") from None


# the settings that change what the compiler generates: compiled work kept on disk
# depends on their values (flashlight.traced)
_COMPILED = ("check_bounds", "sum_dots", "lazy_rescale", "repeats_outside")


def compiled() -> dict[str, Any]:
    """The current values of the settings that change the generated code."""
    return {name: get(name) for name in _COMPILED}


def current() -> dict[str, Any]:
    """Every setting's current value, by name (what another process needs to compile as
    this one would)."""
    return {name: get(name) for name in _KNOBS}


def changed() -> dict[str, str]:
    """The environment variables of this module that are set, as set (what a benchmark
    records beside its results)."""
    return {knob.env: os.environ[knob.env] for knob in _KNOBS.values() if knob.env in os.environ}


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Temporarily set settings by name, e.g. ``override(debug=2)``."""
    unknown = set(values) - set(_KNOBS)
    if unknown:
        raise KeyError(f"unknown Flashlight settings: {sorted(unknown)}")
    saved = dict(_overrides)
    _overrides.update(values)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)


def debug_level() -> int:
    return int(get("debug"))

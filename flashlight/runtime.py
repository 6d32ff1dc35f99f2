"""Runtime: load generated kernels, resolve sizes and strides, pick tiles, launch.

Lengths are runtime arguments: a kernel is compiled once per dtype and Triton's own
specialisation (argument values equal to 1 or divisible by 16), not once per protein
length. Under the Triton interpreter one small configuration is used. On the GPU, the
first launch at some sizes takes the first of these that answers:

1. the tuning cache (:func:`flashlight.tuning_cache.recall_choice`): the choice an
   earlier process made for this exact source, GPU model, Triton version and sizes;
2. the shipped tuned choices (:mod:`flashlight.tuned_configs`), keyed by GPU model,
   Triton major.minor, the kernel's structure and a size bucket (lengths rounded up to
   powers of two), launched without autotuning;
3. autotuning: ``triton.autotune`` over a few candidates a cost model picks
   (:func:`flashlight.tuning.pruned_space`; ``FLASHLIGHT_AUTOTUNE=full``: the whole
   :func:`flashlight.tile_configs.config_space`, and no shipped choices), compiled on a thread pool first
   (:func:`flashlight.tuning_cache.precompile`); then the best candidate is timed
   against the unfused graph the kernel replaces (``Launcher.eager``, built by the
   backend), and the faster one is kept (:func:`flashlight.tuning.choose`) and recorded
   in the tuning cache (:func:`flashlight.tuning_cache.remember_choice`). The unfused
   graph's choice is the string ``"eager"`` (:data:`EAGER`), in the cache and in
   :meth:`Launcher.chosen_configs`. Inside :func:`flashlight.background.compiling_in_background`
   the candidates compile in the background and the timing waits for the context's
   settle ([Note: autotuning in the background]).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import math
import os
import sys
import threading
import time
from typing import Sequence

import torch
import torch.fx as fx

from flashlight import (background, compile_workers, compiled_launch, launch_plan, prepare, settings, tuned_configs,
                        tuning)
from flashlight.codegen import KernelSource
from flashlight.tile_configs import SMALL_FOOTPRINT_CONFIGS, candidate_space, configs, triton_configs
from flashlight.ir import Dim, TiledKernel
from flashlight.launch_sizes import index_kwargs, integer_arguments, read_sizes, size_sources, span
from flashlight.tuning_cache import gpu_capability, gpu_name, precompile, recall_choice, remember_choice

log = logging.getLogger("flashlight")
_MODULES: dict[str, object] = {}
COMPILE_EVENTS: list[str] = []  # one entry per generated kernel loaded (tests count these)
# one entry per autotuning done in this process: what bench/tune_configs.py ships
TUNING_EVENTS: list[dict] = []
EAGER = tuning.EAGER  # the choice of the unfused graph over the kernel
_COMPILING = "compiling"  # a launch whose kernel compiles in the background
_TUNED_AT_SETTLE = "tuned at settle"  # a background job that built every candidate

# [Note: autotuning in the background]
# A kernel with no known choice (no tuning cache entry, no shipped one for this GPU or its
# architecture: a new kernel, or a GPU without entries) autotunes at its first launch:
# its candidates compile (about a second on a thread pool) and are timed on the GPU. In a
# fold's first pass that stalled the pass for each such kernel (on an H100, the extra-MSA
# stack's first iteration took 3.6 s of a 4.8 s first call while its global column
# kernels, without entries, tuned in place). Inside the background context the
# candidates now compile on the context's pool instead, while the unfused graph answers,
# and the timing (each candidate, then the best against the unfused graph, recorded as
# always) is deferred to the context's settle or end (``Compiles.after``), where nothing
# else runs on the GPU, as autotuning needs; until then the unfused graph answers. A
# failed tuning is logged, and the next launch outside the context tunes in place. The
# first call's tensors are kept until then (the timing runs on them).

def load_module(src: KernelSource):
    """Import generated source (cached by content); returns the JIT function."""
    return load_source(src.name, src.source)


def load_source(name: str, source: str):
    """Import ``source`` (cached by content), a module defining the JIT function ``name``;
    returns that function."""
    key = hashlib.sha1(source.encode()).hexdigest()[:16]
    module = _MODULES.get(key)
    if module is None:
        folder = os.path.join(settings.get("cache_dir"), "kernels")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{name}_{key}.py")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(f"flashlight_kernel_{key}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _MODULES[key] = module
        COMPILE_EVENTS.append(name)
    return getattr(module, name)


def _out_of_resources(error: BaseException) -> bool:
    """Whether ``error`` is Triton's report that a compiled kernel does not fit the GPU."""
    from triton.runtime.errors import OutOfResources

    return isinstance(error, OutOfResources)


class Launcher:
    """Calls a generated kernel on real tensors; the FX graph calls this object.

    It returns the kernel's output, or for a kernel with several outputs ([Note: several
    outputs] in :mod:`flashlight.passes.outputs`) a tuple of them, each a new contiguous
    tensor over its own axes.
    """

    signature: str | None = None  # the kernel's structure, as the shipped tuned choices key it

    def __init__(self, tiled: TiledKernel, src: KernelSource, autotune: bool | str | None = None, *,
                 input_dtypes: tuple[torch.dtype, ...] = (), aten_ops: tuple[str, ...] = (), eager=None):
        self.tiled = tiled
        self.input_dtypes = input_dtypes  # of the kernel's inputs, in argument order
        self.aten_ops = aten_ops  # the ATen operations the kernel absorbed
        # (argument, axis): inputs to copy with that axis contiguous first (TilePlan.relayouts)
        self.relayouts = tuple((src.inputs.index(name), axis) for name, axis in tiled.plan.relayouts)
        self.kernel = tiled.kernel
        self.src = src
        self.sources = size_sources(tiled.kernel, src)
        self.out_axes = tiled.kernel.axes
        self.outputs = tiled.kernel.outputs()  # every output's axes and dtype, in order
        self.row: Dim | None = tiled.tiling.row
        self.grid_dims = tiled.tiling.grid
        self.column: Dim | None = tiled.tiling.column  # tiled by BLOCK_N across the grid
        self._autotune_option = autotune  # None: the setting, read now and on a reload
        self.autotune = settings.get("autotune") if autotune is None else autotune
        self.signature = tuning.kernel_signature(tiled, src.fp32_precision, src.fma_dots)
        self._fn = None  # the autotuning wrapper
        self._raw = None  # the JIT function itself
        # sizes -> the configuration autotuning chose for them (or EAGER): later calls with
        # those sizes launch it directly, without the autotuner's per-call work
        self._chosen: dict[tuple[int, ...], dict | str] = {}
        self._plans: dict[tuple, launch_plan.LaunchPlan] = {}  # call signature -> its launch ([Note: launch plans])
        self._unfused: set[tuple] = set()  # call signatures whose sizes chose the unfused graph
        # sizes whose deferred tuning ran ([Note: autotuning in the background])
        self._tuned_late: set[tuple[int, ...]] = set()
        # sizes -> seconds each candidate took to build from nothing, where recorded
        # (FLASHLIGHT_RECORD_BUILDS; [Note: a choice that builds fast])
        self._build_s: dict[tuple[int, ...], dict[tuple, float]] = {}
        # the integer arguments (sizes, strides) of the first launch, by name: what Triton's
        # JIT specializes on, so an ahead-of-time build can do the same (flashlight.aot)
        self.first_arguments: dict[str, int] | None = None
        self.eager = eager  # the PyTorch computation of the kernel's value from its inputs, or None
        self.__name__ = f"flashlight_{src.name}"

    def __reduce__(self):
        """Pickled as what it is built from (a traced graph kept on disk, [Note: traced
        capture] in :mod:`flashlight.traced`), the unfused graph as its nodes ([Note: graphs
        unpickled without tracing] in :mod:`flashlight.graph_store`); choices and plans are
        made again."""
        from flashlight.graph_store import dump_graph

        eager = self.eager
        nodes = dump_graph(eager) if isinstance(eager, fx.GraphModule) else None
        return (_rebuilt_launcher, (self.tiled, self.src, getattr(self, "_autotune_option", None),
                                    self.input_dtypes, self.aten_ops, eager if nodes is None else nodes))

    def chosen_configs(self) -> dict[tuple[int, ...], tuple[int, int, int, int] | str]:
        """Size arguments -> (BLOCK_M, BLOCK_N, num_warps, num_stages) autotuning chose for
        them, or ``"eager"`` (:data:`EAGER`) where the unfused graph runs instead."""
        return {sizes: EAGER if kw == EAGER else tuned_configs.config_key(kw) for sizes, kw in self._chosen.items()}

    def candidate_configs(self) -> list[tuple[int, int, int, int]]:
        """The (BLOCK_M, BLOCK_N, num_warps, num_stages) autotuning times on a GPU."""
        return candidate_space(self.src, self.tiled, self.autotune)

    def pin_choice(self, sizes: tuple[int, ...], choice: dict | str) -> None:
        """Launch ``choice`` (launch settings, or ``"eager"``: the unfused graph) from now on
        at size arguments ``sizes``, without autotuning."""
        if choice == EAGER and getattr(self, "eager", None) is None:
            raise ValueError(f"{self.__name__} has no unfused graph to run")
        self._chosen[tuple(sizes)] = choice if choice == EAGER else dict(choice)
        getattr(self, "_plans", {}).clear()
        getattr(self, "_unfused", set()).clear()

    def _jit(self, interpret: bool):
        if self._fn is None:
            import triton

            self._raw = load_module(self.src)
            self._fn = triton.autotune(configs=configs(self.src, interpret, self.autotune, self.tiled),
                                       key=self._tuning_keys())(self._raw)
        return self._fn

    def _small_footprint_tuner(self):
        """The autotuner over :data:`flashlight.tile_configs.SMALL_FOOTPRINT_CONFIGS`, which replaces the usual one
        for this kernel once none of its candidates fits the GPU."""
        import triton

        self._fn = triton.autotune(configs=triton_configs(SMALL_FOOTPRINT_CONFIGS),
                                   key=self._tuning_keys())(self._raw)
        return self._fn

    def _tuning_keys(self) -> list[str]:
        """The arguments autotuning keys its choice on: the size arguments."""
        return [f"size{k}" for k in range(len(self.src.size_args))]  # none: one choice for all calls

    def _first_launch(self, fn, args: tuple, grid, sizes: tuple[int, ...], device: torch.device,
                      tune: bool, eager_inputs: Sequence[torch.Tensor] | None = None,
                      wide: dict | None = None) -> torch.Tensor | None:
        """Launch at sizes not seen in this process: with the choice an earlier process
        recorded, else the shipped one, else through the autotuner (candidates compiled
        in parallel first), whose best candidate is then timed against the unfused graph
        (given ``eager_inputs``), and the choice recorded. When no candidate fits the
        GPU, autotuning runs again over smaller tiles (:data:`flashlight.tile_configs.SMALL_FOOTPRINT_CONFIGS`).
        Returns the unfused graph's result where that ran, else None (the kernel wrote
        the output). ``wide``: the launch's 64-bit offsets setting ([Note: 64-bit offsets])."""
        prepare.wait()  # [Note: a process's one-time costs]
        wide = wide or {}
        eager_ok = eager_inputs is not None and getattr(self, "eager", None) is not None
        chosen, where = self._known_choice(device, sizes, eager_ok) if tune else (None, None)
        if chosen is not None:
            try:
                result = self._run_eager(eager_inputs) if chosen == EAGER else compiled_launch.launch(
                    self._raw, grid, args, {**chosen, **wide}, {}, 0)
            except Exception as error:  # noqa: BLE001 - a choice that cannot run here is tuned again
                eager_oom = chosen == EAGER and isinstance(error, torch.cuda.OutOfMemoryError)
                if not (eager_oom or (where == "shipped" and _out_of_resources(error))):
                    raise
                log.info("flashlight: %s: the %s choice cannot run here (%s); autotuning", self.src.name, where, error)
                eager_ok = eager_ok and not eager_oom
            else:
                self._chosen[sizes] = chosen
                return result if chosen == EAGER else None
        if tune:
            self._time_builds(fn.configs, args, grid, wide, sizes)
            precompile(self._raw, fn.configs, args, grid, wide)
        try:
            fn[grid](*args, **wide)
        except Exception as error:  # noqa: BLE001 - only running out of resources is retried
            if not (tune and _out_of_resources(error)):
                raise
            log.info("flashlight: %s: no tile candidate fits the GPU (%s); trying smaller tiles", self.src.name, error)
            fn = self._small_footprint_tuner()
            precompile(self._raw, fn.configs, args, grid, wide)
            fn[grid](*args, **wide)
        best = fn.best_config.all_kwargs()
        kernel_ms = eager_ms = None
        if tune and eager_ok:
            kernel_ms, eager_ms = self._time_against_eager({**best, **wide}, args, grid, eager_inputs)
        self._chosen[sizes] = EAGER if tuning.choose(kernel_ms, eager_ms) == EAGER else best
        if tune and (len(fn.configs) > 1 or eager_ms is not None):
            remember_choice(self.src, device, sizes, self._chosen[sizes])
        if tune:
            timings = getattr(fn, "configs_timings", None) or {}
            self._record_tuning(device, sizes, len(fn.configs), kernel_ms, eager_ms, timings)
        return None

    def _time_builds(self, configs, args: tuple, grid, wide: dict, sizes: tuple[int, ...]) -> None:
        """With ``record_builds`` on, each candidate's build seconds for ``sizes``, timed
        once, before any of them is compiled in this process."""
        if settings.get("record_builds") and sizes not in self._build_s:
            self._build_s[sizes] = compile_workers.build_seconds(self._raw, args, grid, configs, wide)

    def _compiled_in_background(self, args: tuple, grid, sizes: tuple[int, ...], device: torch.device,
                                tensors: Sequence[torch.Tensor]):
        """Inside :func:`flashlight.background.compiling_in_background`: the known choice
        for ``sizes`` once its background compile is done, :data:`_COMPILING` until then
        (the compile is started on the first call), or None where this launch compiles
        in place ([Note: compiling in the background]). Where no choice is known, the
        candidates compile in the background and are timed when the context settles
        ([Note: autotuning in the background])."""
        compiles = background.active()
        key = (self.__name__, id(self), sizes)
        job = compiles.job(key)
        if job is None:
            eager_ok = getattr(self, "eager", None) is not None and self._eager_fits(sizes, tensors, device)
            chosen, _ = self._known_choice(device, sizes, eager_ok)
            if chosen == EAGER or not eager_ok:
                return None
            if chosen is None:
                return self._tune_in_background(compiles, key, args, grid, sizes, device, tensors)
            chosen = dict(chosen)
            job = compiles.submit(key, lambda: self._compile(args, grid, chosen, device))
        if not job.done():
            return _COMPILING
        result = job.result() if job.exception() is None else None
        if result is not _TUNED_AT_SETTLE:
            return result
        # the candidates are built: the deferred tuning's choice; in place where it failed
        if sizes in self._chosen:
            return self._chosen[sizes]
        return None if sizes in self._tuned_late else _COMPILING

    def _tune_in_background(self, compiles, key, args: tuple, grid, sizes: tuple[int, ...],
                            device: torch.device, tensors: Sequence[torch.Tensor]) -> str:
        """Compile every autotuning candidate for ``sizes`` on the context's pool, and time
        them (and the unfused graph) when the context settles ([Note: autotuning in the
        background]); :data:`_COMPILING`: the unfused graph answers until then."""
        fn = self._jit(interpret=False)

        def build():
            prepare.wait()  # [Note: a process's one-time costs]: Triton's driver, loaded once
            with launch_plan.on_device(device):
                self._time_builds(fn.configs, args, grid, {}, sizes)
                precompile(self._raw, fn.configs, args, grid)  # for this launch's GPU
            return _TUNED_AT_SETTLE

        def tune():
            self._tuned_late.add(sizes)
            if sizes in self._chosen:
                return
            try:
                self._first_launch(fn, args, grid, sizes, device, True, eager_inputs=tensors)
            except Exception as error:  # noqa: BLE001 - the next launch tunes in place and meets it there
                log.warning("flashlight: %s: autotuning after the background compile failed (%s: %s)",
                            self.__name__, type(error).__name__, error)

        compiles.submit(key, build)
        compiles.after(key, tune)
        return _COMPILING

    def _compile(self, args: tuple, grid, chosen: dict, device: torch.device) -> dict:
        """Compile (do not launch) configuration ``chosen`` for ``args``, and have Triton
        build its launcher and load the binary (what reading a compiled kernel's ``run``
        does; with empty caches the launcher is C code compiled for the kernel's
        signature), so that the first launch finds everything done; returns ``chosen``."""
        phase = compile_workers.phase  # each step's seconds, in a background job's timeline
        with phase("prepare_wait_s"):  # [Note: a process's one-time costs]
            # the worker needs the launch's specialization only, not Triton's digest
            prepare.wait(prepare.DRIVER)
        with launch_plan.on_device(device):
            # into Triton's disk cache from another process, where workers run ([Note:
            # compiling in other processes]); the compile below then only loads it
            elsewhere = compile_workers.compile_elsewhere(self._raw, args, grid, chosen)
            with phase("prepare_wait_s"):
                prepare.wait()
            start = time.perf_counter()
            with phase("load_s" if elsewhere else "compile_s"):
                kernel = self._raw.warmup(*args, grid=grid, **chosen)
            if elsewhere:
                compile_workers.note_load(time.perf_counter() - start)
            with phase("launcher_s"):  # [Note: the static launcher]
                compiled_launch.prepared(kernel, device, len(args))
        return chosen

    def _check_known(self, device: torch.device, sizes: tuple[int, ...], tune: bool) -> None:
        """Raise :class:`NoKnownChoice` where a first launch at ``sizes`` would autotune,
        compile in the background or compile untuned (inside :func:`known_choices_only`)."""
        if not tune or background.active() is not None or self._known_choice(device, sizes, True)[0] is None:
            raise NoKnownChoice(f"{self.__name__}: no launch choice recorded for sizes {sizes}")

    def _eager_fits(self, sizes: tuple[int, ...], tensors: Sequence[torch.Tensor], device: torch.device) -> bool:
        """Whether the unfused graph's scores (rows x keys of every program, about three
        copies of the widest input dtype) fit in :data:`background.MEMORY_SHARE` of the
        free memory of ``device``."""
        if device.type != "cuda":
            return True
        rows, keys, programs = tuning.extents(self.tiled, dict(zip(self.src.size_args, sizes)))
        width = max(t.element_size() for t in tensors)
        free, _ = torch.cuda.mem_get_info(device)
        return 3 * rows * keys * programs * width <= background.MEMORY_SHARE * free

    def _known_choice(self, device: torch.device, sizes: tuple[int, ...], eager_ok: bool):
        """(choice, where it came from) for a first launch without autotuning: the tuning
        cache's, else the shipped one (not with ``FLASHLIGHT_AUTOTUNE=full``); (None, None)
        when neither has one this launcher can run."""
        chosen, where = recall_choice(self.src, device, sizes), "tuning cache"
        if chosen is None and self.signature is not None and getattr(self, "autotune", True) != "full":
            chosen, where = tuned_configs.lookup(gpu_name(device), tuned_configs.triton_version(),
                                                 self.signature, self._bucket(sizes),
                                                 capability=gpu_capability(device)), "shipped"
        if chosen is None or (chosen == EAGER and not eager_ok):
            return None, None
        return chosen, where

    def _bucket(self, sizes: tuple[int, ...]) -> str:
        """The size bucket of a launch at size arguments ``sizes``."""
        return tuning.size_bucket(*tuning.extents(self.tiled, dict(zip(self.src.size_args, sizes))))

    def _run_eager(self, tensors: Sequence[torch.Tensor]):
        """The unfused graph's value for the kernel's inputs, in the kernel's (contiguous) layout."""
        values = self.eager(*tensors)
        if isinstance(values, (tuple, list)):
            return tuple(v.contiguous() for v in values)
        return values.contiguous()

    def _eager_launch(self, fn, args: tuple, grid, sizes: tuple[int, ...], device: torch.device,
                      tensors: Sequence[torch.Tensor], tune: bool, wide: dict | None = None) -> torch.Tensor | None:
        """Run the unfused graph chosen for these sizes; where it runs out of GPU memory,
        the kernel is tuned and launched instead (and chosen from then on)."""
        try:
            return self._run_eager(tensors)
        except torch.cuda.OutOfMemoryError:
            log.warning("flashlight: %s: the unfused graph ran out of GPU memory; using the kernel", self.__name__)
            del self._chosen[sizes]
            return self._first_launch(fn, args, grid, sizes, device, tune, wide=wide)

    def _time_against_eager(self, best: dict, args: tuple, grid, tensors: Sequence[torch.Tensor]):
        """Median milliseconds of the best kernel candidate and of the unfused graph (None
        where the graph fails, e.g. runs out of memory materialising its scores)."""
        known: dict = {}  # the compiled launch, found at the first timed call
        kernel_ms = _median_ms(lambda: compiled_launch.launch(self._raw, grid, args, best, known, 0))
        try:
            eager_ms = _median_ms(lambda: self.eager(*tensors))
        except Exception as error:  # noqa: BLE001 - the kernel stays the choice
            log.info("flashlight: %s: the unfused graph was not timed (%s)", self.__name__, error)
            eager_ms = None
        return kernel_ms, eager_ms

    def _record_tuning(self, device: torch.device, sizes: tuple[int, ...], candidates: int,
                       kernel_ms: float | None, eager_ms: float | None, timings: dict | None = None) -> None:
        """Note an autotuning outcome in :data:`TUNING_EVENTS` (what the shipped data holds),
        with each candidate's time (the autotuner's ``timings``: config -> median ms, or
        its quantiles) and build seconds where recorded."""
        if self.signature is None:
            return
        chosen = self._chosen[sizes]
        builds = self._build_s.get(sizes, {})
        measured = []
        for config, ms in (timings or {}).items():
            options = config.all_kwargs()
            if not all(k in options for k in tuned_configs.CONFIG_KEYS):
                continue  # not a tile configuration the shipped data can hold
            key = tuned_configs.config_key(options)
            median = ms[0] if isinstance(ms, (list, tuple)) else ms
            measured.append({"config": dict(zip(tuned_configs.CONFIG_KEYS, key)), "ms": float(median),
                             "build_s": builds.get(key)})
        TUNING_EVENTS.append({
            "kernel": self.src.name, "gpu": gpu_name(device), "capability": gpu_capability(device),
            "triton": tuned_configs.triton_version(),
            "signature": self.signature, "bucket": self._bucket(sizes), "sizes": list(sizes),
            "choice": EAGER if chosen == EAGER else {k: int(chosen[k]) for k in tuned_configs.CONFIG_KEYS},
            "candidates": candidates, "kernel_ms": kernel_ms, "eager_ms": eager_ms,
            "measured_candidates": measured,
        })

    def _size(self, d: Dim, values: dict[str, int]) -> int:
        return int(d.size) if d.is_static else values[d.size]

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        import triton

        tensors = list(tensors)
        call = launch_plan.signature(tensors)
        plan = self._plans.get(call)
        if plan is not None:  # [Note: launch plans]
            return self._result(self._summed(plan.launch(self._raw, tensors)))
        if call in self._unfused:  # [Note: launch plans]: the unfused graph, on the inputs as given
            try:
                return self._run_eager(tensors)
            except torch.cuda.OutOfMemoryError:
                self._unfused.discard(call)  # the general path launches the kernel instead
        if any(t.numel() == 0 for t in tensors):
            return self._call_empty(tensors)
        relayouts = []
        for k, axis in self.relayouts:
            t = tensors[k]
            if t.stride(axis) != 1 and t.shape[axis] > 1:
                # [..., X, ...] with X strided -> same values, X contiguous
                tensors[k] = t.movedim(axis, -1).contiguous().movedim(-1, axis)
                relayouts.append((k, axis))
        values = read_sizes(self.sources, tensors)
        outs = [torch.empty(self._shape(output.axes, values), dtype=output.dtype, device=tensors[0].device)
                for output in getattr(self, "outputs", self.kernel.outputs())]
        out = outs[0]
        if all(o.numel() == 0 for o in outs):
            return self._result(outs)
        grid_size = 1
        for d in self.grid_dims:
            grid_size *= self._size(d, values)
        rows = self._size(self.row, values) if self.row is not None else 1
        size_args = [values[s] for s in self.src.size_args]
        strides = [st for t in tensors for st in t.stride()]
        interpret = tensors[0].device.type == "cpu"
        fn = self._jit(interpret)
        column = getattr(self, "column", None)
        columns = self._size(column, values) if column is not None else 1
        out_strides = [st for o in outs for st in o.stride()]
        splits, split_args = 1, ()
        if self.tiled.tiling.split:  # [Note: split serial loops]
            tiles = triton.cdiv(rows, tuning.NOMINAL_TILE) * grid_size * triton.cdiv(columns, tuning.NOMINAL_TILE)
            splits, length = tuning.split_count(self._size(self.kernel.loop[0].dim, values), tiles,
                                                _multiprocessors(out.device))
            outs = [torch.empty((splits, *out.shape), dtype=torch.float32, device=out.device)]  # partial sums
            out_strides, split_args = list(outs[0].stride()[1:]), (splits, length, outs[0].stride(0))
        grid = lambda meta: (triton.cdiv(rows, meta["BLOCK_M"]) * grid_size * splits  # noqa: E731
                             * (triton.cdiv(columns, meta["BLOCK_N"]) if column is not None else 1),)
        checks: list = []
        if self.src.check_bounds:
            errors = torch.zeros(len(tensors) + len(outs), dtype=torch.int32, device=out.device)
            checks = [span(t) for t in (*tensors, *outs)] + [errors]
        args = (*tensors, *outs, *size_args, *strides, *out_strides, *split_args, *checks)
        if self.first_arguments is None:
            self.first_arguments = integer_arguments(size_args, tensors, outs, split_args)
        sizes = tuple(size_args)
        chosen = self._chosen.get(sizes)
        tune = not interpret and bool(self.autotune)
        wide = index_kwargs((*tensors, *outs))  # [Note: 64-bit offsets]
        if chosen is None and getattr(_KNOWN_ONLY, "depth", 0) and not interpret:
            self._check_known(out.device, sizes, tune)  # [Note: preloading kept graphs]
        if chosen is None and tune and background.active() is not None and not wide:
            chosen = self._compiled_in_background(args, grid, sizes, out.device, tensors)
            if chosen == _COMPILING:
                return self._run_eager(tensors)  # [Note: compiling in the background]
            if chosen is not None:
                self._chosen[sizes] = chosen
        if chosen is None:
            result = self._first_launch(fn, args, grid, sizes, out.device, tune, eager_inputs=tensors, wide=wide)
        elif chosen == EAGER:
            result = self._eager_launch(fn, args, grid, sizes, out.device, tensors, tune, wide)
            if self._chosen.get(sizes) == EAGER and not checks:
                self._unfused.add(call)
        else:
            plan = launch_plan.LaunchPlan(
                tuple(relayouts), tuple(tuple(o.shape) for o in outs), tuple(o.dtype for o in outs),
                args[len(tensors) + len(outs):], tuple(grid(chosen)), {**chosen, **wide})
            compiled_launch.launch(self._raw, plan.grid, args, plan.chosen, plan.compiled, len(tensors))
            result = None
            if not checks:
                self._plans[call] = plan
        if result is not None:
            return result  # the unfused graph ran instead of the kernel
        if checks and bool(errors.any()):
            names = [*self.src.inputs, "the output", *(f"output {k}" for k in range(1, len(outs)))]
            bad = [f"{names[k]} ({int(n)} lanes)" for k, n in enumerate(errors.tolist()) if n]
            raise RuntimeError(f"{self.__name__}: memory access out of bounds in {', '.join(bad)}")
        return self._result(self._summed(outs))

    def _summed(self, outs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The outputs; for a split serial loop, its partial sums added in order, in the
        output's dtype ([Note: split serial loops])."""
        if not self.tiled.tiling.split:
            return outs
        return [outs[0].sum(0).to(self.kernel.dtype)]

    def _shape(self, axes, values: dict[str, int]) -> list[int]:
        return [math.prod(self._size(d, values) for d in axis) for axis in axes]

    def _result(self, outs: list[torch.Tensor]):
        """The output, or the tuple of outputs of a kernel with several."""
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _call_empty(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """A launch where an input has a zero-size dim (a length Dynamo left symbolic is
        0): what eager PyTorch gives (a sum over no keys is 0, a softmax over them empty)."""
        if self.eager is not None:
            return self.eager(*tensors)
        values = read_sizes(self.sources, tensors)
        outputs = getattr(self, "outputs", self.kernel.outputs())
        shapes = [self._shape(output.axes, values) for output in outputs]
        if all(math.prod(shape) == 0 for shape in shapes):
            return self._result([torch.empty(shape, dtype=output.dtype, device=tensors[0].device)
                                 for shape, output in zip(shapes, outputs)])
        raise RuntimeError(f"{self.__name__}: an input has a zero-size dim and no PyTorch form of "
                           f"this kernel is attached to compute its {shapes[0]} result")


class NoKnownChoice(RuntimeError):
    """A launch inside :func:`known_choices_only` that would have to tune or compile."""


_KNOWN_ONLY = threading.local()


@contextlib.contextmanager
def known_choices_only():
    """On this thread, first launches use launch choices recorded earlier (the tuning
    cache, the shipped ones) and raise :class:`NoKnownChoice` where they would autotune
    or compile in the background instead ([Note: preloading kept graphs] in
    flashlight/traced.py)."""
    _KNOWN_ONLY.depth = getattr(_KNOWN_ONLY, "depth", 0) + 1
    try:
        yield
    finally:
        _KNOWN_ONLY.depth -= 1


def _multiprocessors(device: torch.device) -> int:
    """The device's multiprocessors (an H200's 132 for the interpreter, so a CPU run
    splits loops as the GPU would)."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def _rebuilt_launcher(tiled, src, autotune, input_dtypes, aten_ops, eager) -> Launcher:
    if isinstance(eager, list):  # its nodes (Launcher.__reduce__)
        from flashlight.graph_store import load_graph

        eager = load_graph(eager)
    return Launcher(tiled, src, autotune, input_dtypes=input_dtypes, aten_ops=aten_ops, eager=eager)


def _median_ms(fn) -> float:
    """Median milliseconds of ``fn`` on the GPU (a short ``triton.testing.do_bench``)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))

"""Traced capture: compiling a pure tensor function without Dynamo, kept on disk.

[Note: traced capture]
``torch.compile`` captures a function through Dynamo (bytecode tracing, guards) and
AOTAutograd, about 0.1-0.2 s per function in every new process even when each kernel
is already in Triton's and Flashlight's caches; a patched OpenFold model compiles about
nine attention cores, so that capture was most of its first call with the caches filled,
and Dynamo's guards and AOTAutograd's wrappers cost host time on every call.

``flashlight.compile(fn, capture="trace")`` is for *pure* functions of tensors: no
Python control flow on tensor values, no side effects, positional tensor arguments,
the same graph for every call whose inputs pass its guards. A
:class:`TracedFunction` captures such a function with ``make_fx`` (ATen operations, the
decompositions AOTAutograd would apply), compiles the graph as the backend does
(:func:`flashlight.backend.compile_with_remainder`), and guards the result itself:

* the first capture for a family of inputs (dtypes, ranks, device) is *static*: its
  graph holds this call's sizes and it serves calls with the same shapes and strides
  (as Dynamo's first compile of a function does);
* a second shape in that family is captured *symbolically* (sizes and strides as
  symbols; Dynamo's "automatic dynamic"), guarded by the expression PyTorch's shape
  environment produces for it (size relations, 0/1 specialisations, sizes a tile fixed);
  a call whose sizes match an entry's but whose strides do not (a transposed pair
  representation) is captured static again;
* each call signature (shapes, strides, storage offsets, dtypes, device) found once is
  then a dictionary look-up.

``dynamic`` means what it means to ``torch.compile``: the above is ``None``; ``True``
makes every size symbolic from the first capture, ``False`` captures each shape static.

A graph Flashlight fused whole (the remainder only re-indexes memory) is written to
the cache folder (``graphs/``), keyed by the function's name, a digest of the source
file that defines it, the options and the versions of Flashlight, PyTorch and Triton;
a later process loads it instead of tracing (a few milliseconds), and its kernels load
from Triton's cache. A function that calls code in other files must pass ``version``
(any string that changes when that code does). Where an input requires a gradient, the
call goes through ``torch.compile`` (AOTAutograd derives the backward), as without
``capture="trace"``.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import logging
import os
import pickle
import threading
from typing import Any, Callable

import torch
import torch.fx as fx

from flashlight import background, launch_plan, settings
from flashlight.graph_store import dump_graph, load_graph
from flashlight.codegen import fp32_precision

log = logging.getLogger("flashlight")
_FORMAT = 5  # of the on-disk entries; a change makes older files unread

# [Note: preloading kept graphs]
# In a process whose caches hold a function's graphs, its first call still pays their
# loading: the pickled graph rebuilt, each kernel's module imported and its binary and
# launcher loaded by Triton, its launch plan made, where the caller first calls it (a
# fold's first recycling iteration, which then takes longer than stock's on a small
# record). ``preload`` does that work earlier, on a thread, while the caller still builds
# its model (``flashlight.prepare.preload``): it runs each kept static graph once on zeros
# of exactly the call signature it serves (shapes, strides, storage offsets, dtypes,
# device: the same kernel specialisations as the real call), so the first real call is
# a dictionary look-up and a launch. What would cost more than loading is never done
# there: a kernel without a recorded launch choice (autotuning), inputs of more than
# ``max_bytes`` (large folds are bound by the device, not by these milliseconds), a
# graph for another device. The function's lock is held throughout, so a first call
# that comes meanwhile waits for the preload rather than racing it.
PRELOAD_MAX_BYTES = 256 << 20


@dataclasses.dataclass
class Entry:
    """One compiled graph: ``run`` on the tensors; ``family`` (device, dtypes, ranks) and
    either the ``signature`` it serves (static) or its ``guard`` expression (symbolic)."""

    run: Callable
    family: tuple
    signature: tuple | None = None
    guard_text: str | None = None
    graph: list | None = None  # the serialised graph, when it can be kept on disk
    single: bool = False  # fn returns one tensor (the graph returns a tuple of one)

    @functools.cached_property
    def call(self) -> Callable:
        """``run`` on positional tensors, without ``nn.Module``'s hook machinery where it is
        a graph; Inductor's compiled graphs take their arguments as one list."""
        run = self.run
        if isinstance(run, fx.GraphModule):
            run = run.forward
        elif getattr(run, "_boxed_call", False):
            boxed = run
            run = lambda *args: boxed(list(args))  # noqa: E731
        if not self.single:
            return run
        return lambda *args: run(*args)[0]

    @functools.cached_property
    def guard(self):
        return compile(self.guard_text, "<flashlight guard>", "eval") if self.guard_text else None

    def accepts(self, tensors: list[torch.Tensor], signature: tuple) -> bool:
        if self.family != family_of(tensors):
            return False
        if self.signature is not None:
            return self.signature == signature
        from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

        names = {f"t{k}": t for k, t in enumerate(tensors)}
        return self.guard is None or bool(eval(self.guard, SYMPY_INTERP, {"L": names}))


def call_signature(tensors: list[torch.Tensor]) -> tuple:
    """What a static entry serves exactly: each input's shape, strides, dtype and storage
    offset, and the device (a symbolic entry's guard reads the same)."""
    return launch_plan.signature(tensors), tuple(t.storage_offset() for t in tensors)


def family_of(tensors: list[torch.Tensor]) -> tuple:
    """What every entry checks exactly: the device, each input's dtype and rank, and how
    float32 products are computed (``torch.backends.cuda.matmul.allow_tf32`` and, with it
    off, ``FLASHLIGHT_FP32_DOTS``, which the generated kernels print into their ``tl.dot``
    s: a graph compiled with TF32 must not serve a call made without it, nor the other
    way round)."""
    return (str(tensors[0].device.type), *((t.dtype, t.dim()) for t in tensors), fp32_precision())


class TracedFunction:
    """``fn`` compiled by traced capture ([Note: traced capture])."""

    def __init__(self, fn: Callable, options: dict[str, Any], *, name: str | None = None,
                 version: str = "", dynamic: bool | None = None):
        self.fn = fn
        # as torch.compile's: None, static first then the sizes that changed symbolic;
        # True, every size symbolic from the first capture; False, a capture per shape
        self.dynamic = dynamic
        self.options = dict(options)
        self.__name__ = name or getattr(fn, "__name__", "traced")
        self.__doc__ = fn.__doc__
        self.version = version
        self._by_signature: dict[tuple, Entry] = {}
        self._entries: list[Entry] = []
        self._loaded = False
        self._lock = threading.Lock()
        self._dynamo = None
        self._untraceable = False  # make_fx failed: every call goes through Dynamo
        self.captures = 0  # graphs traced by this process (tests and reports read it)

    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return self.fn(*args, **kwargs)  # inside a larger compiled region: its capture traces fn
        if self._untraceable or kwargs or not args or not all(isinstance(a, torch.Tensor) for a in args) \
                or _needs_grad(args):
            return self._through_dynamo()(*args, **kwargs)
        compiles = background.active()
        if compiles is not None:
            compiles.run_ready()  # graphs captured elsewhere, back since the last call
        tensors = list(args)
        signature = call_signature(tensors)
        entry = self._by_signature.get((signature, fp32_precision()))
        if entry is None:
            entry = self._entry_for(tensors, signature)
            if entry is None:  # being captured in another process: this call runs eagerly
                return self.fn(*tensors)
        return entry.call(*tensors)

    def _through_dynamo(self):
        if self._dynamo is None:
            from flashlight.api import compile as compile_

            self._dynamo = compile_(self.fn, dynamic=None, **self.options)
        return self._dynamo

    def _load_kept(self) -> None:
        """The entries an earlier process kept on disk, once (the caller holds the lock)."""
        if not self._loaded:
            self._entries.extend(load_entries(self._disk_key()))
            self._loaded = True
            if self._entries and settings.debug_level() >= 1:
                log.warning("[flashlight] %s: %d traced graph(s) loaded from the cache folder",
                            self.__name__, len(self._entries))

    def preload(self, devices: tuple[str, ...] = ("cuda",), max_bytes: int = PRELOAD_MAX_BYTES) -> int:
        """Load the graphs an earlier process kept, and run each static one on ``devices``
        once on zeros of its call signature, so that a first call of that signature finds
        its graph, kernels and launch plans ready ([Note: preloading kept graphs]);
        returns how many were run. Never autotunes or compiles in the background: a
        graph with a kernel whose launch settings no earlier process chose is left for its
        first call."""
        from flashlight import runtime

        with self._lock:
            self._load_kept()
            warmed = 0
            for entry in self._entries:
                signature = entry.signature
                key = (signature, entry.family[-1])
                if signature is None or entry.family[0] not in devices or key in self._by_signature:
                    continue
                tensors = _zeros_of(signature, max_bytes)
                if tensors is None:
                    continue
                try:
                    with torch.no_grad(), runtime.known_choices_only(), launch_plan.on_device(tensors[0].device):
                        for _ in range(2):  # the second launch of a kernel makes its launch plan
                            entry.call(*tensors)
                except Exception as error:  # noqa: BLE001 - only an optimisation: the first call does it
                    log.debug("flashlight: %s not preloaded (%s: %s)", self.__name__, type(error).__name__, error)
                    continue
                self._by_signature[key] = entry
                warmed += 1
            return warmed

    def _entry_for(self, tensors: list[torch.Tensor], signature: tuple) -> Entry | None:
        """The entry serving this call, captured where none does; None while another
        process captures it ([Note: capturing in another process])."""
        with self._lock:
            self._load_kept()
            entry = next((e for e in self._entries if e.accepts(tensors, signature)), None)
            if entry is None:
                # as torch.compile's automatic dynamic: symbolic once a size changed, a
                # call that only lays its inputs out otherwise (strides) is another static one
                symbolic = self.dynamic if self.dynamic is not None else any(self._changed_dims(tensors))
                entry = None if symbolic else self._captured_elsewhere(tensors, signature)
                if entry is _PENDING:
                    return None
                if entry is None:
                    entry = self._capture(tensors, signature, symbolic)
                self._entries.append(entry)
                if entry.graph is not None:
                    save_entries(self._disk_key(), self._entries)
            self._by_signature[(signature, fp32_precision())] = entry
            return entry

    def _capture(self, tensors: list[torch.Tensor], signature: tuple, symbolic: bool) -> Entry:
        try:
            entry = self.traced_entry(tensors, signature, self._changed_dims(tensors) if symbolic else None)
        except _Untraceable as error:  # not a pure function of tensors
            if settings.get("on_error") == "raise":
                raise error.__cause__ from None
            log.warning("[flashlight] %s cannot be traced (%s); it is compiled through Dynamo",
                        self.__name__, " ".join(str(error.__cause__).split())[:200])
            self._untraceable = True
            return Entry(self._through_dynamo(), family_of(tensors), signature)
        self.captures += 1
        return entry

    def traced_entry(self, tensors: list[torch.Tensor], signature: tuple, dynamic: list[set[int]] | None) -> Entry:
        """``fn`` traced on ``tensors`` (real, or fake tensors of the call's layout: the trace
        reads nothing else of them) and compiled; static unless ``dynamic`` names the sizes
        left symbolic. Raises :class:`_Untraceable` where ``make_fx`` fails."""
        from flashlight.backend import compile_with_remainder

        symbolic = dynamic is not None
        try:
            gm, fakes, single = self._trace(tensors, dynamic)
        except Exception as error:  # noqa: BLE001 - the caller decides
            raise _Untraceable(str(error)) from error
        compiled = compile_with_remainder(gm, fakes, None, self.options, "inference")
        guard_text = None
        if symbolic:  # after the compile: fixing a size a tile needs adds a guard
            shape_env = fakes[0].fake_mode.shape_env
            guard_text = shape_env.produce_guards_expression(fakes, ignore_static=False) or "True"
        if settings.debug_level() >= 1:
            log.warning("[flashlight] traced %s (%s)", self.__name__, "symbolic" if symbolic else "static")
        return Entry(compiled, family_of(tensors), None if symbolic else signature, guard_text,
                     dump_graph(compiled) if isinstance(compiled, fx.GraphModule) else None, single)

    def _captured_elsewhere(self, tensors: list[torch.Tensor], signature: tuple):
        """Inside a background-compile context with a capture process started ([Note:
        capturing in another process] in flashlight.capture_worker): the entry that process
        captured for this static signature, or :data:`_PENDING` while it works (the job is
        submitted on the first such call); None where the capture is made here."""
        from flashlight import capture_worker

        compiles = background.active()
        if compiles is None or not capture_worker.ready():
            return None
        key = (f"{capture_worker.KEY_PREFIX}{self.__name__}", self._key_digest, signature, fp32_precision())
        job = compiles.job(key)
        if job is None:
            request = capture_worker.request(self.fn, self.__name__, self.options, self.version, self.dynamic,
                                             signature, fp32_precision())
            if request is None:
                return None
            compiles.add(key, capture_worker.submit(request))
            compiles.install(key, lambda: self._run_captured(signature))
            return _PENDING
        if not job.done():
            return _PENDING
        result = job.result() if job.exception() is None else {"ok": False, "error": repr(job.exception())}
        if not result.get("ok"):
            log.debug("flashlight: %s captured here (%s)", self.__name__, result.get("error"))
            return None
        family, _, guard_text, graph, single = capture_worker.entry_of(result)
        if family != family_of(tensors):
            return None
        self.captures += 1
        return Entry(load_graph(graph), family, signature, guard_text, graph, single)

    def _run_captured(self, signature: tuple) -> None:
        """Where no call has installed the graph captured elsewhere for ``signature``, run
        it once on zeros of that layout, so that its kernels' compiles start now."""
        if any(key[0] == signature for key in self._by_signature):
            return
        tensors = _zeros_of(signature, float("inf"))
        with torch.no_grad(), launch_plan.on_device(tensors[0].device):
            self(*tensors)

    def _changed_dims(self, tensors: list[torch.Tensor]) -> list[set[int]]:
        """Per input, the dims whose size differs from a static entry of the same family:
        the sizes a symbolic capture leaves symbolic (Dynamo's automatic dynamic); every
        dim with ``dynamic=True``."""
        if self.dynamic:
            return [set(range(t.dim())) for t in tensors]
        family = family_of(tensors)
        changed: list[set[int]] = [set() for _ in tensors]
        for entry in self._entries:
            if entry.family == family and entry.signature is not None:
                for dims, t, (shape, _, _) in zip(changed, tensors, entry.signature[0][1:]):
                    dims.update(d for d, (a, b) in enumerate(zip(t.shape, shape)) if a != b)
        return changed

    def _trace(self, tensors: list[torch.Tensor], dynamic: list[set[int]] | None):
        """The ATen graph of ``fn`` (with AOTAutograd's inference decompositions) returning
        a tuple, as AOTAutograd's do; the fake values of its inputs (sizes in ``dynamic``
        symbolic, the others as in ``tensors``: all of them when ``dynamic`` is None); and
        whether ``fn`` returned one tensor rather than a tuple or list of them."""
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

        from flashlight import prepare
        from flashlight.decompositions import decompositions

        prepare.wait(prepare.CAPTURE)  # [Note: a process's one-time costs]
        if dynamic is None:
            # every size static: no shape environment, whose symbolic reasoning about each
            # view's sizes and strides costs 4-20 ms per input (sympy's facts about new
            # integers) against about 1 ms without it (2-core CI machine)
            mode = FakeTensorMode()
            fakes = [mode.from_tensor(t) for t in tensors]
        else:
            # no "duck" sizing: sizes equal in this call need not be equal in the next
            mode = FakeTensorMode(shape_env=ShapeEnv(duck_shape=False))
            fakes = []
            for k, t in enumerate(tensors):
                sizes = [DimDynamic.DYNAMIC if d in dynamic[k] else DimDynamic.STATIC for d in range(t.dim())]
                fakes.append(mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes)))
        single = []

        def as_tuple(*args):
            out = self.fn(*args)
            single.append(isinstance(out, torch.Tensor))
            out = (out,) if single[0] else tuple(out)
            if not all(isinstance(t, torch.Tensor) for t in out):
                raise TypeError("the function must return a tensor, or a tuple or list of tensors")
            return out

        with torch.no_grad(), mode:
            gm = make_fx(as_tuple, tracing_mode="real", decomposition_table=decompositions(inference=True))(*fakes)
        return gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"], single[0]

    @functools.cached_property
    def _key_digest(self) -> str:
        return _digest(self.fn, self.__name__, {**self.options, "dynamic": self.dynamic}, self.version)

    def _disk_key(self) -> str:
        return f"{self.__name__}_{self._key_digest}"


_PENDING = object()  # an entry another process is still capturing


class _Untraceable(Exception):
    """``make_fx`` could not trace the function (the cause is chained)."""


def _extents(signature: tuple) -> list[int]:
    """Elements of storage each input of ``signature`` (:func:`call_signature`) spans."""
    (_, *layouts), offsets = signature
    extents = []
    for (shape, stride, _), offset in zip(layouts, offsets):
        span = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(n > 0 for n in shape) else 0
        extents.append(offset + span)
    return extents


def _zeros_of(signature: tuple, max_bytes: float) -> list[torch.Tensor] | None:
    """Zero tensors with exactly the layout of ``signature`` (:func:`call_signature`), or
    None where they would take more than ``max_bytes``."""
    (device, *layouts), offsets = signature
    extents = _extents(signature)
    if sum(n * dtype.itemsize for n, (_, _, dtype) in zip(extents, layouts)) > max_bytes:
        return None
    return [torch.zeros(n, dtype=dtype, device=device).as_strided(shape, stride, offset)
            for n, (shape, stride, dtype), offset in zip(extents, layouts, offsets)]


def stand_ins(signature: tuple) -> list[torch.Tensor]:
    """Fake tensors with exactly the layout of ``signature`` (device included), for a
    capture in a process that must not touch the device ([Note: capturing in another
    process] in flashlight.capture_worker)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    (device, *layouts), offsets = signature
    with FakeTensorMode():
        return [torch.empty(n, dtype=dtype, device=device).as_strided(shape, stride, offset)
                for n, (shape, stride, dtype), offset in zip(_extents(signature), layouts, offsets)]


def _needs_grad(args) -> bool:
    return torch.is_grad_enabled() and any(a.requires_grad for a in args)


def _digest(fn: Callable, name: str, options: dict, version: str) -> str:
    """What an on-disk entry of ``fn`` depends on ([Note: traced capture]), the settings
    that change the generated code included (:func:`flashlight.settings.compiled`)."""
    text = [name, getattr(fn, "__qualname__", ""), repr(sorted(options.items())), version,
            repr(sorted(versions().items())), repr(sorted(settings.compiled().items())), str(_FORMAT)]
    try:
        with open(inspect.getsourcefile(inspect.unwrap(fn)), "rb") as f:
            text.append(hashlib.sha1(f.read()).hexdigest())
    except (TypeError, OSError):
        text.append(repr(getattr(fn, "__code__", fn)))  # no file: this process only
    return hashlib.sha1("\0".join(text).encode()).hexdigest()[:16]


@functools.cache
def source_digest() -> str:
    """A digest of Flashlight's own sources: a new version compiles again."""
    root = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha1()
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(f for f in files if f.endswith(".py")):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + f.read())
    return digest.hexdigest()[:16]


@functools.cache
def versions() -> dict[str, str]:
    """What compiled work kept on disk depends on: PyTorch's and Triton's versions and
    Flashlight's sources (:func:`source_digest`)."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    return {"torch": torch.__version__, "triton": triton_version, "flashlight": source_digest()}


# ---- graphs on disk (flashlight.graph_store) ----------------------------------------------


def _path(key: str) -> str:
    return os.path.join(settings.get("cache_dir"), "graphs", f"{key}.pkl")


def load_entries(key: str) -> list[Entry]:
    """The entries an earlier process kept for ``key`` (none when the cache is off,
    absent or unreadable)."""
    if not settings.get("graph_cache"):
        return []
    try:
        with open(_path(key), "rb") as f:
            stored = pickle.load(f)
        return [Entry(load_graph(graph), family, signature, guard_text, graph, single)
                for family, signature, guard_text, graph, single in stored]
    except FileNotFoundError:
        return []
    except Exception as error:  # noqa: BLE001 - a damaged or older file: trace again
        log.warning("[flashlight] ignoring the traced graphs in %s (%s)", _path(key), error)
        return []


def save_entries(key: str, entries: list[Entry]) -> None:
    """Write ``entries`` that can be kept for ``key`` (atomically: a reader never sees
    part of a file)."""
    if not settings.get("graph_cache"):
        return
    stored = [(e.family, e.signature, e.guard_text, e.graph, e.single) for e in entries if e.graph is not None]
    path = _path(key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as f:
            pickle.dump(stored, f)
        os.replace(tmp, path)
    except Exception as error:  # noqa: BLE001 - the cache is an optimisation
        log.warning("[flashlight] could not keep traced graphs in %s (%s)", path, error)
        if os.path.exists(tmp):
            os.unlink(tmp)

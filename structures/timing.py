"""Per-layer latency of an OpenFold model, measured with forward hooks.

A forward pre-hook marks the start and a forward hook the end of every timed module:
with CUDA events on a GPU, with the wall clock on a CPU. A module called several times
in one forward pass (once per recycling iteration) reports the sum of its calls.

[Note: synchronised module spans]
On a GPU the host runs ahead of the device: when a module starts, kernels of earlier
modules may still be queued. Events recorded on the stream then measure a module's own
device time only if the device never waits for the host inside it. A launch-bound
module (a chunked transition: many small kernels) behaves differently depending on what
ran before it: after a slow module the queue is full and its kernels run back to back
(short span); after a fast one the device idles between its launches (long span). The
same unpatched module then measured 64 ms behind stock attention and 107 ms behind
Flashlight's (bench/results/fold_noise_256.json: host spans 152 vs 104 ms). With
``synchronize=True`` the pre-hook synchronises before it records the start: every module
starts on an idle device, and its span is its own latency, host launch time included,
whatever ran before it (the end event is not synchronised; the next start is). That is
the timer for comparing modules (``flashlight-fold --sync-modules``,
``bench/fold_noise.py``). It costs one synchronise per timed module (about 500 per pass of
a 48-block model) and the host's head start at each module boundary, so the pass itself
gets slower; the default timer leaves the pass as a user runs it, and its model time is
the end-to-end figure. ``--compare`` on a GPU therefore times both: after the timed
passes each variant runs one more pass with synchronised starts, and the comparison's
module rows come from it (``latency.json``: ``runs.<variant>.modules_synchronised``).

[Note: layer spans under CUDA graphs]
A Flashlight model whose stacks and structure module replay CUDA graphs ([Note: CUDA
graphs for the stacks] in ``flashlight.integrations.openfold_graphs``) runs no Python,
and so no hook, inside a replayed call, and a hook must not record events or
synchronise while a call is being recorded. Stage spans (hooks around the stacks and
the structure module) cover every call; block and module spans skip recordings
(``openfold_graphs.recording()``) and cover the eager calls only, and a pass's
``replayed_iterations`` counts the graphed calls it replayed.
Comparisons of modules use the synchronised pass, which runs every call eagerly.

Timed modules, found by structure rather than by one fixed attribute path:

- *stages*: the model's direct children (input embedder, extra-MSA stack, Evoformer
  stack, structure module, heads, ...);
- *blocks*: every ``EvoformerBlock`` of the main Evoformer stack, in order;
- *modules* inside each block: :data:`MODULE_KINDS`. OpenFold 0.0.1 nests the pair
  modules as ``blocks[i].core.tri_att_start``, upstream 2.x as
  ``blocks[i].pair_stack.tri_att_start``; a module is found by its attribute name
  anywhere below the block, else by its class.
"""
from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

MODULE_KINDS: Tuple[str, ...] = (
    "msa_att_row",
    "msa_att_col",
    "msa_transition",
    "outer_product_mean",
    "tri_mul_out",
    "tri_mul_in",
    "tri_att_start",
    "tri_att_end",
    "pair_transition",
)

# Class names that identify each module kind when the attribute name does not.
_KIND_CLASSES: Dict[str, Tuple[str, ...]] = {
    "msa_att_row": ("MSARowAttentionWithPairBias",),
    "msa_att_col": ("MSAColumnAttention",),
    "msa_transition": ("MSATransition",),
    "outer_product_mean": ("OuterProductMean",),
    "tri_mul_out": ("TriangleMultiplicationOutgoing", "FusedTriangleMultiplicationOutgoing"),
    "tri_mul_in": ("TriangleMultiplicationIncoming", "FusedTriangleMultiplicationIncoming"),
    "tri_att_start": ("TriangleAttentionStartingNode", "TriangleAttention"),
    "tri_att_end": ("TriangleAttentionEndingNode", "TriangleAttention"),
    "pair_transition": ("PairTransition",),
}
BLOCK_CLASSES = ("EvoformerBlock",)
STACK_CLASSES = ("EvoformerStack",)


def find_evoformer_stack(model: torch.nn.Module) -> torch.nn.Module:
    """The main Evoformer stack of ``model`` (the first ``EvoformerStack`` module)."""
    for module in model.modules():
        if type(module).__name__ in STACK_CLASSES:
            return module
    raise ValueError(f"no Evoformer stack found in {type(model).__name__}")


def find_evoformer_blocks(model: torch.nn.Module) -> List[torch.nn.Module]:
    """The Evoformer blocks of the main stack, in execution order."""
    stack = find_evoformer_stack(model)
    blocks = [m for m in stack.modules() if type(m).__name__ in BLOCK_CLASSES]
    if not blocks:
        raise ValueError("the Evoformer stack has no EvoformerBlock modules")
    return blocks


def find_block_modules(block: torch.nn.Module) -> Dict[str, torch.nn.Module]:
    """The modules of one Evoformer block, keyed by :data:`MODULE_KINDS` (those found)."""
    found: Dict[str, torch.nn.Module] = {}
    named = list(block.named_modules())
    for kind in MODULE_KINDS:
        for name, module in named:
            if name.rsplit(".", 1)[-1] == kind:
                found[kind] = module
                break
    used = {id(m) for m in found.values()}
    for kind in MODULE_KINDS:
        if kind in found:
            continue
        for _, module in named:
            if type(module).__name__ in _KIND_CLASSES[kind] and id(module) not in used:
                found[kind] = module
                used.add(id(module))
                break
    return found


@dataclasses.dataclass
class Structure:
    """The timed parts of a model: stage names, and per block the module kinds found."""

    stages: List[str]
    blocks: List[List[str]]

    @property
    def num_blocks(self) -> int:
        """Number of Evoformer blocks."""
        return len(self.blocks)


@dataclasses.dataclass
class RunTiming:
    """Seconds spent in each timed part during one forward pass."""

    model_s: float
    stages: Dict[str, float]
    blocks: List[float]
    modules: List[Dict[str, float]]
    host: Dict[str, float] = dataclasses.field(default_factory=dict)  # HostRecord.to_json()
    # stack and structure-module calls replayed as CUDA graphs: not in the block and module spans
    # ([Note: layer spans under CUDA graphs])
    replayed_iterations: int = 0

    def to_json(self) -> dict:
        """Layer timings as the ``latency.json`` per-run layout."""
        return {
            "model_s": self.model_s,
            "replayed_iterations": self.replayed_iterations,
            "host": dict(self.host),
            "stages": dict(self.stages),
            "blocks": [
                {"index": i, "total_s": total, "modules": dict(mods)}
                for i, (total, mods) in enumerate(zip(self.blocks, self.modules))
            ],
        }


class FrozenHeap:
    """Passes that start with the collector's work done ([Note: the collector between passes]).

    [Note: the collector between passes]
    Python's cyclic garbage collector runs a full collection, which walks every object
    the process holds, whenever enough objects have survived since the last one; it runs
    on whichever thread allocates at that moment. A fold's process holds PyTorch's and
    OpenFold's objects, the model, and after compiling the captured graphs and their
    lowering: on a 2-core CPU, after a two-block fold with empty caches, a full collection
    of its 380,000 objects took 0.18 s. On an H200 the synchronised module pass of both
    ``--compare`` processes with empty caches measured a 0.23-0.29 s stall in one
    triangle attention call (where the blocks were kept: block 29's call 0.29 s, every
    other call of it 2.7-3.5 ms), and no process with filled caches, where compiling
    leaves far fewer objects: a full collection is the likely stall (a host pause inside
    one module's span; not confirmed), and a timed pass can meet one as well. So every
    pass of every variant starts with a full collection and the survivors frozen
    (``gc.freeze``: later collections skip them), outside the timed span but inside the
    process's wall time; a collection during a pass then walks only what that pass
    allocated. The freeze is undone when the record's passes end (``gc.unfreeze``), so
    garbage that only became unreachable later is still collected.
    """

    def __enter__(self) -> "FrozenHeap":
        self.refreeze()
        return self

    def refreeze(self) -> None:
        """Collect what the previous pass left and freeze what survives."""
        gc.collect()
        gc.freeze()

    def __exit__(self, *exc) -> None:
        gc.unfreeze()


class HostRecord:
    """What the host did during one pass ([Note: the host's record of a pass]).

    [Note: the host's record of a pass]
    A pass whose kernels are small (a single-sequence record, bf16) is bound by the
    host: its time is the Python and launch work of every module, and anything else the
    process does meanwhile lengthens it. Beside the pass's time each run records
    ``issue_s`` (until the forward returned, before the final synchronisation: close to
    ``model_s`` when the device waited for the host), ``cpu_s`` (the process's CPU time
    over all its threads: above ``model_s`` when other threads worked meanwhile) and the
    garbage collector's work (``gc_collections``, ``gc_full``: a full collection walks
    every object the process holds, and after compiling that includes the captured
    graphs), read from ``gc.get_stats()``. Not timed with ``gc.callbacks``: a Ctrl-C
    that arrives while a callback runs is raised inside it, where the collector
    discards it, and the fold would not stop. Before the pass it times a fixed
    pure-Python workload on the calling thread (``probe_ms``, :func:`host_probe_ms`):
    two processes of one machine whose unpatched modules ran at different speeds
    (bench/results/h100_2026-12-07d) say, by their probes, whether the host itself was
    slower in one of them, or the process.
    """

    def __enter__(self) -> "HostRecord":
        self.probe_ms = host_probe_ms()
        self._gc = [stat["collections"] for stat in gc.get_stats()]
        self._cpu, self.start = time.process_time(), time.perf_counter()
        return self

    def issued(self) -> None:
        """Mark the forward's return (before the final synchronisation)."""
        self.issue_s = time.perf_counter() - self.start

    def __exit__(self, *exc) -> None:
        self.cpu_s = time.process_time() - self._cpu
        self.collections = [stat["collections"] - before for stat, before in zip(gc.get_stats(), self._gc)]

    def to_json(self) -> Dict[str, float]:
        return {"issue_s": self.issue_s, "cpu_s": self.cpu_s, "probe_ms": self.probe_ms,
                "gc_collections": sum(self.collections), "gc_full": self.collections[-1]}


def host_probe_ms(repeats: int = 5, steps: int = 20000) -> float:
    """Median milliseconds of a fixed pure-Python loop of ``steps`` steps on this thread
    ([Note: the host's record of a pass]): the host's speed at the moment, other threads
    of the process competing for the interpreter included (about 1 ms a run on a GPU
    machine's host)."""
    times = []
    for _ in range(repeats):
        start, total = time.perf_counter(), 0
        for k in range(steps):
            total += k & 7
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


class Clock:
    """Start/end markers: CUDA events on a GPU, ``perf_counter`` on a CPU.

    With ``synchronize_starts``, ``mark(start=True)`` first waits for the device to finish
    queued work, so that the span it opens is the module's own ([Note: synchronised
    module spans]).
    """

    def __init__(self, device: torch.device, synchronize_starts: bool = False):
        self.cuda = device.type == "cuda"
        self.synchronize_starts = synchronize_starts and self.cuda

    def mark(self, start: bool = False):
        if self.cuda:
            if start and self.synchronize_starts:
                torch.cuda.synchronize()
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start, end) -> float:
        if self.cuda:
            return start.elapsed_time(end) / 1000.0
        return end - start

    def ms(self, start, end) -> float:
        return self.seconds(start, end) * 1e3

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    @property
    def method(self) -> str:
        if not self.cuda:
            return "wall_clock"
        return "cuda_events_synchronized" if self.synchronize_starts else "cuda_events"


class LayerTimer:
    """Hooks that time the stages, Evoformer blocks and block modules of a model.

    Use as a context manager around the runs to time (hooks are removed on exit)::

        with LayerTimer(model, device) as timer:
            out, timing = timer.run(lambda: model(batch))
    """

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        on_recycle: Optional[Callable[[], None]] = None,
        synchronize: bool = False,
    ):
        self.model = model
        self.clock = Clock(device, synchronize_starts=synchronize)
        self.on_recycle = on_recycle
        self._targets: List[Tuple[tuple, torch.nn.Module]] = []
        stages = [(name, child) for name, child in model.named_children()]
        for name, child in stages:
            self._targets.append((("stage", name), child))
        blocks = find_evoformer_blocks(model)
        block_kinds = []
        for index, block in enumerate(blocks):
            self._targets.append((("block", index), block))
            modules = find_block_modules(block)
            block_kinds.append([k for k in MODULE_KINDS if k in modules])
            for kind, module in modules.items():
                self._targets.append((("module", index, kind), module))
        self.structure = Structure([name for name, _ in stages], block_kinds)
        self._stack = find_evoformer_stack(model)
        from flashlight.integrations.openfold_graphs import installed

        self._graphed = installed(model)  # [Note: layer spans under CUDA graphs]
        self._handles: list = []
        self._open: Dict[tuple, list] = {}
        self._spans: Dict[tuple, list] = {}

    @property
    def method(self) -> str:
        """``cuda_events``, ``cuda_events_synchronized`` or ``wall_clock``."""
        return self.clock.method

    def __enter__(self) -> "LayerTimer":
        for key, module in self._targets:
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(key)))
            self._handles.append(module.register_forward_hook(self._post_hook(key)))
        if self.on_recycle is not None:
            callback = self.on_recycle

            def recycled(module, args, output):
                callback()  # a forward hook's return value would replace the output

            self._handles.append(self._stack.register_forward_hook(recycled))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre_hook(self, key):
        @torch.compiler.disable
        def hook(module, args):
            if not _recording():
                self._open.setdefault(key, []).append(self.clock.mark(start=True))

        return hook

    def _post_hook(self, key):
        @torch.compiler.disable
        def hook(module, args, output):
            starts = self._open.get(key)
            if starts and not _recording():
                self._spans.setdefault(key, []).append((starts.pop(), self.clock.mark()))

        return hook

    def run(self, fn: Callable[[], object]) -> Tuple[object, RunTiming]:
        """Call ``fn`` (one forward pass) and return its result and the timings."""
        self._open.clear()
        self._spans.clear()
        self.clock.synchronize()
        replays = sum(g.replays for g in self._graphed)
        with HostRecord() as host:
            start = host.start  # one start for both: issue_s never exceeds model_s
            result = fn()
            host.issued()
            self.clock.synchronize()
            model_s = time.perf_counter() - start
        totals: Dict[tuple, float] = {}
        for key, spans in self._spans.items():
            totals[key] = sum(self.clock.seconds(a, b) for a, b in spans)
        stages = {name: totals.get(("stage", name), 0.0) for name in self.structure.stages}
        blocks = [totals.get(("block", i), 0.0) for i in range(self.structure.num_blocks)]
        modules = [
            {kind: totals.get(("module", i, kind), 0.0) for kind in kinds}
            for i, kinds in enumerate(self.structure.blocks)
        ]
        replayed = sum(g.replays for g in self._graphed) - replays
        return result, RunTiming(model_s, stages, blocks, modules, host.to_json(), replayed)


def _recording() -> bool:
    """Whether a graphed call is being recorded into a CUDA graph (or replayed) here."""
    from flashlight.integrations.openfold_graphs import recording

    return recording()


def _median(values: List[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def median_timing(runs: List[RunTiming]) -> RunTiming:
    """Element-wise median over runs (every entry is the median of that entry)."""
    if not runs:
        raise ValueError("no runs to take the median of")
    first = runs[0]
    return RunTiming(
        model_s=_median([r.model_s for r in runs]),
        stages={k: _median([r.stages[k] for r in runs]) for k in first.stages},
        blocks=[_median([r.blocks[i] for r in runs]) for i in range(len(first.blocks))],
        modules=[
            {k: _median([r.modules[i][k] for r in runs]) for k in first.modules[i]}
            for i in range(len(first.modules))
        ],
        host={k: _median([r.host.get(k, 0.0) for r in runs]) for k in first.host},
        replayed_iterations=max(r.replayed_iterations for r in runs),
    )


def module_totals(timing: RunTiming) -> Dict[str, float]:
    """Seconds per module kind, summed over all blocks."""
    totals = {kind: 0.0 for kind in MODULE_KINDS}
    for mods in timing.modules:
        for kind, seconds in mods.items():
            totals[kind] += seconds
    return {k: v for k, v in totals.items() if any(k in m for m in timing.modules)}


def kernel_profile(fn: Callable[[], object], device: torch.device, top: int = 30) -> List[dict]:
    """The ``top`` longest kernels of one call of ``fn`` by total time, longest first:
    ``name``, ``calls`` and ``total_ms`` of each (on a GPU, the device time of each CUDA
    kernel; on a CPU, each operator's own CPU time), from ``torch.profiler``. For
    comparing what ran (which GEMM kernels, how long each) between runs."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        total_us = event.device_time_total if cuda else event.self_cpu_time_total
        if total_us > 0:
            rows.append({"name": event.key, "calls": event.count, "total_ms": total_us / 1e3})
    rows.sort(key=lambda row: -row["total_ms"])
    return rows[:top]


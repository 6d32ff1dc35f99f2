"""OpenFold's stacks and structure module replayed as CUDA graphs: ``patch_openfold(model)``'s default (``cuda_graphs=True``).

[Note: CUDA graphs for the stacks]
With the attentions fused, an OpenFold pass on a GPU is bound by the host: the Python
of the unpatched modules (layer norms, transitions, the triangle multiplications' chunk
loops, the structure module's eight blocks of small operations) issues kernels more
slowly than the device runs them (H200, bf16, 256 residues, 5632 MSA rows: the timed
span of an unpatched module equalled its span with a synchronised start,
``bench/results/fold_product_runs/README.md``; one structure-module call launches about
4300 kernels that run for 8 ms and takes 60-95 ms of host time, its spread the host's
from process to process). ``AlphaFold`` calls its Evoformer stack, its extra-MSA stack
and its structure module once per recycling iteration, with the same shapes every time,
so the patch sets an instance ``forward`` (:class:`GraphedForward`) on each module of a
class in :data:`GRAPHED_CLASSES`: it records the class's ``forward`` once into a CUDA
graph and replays it on the calls after that; the device runs the recorded kernels back
to back and the host only copies the inputs in and the outputs out.

- *Why these modules and not the whole iteration.* Recording ``AlphaFold.iteration``
  fails: OpenFold's recycling embedder makes a tensor from a Python list on every call
  (``new_tensor([inf])``), a copy from pageable host memory that a graph cannot hold.
  The stacks hold the 48 + 4 blocks, the structure module most of the remaining
  launches; the embedders and heads stay eager.
- *Kernels a graph does not see.* A recording holds only kernels launched on the
  capturing stream. OpenFold's in-place softmax extension (``attn_core_inplace_cuda``,
  used by the structure module's invariant point attention when ``inplace_safe`` is set,
  as it is in inference) launches on the legacy default stream: recorded, the softmax
  is missing from the graph and the replay is wrong (measured on an H200: atom positions
  off by 30 A). So the structure module is recorded and replayed with
  ``inplace_safe=False``: its out-of-place path, ``torch.softmax``, which the graph
  holds; the in-place path only saves memory, of an ``[H, N, N]`` tensor here.
  :data:`GRAPHED_CLASSES` holds such keyword arguments per class.
- *When it records.* A call is keyed by its tensors' shapes, dtypes and devices and its
  other arguments (flags such as ``chunk_size``, ``inplace_safe``). The first call of a
  key runs eagerly: it compiles and tunes Flashlight's kernels and makes every lazy
  initialisation (cuBLAS handles and workspaces, OpenFold's cached constants) that a
  recording must not contain. The second call records and replays; later ones replay.
  A recording first waits for the kernels compiling in the background
  (:func:`flashlight.background.settle`), so that it holds them, not their unfused
  graphs. In a fold the eager call is the warm-up pass's, or, in a fold without one,
  the first recycling iteration's.
- *What it keeps.* A graph reads its inputs from, and writes its outputs to, fixed
  buffers: each call copies its tensors into the input buffers (OpenFold's inference path
  updates ``m`` and ``z`` in place: the buffers, not the caller's tensors) and returns
  clones of the outputs, so results stay valid after later calls. Each module keeps only
  its newest key's graph (a record of another length records again), with the memory
  pool the recording allocated, about the eager call's own working memory. A graph reads
  the parameters and buffers where they were when it was recorded: weights loaded in
  place (``load_state_dict`` copies) are seen by the next replay; a parameter or buffer
  assigned anew (``load_state_dict(..., assign=True)``, ``module.weight = ...``) makes
  the next call record again (checked on every call: about 0.5 ms for the 5186 tensors
  of ``model_1``'s Evoformer stack on the 2-core CI machine).
- *When it stays eager.* Training or autograd (``self.training`` or grad enabled),
  tracing by ``torch.compile`` (a model compiled whole traces the stock forward),
  tensors not on a CUDA device, inside :func:`eager` (the fold's synchronised-module
  pass times every module with hooks, which a replay does not run), or a key whose
  recording failed (an operation a graph cannot hold; the reason is logged once and
  kept in :attr:`GraphedForward.failures`).
- *Hooks.* Forward hooks on a graphed module run around every call, replayed or not;
  hooks on modules inside it run on eager calls and while a call is recorded, not on
  replays. :func:`recording` tells such a hook that what it sees is being recorded (or
  replayed by a stand-in recorder), so it must not time it.

[Note: recording without draining the device]
``torch.cuda.graph`` synchronises the device and empties the allocator's cache before it
captures, so a recording waits for all queued work and then captures with the device
idle: in a fold's first timed iteration the structure module's capture waits for the
Evoformer's replay (about 0.3 s at 256 residues in bf16), and the Evoformer's for the
extra-MSA stack's. Capturing records work without running it, so it need not wait:
with ``FLASHLIGHT_GRAPH_CAPTURE=overlap`` the recorder captures on a side stream
(``CUDAGraph.capture_begin``) while the device still runs what came before. The
recording's memory pool is then new memory beside the allocator's cache (not memory the
cache gave back), so this is done only when the device's free memory covers the cache's
unused part, about the eager call's working memory that the recording needs again
(:func:`spare_memory`); otherwise the recorder drains as ``torch.cuda.graph`` does
(``FLASHLIGHT_GRAPH_CAPTURE=drain`` always does). Measured on an H200 (the default fold
command with ``--compare --dtype bf16``, 256 residues, 5632 MSA rows, one timed pass, the
two settings one after the other on one machine): 1.74 / 1.76 s (cold / warm caches)
overlapping against 2.11 / 2.00 s draining, the structure module's four iterations
0.12 s against 0.24 s (``bench/results/fold_product_runs/README.md``).
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, Iterator

import torch
from torch.utils import _pytree as pytree

from flashlight import background, prepare, settings

log = logging.getLogger("flashlight.openfold")
# class name -> keyword arguments its recorded calls use ([Note: CUDA graphs for the stacks])
GRAPHED_CLASSES: dict[str, dict[str, Any]] = {
    "EvoformerStack": {},
    "ExtraMSAStack": {},
    "StructureModule": {"inplace_safe": False},  # its in-place softmax escapes the graph
}
_QUIET = threading.local()  # .depth: recordings or replays in progress on this thread


def recording() -> bool:
    """Whether a graphed call is being recorded or replayed on this thread: a forward hook
    inside it that runs now must not time it."""
    if getattr(_QUIET, "depth", 0):
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def _quiet_hooks() -> Iterator[None]:
    _QUIET.depth = getattr(_QUIET, "depth", 0) + 1
    try:
        yield
    finally:
        _QUIET.depth -= 1


class CudaGraphRecorder:
    """Records a call into a ``torch.cuda.CUDAGraph``; :meth:`record` returns its
    outputs (fixed buffers) and a function that replays it into them. A stand-in for
    tests may set ``runs_on_cpu`` to take calls on CPU tensors."""

    runs_on_cpu = False

    def record(self, fn: Callable[[], Any]) -> tuple[Any, Callable[[], None]]:
        if settings.get("graph_capture") == "overlap" and spare_memory(*_memory_now()):
            return self._record_overlapping(fn)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # thread_local: a kernel compiling on another thread does not break the recording
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            outputs = fn()
        return outputs, graph.replay

    @staticmethod
    def _record_overlapping(fn: Callable[[], Any]) -> tuple[Any, Callable[[], None]]:
        """Capture without draining the device first ([Note: recording without draining
        the device])."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(torch.cuda.Stream()):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                outputs = fn()
            finally:
                graph.capture_end()
        return outputs, graph.replay


def _memory_now() -> tuple[int, int, int]:
    free, _ = torch.cuda.mem_get_info()
    return free, torch.cuda.memory_reserved(), torch.cuda.memory_allocated()


def spare_memory(free: int, reserved: int, allocated: int) -> bool:
    """Whether a recording can take its pool from the device's ``free`` bytes while the
    allocator keeps its cache (``reserved - allocated`` bytes unused, about the eager
    call's working memory) ([Note: recording without draining the device])."""
    return free >= reserved - allocated


class _Recording:
    """One key's graph: its input buffers (flat leaves), output buffers and replay, and
    the module's parameters and buffers it reads ([Note: CUDA graphs for the stacks],
    "What it keeps")."""

    def __init__(self, key: str, inputs: list, outputs: Any, replay: Callable[[], None],
                 weights: list[tuple[dict, str, torch.Tensor]]):
        self.key = key
        self.inputs = inputs
        self.outputs = outputs
        self.replay = replay
        self.weights = weights  # (the owner's _parameters or _buffers, name, tensor)

    def reads_current_weights(self) -> bool:
        """Whether every parameter and buffer is still the tensor the graph reads (one
        assigned anew, e.g. by ``load_state_dict(..., assign=True)``, is not)."""
        return all(owner.get(name) is tensor for owner, name, tensor in self.weights)


def _weights(module: torch.nn.Module) -> list[tuple[dict, str, torch.Tensor]]:
    """Every parameter and buffer of ``module`` with the dictionary that holds it."""
    return [(owner, name, t) for sub in module.modules()
            for owner in (sub._parameters, sub._buffers) for name, t in owner.items() if t is not None]


class GraphedForward:
    """A module's ``forward`` recorded once per key and replayed (see the module note);
    ``recorded_kwargs`` are keyword arguments the recorded calls use instead of the
    caller's.

    Attributes:
        replays: calls replayed so far.
        recordings: graphs recorded so far.
        failures: ``{key: reason}`` for keys whose recording failed.
    """

    def __init__(self, module: torch.nn.Module, recorder: CudaGraphRecorder | None = None,
                 recorded_kwargs: dict[str, Any] | None = None):
        self.module = module
        self.recorder = recorder or CudaGraphRecorder()
        self.recorded_kwargs = dict(GRAPHED_CLASSES.get(type(module).__name__, {})
                                    if recorded_kwargs is None else recorded_kwargs)
        self.replays = 0
        self.recordings = 0
        self.failures: dict[str, str] = {}
        self._seen: set[str] = set()
        self._recording: _Recording | None = None
        self._suspended = 0

    # picklable and copyable without its graphs
    def __reduce__(self):
        return (GraphedForward, (self.module, None, self.recorded_kwargs))

    def __deepcopy__(self, memo):
        import copy

        return GraphedForward(copy.deepcopy(self.module, memo), None, self.recorded_kwargs)

    def _stock(self, args, kwargs):
        return type(self.module).forward(self.module, *args, **kwargs)

    def _eligible(self, leaves: list) -> bool:
        if self._suspended or self.module.training or torch.is_grad_enabled():
            return False
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        on_device = all(t.is_cuda for t in tensors) or self.recorder.runs_on_cpu
        return bool(tensors) and on_device

    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():  # traced into a compiled region: its graph holds the stock call
            return self._stock(args, kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if not self._eligible(leaves):
            return self._stock(args, kwargs)
        key = repr(spec) + "|" + "|".join(_describe(leaf) for leaf in leaves)
        if key in self.failures or key not in self._seen:
            self._seen.add(key)  # this eager call warms up the key's recording
            return self._stock(args, kwargs)
        if self._recording is None or self._recording.key != key or not self._recording.reads_current_weights():
            recorded = self._record(key, leaves, spec)
            return recorded if recorded is not None else self._stock(args, kwargs)
        return self._replay(self._recording, leaves)

    def _record(self, key: str, leaves: list, spec):
        """Record the key's graph and replay it once; None (the reason kept and logged)
        when the recording fails."""
        # kernels still compiling in the background would leave their unfused graphs in
        # the recording: it waits for them first ([Note: compiling in the background
        # during a fold's pass] in flashlight/structures/compile_pass.py)
        background.settle()
        # nor launches of a preload on another thread ([Note: preloading kept graphs])
        prepare.wait_preloads()
        self._recording = None  # the previous graph's pool is freed first
        buffers = [t.clone(memory_format=torch.contiguous_format) if isinstance(t, torch.Tensor) else t
                   for t in leaves]

        def body():
            args, kwargs = pytree.tree_unflatten(buffers, spec)
            return self._stock(args, {**kwargs, **self.recorded_kwargs})

        with _quiet_hooks():
            try:
                outputs, replay = self.recorder.record(body)
            except Exception as err:  # noqa: BLE001 - the call runs eagerly instead
                reason = f"{type(err).__name__}: {err}".splitlines()[0][:300]
                self.failures[key] = reason
                log.warning("%s stays eager (CUDA graph recording failed: %s)",
                            type(self.module).__name__, reason)
                return None
        self.recordings += 1
        self._recording = _Recording(key, buffers, outputs, replay, _weights(self.module))
        # copied in again: a recorder that runs the call while recording (a stand-in)
        # may have updated the buffers in place
        return self._replay(self._recording, leaves)

    def _replay(self, recording: _Recording, leaves: list):
        for buffer, value in zip(recording.inputs, leaves):
            if isinstance(buffer, torch.Tensor):
                buffer.copy_(value)
        with _quiet_hooks():
            recording.replay()
        self.replays += 1
        return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, recording.outputs)

    def summary(self) -> dict:
        """Recordings, replays and failed recordings (reasons) so far, for reports."""
        return {"recordings": self.recordings, "replays": self.replays,
                "failures": sorted(set(self.failures.values()))}

    def release(self) -> None:
        """Drop the recorded graph (its memory pool goes with it)."""
        self._recording = None

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)}/{value.dtype}/{value.device}"
    return repr(value)


# -- installing -------------------------------------------------------------------------


def find_graphed_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model`` that replay graphs once patched: OpenFold's Evoformer and
    extra-MSA stacks and its structure module (by class name, :data:`GRAPHED_CLASSES`)."""
    return [m for m in model.modules() if type(m).__name__ in GRAPHED_CLASSES]


def installed(model: torch.nn.Module) -> list[GraphedForward]:
    """The :class:`GraphedForward` objects set on the modules of ``model``."""
    found = (m.__dict__.get("forward") for m in model.modules())
    return [f for f in found if isinstance(f, GraphedForward)]


def install(model: torch.nn.Module, recorder: CudaGraphRecorder | None = None) -> list[GraphedForward]:
    """Set a :class:`GraphedForward` as the ``forward`` of every module of
    :data:`GRAPHED_CLASSES` in ``model`` (a module that has one keeps it, and drops its
    graph); returns them all."""
    modules = find_graphed_modules(model)
    taken = [type(s).__name__ for s in modules
             if "forward" in s.__dict__ and not isinstance(s.__dict__["forward"], GraphedForward)]
    if taken:
        raise ValueError(
            f"patch_openfold: an {taken[0]} already has a forward of its own set on the "
            "instance (by another tool's hook or patch); remove it first"
        )
    for module in modules:
        current = module.__dict__.get("forward")
        if isinstance(current, GraphedForward):
            current.release()  # recorded with the previous patch's kernels
        else:
            module.forward = GraphedForward(module, recorder)
    return installed(model)


def uninstall(model: torch.nn.Module) -> int:
    """Remove the graphed forwards from the modules of ``model``; returns how many."""
    removed = 0
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), GraphedForward):
            del module.forward
            removed += 1
    return removed


@contextlib.contextmanager
def eager(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, the graphed modules of ``model`` run eagerly (hooks see every module)."""
    with contextlib.ExitStack() as stack:
        for graphed in installed(model):
            stack.enter_context(graphed.suspended())
        yield

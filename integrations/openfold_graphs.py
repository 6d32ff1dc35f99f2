"""OpenFold's stacks replayed as CUDA graphs: ``patch_openfold(model, cuda_graphs=True)``.

[Note: CUDA graphs for the stacks]
With the attentions fused, an OpenFold pass on a GPU is bound by the host: the Python
of the unpatched modules (layer norms, transitions, the triangle multiplications' chunk
loops) issues kernels more slowly than the device runs them (H200, bf16, 256 residues,
5632 MSA rows: the timed span of an unpatched module equalled its span with a
synchronised start, ``bench/results/fold_product_runs/README.md``). ``AlphaFold``
calls its Evoformer stack and its extra-MSA stack once per recycling iteration, with
the same shapes every time, so the patch sets an instance ``forward``
(:class:`GraphedForward`) on each ``EvoformerStack`` and ``ExtraMSAStack``: it records
the class's ``forward`` once into a CUDA graph and replays it on the calls after that;
the device runs the recorded kernels back to back and the host only copies the inputs
in and the outputs out.

- *Why the stacks and not the whole iteration.* Recording ``AlphaFold.iteration``
  fails: OpenFold's recycling embedder makes a tensor from a Python list on every call
  (``new_tensor([inf])``), a copy from pageable host memory that a graph cannot hold,
  and the structure module's quaternion updates do the same. The two stacks hold the
  48 + 4 blocks, nearly all the launches.
- *When it records.* A call is keyed by its tensors' shapes, dtypes and devices and its
  other arguments (flags such as ``chunk_size``, ``inplace_safe``). The first call of a
  key runs eagerly: it compiles and tunes Flashlight's kernels and makes every lazy
  initialisation (cuBLAS handles and workspaces) that a recording must not contain. The
  second call records and replays; later ones replay. In a fold the warm-up pass is the
  eager call, so every timed iteration replays.
- *What it keeps.* A graph reads its inputs from, and writes its outputs to, fixed
  buffers: each call copies its tensors into the input buffers (OpenFold's inference path
  updates ``m`` and ``z`` in place: the buffers, not the caller's tensors) and returns
  clones of the outputs, so results stay valid after later calls. Each stack keeps only
  its newest key's graph (a record of another length records again), with the memory
  pool the recording allocated, about the eager call's own working memory.
- *When it stays eager.* Training or autograd (``self.training`` or grad enabled),
  tensors not on a CUDA device, inside :func:`eager` (the fold's synchronised-module
  pass times every module with hooks, which a replay does not run), or a key whose
  recording failed (an operation a graph cannot hold; the reason is logged once and
  kept in :attr:`GraphedForward.failures`).
- *Hooks.* Forward hooks on a stack run around every call, replayed or not; hooks on
  modules inside it run on eager calls and while a call is recorded, not on replays.
  :func:`recording` tells such a hook that what it sees is being recorded (or replayed
  by a stand-in recorder), so it must not time it.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, Iterator

import torch
from torch.utils import _pytree as pytree

log = logging.getLogger("flashlight.openfold")
STACK_CLASSES = ("EvoformerStack", "ExtraMSAStack")
_QUIET = threading.local()  # .depth: recordings or replays in progress on this thread


def recording() -> bool:
    """Whether a stack call is being recorded or replayed on this thread: a forward hook
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
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # thread_local: a kernel compiling on another thread does not break the recording
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            outputs = fn()
        return outputs, graph.replay


class _Recording:
    """One key's graph: its input buffers (flat leaves), output buffers and replay."""

    def __init__(self, key: str, inputs: list, outputs: Any, replay: Callable[[], None]):
        self.key = key
        self.inputs = inputs
        self.outputs = outputs
        self.replay = replay


class GraphedForward:
    """A stack's ``forward`` recorded once per key and replayed (see the module note).

    Attributes:
        replays: calls replayed so far.
        recordings: graphs recorded so far.
        failures: ``{key: reason}`` for keys whose recording failed.
    """

    def __init__(self, module: torch.nn.Module, recorder: CudaGraphRecorder | None = None):
        self.module = module
        self.recorder = recorder or CudaGraphRecorder()
        self.replays = 0
        self.recordings = 0
        self.failures: dict[str, str] = {}
        self._seen: set[str] = set()
        self._recording: _Recording | None = None
        self._suspended = 0

    # picklable and copyable without its graphs
    def __reduce__(self):
        return (GraphedForward, (self.module,))

    def __deepcopy__(self, memo):
        import copy

        return GraphedForward(copy.deepcopy(self.module, memo))

    def _stock(self, args, kwargs):
        return type(self.module).forward(self.module, *args, **kwargs)

    def _eligible(self, leaves: list) -> bool:
        if self._suspended or self.module.training or torch.is_grad_enabled():
            return False
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        on_device = all(t.is_cuda for t in tensors) or self.recorder.runs_on_cpu
        return bool(tensors) and on_device

    def __call__(self, *args, **kwargs):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if not self._eligible(leaves):
            return self._stock(args, kwargs)
        key = repr(spec) + "|" + "|".join(_describe(leaf) for leaf in leaves)
        if key in self.failures or key not in self._seen:
            self._seen.add(key)  # this eager call warms up the key's recording
            return self._stock(args, kwargs)
        if self._recording is None or self._recording.key != key:
            recorded = self._record(key, leaves, spec)
            return recorded if recorded is not None else self._stock(args, kwargs)
        return self._replay(self._recording, leaves)

    def _record(self, key: str, leaves: list, spec):
        """Record the key's graph and replay it once; None (the reason kept and logged)
        when the recording fails."""
        self._recording = None  # the previous graph's pool is freed first
        buffers = [t.clone(memory_format=torch.contiguous_format) if isinstance(t, torch.Tensor) else t
                   for t in leaves]

        def body():
            args, kwargs = pytree.tree_unflatten(buffers, spec)
            return self._stock(args, kwargs)

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
        self._recording = _Recording(key, buffers, outputs, replay)
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


def find_stacks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """OpenFold's Evoformer and extra-MSA stacks in ``model`` (found by class name)."""
    return [m for m in model.modules() if type(m).__name__ in STACK_CLASSES]


def installed(model: torch.nn.Module) -> list[GraphedForward]:
    """The :class:`GraphedForward` objects set on the stacks of ``model``."""
    found = (m.__dict__.get("forward") for m in model.modules())
    return [f for f in found if isinstance(f, GraphedForward)]


def install(model: torch.nn.Module, recorder: CudaGraphRecorder | None = None) -> list[GraphedForward]:
    """Set a :class:`GraphedForward` as the ``forward`` of every stack in ``model`` (a
    stack that has one keeps it, and drops its graph); returns them all."""
    stacks = find_stacks(model)
    taken = [type(s).__name__ for s in stacks
             if "forward" in s.__dict__ and not isinstance(s.__dict__["forward"], GraphedForward)]
    if taken:
        raise ValueError(
            f"patch_openfold: an {taken[0]} already has a forward of its own set on the "
            "instance (by another tool's hook or patch); remove it first"
        )
    for stack in stacks:
        current = stack.__dict__.get("forward")
        if isinstance(current, GraphedForward):
            current.release()  # recorded with the previous patch's kernels
        else:
            stack.forward = GraphedForward(stack, recorder)
    return installed(model)


def uninstall(model: torch.nn.Module) -> int:
    """Remove the graphed forwards from the stacks in ``model``; returns how many."""
    removed = 0
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), GraphedForward):
            del module.forward
            removed += 1
    return removed


@contextlib.contextmanager
def eager(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, the stacks of ``model`` run eagerly (hooks see every module)."""
    with contextlib.ExitStack() as stack:
        for graphed in installed(model):
            stack.enter_context(graphed.suspended())
        yield

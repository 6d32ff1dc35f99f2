"""The launch of a compiled kernel at one call signature, worked out once.

[Note: launch plans]
A launch at sizes the launcher has seen computes the same things every time from the
inputs' shapes and strides: which inputs need a contiguous copy first, the outputs'
shapes, the size and stride arguments, the grid. In a host-bound program (a
single-sequence fold, a training step's forward and backward of small attentions) that
Python work was a large part of each launch. A :class:`LaunchPlan` holds all of it for
one *call signature* (every input's shape, strides and dtype, and the device), made at
the first steady launch of that signature; later calls with the same signature only
copy what must be copied, allocate the outputs and launch. A signature whose sizes chose
the unfused graph (autotuning timed it faster than the kernel) runs that graph on the
inputs as given, with none of the kernel's launch work (its inputs' copies, its outputs,
its arguments): that work cost more than the graph's own host time in a host-bound
program. Anything else (a first launch, bounds checks, empty inputs) takes the general
path, and a changed choice for some sizes drops the launcher's plans.

[Note: launching the compiled kernel]
Launching through Triton's JIT function binds the arguments, computes each one's
specialisation and looks the compiled kernel up on every call: tens of microseconds with
the fifty-odd arguments of a fused attention, more than a small kernel runs. Within one
plan every size argument is fixed, so the only specialisation left to vary is whether
each input's data starts on a 16-byte boundary (fresh outputs always do). A plan keeps
how to launch the kernel compiled for each alignment of its inputs
(:func:`flashlight.compiled_launch.launch`: PyTorch's static launcher, [Note: the static
launcher], or Triton's launcher for the kernel), and later launches with that alignment
call it directly, on the current stream, as Inductor launches its kernels. Where that
cannot be the same launch (another current device, Triton's launch hooks set for a
profiler, the interpreter, which compiles nothing) the JIT function launches as before.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Sequence

import torch

from flashlight import compiled_launch


def on_device(device: torch.device):
    """A context making ``device`` the current CUDA device (nothing for another device)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def signature(tensors: Sequence[torch.Tensor]) -> tuple:
    """What a plan depends on: each input's shape, strides and dtype, and the device."""
    return (tensors[0].device, *((t.shape, t.stride(), t.dtype) for t in tensors))


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """One call signature's launch: ``relayouts`` (input, axis) to make contiguous first,
    ``out_shapes``/``out_dtypes`` of the outputs, ``tail`` (the size, input-stride and
    output-stride arguments), ``grid`` and the launch settings ``chosen``."""

    relayouts: tuple[tuple[int, int], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[torch.dtype, ...]
    tail: tuple[int, ...]
    grid: tuple[int, ...]
    chosen: dict
    # inputs' alignment -> how to launch the kernel compiled for it (flashlight.compiled_launch)
    compiled: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def launch(self, raw, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Launch the JIT function ``raw`` on ``tensors``, or the kernel it compiled for
        them ([Note: launching the compiled kernel]); returns the outputs."""
        for k, axis in self.relayouts:
            # [..., X, ...] with X strided -> same values, X contiguous
            tensors[k] = tensors[k].movedim(axis, -1).contiguous().movedim(-1, axis)
        device = tensors[0].device
        outs = [torch.empty(shape, dtype=dtype, device=device)
                for shape, dtype in zip(self.out_shapes, self.out_dtypes)]
        compiled_launch.launch(raw, self.grid, (*tensors, *outs, *self.tail), self.chosen, self.compiled,
                               len(tensors))
        return outs

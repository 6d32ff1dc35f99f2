"""The launch of a compiled kernel at one call signature, worked out once.

[Note: launch plans]
A launch at sizes the launcher has seen computes the same things every time from the
inputs' shapes and strides: which inputs need a contiguous copy first, the outputs'
shapes, the size and stride arguments, the grid. In a host-bound program (a
single-sequence fold, a training step's forward and backward of small attentions) that
Python work was a large part of each launch. A :class:`LaunchPlan` holds all of it for
one *call signature* (every input's shape, strides and dtype, and the device), made at
the first steady launch of that signature; later calls with the same signature only
copy what must be copied, allocate the outputs and launch. Anything a plan does not
cover (a first launch, an unfused-graph choice, bounds checks, empty inputs) takes the
general path, and a changed choice for some sizes drops the launcher's plans.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch


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

    def launch(self, raw, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Launch the JIT function ``raw`` on ``tensors``; returns the outputs."""
        for k, axis in self.relayouts:
            # [..., X, ...] with X strided -> same values, X contiguous
            tensors[k] = tensors[k].movedim(axis, -1).contiguous().movedim(-1, axis)
        device = tensors[0].device
        outs = [torch.empty(shape, dtype=dtype, device=device)
                for shape, dtype in zip(self.out_shapes, self.out_dtypes)]
        raw[self.grid](*tensors, *outs, *self.tail, **self.chosen)
        return outs

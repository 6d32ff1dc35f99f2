"""Launch sizes: where a kernel's symbolic sizes are read from its inputs at run time,
a launch's integer arguments by name, and whether its offsets need 64 bits."""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch

from flashlight.codegen import WIDE_BITS, KernelSource
from flashlight.indexing import Unsupported, evaluate_size, size_formula
from flashlight.ir import Dim, Gather, Kernel, Load, spans_extent, walk


class UnreadableSizes(ValueError):
    """A kernel's symbolic size that no input's shape gives (every input merges it with
    another unknown one): the kernel cannot be launched, its graph runs without it."""


@dataclasses.dataclass(frozen=True)
class SizeSource:
    """Where a symbolic size is read at run time: ``inputs[tensor].shape[axis]``, divided
    by ``others``, the sizes merged with it in that axis (static, or read directly); or,
    ``computed``, its text evaluated with the sizes it names ([Note: sizes used as
    values] in :mod:`flashlight.indexing`)."""

    tensor: int
    axis: int
    others: tuple = ()
    computed: bool = False


def read_sizes(sources: dict[str, SizeSource], tensors) -> dict[str, int]:
    """The symbolic sizes' values for a launch on ``tensors``."""
    values = {text: tensors[s.tensor].shape[s.axis] for text, s in sources.items() if not (s.others or s.computed)}
    for text, s in sources.items():
        if s.others:
            rest = math.prod(o if isinstance(o, int) else values[o] for o in s.others)
            values[text] = tensors[s.tensor].shape[s.axis] // rest if rest else 0
    for text, s in sources.items():
        if s.computed:
            values[text] = evaluate_size(text, values)
    return values


def size_sources(kernel: Kernel, src: KernelSource) -> dict[str, SizeSource]:
    """Where each symbolic size of ``src`` is read: an input axis that is that size alone,
    else a merged axis whose other sizes are static or read alone (a row dim that only
    the flattened rows of a projection's input carry)."""
    found: dict[str, SizeSource] = {}
    merged: list[tuple[int, int, tuple[Dim, ...]]] = []
    for expr in [*kernel.epilogues(), *(e for r in kernel.loop for e in r.exprs())]:
        for node in walk(expr):
            if isinstance(node, Load) and node.base in src.inputs:
                axes = node.index
            elif isinstance(node, Gather) and node.base in src.inputs:  # a position that is an axis's index
                axes = tuple(p.axis if spans_extent(p, e) else () for p, e in zip(node.positions, node.extents))
                for a, extent in enumerate(node.extents):  # a looked-up axis's size (its bound)
                    if isinstance(extent, str):
                        found.setdefault(extent, SizeSource(src.inputs.index(node.base), a))
            else:
                continue
            for a, axis in enumerate(axes):
                if len(axis) == 1 and not axis[0].is_static:
                    found.setdefault(axis[0].size, SizeSource(src.inputs.index(node.base), a))
                elif len(axis) > 1:
                    merged.append((src.inputs.index(node.base), a, axis))
    for tensor, a, axis in merged:
        unknown = [d for d in axis if not d.is_static and d.size not in found]
        if len(unknown) == 1 and sum(d.size == unknown[0].size for d in axis) == 1:
            others = tuple(d.size for d in axis if d != unknown[0])
            found[unknown[0].size] = SizeSource(tensor, a, others)
    for k, sizes in enumerate(src.input_sizes):  # sizes no load names alone: an input's own axis
        for a, size in enumerate(sizes):
            if isinstance(size, str):
                found.setdefault(size, SizeSource(k, a))
    for text in src.size_args:  # a size used as a value: computed from the sizes it names
        if text not in found and all(name in found for name in _names_in(text)):
            found[text] = SizeSource(-1, -1, computed=True)
    missing = [s for s in src.size_args if s not in found]
    if missing:
        raise UnreadableSizes(f"sizes {missing} cannot be read from any kernel input")
    return found


def _names_in(text: str) -> tuple[str, ...]:
    """The sizes size ``text`` names; a symbol where it is no expression the runtime
    evaluates (then it must be read whole, or is missing)."""
    try:
        return size_formula(text)[1]
    except Unsupported:
        return (text,)


def integer_arguments(size_args, tensors, outs, split_args) -> dict[str, int]:
    """A launch's integer arguments by name (``size0``, ``in1_s2``, ``out_s0``, ...)."""
    named = {f"size{k}": int(v) for k, v in enumerate(size_args)}
    named.update({f"in{k}_s{a}": int(st) for k, t in enumerate(tensors) for a, st in enumerate(t.stride())})
    if split_args:  # the partial sums' buffer: its strides past the split, then the split's
        named.update({f"out_s{a}": int(st) for a, st in enumerate(outs[0].stride()[1:])})
        named["out_split"] = int(split_args[2])
    else:
        named.update({f"out{k or ''}_s{a}": int(st)
                      for k, o in enumerate(outs) for a, st in enumerate(o.stride())})
    return named


# Largest element offset a 32-bit launch reaches ([Note: 64-bit offsets] in flashlight.codegen)
OFFSET_LIMIT = 2**31 - 1


def index_kwargs(tensors: Sequence[torch.Tensor]) -> dict:
    """The launch argument that makes a kernel's offsets 64-bit, where one of ``tensors``
    reaches an element past :data:`OFFSET_LIMIT` ({} otherwise: the 32-bit build)."""
    if any(span(t) - 1 > OFFSET_LIMIT for t in tensors):
        return {"INDEX_BITS": WIDE_BITS}
    return {}


def span(t: torch.Tensor) -> int:
    """One past the largest element offset ``t`` addresses through its strides."""
    return 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))

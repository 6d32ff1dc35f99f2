"""Flashlight kernels as one PyTorch operator, so that other compilers schedule around them.

``torch.ops.flashlight.launch(kernel, inputs)`` runs the generated kernel named
``kernel`` on ``inputs`` and returns its output, a new contiguous tensor
(``torch.ops.flashlight.launch_outputs``: the list of outputs of a kernel with several,
each a new contiguous tensor). Each is a ``torch.library`` operator with a fake (meta)
implementation ([Note: the launch op's dispatch cost]), so Inductor (and any
tracer) sees an opaque op whose output shape, with symbolic sizes, dtype and strides it
knows without running it: the shape is read off the inputs' shapes exactly as
:meth:`flashlight.runtime.Launcher.__call__` reads it.

Kernels are found in a process-wide registry by a key that is a digest of the kernel's
source and its launch metadata, not a counter: a graph Inductor compiled in another
process and loads from its on-disk cache names the same kernel in this one, which the
backend registers before it hands the graph to Inductor.
"""
from __future__ import annotations

import hashlib
import math
from typing import Sequence

import torch

from flashlight.launch_sizes import read_sizes
from flashlight.runtime import Launcher

_REGISTRY: dict[str, Launcher] = {}  # key -> the launcher of that kernel


def kernel_key(launcher: Launcher) -> str:
    """The registry key of ``launcher``'s kernel: its name and a digest of everything
    that decides what it computes and the shape it returns."""
    src = launcher.src
    shape = [[[str(d.size) for d in axis] for axis in out.axes] for out in launcher.kernel.outputs()]
    dtypes = [str(out.dtype) for out in launcher.kernel.outputs()]
    sizes = sorted((text, s.tensor, s.axis) for text, s in launcher.sources.items())
    text = repr((src.source, shape, sizes, dtypes, tuple(src.inputs),
                 tuple(getattr(src, "fast_axes", ())), launcher.autotune))
    return f"{src.name}_{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def register(launcher: Launcher) -> str:
    """Make ``launcher`` callable as ``torch.ops.flashlight.launch(key, inputs)``; returns the key."""
    key = kernel_key(launcher)
    _REGISTRY[key] = launcher
    return key


def launcher_of(kernel: str) -> Launcher:
    """The launcher registered under ``kernel``."""
    try:
        return _REGISTRY[kernel]
    except KeyError:
        raise RuntimeError(f"no Flashlight kernel {kernel!r} is registered in this process "
                           "(compile the function that uses it first)") from None


def output_shape(launcher: Launcher, inputs: Sequence[torch.Tensor], k: int = 0) -> list:
    """The shape of the ``k``-th output ``launcher`` returns for ``inputs`` (SymInts
    where the inputs' sizes are)."""
    values = read_sizes(launcher.sources, inputs)
    return [math.prod((int(d.size) if d.is_static else values[d.size]) for d in axis)
            for axis in launcher.kernel.outputs()[k].axes]


def _fresh(out: torch.Tensor, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """``out`` as a new contiguous tensor, as the fake implementations promise (the
    unfused graph may have run instead of the kernel: size 0, or faster)."""
    if out._base is not None or not out.is_contiguous() or any(out is t for t in inputs):
        out = out.clone(memory_format=torch.contiguous_format)
    return out


# [Note: the launch op's dispatch cost]
# ``torch.library.custom_op`` wraps its kernel in Python layers that run on every call
# (an autograd wrapper, a redispatch, an aliasing check of the result against the
# inputs): in a profile on an H200 host (torch 2.11) of the forward and backward of the
# MSA row attention at AlphaFold2's training sizes, about 40% of the host time went
# there (``bench.training``'s ``host_profile``). The ops
# are therefore defined with ``torch.library.Library`` and a CompositeExplicitAutograd
# kernel: the dispatcher calls the launcher directly. Neither op needs a derivative:
# they run inside graphs AOTAutograd compiled (Flashlight derives the backward
# kernels itself), under no-grad; what the custom-op layers checked holds by
# construction (``_fresh``: every output a new tensor).
_LIBRARY = torch.library.Library("flashlight", "FRAGMENT")  # noqa: TOR901 - one definition per process
_LIBRARY.define("launch(str kernel, Tensor[] inputs) -> Tensor")
_LIBRARY.define("launch_outputs(str kernel, Tensor[] inputs) -> Tensor[]")


def launch(kernel: str, inputs: list[torch.Tensor]) -> torch.Tensor:
    """Run the Flashlight kernel registered as ``kernel`` on ``inputs``."""
    return _fresh(launcher_of(kernel)(*inputs), inputs)


def launch_outputs(kernel: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run the Flashlight kernel with several outputs registered as ``kernel`` on ``inputs``."""
    outs = [_fresh(out, inputs) for out in launcher_of(kernel)(*inputs)]
    return [out.clone() if any(out is other for other in outs[:k]) else out for k, out in enumerate(outs)]


def _launch_fake(kernel: str, inputs: list[torch.Tensor]) -> torch.Tensor:
    launcher = launcher_of(kernel)
    return inputs[0].new_empty(output_shape(launcher, inputs), dtype=launcher.kernel.dtype)


def _launch_outputs_fake(kernel: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    launcher = launcher_of(kernel)
    return [inputs[0].new_empty(output_shape(launcher, inputs, k), dtype=out.dtype)
            for k, out in enumerate(launcher.kernel.outputs())]


_LIBRARY.impl("launch", launch, "CompositeExplicitAutograd")
_LIBRARY.impl("launch_outputs", launch_outputs, "CompositeExplicitAutograd")
torch.library.register_fake("flashlight::launch", _launch_fake, lib=_LIBRARY)
torch.library.register_fake("flashlight::launch_outputs", _launch_outputs_fake, lib=_LIBRARY)

"""Run stock OpenFold on CPU: a PyTorch fallback for its in-place softmax extension.

OpenFold ships a compiled extension, ``attn_core_inplace_cuda``, with two functions:

- ``forward_(logits, rows, cols)``: softmax over the last dimension of ``logits``
  (viewed as ``[rows, cols]``), written back in place;
- ``backward_(probs, d_out, values, rows, cols_out, cols_values)``: overwrites the
  softmax output ``probs`` (``[*, Q, K]``) with the gradient of the attention logits,
  ``probs * (d_out @ values^T - sum(probs * (d_out @ values^T), -1))``, given the
  gradient ``d_out`` (``[*, Q, C]``) of ``probs @ values`` (``values``: ``[*, K, C]``).

When OpenFold is built without CUDA the extension is a stub whose functions raise on
every call. Stock OpenFold calls them on paths that are on by default, so a CPU model
fails without help:

- ``openfold.utils.kernel.attention_core`` (``Attention(..., use_memory_efficient_kernel=
  True)``), which ``ExtraMSABlock`` uses for extra-MSA row attention;
- ``InvariantPointAttention.forward`` with ``inplace_safe=True`` (inference under
  ``torch.no_grad()``), for its in-place softmax.

:func:`cpu_compat` swaps the stub's two functions for the PyTorch implementations below
for the duration of a ``with`` block. The replacements hand CUDA tensors to the original
functions, so the patch changes nothing on a GPU build; like the CUDA kernels, they compute
half-precision tensors in float32 and write back in the tensor's dtype. Nothing in site-packages is edited,
and the original functions are restored on exit::

    from flashlight.integrations.openfold_compat import cpu_compat

    with torch.no_grad(), cpu_compat():
        out = model(batch)
"""
from __future__ import annotations

import contextlib
import importlib
import threading
from types import ModuleType
from typing import Callable, Iterator

import torch

EXTENSION = "attn_core_inplace_cuda"

_lock = threading.Lock()


def _extension() -> ModuleType:
    try:
        return importlib.import_module(EXTENSION)
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise ImportError(
            f"OpenFold's extension module {EXTENSION!r} is not importable ({err}). "
            "Install OpenFold with scripts/setup.sh."
        ) from err


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float32 for half-precision tensors (as the CUDA kernels compute), else their own dtype."""
    return torch.promote_types(tensor.dtype, torch.float32)


def _rows_view(tensor: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``tensor`` as ``[rows, cols]`` (a view, so writes reach ``tensor``)."""
    if tensor.numel() != rows * cols:
        raise ValueError(
            f"tensor of shape {tuple(tensor.shape)} does not hold {rows} rows of {cols} columns"
        )
    if tensor.is_contiguous():
        return tensor.view(rows, cols)
    if tensor.shape[-1] != cols:
        raise ValueError(f"non-contiguous tensor whose last dimension is not {cols}")
    return tensor  # softmax over the last dimension works on it directly


def softmax_inplace_forward_(logits: torch.Tensor, rows: int, cols: int) -> None:
    """``logits[r, :] = softmax(logits[r, :])`` for each of ``rows`` rows, in place."""
    view = _rows_view(logits, rows, cols)
    view.copy_(torch.softmax(view, dim=-1, dtype=_compute_dtype(logits)))


def softmax_inplace_backward_(
    probs: torch.Tensor,
    d_out: torch.Tensor,
    values: torch.Tensor,
    rows: int,
    cols_out: int,
    cols_values: int,
) -> None:
    """Overwrite ``probs`` (softmax output, ``[*, Q, K]``) with d(loss)/d(logits).

    ``d_out`` (``[*, Q, C]``) is the gradient of ``probs @ values`` (``values``:
    ``[*, K, C]``); ``rows`` is the number of rows of ``probs``, ``cols_out`` = K and
    ``cols_values`` = C.
    """
    if probs.numel() != rows * cols_out or probs.shape[-1] != cols_out:
        raise ValueError(f"probs of shape {tuple(probs.shape)} is not [*, Q, {cols_out}]")
    if d_out.shape[-1] != cols_values or values.shape[-1] != cols_values:
        raise ValueError(f"d_out and values must end in {cols_values} columns")
    dtype = _compute_dtype(probs)
    p = probs.to(dtype)
    # [*, Q, K]
    d_p = torch.matmul(d_out.to(dtype), values.to(dtype).transpose(-1, -2))
    d_logits = p * (d_p - (p * d_p).sum(dim=-1, keepdim=True))
    probs.copy_(d_logits)


def _on_cuda(*tensors: torch.Tensor) -> bool:
    return any(t.is_cuda for t in tensors)


def _dispatching(original: Callable, fallback: Callable) -> Callable:
    """``fallback`` for CPU tensors, ``original`` (the compiled function) otherwise."""

    def call(*args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if _on_cuda(*tensors):
            return original(*args)
        return fallback(*args)

    call.__name__ = getattr(original, "__name__", fallback.__name__)
    call.__doc__ = fallback.__doc__
    call.flashlight_fallback = fallback  # marks a patched function
    call.flashlight_original = original
    return call


def is_active() -> bool:
    """Whether the extension's functions are currently the CPU fallbacks."""
    ext = _extension()
    return hasattr(ext.forward_, "flashlight_fallback")


@contextlib.contextmanager
def cpu_compat() -> Iterator[None]:
    """Within the block, OpenFold's in-place softmax extension also works on CPU tensors.

    Re-entrant: a nested block leaves the outer patch in place; the stub's own
    functions come back when the outermost block exits.
    """
    ext = _extension()
    with _lock:
        saved = (ext.forward_, ext.backward_)
        if not hasattr(ext.forward_, "flashlight_fallback"):
            ext.forward_ = _dispatching(saved[0], softmax_inplace_forward_)
            ext.backward_ = _dispatching(saved[1], softmax_inplace_backward_)
    try:
        yield
    finally:
        with _lock:
            ext.forward_, ext.backward_ = saved

"""Flashlight: fused FlashAttention-style Triton kernels from attention written in plain PyTorch.

Public API (everything a user needs is here):

- ``torch.compile(fn, backend="flashlight")``: the backend, registered on import.
- :func:`compile`: the same, with options.
- :func:`explain`: compile for given inputs and report the generated kernels and the
  operations left outside them (with reasons).
- :func:`patch_openfold` / :func:`unpatch_openfold`: swap OpenFold's Evoformer attention
  modules for Flashlight-compiled ones, reversibly.
- :func:`compiling_in_background`: a context in which new kernels compile on threads
  while their unfused graphs answer (for a warm-up pass).
- :mod:`flashlight.settings`: every environment variable, with a scoped override.
"""
from __future__ import annotations

from flashlight import settings
from flashlight.api import ExplainReport, FallbackOp, KernelReport, compile, explain
from flashlight.background import compiling_in_background


def _register_backend() -> None:
    import torch._dynamo

    from flashlight.backend import flashlight_backend

    if "flashlight" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(flashlight_backend, name="flashlight")


_register_backend()

__all__ = [
    "ExplainReport",
    "FallbackOp",
    "KernelReport",
    "compile",
    "compiling_in_background",
    "explain",
    "patch_openfold",
    "settings",
    "unpatch_openfold",
]


def patch_openfold(model, **options):
    """Replace OpenFold's gated self-attention modules in ``model`` by Flashlight-compiled ones.

    See :func:`flashlight.integrations.openfold.patch_openfold`.
    """
    from flashlight.integrations.openfold import patch_openfold as _patch

    return _patch(model, **options)


def unpatch_openfold(model):
    """Undo :func:`patch_openfold`, restoring stock behaviour exactly."""
    from flashlight.integrations.openfold import unpatch_openfold as _unpatch

    return _unpatch(model)

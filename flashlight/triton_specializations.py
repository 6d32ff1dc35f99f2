"""A launch's specialization as Triton's JIT serialises it, read back into a compile's source.

Triton's JIT hands its ``jit_cache_hook`` the specialization of each launch it is about to
compile (signature, constants, alignment attributes, options, target) as JSON text.
:func:`read` turns that text back into what ``triton.compile`` takes, for the compile
workers ([Note: compiling in other processes] in :mod:`flashlight.compile_workers`) and
for the parent's launcher built beside a worker's compile ([Note: the launcher beside the
compile] there). This module imports Triton and nothing of PyTorch or of the
``flashlight`` package: the workers load it by its file's path.
"""
from __future__ import annotations

import json

import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def _tuples(value):
    """JSON's lists back into the tuples Triton keys and specializes on."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _constant(value):
    if isinstance(value, str) and tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict) and "constexpr" in value:
        return tl.constexpr(_tuples(value["constexpr"]))
    return _tuples(value)


def read(jit_fn, text: str, default_target: dict | None = None) -> tuple[ASTSource, GPUTarget, dict]:
    """(source, target, options) of the launch of ``jit_fn`` that ``text`` specializes: the
    arguments of ``triton.compile``, under the cache key the JIT's own compile uses."""
    data = json.loads(text)
    constants = {tuple(k): _constant(v) for k, v in zip(data["constant_keys"], data["constant_vals"])}
    attrs = {tuple(k): v for k, v in zip(data["attrs_keys"], data["attrs_vals"])}
    signature = {k: _tuples(v) for k, v in data["signature"].items()}
    options = {k: _tuples(v) for k, v in data["options"].items()}
    target = GPUTarget(**(data.get("target") or default_target))
    return ASTSource(jit_fn, signature, constants, attrs), target, options

"""The attention core of OpenFold's gated self-attention, in plain PyTorch, and its compiled forms.

OpenFold's ``Attention`` module computes, for query input ``q_x`` and key/value input
``kv_x`` (``[*, Q, C_q]`` and ``[*, K, C_k]``)::

    q, k, v = linear_q(q_x), linear_k(kv_x), linear_v(kv_x)    # [*, Q/K, H * C]
    q, k, v = (t.view(..., H, C).transpose(-2, -3) ...)        # [*, H, Q/K, C]
    a = softmax(q / sqrt(C) @ k^T + sum(biases), -1)           # [*, H, Q, K]
    o = (a @ v).transpose(-2, -3) * sigmoid(linear_g(q_x))     # [*, Q, H, C]
    out = linear_o(o.flatten(-2))                              # [*, Q, C_q]

The projections stay ordinary PyTorch calls on the module's own layers. Everything
between them, from the projected ``q, k, v``, the biases and the gate's logits to the
gated output, is one of the functions below: scaling, scores, every bias, the softmax,
``@ v``, the transpose back and the sigmoid gate. Flashlight compiles such a function
into a single fused kernel, so the ``[*, H, Q, K]`` scores never reach memory and the
broadcast biases and the gate are applied inside it.

The functions are pure (no in-place operations) and take a fixed number of biases:
``attention_core(n_biases, gated)`` picks one. OpenFold passes one bias (MSA column
attention: the mask bias ``[*, S, 1, 1, K]``) or two (MSA row and triangle attention: the
mask bias and the pair/triangle bias ``[*, 1, H, Q, K]``); zero happens with
``use_flash=True`` and no mask.

[Note: one compiled callable per signature]
``compiled_core`` compiles each core once per *signature*: bias count, gating, heads
``H``, head width ``C``, dtype and compile options. The cache is module level, shared by
all patched modules, so the 48 Evoformer blocks of a model share one compiled row
attention. The cores are pure functions of tensors, so they are compiled by traced
capture ([Note: traced capture] in :mod:`flashlight.traced`): no Dynamo, and the
compiled graphs are kept on disk, so a later process loads them instead of capturing
again. Each signature compiles its own copy of the function under a descriptive name
(a fresh code object): its on-disk entries are named after it, and where a call needs
gradients it goes through ``torch.compile``, which keeps its compiled graphs on the
function's code object with a limit on how many it keeps, so that e.g. fp32 and bf16,
or the Evoformer's ``C = 32`` and the template stack's ``C = 16``, never compete for that
limit. Sequence lengths and batch sizes are not part of the signature: a second length
makes those sizes symbolic instead of compiling once per length.

[Note: the cores' remainder]
A core is one attention, which Flashlight fuses into one kernel with a loop over the keys.
Where a size of 1 removes that loop (a single-sequence record: MSA column attention over
one sequence, the extra-MSA stack's global attention over its one row), the kernel is a
single contraction, which Flashlight leaves to Inductor when Inductor compiles the rest
of a graph ([Note: what Flashlight keeps when Inductor compiles the rest] in
``flashlight.backend``); Inductor would then compile the whole core. That gains nothing
on a graph this small, costs the process Inductor's first use (seconds), and leaves a
compiled graph that the cores' disk cache cannot keep, so every later process traces and
compiles it again (on the CPU test model: two of five cores of a single-sequence record
traced again in a second process). The cores are therefore compiled with the eager
remainder (``remainder="eager"``, unless a caller's options say otherwise): Flashlight
keeps its kernel, the graph is fused whole and kept on disk. Tested in
``tests/test_openfold_patch.py``.

[Note: global column attention]
The extra-MSA stack's ``MSAColumnGlobalAttention`` (``GlobalAttention``) attends, per
column ``r``, from ``H`` queries to the ``S`` sequences of that column::

    q = linear_q(masked mean of m over S)                       # [*, R, H, C]
    k, v = linear_k(m), linear_v(m)                             # [*, R, S, C], one head
    o = softmax(q / sqrt(C) @ k^T + mask_bias, -1) @ v          # [*, R, H, C]
    out = linear_o((o[..., None, :, :] * sigmoid(linear_g(m))).flatten(-2))  # [*, R, S, C_in]

:func:`global_attention` is the middle line, and :func:`gated_global_attention` the last
two as well: the pooled query and the key and value projections stay with the module's
layers (each computed once). Fused whole, the gate's product ``[*, R, S, H, C]`` is
indexed by the sequence, which would make the sequence a grid dim of the attention, so
every program along it would run the whole attention again
(``flashlight.pipeline.recomputes_across_grid`` says so for that fusion); the compiler
keeps the attention output ``[*, R, H, C]`` (small) separate instead, and compiles two
kernels: the attention, a program per column and head block with the sequences as its
key loop, and the gated output projection, a program per column and block of sequences
whose loop runs over the ``H * C`` gate channels ([Note: a loop over several dims] in
``flashlight.passes.loop_dims``): the gate is computed, multiplied by the attention
output and projected tile by tile, never written to memory, where the stock module
writes and reads it three times (the gate, its sigmoid, the product).
Measured on an H100 (``bench/results/global_column``; 256 columns, c_in 64, 8 heads of
8, unchunked): the module 1.28x / 1.20x stock's speed in bfloat16 at 1024 / 5120
sequences, 1.26x / 1.25x in float32 with TF32, where the attention kernel alone had
brought it only level with stock (1.04-1.09x; its layer norm and gate dominate); in
IEEE float32 (TF32 off) an earlier build was 0.93x stock at 5120 sequences, the gated
kernel's dots on the CUDA cores (not re-measured since). With a
program per column the attention kernel is latency-bound (157 us at 5120 sequences for
42 MB of keys and values on an H200): a key loop split across programs would help.
"""
from __future__ import annotations

import math
import threading
import types
from typing import Any, Callable, Hashable, Sequence

import torch


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, biases: Sequence[torch.Tensor]):
    """Scaled attention with additive biases; returns ``[*, Q, H, C]``."""
    # [*, H, Q, C]
    q = q / math.sqrt(q.shape[-1])
    # [*, H, Q, K]
    s = torch.matmul(q, k.transpose(-1, -2))
    for b in biases:
        # Biases may arrive in float32 while q is bf16 (OpenFold adds them in place,
        # which keeps the scores' dtype); the cast keeps the same dtype flow.
        s = s + b.to(s.dtype)
    p = torch.softmax(s, dim=-1)
    # [*, H, Q, C]
    o = torch.matmul(p, v)
    # [*, Q, H, C]
    return o.transpose(-2, -3)


def gated_attention_0(q, k, v, g):
    """``softmax(q k^T / sqrt(C)) v``, transposed to ``[*, Q, H, C]``, gated by ``sigmoid(g)``.

    q: ``[*, H, Q, C]``; k, v: ``[*, H, K, C]``; g: ``[*, Q, H, C]`` gate logits.
    """
    return _attend(q, k, v, ()) * torch.sigmoid(g)


def gated_attention_1(q, k, v, bias_1, g):
    """As :func:`gated_attention_0` with one bias broadcasting to ``[*, H, Q, K]``."""
    return _attend(q, k, v, (bias_1,)) * torch.sigmoid(g)


def gated_attention_2(q, k, v, bias_1, bias_2, g):
    """As :func:`gated_attention_0` with two biases broadcasting to ``[*, H, Q, K]``.

    OpenFold's MSA row attention passes the mask bias ``[*, S, 1, 1, K]`` and the pair
    bias ``[*, 1, H, Q, K]``; triangle attention the same with the triangle bias.
    """
    return _attend(q, k, v, (bias_1, bias_2)) * torch.sigmoid(g)


def attention_0(q, k, v):
    """Ungated :func:`gated_attention_0`: ``[*, Q, H, C]``."""
    return _attend(q, k, v, ())


def attention_1(q, k, v, bias_1):
    """Ungated :func:`gated_attention_1`."""
    return _attend(q, k, v, (bias_1,))


def attention_2(q, k, v, bias_1, bias_2):
    """Ungated :func:`gated_attention_2`."""
    return _attend(q, k, v, (bias_1, bias_2))


def global_attention(q, k, v, bias):
    """``softmax(q k^T / sqrt(C) + bias) v`` with one key/value head shared by the queries.

    q: ``[*, R, H, C]`` pooled queries; k, v: ``[*, R, S, C]``; bias: the mask bias
    broadcasting to ``[*, R, H, S]``. Returns ``[*, R, H, C]`` (see [Note: global column
    attention]).
    """
    # [*, R, H, C]
    q = q / math.sqrt(q.shape[-1])
    # [*, R, H, S]
    s = torch.matmul(q, k.transpose(-1, -2)) + bias.to(q.dtype)
    p = torch.softmax(s, dim=-1)
    # [*, R, H, C]
    return torch.matmul(p, v)


def gated_global_attention(q, k, v, bias, m, w_g, b_g, w_o, b_o):
    """:func:`global_attention` gated per sequence and projected back to the MSA channels:
    ``linear_o(o * sigmoid(linear_g(m)))``, OpenFold's ``GlobalAttention`` after its
    projections (see [Note: global column attention]).

    q, k, v, bias: as :func:`global_attention`; m: ``[*, R, S, C_in]`` the layer-normed
    MSA; ``w_g [H * C, C_in]``, ``b_g [H * C]``, ``w_o [C_in, H * C]``, ``b_o [C_in]``: the
    gate's and the output's ``nn.Linear`` weights and biases. Returns ``[*, R, S, C_in]``.
    """
    # [*, R, H, C]
    o = global_attention(q, k, v, bias)
    # [*, R, S, H, C]: the layers' products written as matmuls plus biases, which the
    # compiler fuses (``F.linear`` with a bias reaches it as ``addmm``, which it leaves)
    g = torch.sigmoid(torch.matmul(m, w_g.t()) + b_g).unflatten(-1, o.shape[-2:])
    # [*, R, S, H * C]
    gated = (o.unsqueeze(-3) * g).flatten(-2)
    return torch.matmul(gated, w_o.t()) + b_o


_CORES: dict[tuple[int, bool], Callable] = {
    (0, True): gated_attention_0,
    (1, True): gated_attention_1,
    (2, True): gated_attention_2,
    (0, False): attention_0,
    (1, False): attention_1,
    (2, False): attention_2,
}

MAX_BIASES = 2


def attention_core(n_biases: int, gated: bool) -> Callable:
    """The plain PyTorch core taking ``n_biases`` biases (0 to 2), gated or not.

    Arguments are ``(q, k, v, *biases, g)`` when gated, ``(q, k, v, *biases)`` otherwise.
    """
    try:
        return _CORES[(n_biases, bool(gated))]
    except KeyError:
        raise ValueError(
            f"the attention core takes 0 to {MAX_BIASES} biases, not {n_biases}"
        ) from None


def _fresh_copy(fn: Callable, name: str) -> Callable:
    """``fn`` with its own code object named ``name`` (see [Note: one compiled callable...])."""
    code = fn.__code__.replace(co_name=name)
    if hasattr(code, "co_qualname"):
        code = code.replace(co_qualname=name)
    copy = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    copy.__doc__ = fn.__doc__
    copy.__module__ = fn.__module__
    copy.__wrapped__ = fn
    return copy


class CompiledFunctions:
    """Functions compiled by Flashlight once per key, under readable names, shared by every
    patched module of the process ([Note: one compiled callable per signature])."""

    def __init__(self):
        self._entries: dict[Hashable, tuple[str, Callable]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, plain: Callable, name: str, options: dict, spec: dict | None = None) -> Callable:
        """``plain`` compiled as ``name`` on first request for ``key``, then cached; what
        Flashlight leaves of it runs eagerly unless ``options`` say otherwise ([Note: the
        cores' remainder]). ``spec``: the arguments that make it again, listed in the
        cache folder for later processes' preloads ([Note: preloading the cores])."""
        options = {"remainder": "eager", **options}
        key = (key, _options_key(options))
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                import flashlight

                # traced capture: no Dynamo, and kept on disk for later processes
                # ([Note: traced capture] in flashlight.traced)
                entry = (name, flashlight.compile(_fresh_copy(plain, name), capture="trace", **options))
                self._entries[key] = entry
                if spec is not None:
                    _list_core({**spec, "options": repr(key[1])})
            return entry[1]

    def names(self) -> list[str]:
        """The names compiled so far, sorted."""
        with self._lock:
            return sorted(name for name, _ in self._entries.values())

    def captures(self) -> int:
        """Graphs traced so far by the compiled functions (not those loaded from disk)."""
        with self._lock:
            return sum(getattr(fn, "captures", 0) for _, fn in self._entries.values())

    def clear(self) -> None:
        """Forget every compiled function (the next request compiles again)."""
        with self._lock:
            self._entries.clear()


_compiled = CompiledFunctions()


def signature_name(n_biases: int, gated: bool, heads: int, width: int, dtype: torch.dtype) -> str:
    """A readable name for one core signature, e.g. ``gated_attention_2_h8_c32_bfloat16``."""
    base = attention_core(n_biases, gated).__name__
    return f"{base}_h{heads}_c{width}_{_dtype_name(dtype)}"


def compiled_core(
    n_biases: int,
    gated: bool,
    heads: int,
    width: int,
    dtype: torch.dtype,
    compile_options: dict[str, Any] | None = None,
) -> Callable:
    """The Flashlight-compiled core for one signature, compiled on first request.

    ``compile_options`` are passed to :func:`flashlight.compile` (e.g.
    ``{"autotune": False}``). The callable is cached for the life of the process.
    """
    plain = attention_core(n_biases, gated)
    name = signature_name(n_biases, gated, heads, width, dtype)
    key = (n_biases, bool(gated), int(heads), int(width), dtype)
    spec = {"kind": "core", "n_biases": n_biases, "gated": bool(gated), "heads": int(heads), "width": int(width),
            "dtype": _dtype_name(dtype)}
    return _compiled.get(key, plain, name, dict(compile_options or {}), spec)


def compiled_global_core(
    heads: int, width: int, dtype: torch.dtype, compile_options: dict[str, Any] | None = None,
    gated: bool = False,
) -> Callable:
    """The Flashlight-compiled :func:`global_attention` (``gated``:
    :func:`gated_global_attention`), e.g. ``gated_global_attention_h8_c8_float32``."""
    core = gated_global_attention if gated else global_attention
    name = f"{core.__name__}_h{heads}_c{width}_{_dtype_name(dtype)}"
    key = ("global", bool(gated), int(heads), int(width), dtype)
    spec = {"kind": "global", "gated": bool(gated), "heads": int(heads), "width": int(width),
            "dtype": _dtype_name(dtype)}
    return _compiled.get(key, core, name, dict(compile_options or {}), spec)


# [Note: preloading the cores]
# A patched model calls its compiled cores for the first time in its first forward, where
# each loads the graphs, kernels and launch plans an earlier process left in the cache
# folder ([Note: preloading kept graphs] in flashlight/traced.py). The cores a model will
# call are only known then (their bias counts come from the calling modules), so the
# cache folder lists every core compiled on this machine (``openfold/cores.json``: its
# kind, bias count, gating, heads, width, dtype and compile options), and
# ``patch_openfold`` preloads, on a thread while the caller builds its inputs, the listed
# cores whose heads, width, dtype and options match a patched module on a CUDA device.


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _options_key(options: dict[str, Any]) -> tuple:
    """Compile options as one hashable, ordered value (the cores' cache keys and list)."""
    return tuple(sorted(options.items()))


def _cores_file() -> str:
    import os

    from flashlight import settings

    return os.path.join(settings.get("cache_dir"), "openfold", "cores.json")


def _listed_cores() -> list[dict]:
    from flashlight.tuning_cache import read_json

    return read_json(_cores_file(), list)


def _list_core(spec: dict) -> None:
    """Add ``spec`` to the cache folder's list of compiled cores (atomically; a failure to
    write only costs a later process its preload)."""
    from flashlight import settings
    from flashlight.tuning_cache import write_json

    listed = _listed_cores()
    if settings.get("graph_cache") and spec not in listed:
        write_json(_cores_file(), listed + [spec])


def preload_listed(shapes: set[tuple[int, int, torch.dtype]], compile_options: dict[str, Any] | None = None,
                   devices: tuple[str, ...] = ("cuda",)) -> int:
    """Preload, on a thread, every listed core ([Note: preloading the cores]) with
    ``(heads, width, dtype)`` in ``shapes`` and these compile options; returns how many
    were queued."""
    from flashlight import prepare, settings

    if not (shapes and settings.get("graph_cache") and settings.get("prepare") and settings.get("preload")):
        return 0
    options = repr(_options_key({"remainder": "eager", **(compile_options or {})}))
    wanted = {(h, w, _dtype_name(d)) for h, w, d in shapes}
    jobs = []
    for spec in _listed_cores():
        if (spec.get("heads"), spec.get("width"), spec.get("dtype")) not in wanted or spec.get("options") != options:
            continue
        dtype = getattr(torch, spec["dtype"])
        if spec.get("kind") == "global":
            fn = compiled_global_core(spec["heads"], spec["width"], dtype, compile_options,
                                      gated=spec.get("gated", False))
        else:
            fn = compiled_core(spec["n_biases"], spec["gated"], spec["heads"], spec["width"], dtype, compile_options)
        if hasattr(fn, "preload"):  # a traced function
            jobs.append(lambda fn=fn: fn.preload(devices))
    prepare.preload(jobs)
    return len(jobs)


def compiled_names() -> list[str]:
    """Names of the signatures compiled so far (see :func:`signature_name`), sorted."""
    return _compiled.names()


def capture_count() -> int:
    """Graphs the compiled cores have traced in this process since the last
    :func:`clear_compiled` (a graph loaded from the disk cache is not counted)."""
    return _compiled.captures()


def clear_compiled() -> None:
    """Forget every compiled core (the next call compiles again)."""
    _compiled.clear()

"""Helpers shared by the compiler's test files (import them from here, not from another
test file): capturing the ATen graph the backend sees, seeded random inputs, the
attention every stage is tested on, checks against float64 eager, the plan the
pipeline makes for a function, and the ATen operations a compiled function still runs
outside its kernels (the profiler's view).

Tests by pipeline stage (see flashlight/README.md for the stages):

- lowering and the graph passes: ``test_compiler.py`` (also the online rewrite's
  algebra and many written variants), ``test_vocabulary.py``;
- tile skipping (``passes/skipping.py``, ``codegen_live.py``): ``test_skipping.py``;
- tiling and dot operands (``passes/tiling.py``, ``contractions.py``, ``tile_plan.py``):
  ``test_dot_operands.py``;
- the pass list, checkers and back-off search (``pipeline.py``, ``backoff.py``):
  ``test_pipeline.py``, ``test_backoff.py``, ``test_backoff_projections.py``;
- the printed IR and source of a few variants: ``test_golden.py`` (``tests/golden/``,
  rewritten by ``python -m tests.golden --update``);
- the whole compiler over the catalog: ``test_variants.py``, ``test_properties.py``;
- generality: several outputs of one loop (``passes/outputs.py``): ``test_multi_output.py``;
  gathers, slices and concatenations (``lower_gather.py``): ``test_gathers.py``,
  ``test_reindexing.py``; reductions over other dims feeding the attention (a pooled
  query, OpenFold's global attention written whole): ``test_global_pooled_query.py``;
  eager's dtypes and errors: ``test_eager_semantics.py``; graphs of symbolic sizes and
  constant folding: ``test_symbolic_sizes.py``;
- backend, runtime and tuning: ``test_backend.py``, ``test_runtime*.py``;
- training (the backward graph, what the forward saves, serial loops): ``test_backward.py``;
  dropout on attention probabilities drawn inside the kernels: ``test_dropout.py``.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch._dynamo.backends.common import aot_autograd

import flashlight


def capture(fn, *args):
    """The ATen graph ``fn`` becomes, as the backend sees it."""
    graphs = []

    def fw(gm, example_inputs):
        graphs.append(gm)
        return gm

    from flashlight.decompositions import decompositions

    torch.compiler.reset()
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=fw, decompositions=decompositions(inference=True)))(*args)
    torch.compiler.reset()
    return graphs[0]


H200_SHARED_MEMORY = 227 * 1024  # bytes per block (opt-in maximum on sm_90)


def shared_memory(compiled) -> int:
    """Shared memory in bytes from what ``KernelReport.aot_compile`` returns: Triton's
    compiled kernel (``.metadata.shared``), or its metadata itself."""
    meta = getattr(compiled, "metadata", compiled)
    shared = meta.get("shared") if isinstance(meta, Mapping) else getattr(meta, "shared", None)
    assert shared is not None, f"aot_compile returned no shared-memory size: {compiled!r}"
    return int(shared)


def rand(*shape, seed):
    """Standard normal values from a generator seeded with ``seed``."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def attention(q, k, v, bias):
    """Attention with an additive bias: ``softmax(q kᵀ + bias) v``."""
    s = q @ k.transpose(-1, -2) + bias
    return torch.softmax(s, dim=-1) @ v


def gated_attention_block(x, wq, wk, wv, wg, wo, heads=3):
    """Projections, attention over ``heads`` heads, a sigmoid gate and an output
    projection: x ``[B, L, C]``, wq/wk/wv/wg ``[C, H*D]``, wo ``[H*D, C]``."""
    B, L, _ = x.shape
    D = wq.shape[1] // heads
    q, k, v = ((x @ w).view(B, L, heads, D).transpose(1, 2) for w in (wq, wk, wv))  # [B, H, L, D]
    o = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, dim=-1) @ v
    o = o.transpose(1, 2).reshape(B, L, heads * D) * torch.sigmoid(x @ wg)  # [B, L, H*D]
    return o @ wo


def attention_inputs(seed, L=19, D=16):
    """q, k, v ``[2, 3, L, D]`` and a bias ``[3, L, L]`` for :func:`attention`."""
    return rand(2, 3, L, D, seed=seed), rand(2, 3, L, D, seed=seed + 1), rand(2, 3, L, D, seed=seed + 2), rand(3, L, L, seed=seed + 3)


def run_with_report(fn, args):
    """``fn(*args)`` compiled by Flashlight, without gradients, and what that one compile
    generated (``flashlight.explain``'s report, without compiling a second time)."""
    from flashlight.report import ExplainReport

    report = ExplainReport()
    torch.compiler.reset()
    with torch.no_grad():
        out = flashlight.compile(fn, report=report)(*args)
    torch.compiler.reset()
    return out, report


def matches_float64(fn, args):
    """``fn`` compiled by Flashlight gives finite values matching ``fn`` in float64;
    returns what that one compile generated (as ``flashlight.explain`` reports it, without
    compiling again)."""
    out, report = run_with_report(fn, args)
    ref = fn(*(a.double() for a in args))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    return report


# ATen operations that only allocate, copy or view memory: all that calling compiled
# Flashlight kernels may run besides them (the Triton interpreter copies its arguments)
LAYOUT_OPS = frozenset(f"aten::{op}" for op in (
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "set_", "copy_", "clone",
    "contiguous", "lift_fresh", "detach", "alias", "view", "_unsafe_view", "reshape", "_reshape_alias",
    "as_strided", "expand", "permute", "transpose", "t", "unsqueeze", "squeeze", "resolve_conj", "resolve_neg",
))  # not casts (``_to_copy``): a dtype conversion left outside is work the kernel should do


def aten_outside_kernels(fn, args) -> list[str]:
    """The ATen operations other than allocations, copies and views (:data:`LAYOUT_OPS`)
    that one call ``fn(*args)`` runs, seen by the profiler (independently of
    ``explain()``): arithmetic, lookups, slicing or concatenation left outside the
    kernels. Call it after a first call, so that compiling is not profiled."""
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(*args)
    return sorted({e.name for e in prof.events() if e.name.startswith("aten::") and e.name not in LAYOUT_OPS})


def plan_of(fn, args):
    """What the pipeline decides for the ATen graph of ``fn``."""
    from flashlight.lower import lower
    from flashlight.pipeline import compile_graph

    return compile_graph(lower(capture(fn, *args)))


# functions written with ops each stage must handle (the tests compile them whole)


def elementary_functions(q, k, v):  # erf, expm1, log1p, sin, cos, exp2, log2, reciprocal
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    t = torch.erf(s) + torch.expm1(0.5 * s) + torch.log1p(s.abs()) + torch.sin(s) * torch.cos(0.3 * s)
    return torch.softmax(t + torch.exp2(-s.abs()) + torch.log2(1.0 + s * s) + torch.reciprocal(2.0 + s.abs()), -1) @ v


def rounding_divisions(q, k, v):  # Python's // and % of negative integers; trunc rounding
    L = q.shape[-2]
    i = torch.arange(L)
    d = i[None, :] - i[:, None]  # [L, L], negative below the diagonal
    bias = 0.1 * torch.div(d, 5, rounding_mode="floor") - 0.05 * (d - 3) % 7 + 0.02 * torch.div(d, 3, rounding_mode="trunc")
    return torch.softmax(q @ k.transpose(-1, -2) + bias, -1) @ v


def cdist_scores(q, k, v):  # an RBF kernel over distances: softmax(-|q_i - k_j|^2 / 2)
    return torch.softmax(-0.5 * torch.cdist(q, k) ** 2, dim=-1) @ v


# stand-ins for Triton's launch objects in the runtime's tests


class FakeTuner:
    """Stands in for the ``triton.autotune`` wrapper: launching it "tunes" (its best
    configuration is the last one) and records the launch's arguments."""

    def __init__(self, configs):
        self.configs, self.launches, self.best_config = configs, [], configs[-1]

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launches.append(args)


class FakeJit:
    """Stands in for a JIT function launched with a chosen configuration: records it."""

    def __init__(self):
        self.launches: list[dict] = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launches.append(kw)


def stand_in_variants(calls: list[str]):
    """A patched and a stock call (for the stock-or-kernel choice) that record their
    name in ``calls`` and return 1.0 and 2.0."""
    def patched():
        calls.append("kernel")
        return torch.tensor(1.0)

    def stock():
        calls.append("stock")
        return torch.tensor(2.0)

    return patched, stock


def computes_softmax(aten_ops) -> bool:
    """Whether a kernel's ATen operations include a softmax: ``_softmax`` itself, or its
    row max and exponentials (softmax arrives decomposed into them)."""
    ops = set(aten_ops)
    return any("softmax" in op for op in ops) or {"amax.default", "exp.default"} <= ops


SOFTMAX_PARTS = ("_softmax", "softmax", "amax", "exp")  # ATen names a fallen-back softmax would show

"""Every attention variant of the catalog (:mod:`bench.variants`) through Flashlight.

For each variant, in float32 and bfloat16:

- the compiled function matches the variant evaluated in float64 on the same inputs,
  every output (a variant may return several) finite, in the eager dtype and shape, on
  fresh random inputs (seeded from the test id, so a failure reproduces) whose lengths
  are not multiples of any tile;
- :func:`flashlight.explain` reports exactly one Flashlight kernel and no fallback op
  (for a whole module with its projections, :data:`MODULES`: the attention in one
  kernel, the projections' matmuls outside);
- every kernel builds ahead of time for Hopper (sm_90) within the H200's shared memory,
  at the default shape and at the head dims of the variant's GPU shapes.

Then the semantics that matter at the edges: non-contiguous inputs, lengths changing
between calls without a compile per length, rows whose scores are all ``-inf`` (the
decision: the output matches eager, NaN in that row as ``torch.softmax`` gives, every
other row finite) and NaN inputs propagating exactly as in eager. Last, variants outside
the catalog, written after the compiler (scores through a sigmoid or a squared ReLU,
masks built inside the function, a learned temperature, a returned log-sum-exp, a gated
residual, T5's bucketed relative positions, a mask applied after the softmax; then BERT's
float mask, Hugging Face's ``finfo.min`` fill, einsums, attention without a softmax, a
learned Gaussian distance bias, per-query and per-key biases, log-length scaling, gated
keys, an integer key mask, layer norms of q and k; a SiLU gate before a layer norm, a
learned key and value appended to every sequence): one kernel each.

Kernels run on CPU through the Triton interpreter (``TRITON_INTERPRET=1``, set by
``conftest.py``), so shapes stay small.
"""
from __future__ import annotations

import math
import zlib

import pytest
import torch
import torch.nn.functional as F

import flashlight
from bench.variants import VARIANTS
from flashlight.report import ExplainReport
from bench.variants_base import as_outputs
from tests.helpers import H200_SHARED_MEMORY, SOFTMAX_PARTS, aten_outside_kernels, computes_softmax, shared_memory

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Scores pass through exp, so float32 keeps ~1e-4; bfloat16 rounds inputs, P and the output.
TOLERANCES = {
    torch.float32: {"rtol": 1e-4, "atol": 1e-4},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch: no graphs or guards left over from another test."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------


def _generator(request, salt: str = "") -> torch.Generator:
    seed = zlib.crc32((request.node.nodeid + salt).encode())
    return torch.Generator().manual_seed(seed)


def _float64(x):
    return x.to(torch.float64) if torch.is_tensor(x) and x.is_floating_point() else x


def _reference(fn, inputs):
    """``fn`` evaluated in float64 on the same values."""
    with torch.no_grad():
        return fn(*[_float64(x) for x in inputs])


def _describe(name: str, dtype: torch.dtype, shape: dict, inputs) -> str:
    layout = ", ".join(
        f"{tuple(x.shape)}{'' if x.is_contiguous() else ' strided'}" for x in inputs if torch.is_tensor(x)
    )
    return f"variant {name}, {dtype}, shape {shape}, inputs [{layout}]"


def _assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, context: str) -> None:
    assert out.shape == ref.shape, f"{context}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    assert torch.isfinite(ref).all(), f"{context}: the float64 reference itself is not finite"
    bad = ~torch.isfinite(out)
    assert not bad.any(), f"{context}: {int(bad.sum())} non-finite output values of {out.numel()}"
    torch.testing.assert_close(
        out.to(torch.float64), ref, **TOLERANCES[dtype], msg=lambda m: f"{context}\n{m}"
    )


def _assert_matches_with_nan(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, context: str) -> None:
    """NaN exactly where the reference has NaN, everything else finite and close."""
    assert out.shape == ref.shape, f"{context}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    nan_out, nan_ref = torch.isnan(out), torch.isnan(ref)
    assert torch.equal(nan_out, nan_ref), (
        f"{context}: NaN at {int(nan_out.sum())} positions, eager has NaN at {int(nan_ref.sum())}; "
        f"first differing index {tuple(torch.nonzero(nan_out != nan_ref)[0].tolist())}"
    )
    assert torch.isfinite(out[~nan_out]).all(), f"{context}: non-NaN values that are not finite"
    torch.testing.assert_close(
        out[~nan_out].to(torch.float64), ref[~nan_ref], **TOLERANCES[dtype], msg=lambda m: f"{context}\n{m}"
    )


# Variants written as a whole module, projections included (OpenFold's global column
# attention): the attention is one Flashlight kernel, and matmuls that are single
# operations (the projections) stay outside it (Inductor compiles them in production);
# tests/test_global_pooled_query.py checks that no kernel computes anything twice.
MODULES = ("global_column",)


def _assert_one_kernel_builds_for_hopper(fn, inputs, context: str, module: bool = False) -> None:
    report = flashlight.explain(fn, *inputs)
    if module:
        attention = [k for k in report.kernels if computes_softmax(k.aten_ops)]
        assert len(attention) == 1, f"{context}: expected the attention in one Flashlight kernel\n{report}"
        outside = [op.name for op in report.fallback_ops if op.name.startswith(("bmm", *SOFTMAX_PARTS))]
        assert not outside, f"{context}: attention left outside the kernel\n{report}"
    else:
        assert len(report.kernels) == 1, f"{context}: expected one Flashlight kernel\n{report}"
        assert report.fallback_ops == [], f"{context}: operations left outside the kernel\n{report}"
    for kernel in report.kernels:
        assert isinstance(kernel.source, str) and "triton" in kernel.source, f"{context}: no Triton source"
        assert len(kernel.aten_ops) > 0, f"{context}: the kernel reports no absorbed ATen ops"
        shared = shared_memory(kernel.aot_compile(90))
        assert 0 <= shared <= H200_SHARED_MEMORY, (
            f"{context}: kernel {kernel.name} needs {shared} bytes of shared memory on sm_90, "
            f"the H200 has {H200_SHARED_MEMORY}"
        )


# ----------------------------------------------------------------------------------------
# Every variant, both dtypes
# ----------------------------------------------------------------------------------------

VARIANT_PARAMS = [pytest.param(name, id=name) for name in VARIANTS]
DTYPE_PARAMS = [pytest.param(dtype, id=key) for key, dtype in DTYPES.items()]


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", VARIANT_PARAMS)
def test_matches_float64(name, dtype, request):
    v = VARIANTS[name]
    gen = _generator(request)
    compiled = flashlight.compile(v.fn)
    # two calls with different random values: the kernel must read its inputs, not the
    # values it was first compiled with
    for call in range(2):
        inputs = v.make_inputs(v.default_shape, dtype, "cpu", gen)
        context = _describe(name, dtype, v.default_shape, inputs) + f", call {call + 1}"
        with torch.no_grad():
            outs = as_outputs(compiled(*inputs))
            eagers = as_outputs(v.fn(*inputs))
        refs = as_outputs(_reference(v.fn, inputs))
        assert len(outs) == len(eagers) == len(refs), f"{context}: {len(outs)} outputs, eager gives {len(eagers)}"
        for n, (out, eager, ref) in enumerate(zip(outs, eagers, refs)):
            where = f"{context}, output {n}" if len(outs) > 1 else context
            assert out.dtype == eager.dtype, f"{where}: dtype {out.dtype}, eager gives {eager.dtype}"
            _assert_matches(out, ref, dtype, where)


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("name", VARIANT_PARAMS)
def test_one_kernel_that_builds_for_hopper(name, dtype, request):
    v = VARIANTS[name]
    inputs = v.make_inputs(v.default_shape, dtype, "cpu", _generator(request))
    _assert_one_kernel_builds_for_hopper(v.fn, inputs, _describe(name, dtype, v.default_shape, inputs),
                                         module=name in MODULES)


# Lengths and counts shrunk so the interpreter can run it; head dims kept as on the GPU.
_SHRINK = {"B": 1, "H": 2, "Hkv": 1, "L": 21, "Lq": 19, "Lkv": 27, "S": 5, "N": 11, "R": 3, "n_docs": 3}


def _gpu_head_dims_shape(name: str) -> dict:
    """The variant's GPU shape with the largest head dims, at interpreter-sized lengths."""
    v = VARIANTS[name]
    widest = max(v.bench_shapes, key=lambda s: sum(s.get(k, 0) for k in ("D", "Dv", "c")))
    shape = {k: min(n, _SHRINK[k]) if k in _SHRINK else n for k, n in widest.items()}
    if "P" in shape:
        shape["P"] = shape["L"] // 2
    return shape


# bfloat16 for every variant; float32 (with TF32 or IEEE) where models run attention in
# it at these head dims: OpenFold's Evoformer. Float32 builds are slow (tens of seconds each).
GPU_HEAD_DIM_CASES = [pytest.param(name, torch.bfloat16, id=f"{name}-bf16") for name in VARIANTS] + [
    pytest.param(name, torch.float32, id=f"{name}-fp32")
    for name in ("msa_row_pair_bias", "msa_column", "triangle_start", "triangle_end")
]


@pytest.mark.parametrize("name, dtype", GPU_HEAD_DIM_CASES)
def test_gpu_head_dims_build_for_hopper(name, dtype, request):
    v = VARIANTS[name]
    shape = _gpu_head_dims_shape(name)
    inputs = v.make_inputs(shape, dtype, "cpu", _generator(request))
    _assert_one_kernel_builds_for_hopper(v.fn, inputs, _describe(name, dtype, shape, inputs), module=name in MODULES)


# ----------------------------------------------------------------------------------------
# Non-contiguous inputs
# ----------------------------------------------------------------------------------------


def _column_major(x: torch.Tensor) -> torch.Tensor:
    """Same values, last two dims stored transposed."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def _every_other(x: torch.Tensor) -> torch.Tensor:
    """Same values, last dim with stride 2 (a view into a buffer twice as wide)."""
    buf = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    buf[..., ::2] = x
    return buf[..., ::2]


@pytest.mark.parametrize(
    "name", ["vanilla", "alibi", "gqa", "cross_attention", "document_mask", "manual_softmax", "triangle_start"]
)
def test_noncontiguous_inputs(name, request):
    v = VARIANTS[name]
    dtype = torch.float32
    inputs = v.make_inputs(v.default_shape, dtype, "cpu", _generator(request))
    relaid = []
    for n, x in enumerate(inputs):
        if x.dim() >= 2:
            x = (_column_major if n % 2 == 0 else _every_other)(x)
            assert not x.is_contiguous()
        relaid.append(x)
    context = _describe(name, dtype, v.default_shape, relaid)
    with torch.no_grad():
        out = flashlight.compile(v.fn)(*relaid)
    _assert_matches(out, _reference(v.fn, inputs), dtype, context)


# ----------------------------------------------------------------------------------------
# Lengths change between calls
# ----------------------------------------------------------------------------------------

LENGTHS = (17, 29, 40, 23)
MAX_COMPILES = 2  # the first length static, then one dynamic-shape compile at most


def _run_lengths(name: str, request) -> None:
    v = VARIANTS[name]
    compiled = flashlight.compile(v.fn)
    gen = _generator(request)
    for length in LENGTHS:
        shape = {**v.default_shape, "L": length}
        inputs = v.make_inputs(shape, torch.float32, "cpu", gen)
        with torch.no_grad():
            out = compiled(*inputs)
        _assert_matches(out, _reference(v.fn, inputs), torch.float32, _describe(name, torch.float32, shape, inputs))


@pytest.mark.parametrize("name", ["msa_row_pair_bias", "causal_index"])
def test_length_change_graph_compiles_bounded(name, request):
    from torch._dynamo.utils import counters

    counters.clear()
    _run_lengths(name, request)
    graphs = counters["stats"]["unique_graphs"]
    assert 1 <= graphs <= MAX_COMPILES, (
        f"variant {name}: {graphs} graph compiles for lengths {LENGTHS}, at most {MAX_COMPILES} allowed"
    )


def _kernel_compile_counter():
    try:
        from flashlight import backend
    except ImportError:
        return None
    return getattr(backend, "compile_count", None)


@pytest.mark.xfail(_kernel_compile_counter() is None, reason="waiting for compile counter", strict=True)
@pytest.mark.parametrize("name", ["msa_row_pair_bias", "causal_index"])
def test_length_change_kernel_compiles_bounded(name, request):
    compile_count = _kernel_compile_counter()
    assert compile_count is not None, "flashlight.backend.compile_count() is missing"
    before = compile_count()
    _run_lengths(name, request)
    kernels = compile_count() - before  # 0 when an earlier test already built the same source
    assert kernels <= MAX_COMPILES, (
        f"variant {name}: {kernels} Flashlight kernel compiles for lengths {LENGTHS}, "
        f"at most {MAX_COMPILES} allowed"
    )


# ----------------------------------------------------------------------------------------
# Rows with every score -inf, and NaN inputs
# ----------------------------------------------------------------------------------------


def masked_softmax_attention(q, k, v, keep):
    # q: [B, H, Lq, D]; k, v: [B, H, Lkv, D]; keep: [B, 1, Lq, Lkv] bool
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def masked_manual_softmax_attention(q, k, v, keep):
    # the same with the softmax written out: exp(-inf - (-inf)) is NaN there too
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    s = torch.where(keep, s, float("-inf"))
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=-1, keepdim=True)) @ v


@pytest.mark.parametrize("fn", [masked_softmax_attention, masked_manual_softmax_attention],
                         ids=["torch_softmax", "manual_softmax"])
def test_fully_masked_rows_match_eager(fn, request):
    gen = _generator(request)
    B, H, Lq, Lkv, D = 2, 2, 21, 30, 16
    q = torch.randn(B, H, Lq, D, generator=gen)
    k = torch.randn(B, H, Lkv, D, generator=gen)
    v = torch.randn(B, H, Lkv, D, generator=gen)
    keep = torch.rand(B, 1, Lq, Lkv, generator=gen) < 0.7
    keep[..., 0] = True  # every row keeps a key ...
    keep[0, 0, 3] = False  # ... but these, where every score is -inf
    keep[1, 0, Lq - 1] = False
    inputs = (q, k, v, keep)
    ref = _reference(fn, inputs)
    expected_nan_rows = torch.zeros(B, 1, Lq, dtype=torch.bool)
    expected_nan_rows[0, 0, 3] = expected_nan_rows[1, 0, Lq - 1] = True
    assert torch.equal(torch.isnan(ref).any(-1), expected_nan_rows.expand(B, H, Lq))  # eager's behaviour
    with torch.no_grad():
        out = flashlight.compile(fn)(*inputs)
    _assert_matches_with_nan(out, ref, torch.float32, f"{fn.__name__}, fully masked rows")


@pytest.mark.parametrize(
    "name, which, index",
    [
        ("vanilla", 0, (0, 1, 5, 3)),  # q: that query row becomes NaN
        ("vanilla", 1, (1, 0, 7, 2)),  # k: every row of that head sees the NaN score
        ("vanilla", 2, (0, 0, 4, 1)),  # v: one output column of that head
        ("causal_tril", 0, (0, 2, 11, 0)),
        ("causal_tril", 1, (0, 1, 30, 5)),  # k: rows before 30 mask it out and stay finite
    ],
    ids=["vanilla-q", "vanilla-k", "vanilla-v", "causal-q", "causal-k"],
)
def test_nan_inputs_propagate_like_eager(name, which, index, request):
    v = VARIANTS[name]
    inputs = list(v.make_inputs(v.default_shape, torch.float32, "cpu", _generator(request)))
    inputs[which] = inputs[which].clone()
    inputs[which][index] = float("nan")
    ref = _reference(v.fn, inputs)
    assert torch.isnan(ref).any() and not torch.isnan(ref).all()
    with torch.no_grad():
        out = flashlight.compile(v.fn)(*inputs)
    _assert_matches_with_nan(out, ref, torch.float32, f"variant {name}, NaN in input {which} at {index}")


# ---------------------------------------------------------------------------- beyond the catalog
# Variants written after the compiler, to try its generality: each is one kernel, with
# nothing of its arithmetic left outside (the profiler's view), and matches float64.


def _sigmoid_scores(q, k, v, b):  # no softmax: sigmoid(q k^T / sqrt(d) + b) @ v
    return torch.sigmoid(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + b) @ v


def _relu_squared(q, k, v):  # relu(s)^2 normalised by its row sum (no row max)
    s = torch.relu(q @ k.transpose(-1, -2)) ** 2
    return (s / (s.sum(-1, keepdim=True) + 1e-6)) @ v


def _mask_built_inside(q, k, v):  # a causal mask made from torch.ones(...).tril() in the function
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    s = (q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf"))
    return torch.softmax(s * q.shape[-1] ** -0.5, dim=-1) @ v


def _lengths_mask(q, k, v, lengths):  # key padding from per-batch lengths: arange < length
    keep = torch.arange(k.shape[-2])[None, :] < lengths[:, None]  # [B, K]
    s = (q @ k.transpose(-1, -2)).masked_fill(~keep[:, None, None, :], -1e9)
    return torch.softmax(s, -1) @ v


def _softplus_temperature(q, k, v, t):  # a learned temperature per head, through softplus
    return torch.softmax((q @ k.transpose(-1, -2)) / F.softplus(t)[None, :, None, None], -1) @ v


def _output_and_logsumexp(q, k, v):  # the output and each row's log-sum-exp, both returned
    s = q @ k.transpose(-1, -2) * 0.25
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def _tanh_gated_residual(q, k, v, x, g):  # x + tanh(g) * attention
    return x + torch.tanh(g) * (torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v)


def _t5_buckets(q, k, v, table):  # T5's log-spaced relative-position buckets, a bias looked up per head
    rel = torch.arange(k.shape[-2])[None, :] - torch.arange(q.shape[-2])[:, None]  # [Lq, Lk]
    n = -rel.clamp(max=0)  # distance to the past
    far = 8 + (torch.log(n.float().clamp(min=1) / 8) / math.log(128 / 8) * 24).long()
    bucket = torch.where(n < 8, n, far.clamp(max=31))
    return torch.softmax(q @ k.transpose(-1, -2) + table[bucket].permute(2, 0, 1), -1) @ v  # table [32, H]


def _renormalised_after_mask(q, k, v, keep):  # a key mask applied to p, then p renormalised
    p = torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) * keep
    return (p / p.sum(-1, keepdim=True).clamp_min(1e-9)) @ v


def _exp_of_log_softmax(q, k, v):  # the weights as exp(log_softmax)
    return torch.exp(F.log_softmax(q @ k.transpose(-1, -2) * 0.25, -1)) @ v


def _bert_float_mask(q, k, v, m):  # BERT's (1 - mask) * -10000 from a 0/1 float key mask [B, L]
    additive = (1.0 - m[:, None, None, :]) * -10000.0  # [B, 1, 1, L]
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + additive, -1) @ v


def _finfo_min_where(q, k, v, keep):  # where(mask, s, finfo.min), softmax with a dtype argument
    s = torch.where(keep, q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, torch.finfo(q.dtype).min)
    return torch.softmax(s, -1, dtype=torch.float32).to(q.dtype) @ v


def _einsum_attention(q, k, v):  # both products written as einsums
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * 0.25
    return torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)


def _linear_causal(q, k, v):  # no softmax at all: causal (q k^T) v scaled by the length
    return (q @ k.transpose(-1, -2)).tril() @ v / q.shape[-2]


def _gaussian_distance_bias(q, k, v, a, w):  # a learned Gaussian of |i - j| per head: a_h exp(-d^2 / 2 w_h^2)
    d2 = ((torch.arange(q.shape[-2])[:, None] - torch.arange(k.shape[-2])[None, :]) ** 2).float()
    bias = a[:, None, None] * torch.exp(-d2[None] / (2 * w[:, None, None] ** 2))  # [H, L, L]
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + bias, -1) @ v


def _rank_one_bias(q, k, v, a, c):  # a per-query plus a per-key bias, an outer sum [B, H, L, L]
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + a[..., :, None] + c[..., None, :], -1) @ v


def _log_n_scaling(q, k, v):  # scores scaled by log(n) / log(16), n the number of keys
    return torch.softmax(q @ k.transpose(-1, -2) * (math.log(k.shape[-2]) / math.log(16)) * 0.25, -1) @ v


def _gated_keys(q, k, v, gk):  # keys gated before the product
    return torch.softmax(q @ (k * torch.sigmoid(gk)).transpose(-1, -2) * 0.25, -1) @ v


def _int_key_mask(q, k, v, m):  # masked_fill(mask == 0, -inf) with an int64 key mask [B, L]
    s = (q @ k.transpose(-1, -2) * 0.25).masked_fill(m[:, None, None, :] == 0, float("-inf"))
    return torch.softmax(s, -1) @ v


def _qk_layer_norm(q, k, v, wq, wk):  # a layer norm over the head width of q and of k
    q, k = F.layer_norm(q, (q.shape[-1],), wq), F.layer_norm(k, (k.shape[-1],), wk)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v


def _kv_cache_cat(q, k, v, k_past, v_past):  # keys and values appended to a cache of 11 positions
    k_all, v_all = torch.cat([k_past, k], -2), torch.cat([v_past, v], -2)
    return torch.softmax(q @ k_all.transpose(-1, -2) * 0.25, -1) @ v_all


def _alibi_inside(q, k, v):  # ALiBi's slopes and distances computed in the function
    heads, n = q.shape[1], q.shape[2]
    slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1) / heads)
    pos = torch.arange(n)
    bias = -slopes[:, None, None] * (pos[None, :, None] - pos[None, None, :]).abs()
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + bias, -1) @ v


def _full_triu_mask(q, k, v):  # a causal mask as full(-inf).triu(1), added
    m = torch.full((q.shape[2], q.shape[2]), float("-inf")).triu(1)
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + m, -1) @ v


def _clamp_cap(q, k, v):  # scores clamped to [-5, 5]
    return torch.softmax(torch.clamp(q @ k.transpose(-1, -2) * 0.25, -5, 5), -1) @ v


def _gqa_broadcast(q, k, v):  # queries grouped [B, 1, G, L, D] against one key head [B, 1, 1, L, D]
    q5 = q.view(q.shape[0], 1, *q.shape[1:])
    k5, v5 = k[:, :1, None], v[:, :1, None]
    return (torch.softmax(q5 @ k5.transpose(-1, -2) * 0.25, -1) @ v5).flatten(1, 2)


def _two_attentions(q, k, v, b):  # a plain and a masked attention of the same q, k, v, summed
    s = q @ k.transpose(-1, -2) * 0.25
    return torch.softmax(s, -1) @ v + torch.softmax(s + b, -1) @ v


def _multiplicative_mask(q, k, v, m):  # scores times a 0/1 key mask (masked scores 0, not -inf)
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25 * m, -1) @ v


def _temperature_after_bias(q, k, v, b, t):  # (s + b) / t with a learned scalar t
    return torch.softmax((q @ k.transpose(-1, -2) + b) / t, -1) @ v


def _max_subtracted_by_hand(q, k, v):  # the row max subtracted (detached) before the softmax
    s = q @ k.transpose(-1, -2) * 0.25
    return torch.softmax(s - s.amax(-1, keepdim=True).detach(), -1) @ v


def _max_values_log_softmax(q, k, v):  # max(...).values subtracted, weights as exp(log_softmax)
    s = q @ k.transpose(-1, -2) * 0.25
    return torch.log_softmax(s - s.max(-1, keepdim=True).values, -1).exp() @ v


def _silu_gate_layer_norm(q, k, v, gate):  # output gated by SiLU, then a layer norm over the head width
    o = torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v * F.silu(gate)
    return F.layer_norm(o, (o.shape[-1],))


def _learned_kv_token(q, k, v, k_token, v_token):  # nn.MultiheadAttention's add_bias_kv: one learned key and value
    size = (*k.shape[:2], 1, k.shape[-1])
    k = torch.cat([k, k_token.expand(size)], -2)
    v = torch.cat([v, v_token.expand(size)], -2)
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v


def _point_distances(q, k, v, q_points, k_points, w):  # invariant point attention's squared distances of points
    # q_points, k_points: [B, H, L, P * 3], P points of 3 coordinates per position and head
    a, b = q_points.unflatten(-1, (4, 3)), k_points.unflatten(-1, (4, 3))
    d2 = ((a[:, :, :, None] - b[:, :, None]) ** 2).sum(dim=(-1, -2))  # [B, H, L, L]
    s = q @ k.transpose(-1, -2) * 0.25 - 0.5 * F.softplus(w)[:, None, None] * d2
    return torch.softmax(s, -1) @ v


def _entropy_too(q, k, v):  # the output and each row's attention entropy
    log_p = torch.log_softmax(q @ k.transpose(-1, -2) * 0.25, -1)
    p = log_p.exp()
    return p @ v, -(p * log_p).sum(-1)


def _two_temperatures(q, k, v, b):  # a softmax of the biased scores at two temperatures, mixed
    s = q @ k.transpose(-1, -2) * 0.25 + b
    return (0.7 * torch.softmax(s, -1) + 0.3 * torch.softmax(2 * s, -1)) @ v


def _megatron_baddbmm(q, k, v):  # [B*H, L, D] baddbmm into an empty buffer with beta 0, then bmm
    b, h, n, d = q.shape
    q, k, v = (t.reshape(b * h, n, d) for t in (q, k, v))
    buffer = torch.empty(b * h, n, n, dtype=q.dtype, device=q.device)
    s = torch.baddbmm(buffer, q, k.transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(d))
    return torch.bmm(torch.softmax(s, -1), v).view(b, h, n, d)


def _eval_dropout(q, k, v):  # dropout of the probabilities in eval mode: the identity
    return F.dropout(torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1), 0.1, training=False) @ v


def _talking_heads(q, k, v, w_pre):  # heads mixed before the softmax: s'[h] = sum_g W[h, g] s[g]
    s = torch.einsum("bgqd,bgkd->bgqk", q, k) * q.shape[-1] ** -0.5
    return torch.softmax(torch.einsum("hg,bgqk->bhqk", w_pre, s), -1) @ v


def _baddbmm_alibi(q, k, v, slopes):  # BLOOM: baddbmm of an ALiBi row bias over batch x heads, a float32 softmax
    b, h, n, d = q.shape
    alibi = (slopes[:, None] * torch.arange(n, dtype=q.dtype)[None, :])[None].expand(b, h, n).reshape(b * h, 1, n)
    s = torch.baddbmm(alibi, q.reshape(b * h, n, d), k.reshape(b * h, n, d).transpose(1, 2), beta=1.0, alpha=0.25)
    return torch.bmm(F.softmax(s.float(), dim=-1).to(q.dtype), v.reshape(b * h, n, d)).view(b, h, n, d)


def _swin_table_bias(q, k, v, table):  # a relative bias gathered from a table [2L - 1, H] by an index
    n = q.shape[2]
    index = torch.arange(n)[:, None] - torch.arange(n)[None, :] + n - 1
    bias = table[index.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous()
    return torch.softmax(q @ k.transpose(-2, -1) * 0.25 + bias.unsqueeze(0), -1) @ v


def _softmax_over_queries(q, k, v):  # weights normalised over dim -2 of k q^T, transposed back
    return torch.softmax(k @ q.transpose(-2, -1) * 0.25, dim=-2).transpose(-2, -1) @ v


def _decoupled_rotary(q, k, v, q_rope, k_rope):  # queries and keys with a rotary part, one shared rotary key head
    qf, kf = torch.cat([q, q_rope], -1), torch.cat([k, k_rope.expand(-1, q.shape[1], -1, -1)], -1)
    return torch.softmax(qf @ kf.transpose(-2, -1) / math.sqrt(qf.shape[-1]), -1) @ v


def _rotate_half_rotary(q, k, v, keep, cos, sin):  # ESM-2: rotate_half rotary on q and k, a key padding mask
    def rotated(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    q, k = q * cos + rotated(q) * sin, k * cos + rotated(k) * sin
    s = ((q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)).masked_fill(~keep[:, None, None, :], float("-inf"))
    return torch.softmax(s, -1) @ v

ROUND = {  # name: (function, its inputs beyond q, k, v of [B 2, H 3, L 37, D 16])
    "sigmoid_scores": (_sigmoid_scores, lambda r: (r(3, 37, 37),)),
    "relu_squared": (_relu_squared, lambda r: ()),
    "mask_built_inside": (_mask_built_inside, lambda r: ()),
    "lengths_mask": (_lengths_mask, lambda r: (torch.tensor([37, 20]),)),
    "softplus_temperature": (_softplus_temperature, lambda r: (r(3),)),
    "output_and_logsumexp": (_output_and_logsumexp, lambda r: ()),
    "tanh_gated_residual": (_tanh_gated_residual, lambda r: (r(2, 3, 37, 16), r(2, 3, 37, 16))),
    "t5_buckets": (_t5_buckets, lambda r: (r(32, 3),)),
    "renormalised_after_mask": (_renormalised_after_mask, lambda r: ((r(2, 1, 1, 37) > -0.5).float(),)),
    "exp_of_log_softmax": (_exp_of_log_softmax, lambda r: ()),
    "bert_float_mask": (_bert_float_mask, lambda r: ((r(2, 37) > -0.7).float(),)),
    "finfo_min_where": (_finfo_min_where, lambda r: (r(2, 1, 37, 37) > -1.0,)),
    "einsum_attention": (_einsum_attention, lambda r: ()),
    "linear_causal": (_linear_causal, lambda r: ()),
    "gaussian_distance_bias": (_gaussian_distance_bias, lambda r: (r(3), r(3).abs() * 3 + 1)),
    "rank_one_bias": (_rank_one_bias, lambda r: (r(2, 3, 37), r(2, 3, 37))),
    "log_n_scaling": (_log_n_scaling, lambda r: ()),
    "gated_keys": (_gated_keys, lambda r: (r(2, 3, 37, 16),)),
    "int_key_mask": (_int_key_mask, lambda r: ((r(2, 37) > -0.7).long(),)),
    "qk_layer_norm": (_qk_layer_norm, lambda r: (1 + 0.1 * r(16), 1 + 0.1 * r(16))),
    "kv_cache_cat": (_kv_cache_cat, lambda r: (r(2, 3, 11, 16), r(2, 3, 11, 16))),
    "alibi_inside": (_alibi_inside, lambda r: ()),
    "full_triu_mask": (_full_triu_mask, lambda r: ()),
    "clamp_cap": (_clamp_cap, lambda r: ()),
    "gqa_broadcast": (_gqa_broadcast, lambda r: ()),
    "two_attentions": (_two_attentions, lambda r: (r(2, 1, 1, 37),)),
    "multiplicative_mask": (_multiplicative_mask, lambda r: ((r(2, 1, 1, 37) > -0.5).float(),)),
    "temperature_after_bias": (_temperature_after_bias, lambda r: (r(1, 3, 37, 37), r(()).abs() + 0.5)),
    "max_subtracted_by_hand": (_max_subtracted_by_hand, lambda r: ()),
    "max_values_log_softmax": (_max_values_log_softmax, lambda r: ()),
    "silu_gate_layer_norm": (_silu_gate_layer_norm, lambda r: (r(2, 3, 37, 16),)),
    "learned_kv_token": (_learned_kv_token, lambda r: (r(1, 3, 1, 16), r(1, 3, 1, 16))),
    "point_distances": (_point_distances, lambda r: (r(2, 3, 37, 12), r(2, 3, 37, 12), r(3))),
    "entropy_too": (_entropy_too, lambda r: ()),
    "two_temperatures": (_two_temperatures, lambda r: (r(3, 37, 37),)),
    "baddbmm_alibi": (_baddbmm_alibi, lambda r: (r(3).abs() * 0.1,)),
    "swin_table_bias": (_swin_table_bias, lambda r: (r(73, 3),)),
    "softmax_over_queries": (_softmax_over_queries, lambda r: ()),
    "decoupled_rotary": (_decoupled_rotary, lambda r: (r(2, 3, 37, 8), r(2, 1, 37, 8))),
    "talking_heads": (_talking_heads, lambda r: (torch.eye(3) + 0.3 * r(3, 3),)),
    "megatron_baddbmm": (_megatron_baddbmm, lambda r: ()),
    "eval_dropout": (_eval_dropout, lambda r: ()),
    "rotate_half_rotary": (_rotate_half_rotary,
                           lambda r: (r(2, 37) > -1, torch.cos(0.1 * r(37, 16)), torch.sin(0.1 * r(37, 16)))),
}


@pytest.mark.parametrize("name", sorted(ROUND))
def test_variants_beyond_the_catalog_are_one_kernel(name, request):
    fn, extra = ROUND[name]
    g = _generator(request)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    inputs = [r(2, 3, 37, 16), r(2, 3, 37, 16), r(2, 3, 37, 16), *extra(r)]
    report = ExplainReport()  # filled by the one compile (explain() would compile and run again)
    torch.compiler.reset()
    with torch.no_grad():
        compiled = flashlight.compile(fn, report=report)
        outs = as_outputs(compiled(*inputs))
        assert len(report.kernels) == 1 and report.fallback_ops == [], report
        assert aten_outside_kernels(compiled, inputs) == []
    for out, ref in zip(outs, as_outputs(_reference(fn, inputs)), strict=True):
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


REDUCING = {"bmm", "baddbmm", "mm", "sum", "amax", "max", "logsumexp", "_softmax", "_log_softmax"}


@pytest.mark.parametrize("name", ["sigmoid_scores", "output_and_logsumexp", "softplus_temperature",
                                  "einsum_attention", "linear_causal", "kv_cache_cat", "temperature_after_bias",
                                  "entropy_too", "baddbmm_alibi"])
def test_variants_beyond_the_catalog_have_gradients(name, request):
    """Gradients of every float input through the derived backward match float64 (a
    sigmoid of the scores, a returned log-sum-exp, a learned temperature per head)."""
    fn, extra = ROUND[name]
    g = _generator(request)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    inputs = [r(2, 3, 37, 16), r(2, 3, 37, 16), r(2, 3, 37, 16), *extra(r)]
    leaves = [x.clone().requires_grad_() for x in inputs]
    report = ExplainReport()
    outs = as_outputs(torch.compile(fn, backend=flashlight.backend.make_backend(report=report))(*leaves))
    grad_outs = [torch.randn(o.shape, generator=g) for o in outs]
    grads = torch.autograd.grad(outs, leaves, grad_outs)
    exact = [x.detach().double().requires_grad_() for x in inputs]
    refs = torch.autograd.grad(as_outputs(fn(*exact)), exact, [go.double() for go in grad_outs])
    # forward and backward kernels; outside them at most pointwise work on the small
    # parameters (the softplus's derivative on the [H] temperatures), never a reduction
    assert len(report.kernels) >= 2, str(report)
    assert all(op.reason and op.name.split(".")[0] not in REDUCING for op in report.fallback_ops), str(report)
    for got, ref in zip(grads, refs, strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))

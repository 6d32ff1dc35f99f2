"""Training: gradients through Flashlight-compiled attention, against float64 eager.

The backward graph AOTAutograd derives is compiled by the same pipeline as the forward;
the forward saves no tensor over queries and keys for it ([Note: what the backward
saves] in ``flashlight/partition.py``). Every test draws fresh random inputs and a fresh
random output gradient. Tolerances, relative to the largest magnitude of each gradient:
float32 1e-4, bfloat16 2e-2. Kernels run through the Triton interpreter.
"""
from __future__ import annotations

import re

import pytest
import torch

import flashlight
from flashlight import settings
from bench.variants import VARIANTS
from bench.variants_base import as_outputs
from flashlight.report import ExplainReport
from tests.helpers import H200_SHARED_MEMORY, shared_memory

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}

# interpreter-sized lengths (not multiples of a tile) longer than the head widths, so the
# scores outnumber every input (what the saved-tensor check relies on)
_SMALL = {"L": 13, "Lq": 11, "Lkv": 14, "S": 3, "N": 9, "B": 1, "D": 8, "Dv": 8, "c": 8}


def _small_shape(name: str) -> dict:
    shape = dict(VARIANTS[name].default_shape)
    shape.update({k: min(v, _SMALL[k]) for k, v in shape.items() if k in _SMALL})
    if "P" in shape:
        shape["P"] = shape["L"] // 2
    if "n_docs" in shape:
        shape["n_docs"] = 2
    return shape


def _leaves(inputs, dtype=None):
    """Copies of ``inputs`` whose floating tensors require gradients (in ``dtype`` if given)."""
    out = []
    for x in inputs:
        if torch.is_tensor(x) and x.is_floating_point():
            x = x.detach().to(dtype or x.dtype).requires_grad_()
        out.append(x)
    return out


def _differentiable(args):
    return [x for x in args if torch.is_tensor(x) and x.requires_grad]


def _gradients(fn, args, grad_out, compiled: bool, report: ExplainReport | None = None):
    """``fn(*args)`` and the gradients of ``(fn(*args) * grad_out).sum()`` for every
    input that requires them (summed over the outputs, with a gradient each, where ``fn``
    returns several), and the numbers of elements autograd saved."""
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel())
        return t

    run = torch.compile(fn, backend=flashlight.backend.make_backend(report=report)) if compiled else fn
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run(*args)
    grads = torch.autograd.grad(as_outputs(out), _differentiable(args),
                                [g.to(o.dtype) for o, g in zip(as_outputs(out), as_outputs(grad_out), strict=True)])
    return out, grads, saved


def _assert_close(got, want, dtype, what, eager=None, scale=None):
    """``got`` within the dtype's tolerance of the float64 ``want``, relative to ``scale``
    (a number, or a tensor of ``want``'s shape giving each element its own; by default
    ``want``'s largest magnitude); in 16 bits, or at most twice as far from it as
    ``eager`` (PyTorch's own value in that dtype), where a draw of inputs makes the
    rounding larger than the tolerance."""
    assert torch.isfinite(got).all(), f"{what}: non-finite gradient values"
    largest = want.abs().max().item()
    if scale is None or not torch.is_tensor(scale):
        scale = torch.tensor(max(largest, scale or 0.0), dtype=torch.float64)
    bound = TOL[dtype] * scale.clamp(min=largest) + 1e-12
    if eager is not None:
        bound = bound.clamp(min=2 * (eager.double() - want).abs().max().item())
    err = (got.double() - want).abs()
    bound = bound.expand_as(err)
    worst = (err - bound).flatten().argmax().item()
    assert (err <= bound).all(), (
        f"{what}: error {err.flatten()[worst].item():.3g} at element {worst} against a bound of "
        f"{bound.flatten()[worst].item():.3g} (largest value {largest:.3g})")


def _gradient_term_scales(fn, reference, grad_out, every_element: bool) -> list:
    """For each input that requires a gradient, the sum of the magnitudes of the terms its
    gradient adds up, ``sum_j |grad_out_j * d out_j / d x_i|`` for each element ``x_i``
    (from the Jacobian, forward-mode in float64): a float for a single-element input, a
    tensor of the input's shape for the others where ``every_element``, else ``None``.

    A gradient is a sum of terms, and those terms can cancel: a learned lambda or
    temperature gets one term per output element, hundreds of times larger than their sum
    behind a norm over the head width; a mask or bias broadcast over heads and queries
    gets one term per head and query (OpenFold's mask, scaled by 1e9 into the scores,
    sums terms of 5e9 into 1e9). Rounding error is relative to the terms, so the
    tolerance is too. In float32 only the single-element inputs need it (the rest keep
    their gradient's largest value as the scale); in 16 bits, where every term is
    rounded, every element does.
    """
    values = [x.detach() if torch.is_tensor(x) else x for x in reference]
    tensor_at = [i for i, x in enumerate(values) if torch.is_tensor(x) and x.is_floating_point()]  # masks stay fixed
    wanted = [n for n, i in enumerate(tensor_at)
              if reference[i].requires_grad and (every_element or values[i].numel() == 1)]

    def of_tensors(*tensors):
        full = list(values)
        for i, t in zip(tensor_at, tensors, strict=True):
            full[i] = t
        return as_outputs(fn(*full))

    jacobians = torch.func.jacfwd(of_tensors, argnums=tuple(wanted))(*(values[i] for i in tensor_at)) if wanted else ()
    terms = {}
    for n, column in zip(wanted, zip(*jacobians) if wanted else (), strict=True):
        x = values[tensor_at[n]]
        total = torch.zeros(x.shape, dtype=torch.float64)
        for g, jac in zip(as_outputs(grad_out), column, strict=True):  # jac: [*out, *x]
            weighted = g.reshape(g.shape + (1,) * x.dim()) * jac
            total += weighted.abs().flatten(0, g.dim() - 1).sum(0) if g.dim() else weighted.abs()
        terms[tensor_at[n]] = total.sum().item() if x.numel() == 1 else total
    return [terms.get(i) for i, x in enumerate(reference) if torch.is_tensor(x) and x.requires_grad]


def _check_variant(name, gen, dtype=torch.float32, shape=None):
    v = VARIANTS[name]
    for _ in range(10):
        inputs = v.make_inputs(shape or _small_shape(name), torch.float32, "cpu", gen)
        args = _leaves(inputs, dtype)
        reference = [x.detach().double().requires_grad_() if torch.is_tensor(x) and x.requires_grad else x
                     for x in args]
        want_out = as_outputs(v.fn(*reference))
        grad_out = tuple(torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in want_out)
        want = torch.autograd.grad(want_out, _differentiable(reference), grad_out, retain_graph=True)
        # a draw where a gradient is exactly zero by cancellation (a mask leaving every
        # softmax row one key, whose probability is 1 whatever the scores) holds its
        # rounding to no scale: draw again
        if all(w.abs().max() > 0 for w in want):
            break
    torch.compiler.reset()
    report = ExplainReport()
    out, grads, saved = _gradients(v.fn, args, grad_out, compiled=True, report=report)
    n_out, n_grads = len(want_out), len(want)
    eager_out, eager_grads = [None] * n_out, [None] * n_grads
    if dtype != torch.float32:  # PyTorch's own values in that dtype: a second bound
        eager, eager_grads, _ = _gradients(v.fn, _leaves(inputs, dtype), grad_out, compiled=False)
        eager_out = as_outputs(eager)
    for n, (got, exact, own) in enumerate(zip(as_outputs(out), want_out, eager_out, strict=True)):
        _assert_close(got, exact, dtype, f"{name} output {n}", own)
    scales = _gradient_term_scales(v.fn, reference, grad_out, every_element=dtype != torch.float32)
    for k, (got, exact, own, scale) in enumerate(zip(grads, want, eager_grads, scales, strict=True)):
        _assert_close(got, exact, dtype, f"{name} gradient of input {k}", own, scale)
    torch.compiler.reset()
    return args, out, saved, report


def _largest_input_or_output(args, out) -> int:
    return max([o.numel() for o in as_outputs(out)] + [x.numel() for x in args if torch.is_tensor(x)])


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_gradients_match_float64_and_nothing_score_sized_is_saved(name, gen):
    args, out, saved, report = _check_variant(name, gen)
    assert report.kernels, f"{name}: no Flashlight kernel ran\n{report}"
    # the scores (a value per query and key, per head and batch) outnumber every input
    assert max(saved) <= _largest_input_or_output(args, out), (
        f"{name}: autograd saved a tensor of {max(saved)} elements; inputs and output have at most "
        f"{_largest_input_or_output(args, out)}"
    )


def test_the_saved_tensor_check_can_fail(gen):
    """AOTAutograd's own partition saves the probabilities: the check above catches it."""
    v = VARIANTS["msa_row_pair_bias"]
    args = _leaves(v.make_inputs(_small_shape("msa_row_pair_bias"), torch.float32, "cpu", gen))
    out = v.fn(*args)
    saved = []
    torch.compiler.reset()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = torch.compile(v.fn, backend="aot_eager")(*args)
    torch.compiler.reset()
    assert max(saved) > _largest_input_or_output(args, out)


def test_bfloat16_gradients(gen):
    _check_variant("msa_row_pair_bias", gen, torch.bfloat16)


def test_plain_attention_backward_is_flashlight_kernels_only(gen):
    """Forward and backward of softmax attention run as Flashlight kernels alone."""
    _, _, _, report = _check_variant("vanilla", gen)
    assert report.fallback_ops == [], str(report)
    assert len(report.kernels) >= 2  # the forward and at least one backward kernel


def test_a_broadcast_bias_gradient_is_a_serial_loop_of_dots(gen):
    """The pair bias ``[1, H, L, L]`` is shared by every MSA row: its gradient sums the
    score gradients over the rows, as a serial loop over them whose steps are query x key
    tiles with ``tl.dot`` ([Note: serial loops] in ``flashlight/passes/tiling.py``)."""
    _, _, _, report = _check_variant("evoformer_core", gen)
    serial = [k for k in report.kernels if "num_n = tl.cdiv" in k.source]
    assert len(serial) == 1 and serial[0].source.count("tl.dot(") == 2, str(report)


@pytest.mark.parametrize("min_split_len", [1, 4])
def test_a_split_serial_loop_adds_its_partial_sums(gen, monkeypatch, min_split_len):
    """The bias gradient's serial loop over 9 rows, shared out among programs of 9 (one
    row each) or 2 (5 rows, then 4) runs ([Note: split serial loops]): the partial sums
    add up to float64 eager's gradient, in float32 and bfloat16."""
    from flashlight import tuning

    monkeypatch.setattr(tuning, "MIN_SPLIT_LEN", min_split_len)
    assert tuning.split_count(9, 4, 132) == ((9, 1) if min_split_len == 1 else (2, 5))
    for dtype in (torch.float32, torch.bfloat16):
        _, _, _, report = _check_variant("evoformer_core", gen, dtype, {"N": 9, "L": 13, "H": 2, "c": 16})
        serial = [k for k in report.kernels if "num_n = tl.cdiv" in k.source]
        assert len(serial) == 1 and "SPLIT_LEN" in serial[0].source, str(report)


def test_split_counts_fill_the_gpu_and_keep_runs_long():
    from flashlight import tuning

    assert tuning.split_count(256, 64, 132) == (5, 52)  # 64 tiles: 5 runs of 52 rows (the last 48)
    assert tuning.split_count(256, 4096, 132) == (1, 256)  # the tiles fill the GPU already
    assert tuning.split_count(20, 1, 132) == (1, 20)  # too few rows to share out
    assert tuning.split_count(0, 1, 132) == (1, 1)


def test_a_mask_gradient_leaves_the_scores_in_the_kernels(gen):
    """The gradient of a float mask sums the score gradients over heads and queries, two
    reductions one kernel cannot nest: the back-off keeps the smallest value separate
    (the sum over queries), not the scores or ``dp``, which every other backward kernel
    then would read from memory, rounded to the graph's dtype."""
    _, _, _, report = _check_variant("msa_row_pair_bias", gen)
    assert not [op for op in report.fallback_ops if op.name.startswith("bmm")], str(report)


@pytest.mark.parametrize("name, shape", [
    ("causal_tril", {"L": 70}),
    ("sliding_window", {"L": 90}),
    ("document_mask", {"L": 80, "n_docs": 5}),
    ("gqa", {"L": 70}),  # the shared keys' gradient: an inner loop over the group's heads
])
def test_masked_backward_kernels_skip_the_tiles_their_forward_skips(name, shape, gen):
    """The backward's loops are zero where the mask removes (``P = 0`` there, so are
    ``P @ dO`` and ``dS = P * dP - P * delta``: [Note: tile skipping] in
    flashlight/passes/skipping.py): every kernel of forward and backward runs only the
    tiles the mask leaves live, and the run of full tiles without masks, at lengths
    where most of the interpreter's 32 x 16 tiles are dead or full; gradients against
    float64. Before, only the forward kernels skipped."""
    _, _, _, report = _check_variant(name, gen, shape={**_small_shape(name), **shape})
    masked = [k for k in report.kernels if 'float("-inf")' in k.source]  # (not the row term's)
    assert len(masked) >= 3, str(report)
    for kernel in masked:
        assert "tiles_first" in kernel.source and "range(full_first, full_end" in kernel.source, kernel.source


def _gradients_of_two_calls(name, shape, gen):
    """The gradients of two calls of variant ``name`` compiled once, same inputs."""
    v = VARIANTS[name]
    args = _leaves(v.make_inputs(shape, torch.float32, "cpu", gen))
    grad_out = torch.randn(v.fn(*args).shape, generator=gen)
    torch.compiler.reset()
    compiled = torch.compile(v.fn, backend="flashlight")
    first = torch.autograd.grad(compiled(*args), _differentiable(args), grad_out)
    again = torch.autograd.grad(compiled(*args), _differentiable(args), grad_out)
    torch.compiler.reset()
    return first, again


def test_gradients_are_deterministic(gen):
    first, again = _gradients_of_two_calls("msa_row_pair_bias", _small_shape("msa_row_pair_bias"), gen)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_changing_lengths_and_strided_inputs(gen):
    def attention(q, k, v, bias):  # [B, L, H, D] inputs, read through transposes
        s = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2) * 0.25 + bias
        return (torch.softmax(s, -1) @ v.transpose(1, 2)).transpose(1, 2)

    torch.compiler.reset()
    compiled = torch.compile(attention, backend="flashlight")
    for length in (11, 14, 17):
        args = [torch.randn(2, length, 3, 16, generator=gen) for _ in range(3)]
        args.append(torch.randn(3, length, length, generator=gen))  # broadcast over the batch
        args = _leaves(args)
        reference = [x.detach().double().requires_grad_() for x in args]
        grad_out = torch.randn(2, length, 3, 16, generator=gen, dtype=torch.float64)
        got = torch.autograd.grad(compiled(*args), args, grad_out.float())
        want = torch.autograd.grad(attention(*reference), reference, grad_out)
        for k, (g, w) in enumerate(zip(got, want)):
            _assert_close(g, w, torch.float32, f"length {length}, input {k}")
    torch.compiler.reset()


def test_no_grad_compiles_an_inference_graph(gen):
    """Without gradients nothing is saved and the forward is one kernel, as before."""
    v = VARIANTS["msa_row_pair_bias"]
    inputs = v.make_inputs(_small_shape("msa_row_pair_bias"), torch.float32, "cpu", gen)
    report = flashlight.explain(v.fn, *inputs)
    assert len(report.kernels) == 1, str(report)


def test_inductor_remainder_trains(gen):
    """The graph around the kernels through Inductor (its C++ backend on the CPU)."""
    def gated(q, k, v, bias, g):  # [B, H, L, D]; the gate outside the attention kernel's loop
        o = torch.softmax(q @ k.transpose(-1, -2) * 0.25 + bias, -1) @ v
        return torch.nn.functional.layer_norm(o * torch.sigmoid(g), (o.shape[-1],))

    args = _leaves([torch.randn(1, 2, 12, 16, generator=gen) for _ in range(3)]
                   + [torch.randn(2, 12, 12, generator=gen), torch.randn(1, 2, 12, 16, generator=gen)])
    reference = [x.detach().double().requires_grad_() for x in args]
    grad_out = torch.randn(1, 2, 12, 16, generator=gen, dtype=torch.float64)
    torch.compiler.reset()
    compiled = flashlight.compile(gated, remainder="inductor")
    got = torch.autograd.grad(compiled(*args), args, grad_out.float())
    torch.compiler.reset()
    want = torch.autograd.grad(gated(*reference), reference, grad_out)
    for k, (g, w) in enumerate(zip(got, want)):
        _assert_close(g, w, torch.float32, f"input {k}")


def test_a_split_serial_loop_gives_the_same_gradient_on_every_call(gen, monkeypatch):
    """The partial sums are stored per program (every slice of their uninitialised
    buffer written) and added in order after the launch, with no atomics: two calls give
    bit-identical gradients ([Note: split serial loops])."""
    from flashlight import tuning

    monkeypatch.setattr(tuning, "MIN_SPLIT_LEN", 2)
    first, again = _gradients_of_two_calls("evoformer_core", {"N": 9, "L": 13, "H": 2, "c": 16}, gen)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_the_term_scaled_bound_can_fail(gen):
    """Scaled by its terms, the 16-bit bound on the mask's gradient still rejects a
    gradient that misses one head's terms (what a kernel summing over the wrong dims would
    give)."""
    v = VARIANTS["msa_row_pair_bias"]
    inputs = v.make_inputs(_small_shape("msa_row_pair_bias"), torch.float64, "cpu", gen)
    reference = _leaves(inputs)
    (out,) = as_outputs(v.fn(*reference))
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)  # [B, S, L, H, c]
    (scales,) = [s for s in _gradient_term_scales(v.fn, reference, (grad_out,), every_element=True)
                 if torch.is_tensor(s) and s.shape == reference[3].shape]
    mask_grad = torch.autograd.grad(out, reference[3], grad_out, retain_graph=True)[0]
    one_head_less = torch.autograd.grad(out, reference[3], grad_out * (torch.arange(out.shape[-2]) != 0)[:, None])[0]
    _assert_close(mask_grad.bfloat16(), mask_grad, torch.bfloat16, "the mask's gradient", scale=scales)
    with pytest.raises(AssertionError, match="the mask's gradient"):
        _assert_close(one_head_less, mask_grad, torch.bfloat16, "the mask's gradient", scale=scales)


def test_grouped_query_attention_with_repeated_heads_trains_in_kernels(gen):
    """Keys and values shared by groups of query heads, repeated with ``repeat_interleave``:
    their gradients sum the repeated heads' gradients over each group ([Note: a finer
    read of a producer] in flashlight/passes/fusion.py, [Note: a small sum inside the
    loop] in flashlight/passes/online.py). The softmax and its backward run in kernels
    (PyTorch computed them before). At 13 queries, no longer than the repeats' sum may
    be (``SMALL_SUM``), the loop runs over the repeats and the scores' matmul stays
    outside; longer, nothing does (the test below)."""
    def gqa(q, k, v):  # [B, H, L, D], [B, H / 2, L, D] x2
        k2, v2 = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        return torch.softmax(q @ k2.transpose(-1, -2) * 0.35, -1) @ v2

    args = _leaves([torch.randn(2, 4, 13, 8, generator=gen)] + [torch.randn(2, 2, 13, 8, generator=gen)
                                                                 for _ in range(2)])
    reference = [x.detach().double().requires_grad_() for x in args]
    grad_out = torch.randn(2, 4, 13, 8, generator=gen, dtype=torch.float64)
    report = ExplainReport()
    torch.compiler.reset()
    got = torch.autograd.grad(torch.compile(gqa, backend=flashlight.backend.make_backend(report=report))(*args),
                              args, grad_out.float())
    torch.compiler.reset()
    want = torch.autograd.grad(gqa(*reference), reference, grad_out)
    for k, (g, w) in enumerate(zip(got, want)):
        _assert_close(g, w, torch.float32, f"input {k}")
    assert {op.name for op in report.fallback_ops} <= {"bmm.default"}, str(report)


def test_a_kernel_swaps_the_factors_of_all_its_transposed_dots_or_of_none(gen):
    """[Note: the order of a dot's operands] (flashlight/passes/tile_plan.py): causal
    attention's keys' and values' gradient kernel runs its scores, ``dp`` and ``dk`` as
    dots whose results come out in the order the kernel uses (FlashAttention-2's
    ``k q^T``, ``v dO^T``, ``dS q``), not transposed after; the Evoformer's mask bias
    gradient, whose scores' first factor is computed in the kernel, keeps every result
    transposed. Gradients against float64 both."""
    _, _, _, report = _check_variant("causal_tril", gen, shape={**_small_shape("causal_tril"), "L": 37})
    backward = [k for k in report.kernels if k.source.count("tl.dot(") >= 4]  # and the forward's
    assert backward and not any("= tl.trans(dot" in k.source for k in backward), str(report)
    shape = {**_small_shape("msa_row_pair_bias"), "H": 8, "S": 2, "L": 64}  # heads in an inner loop
    _, _, _, report = _check_variant("msa_row_pair_bias", gen, shape=shape)
    looped = [k for k in report.kernels if "for u" in k.source and "tl.dot(" in k.source]
    assert looped and all(k.source.count("= tl.trans(dot") == k.source.count("tl.dot(") for k in looped), \
        str(report)


@pytest.mark.parametrize("name", ["gqa", "mqa"])
def test_keys_shared_by_a_group_of_heads_are_saved_once(name, gen):
    """The forward saves the shared keys and values, not the repeat of them per query head
    that its matmuls read ([Note: repeated values are not saved] in flashlight/partition.py):
    what autograd keeps is the inputs, the output and two numbers per query row. Before,
    the repeated keys and values (the group's size times larger) were saved."""
    shape = {**_small_shape(name), "L": 21}
    args, out, saved, _ = _check_variant(name, gen, shape=shape)
    q, k, v = args[:3]
    rows = q.numel() // q.shape[-1]
    assert k.shape[1] < q.shape[1]  # heads share keys
    assert sum(saved) <= q.numel() + k.numel() + v.numel() + out.numel() + 2 * rows, saved


@pytest.mark.parametrize("outside", [True, False], ids=["repeats_outside", "repeats_inside"])
@pytest.mark.parametrize("name, causal", [("gqa", True), ("mqa", False)])
def test_shared_keys_train_with_nothing_outside_the_kernels(name, causal, outside, gen):
    """Past ``SMALL_SUM`` queries the repeats' sum is an inner loop, each repeat's
    contribution to the shared keys' and values' gradients a ``tl.dot`` of its own, with
    its scores and ``dp`` computed in the kernel ([Note: contractions summed by an inner
    loop] in flashlight/passes/tiling.py): the catalog's grouped- and multi-query
    attention train with no operation outside Flashlight's kernels (the scores and ``dp``
    were two matmuls of ``rows x keys`` outside), gradients against float64, and the
    kernel builds for sm_90. By default the repeats' loop runs around the query loop
    where that loop is one loop ([Note: the repeats outside the key loop]), inside each
    of its steps where tile skipping splits it (causal attention) or with
    ``FLASHLIGHT_REPEATS_OUTSIDE=0``. The backward reads the shared keys and values, not each
    head's repeat of them ([Note: repeated values are not saved] in
    flashlight/partition.py): their tiles are loaded once, before any loop."""
    shape = {**_small_shape(name), "L": 37}
    with settings.override(repeats_outside=outside):
        _, _, _, report = _check_variant(name, gen, shape=shape)
    assert report.fallback_ops == [], str(report)
    looped = [k for k in report.kernels if "for u" in k.source and k.source.count("tl.dot(") >= 4]
    assert len(looped) == 1, str(report)
    source = looped[0].source
    at_top = re.search(r"\n    for u\d+ in range", source)  # in the body, not in a loop
    assert ("for start_n in range(full_first, full_end" in source) == causal, source  # tile skipping
    assert bool(at_top) == (outside and not causal), source
    if at_top:  # each pass starts with the query loop: nothing of its own to load
        pass_head = source[at_top.end():source.index("for start_n in range(", at_top.end())]
        assert "tl.load(" not in pass_head, source
    prologue = source[:source.index("for ")]
    assert prologue.count("tl.load(") == 2 and "offs_m[:, None]" in prologue, source  # k and v tiles
    built = looped[0].aot_compile(90, block_m=64, block_n=32, num_warps=4, num_stages=2)
    assert 0 < shared_memory(built) <= H200_SHARED_MEMORY


def _softmax_of_a_rounded_difference(detach_max: bool):
    """Half-precision attention whose exponent is a difference taken in bfloat16: a
    narrowing cast between the scores' constant factor and the ``exp``."""
    def fn(q, k, v):
        s = (q @ k.transpose(-1, -2)) * 0.25                # [B, H, L, L] float16
        m = s.amax(-1, keepdim=True)
        m = m.detach() if detach_max else m
        e = torch.exp((s.to(torch.bfloat16) - m.to(torch.bfloat16)).to(q.dtype))
        return (e / e.sum(-1, keepdim=True)) @ v
    return fn


@pytest.mark.parametrize("detach_max", [True, False])
def test_a_rounding_cast_inside_the_exponent_keeps_its_place(detach_max, gen):
    """Folding ``log2(e)`` or the scale through a cast that rounds would round other
    values than the program does (``round(k * x)`` is not ``k * round(x)``); the
    recomputed probabilities then disagree with the forward's and the gradients of q and
    k drifted to 5x PyTorch's own error. Output and gradients stay within twice eager's
    float16 error from the float64 program (which rounds to bfloat16 where it casts)."""
    fn = _softmax_of_a_rounded_difference(detach_max)
    inputs = [torch.randn(2, 3, 24, 16, generator=gen) for _ in range(3)]
    grad_out = torch.randn(2, 3, 24, 16, generator=gen, dtype=torch.float64)

    def run(f, dtype):
        args = _leaves(inputs, dtype)
        out = f(*args)
        return [out, *torch.autograd.grad(out, args, grad_out.to(out.dtype))]

    want = run(fn, torch.float64)
    eager = run(fn, torch.float16)
    torch.compiler.reset()
    got = run(torch.compile(fn, backend="flashlight"), torch.float16)
    torch.compiler.reset()
    for what, g, w, e in zip(("output", "dq", "dk", "dv"), got, want, eager, strict=True):
        assert torch.isfinite(g).all(), what
        err, own = ((x.double() - w).abs().max().item() for x in (g, e))
        assert err <= 2 * own + 1e-4 * w.abs().max().item(), f"{what}: error {err:.3g}, eager's {own:.3g}"


def _distance_biased_attention(q, k, v, a, b):
    """Attention biased by minus a squared distance between per-position points (two
    groups of 4 coordinates), its softmax written out in the input's dtype."""
    d2 = ((a.unflatten(-1, (2, 4))[:, :, :, None] - b.unflatten(-1, (2, 4))[:, :, None]) ** 2).sum((-1, -2))
    s = q @ k.transpose(-1, -2) * 0.35 - d2  # [B, H, L, L]
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p @ v) / p.sum(-1, keepdim=True)


def test_a_softmax_written_out_in_bfloat16_recomputes_what_its_forward_computed(gen):
    """The backward recomputes the scores, their max and probabilities of such a softmax
    from the same values the forward used ([Note: a 16-bit softmax's scores rounded] in
    flashlight/backward_algebra.py; the distances' sum over both groups inside the
    scores' kernel, as in the forward). Where it read a max and distances rounded
    otherwise, the gradients of q and k were 2-4x eager's error from float64 on a third
    of the draws. (The points' gradients, through the distances, reach 1.2x the bound on
    about one draw in twenty: checked finite only.)"""
    fn = _distance_biased_attention
    compiled = torch.compile(fn, backend="flashlight")
    for _ in range(3):
        inputs = [torch.randn(2, 2, 13, 8, generator=gen) for _ in range(5)]
        reference = [x.double().requires_grad_() for x in inputs]
        want_out = fn(*reference)
        grad_out = torch.randn(want_out.shape, generator=gen, dtype=torch.float64)
        want = torch.autograd.grad(want_out, reference, grad_out)
        scales = _gradient_term_scales(fn, reference, (grad_out,), every_element=True)
        _, eager, _ = _gradients(fn, _leaves(inputs, torch.bfloat16), grad_out, compiled=False)
        args = _leaves(inputs, torch.bfloat16)
        out = compiled(*args)
        got = torch.autograd.grad(out, args, grad_out.to(out.dtype))
        for what, g, w, e, scale in zip("qkv", got, want, eager, scales):
            _assert_close(g, w, torch.bfloat16, f"d{what}", eager=e, scale=scale)
        assert all(torch.isfinite(g).all() for g in got[3:])
    torch.compiler.reset()

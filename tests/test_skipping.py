"""Tile skipping ([Note: tile skipping]): which kernels get a liveness predicate and an
unmasked loop for full tiles, that the narrowed and split loop is exact (vs float64
eager, at lengths where most tiles are dead or full), and that tiles really are skipped."""
from __future__ import annotations

import math

import pytest
import torch

import flashlight
from bench.variants import VARIANTS
from flashlight.ir import Const, Dim, Iota, Kernel, Load, LoopReduction, Pointwise, RunningMax, walk
from flashlight.ir_check import check_kernel_invariants
from flashlight.lower import lower
from flashlight.passes.skipping import NEG_INF, ZERO, mask_site, find_live_tiles, symbolic_value
from flashlight.pipeline import compile_graph
from tests.helpers import capture


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def _kernel_of(fn, *args) -> Kernel:
    plan = compile_graph(lower(capture(fn, *args)), check=True)
    (tiled,) = plan.kernels.values()
    check_kernel_invariants(tiled.kernel)
    return tiled.kernel


def _inputs(name: str, seed: int = 0, **shape):
    v = VARIANTS[name]
    return v.make_inputs({**v.default_shape, **shape}, torch.float32, "cpu", torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------ the pass


@pytest.mark.parametrize("name", ["causal_tril", "causal_triu", "causal_index", "sliding_window",
                                  "prefix_lm", "document_mask", "cross_attention",
                                  "alibi"])  # ALiBi: masked where the float distance j - i > 0
def test_masked_variants_get_a_liveness_predicate(name):
    assert _kernel_of(VARIANTS[name].fn, *_inputs(name)).live is not None


@pytest.mark.parametrize("name", ["vanilla", "softcap", "msa_row_pair_bias", "triangle_start"])
def test_unmasked_or_finitely_biased_variants_run_every_tile(name):
    # the Evoformer's mask bias is 1e9 * (mask - 1): finite, so nothing is provably dead
    assert _kernel_of(VARIANTS[name].fn, *_inputs(name)).live is None


def _scores_masked_by(transform):
    def fn(q, k, v):
        s = q @ k.transpose(-1, -2)
        L = s.shape[-1]
        pos = torch.arange(L)
        return torch.softmax(transform(s, pos[:, None] >= pos[None, :]), dim=-1) @ v

    return fn


def _qkv(L=40, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, L, D, generator=g) for _ in range(3))


def test_an_additive_minus_inf_mask_is_recognised_by_algebra():
    fn = _scores_masked_by(lambda s, keep: s + torch.where(keep, 0.0, -math.inf))
    assert _kernel_of(fn, *_qkv()).live is not None


def test_a_mask_under_a_negative_scale_is_not_treated_as_dead():
    # -(-inf) = +inf: those positions dominate the softmax, they are not no-ops
    fn = _scores_masked_by(lambda s, keep: -2.0 * s.masked_fill(~keep, -math.inf))
    assert _kernel_of(fn, *_qkv()).live is None


def _two_sided_window(q, k, v):
    i = torch.arange(q.shape[-2])
    keep = (i[None, :] - i[:, None]).abs() <= 40
    return torch.softmax(torch.where(keep, q @ k.transpose(-1, -2), -math.inf), dim=-1) @ v


def _float_tril_mask(q, k, v):
    L = q.shape[-2]
    s = (q @ k.transpose(-1, -2)).masked_fill(torch.tril(torch.ones(L, L)) == 0, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("fn", [_two_sided_window, _float_tril_mask], ids=["abs", "float_tril"])
def test_masks_computed_with_abs_or_in_float_from_indices_get_skipping_and_full_tiles(fn):
    kernel = _kernel_of(fn, *_qkv())
    assert kernel.live is not None and kernel.full is not None
    _assert_close_to_float64(fn, _qkv(L=170, seed=4), fn.__name__)


def test_a_mask_on_float_values_keeps_the_full_loop():
    def fn(q, k, v):
        s = q @ k.transpose(-1, -2)
        return torch.softmax(s.masked_fill(s < -1.0, -math.inf), dim=-1) @ v

    assert _kernel_of(fn, *_qkv()).live is None


def test_only_values_computed_from_indices_constants_and_integer_loads_are_bounded():
    from flashlight.ir import Load
    from flashlight.passes.skipping import bounded_by_intervals

    i, j = Dim.fresh(8, "i"), Dim.fresh(8, "j")
    f32 = torch.float32
    dist = Pointwise("cast", (Pointwise("sub", (Iota((j,)), Iota((i,))), torch.int64),), f32)
    assert bounded_by_intervals(Pointwise("gt", (Pointwise("abs", (dist,), f32), Const(3.0, f32)), torch.bool))
    doc = Load("doc", ((j,),), torch.int64)
    assert bounded_by_intervals(Pointwise("eq", (doc, Const(2, torch.int64)), torch.bool))
    score = Load("s", ((i,), (j,)), f32)
    assert not bounded_by_intervals(Pointwise("lt", (score, Const(-1.0, f32)), torch.bool))
    assert not bounded_by_intervals(Pointwise("lt", (dist, Const(math.inf, f32)), torch.bool))


def test_symbolic_neutral_values():
    j = Dim.fresh(8, "j")
    f32 = torch.float32
    ninf = Const(-math.inf, f32)
    x = Iota((j,), f32)
    assert symbolic_value(Pointwise("exp", (Pointwise("sub", (ninf, RunningMax(0, f32)), f32),), f32)) == ZERO
    assert symbolic_value(Pointwise("mul", (Pointwise("exp", (ninf,), f32), x), f32)) == ZERO
    assert symbolic_value(Pointwise("mul", (ninf, Const(0.125, f32)), f32)) == NEG_INF
    assert symbolic_value(Pointwise("mul", (ninf, Const(-1.0, f32)), f32)) is None
    assert symbolic_value(Pointwise("sub", (ninf, ninf), f32)) is None  # NaN, not -inf
    assert symbolic_value(Pointwise("exp", (x,), f32)) is None
    # a backward's dS = P * dP - P * delta, and P = exp(s - m) / l with l loaded
    zero = Pointwise("exp", (ninf,), f32)
    assert symbolic_value(Pointwise("sub", (zero, zero), f32)) == ZERO
    assert symbolic_value(Pointwise("sub", (zero, x), f32)) is None
    row_sum = Load("l", (), f32)
    assert symbolic_value(Pointwise("div", (zero, row_sum), f32)) == ZERO
    assert symbolic_value(Pointwise("div", (zero, zero), f32)) is None  # 0 / 0
    assert symbolic_value(Pointwise("div", (zero, Pointwise("add", (zero, x), f32)), f32)) is None


@pytest.mark.parametrize("name", ["causal_tril", "causal_index", "prefix_lm", "document_mask", "alibi"])
def test_masked_kernels_get_an_unmasked_loop_for_full_tiles(name):
    kernel = _kernel_of(VARIANTS[name].fn, *_inputs(name))
    assert kernel.full is not None and kernel.unmasked is not None
    loop_dim = kernel.loop[0].dim
    assert any(mask_site(n, loop_dim) for red in kernel.loop for n in walk(red.body))
    assert not any(mask_site(n, loop_dim) for red in kernel.unmasked for n in walk(red.body))


def test_the_full_tile_loop_is_printed_without_masks_between_two_masked_ones():
    report = flashlight.explain(VARIANTS["causal_index"].fn, *_inputs("causal_index"))
    source = report.kernels[0].source
    # the scan's coarse and fine steps, then the online loops
    loops = source.split("for start_n in range(")[1:]
    assert len(loops) == 5 and loops[3].startswith("full_first, full_end")
    masked, full = loops[2], loops[3]
    assert "float(\"-inf\"), " in masked  # where(not keep, -inf, s)
    assert "< N_SIZE" in masked and "< N_SIZE" not in full and "<= 0" not in full


def _tiling_of(fn, *args):
    plan = compile_graph(lower(capture(fn, *args)), check=True)
    (tiled,) = plan.kernels.values()
    return tiled.tiling


def test_the_scan_bounds_many_key_tiles_per_step_unless_the_mask_reads_key_by_row_tiles():
    from flashlight.passes.tiling import SCAN_TILES

    # causal: indices only; document mask: one id per key
    for name in ("causal_index", "document_mask"):
        assert _tiling_of(VARIANTS[name].fn, *_inputs(name)).scan_tiles == SCAN_TILES, name
    # indices only: a coarse step of scalar bounds, then tile by tile over what it kept
    source = flashlight.explain(VARIANTS["causal_index"].fn, *_inputs("causal_index")).kernels[0].source
    coarse, fine = source.split("for start_n in range(")[1:3]
    assert coarse.startswith(f"0, N_SIZE, (BLOCK_N * {SCAN_TILES})") and "offs_coarse" in coarse
    assert fine.startswith("coarse_first, coarse_end, BLOCK_N")
    # values loaded along the keys: the vector scan, SCAN_TILES tiles per step, one pass
    source = flashlight.explain(VARIANTS["document_mask"].fn, *_inputs("document_mask")).kernels[0].source
    scan, first_online = source.split("for start_n in range(")[1:3]
    assert scan.startswith(f"0, N_SIZE, BLOCK_N * {SCAN_TILES})") and "offs_scan" in scan
    assert "axis=1)" in scan  # ids loaded [tiles, BLOCK_N], bounded per tile
    assert first_online.startswith("tiles_first, full_first, BLOCK_N")

    def boolean_mask(q, k, v, keep):  # keep: [L, L], a [rows, keys] tile per step
        return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, -math.inf), dim=-1) @ v

    q, k, v = _qkv()
    keep = torch.rand(q.shape[-2], k.shape[-2], generator=torch.Generator().manual_seed(1)) < 0.5
    assert _tiling_of(boolean_mask, q, k, v, keep).scan_tiles == 1


def test_the_vector_scan_narrows_the_range_exactly():
    """Segment ids where a scan step's bounds overlap a query tile's but no key tile's
    inside does (ids 1 and 5 around queries' 2 and 4), with live keys in three scan
    steps apart and a length that is not a multiple of a step."""
    def fn(q, k, v, q_seg, k_seg):
        keep = q_seg[:, None] == k_seg[None, :]
        s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return torch.softmax(s.masked_fill(~keep, -math.inf), dim=-1) @ v

    g = torch.Generator().manual_seed(2)
    Lq, Lk = 96, 1000
    tiles = torch.randint(0, 2, (Lk // 8,), generator=g) * 4 + 1  # ids 1 or 5, constant over 8 keys
    k_seg = tiles.repeat_interleave(8)
    k_seg[100:120] = 4
    k_seg[530:560] = 2
    k_seg[900:990] = torch.randint(2, 5, (90,), generator=g)
    q_seg = torch.full((Lq,), 4)
    q_seg[40:] = torch.randint(1, 3, (Lq - 40,), generator=g) * 2  # 2 or 4
    q, k, v = torch.randn(2, Lq, 16, generator=g), torch.randn(2, Lk, 16, generator=g), torch.randn(2, Lk, 16, generator=g)
    assert _tiling_of(fn, q, k, v, q_seg, k_seg).scan_tiles > 1
    _assert_close_to_float64(fn, (q, k, v, q_seg, k_seg), "segment ids")


def test_a_loop_body_that_is_not_neutral_blocks_skipping():
    j, i = Dim.fresh(8, "j"), Dim.fresh(8, "i")
    f32 = torch.float32
    keep = Pointwise("ge", (Iota((i,)), Iota((j,))), torch.bool)
    score = Pointwise("where", (keep, Iota((j,), f32), Const(-math.inf, f32)), f32)
    # sum of the raw masked scores: -inf where removed, which does change a sum
    loop = (LoopReduction("sum", score, j, (), f32),)
    kernel = Kernel("k", ((i,),), f32, loop, Const(0.0, f32), ())
    assert find_live_tiles(kernel).live is None
    ok = dataclass_replace_body(kernel, Pointwise("exp", (score,), f32))
    found = find_live_tiles(ok)
    assert found.live == keep and found.full == keep
    assert found.unmasked[0].body == Pointwise("exp", (Iota((j,), f32),), f32)  # the kept scores
    check_kernel_invariants(found)


def test_full_tiles_drop_every_where_on_a_masks_condition():
    """On a tile every mask keeps whole, ``where(removed, 0, dS)`` (the gradient of
    ``masked_fill``) is ``dS``: its condition is a site's, constant there."""
    j, i = Dim.fresh(8, "j"), Dim.fresh(8, "i")
    f32 = torch.float32
    removed = Pointwise("lt", (Iota((i,)), Iota((j,))), torch.bool)
    score = Pointwise("where", (removed, Const(-math.inf, f32), Iota((j,), f32)), f32)
    grad = Pointwise("where", (removed, Const(0.0, f32), Iota((i,), f32)), f32)
    body = Pointwise("mul", (Pointwise("exp", (score,), f32), grad), f32)
    kernel = dataclass_replace_body(Kernel("k", ((i,),), f32, (LoopReduction("sum", body, j, (), f32),),
                                           Const(0.0, f32), ()), body)
    found = find_live_tiles(kernel)
    assert found.live == Pointwise("not", (removed,), torch.bool)
    exp = Pointwise("exp", (Iota((j,), f32),), f32)
    assert found.unmasked[0].body == Pointwise("mul", (exp, Iota((i,), f32)), f32)


def dataclass_replace_body(kernel: Kernel, body) -> Kernel:
    import dataclasses

    return dataclasses.replace(kernel, loop=(dataclasses.replace(kernel.loop[0], body=body),))


# ------------------------------------------------------------------- exactness


def _assert_close_to_float64(fn, inputs, context):
    ref = fn(*[x.double() if x.is_floating_point() else x for x in inputs])
    with torch.no_grad():
        out = flashlight.compile(fn)(*inputs)
    assert torch.isfinite(out).all(), context
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4, msg=lambda m: f"{context}\n{m}")


@pytest.mark.parametrize("name, shape", [
    ("causal_index", {"L": 101}),
    ("sliding_window", {"L": 130}),
    ("prefix_lm", {"L": 97, "P": 40}),
    ("document_mask", {"L": 150, "n_docs": 7}),
    ("cross_attention", {"Lkv": 90}),
    ("alibi", {"L": 100}),
])
def test_skipping_is_exact_where_most_tiles_are_dead(name, shape):
    inputs = _inputs(name, seed=3, **shape)
    _assert_close_to_float64(VARIANTS[name].fn, inputs, f"{name} {shape}")


@pytest.mark.parametrize("L, holes", [(190, ()), (190, ((40, 61),)), (190, ((30, 35), (90, 140))),
                                      (600, ((275, 278),)), (600, ((250, 262),))])
def test_full_tile_runs_are_exact_wherever_they_lie(L, holes):
    """A band mask (full tiles in the middle of each row tile's range, partial ones on
    both sides) with key ranges removed: the first run of full tiles runs unmasked, the
    tiles after a hole masked again. At 600 keys the runs cross a step of the scan
    (256 keys under the interpreter's 16-key tiles), and a hole cuts them in the next step."""
    def fn(q, k, v, removed):
        L = q.shape[-2]
        i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
        keep = (j <= i) & (j >= i - 100) & ~removed[None, :]
        s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return torch.softmax(s.masked_fill(~keep, -math.inf), dim=-1) @ v

    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, L, 16, generator=g) for _ in range(3))
    removed = torch.zeros(L, dtype=torch.bool)
    for a, b in holes:
        removed[a:b] = True
    ref = fn(q.double(), k.double(), v.double(), removed)
    with torch.no_grad():
        out = flashlight.compile(fn)(q, k, v, removed)
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    finite = ~torch.isnan(ref)
    torch.testing.assert_close(out[finite].double(), ref[finite], rtol=1e-4, atol=1e-4)


def test_rows_whose_every_tile_is_dead_are_nan_as_in_eager():
    # keys 0..L-1, a query sees keys >= its own index + 70: rows 30..39 see none at all
    def fn(q, k, v):
        Lq, Lk = q.shape[-2], k.shape[-2]
        keep = torch.arange(Lk)[None, :] >= torch.arange(Lq)[:, None] + (Lk - 10)
        s = (q @ k.transpose(-1, -2)).masked_fill(~keep, -math.inf)
        return torch.softmax(s, dim=-1) @ v

    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 40, 16, generator=g), torch.randn(2, 80, 16, generator=g), torch.randn(2, 80, 16, generator=g)
    ref = fn(q.double(), k.double(), v.double())
    with torch.no_grad():
        out = flashlight.compile(fn)(q, k, v)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.isnan(ref[:, 10:]).all()
    torch.testing.assert_close(out[:, :10].double(), ref[:, :10], rtol=1e-4, atol=1e-4)


def test_dead_tiles_are_not_read():
    """NaN in v at keys no query of a tile may see: the first query tile never reads
    the last key tile, so its rows stay finite (eager: 0 * NaN = NaN everywhere; the
    documented difference), while rows that do see the key are NaN in both. With 300
    keys this holds for every tile configuration (tiles are at most 128 wide)."""
    name = "causal_tril"
    q, k, v = _inputs(name, seed=7, L=300)
    v = v.clone()
    v[..., 299, :] = float("nan")  # [B, H, L, D]: the last key
    ref = VARIANTS[name].fn(q.double(), k.double(), v.double())
    assert torch.isnan(ref).all()
    with torch.no_grad():
        out = flashlight.compile(VARIANTS[name].fn)(q, k, v)
    assert torch.isnan(out[..., 299, :]).all()  # the row that sees it
    assert torch.isfinite(out[..., :32, :]).all()  # rows whose tiles never reach key 299


def _sink_attention(q, k, v, sink, keep):
    # q, k, v: [B, H, L, D]; sink: [H] logits of a key that every query sees and that
    # carries no value (attention sinks); keep: [B, L] key padding; causal
    L = q.shape[-2]
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5  # [B, H, L, L]
    pos = torch.arange(L)
    s = s.masked_fill(pos[None, :] > pos[:, None], -math.inf)
    s = s.masked_fill(~keep[:, None, None, :], -math.inf)
    m = torch.maximum(s.amax(-1, keepdim=True), sink[:, None, None])  # [B, H, L, 1]
    e = torch.exp(s - m)
    return (e @ v) / (e.sum(-1, keepdim=True) + torch.exp(sink[:, None, None] - m))


def test_a_max_with_a_floor_starts_from_it_and_keeps_skipping():
    """``max(max_j s_j, r)`` runs as a loop max started at ``r`` ([Note: online
    reduction]), so the masked scores stay the loop body and dead tiles are still
    skipped; rows whose every key is removed give the sink's share, 0, as in eager."""
    g = torch.Generator().manual_seed(11)
    B, H, L, D = 2, 3, 300, 16
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    sink = torch.randn(H, generator=g)
    keep = torch.rand(B, L, generator=g) > 0.3
    keep[1] = False  # batch 1: no key at all
    kernel = _kernel_of(_sink_attention, q, k, v, sink, keep)
    (floored,) = [red for red in kernel.loop if red.op == "max"]
    assert floored.init is not None and kernel.live is not None and kernel.full is not None
    assert not any(isinstance(n, Pointwise) and n.op == "maximum" for n in walk(floored.body))
    ref = _sink_attention(q.double(), k.double(), v.double(), sink.double(), keep)
    with torch.no_grad():
        out = flashlight.compile(_sink_attention)(q, k, v, sink, keep)
    assert torch.isfinite(out).all() and torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def _chunked_causal(q, k, v):  # causal within chunks of 64 keys (chunked local attention)
    pos = torch.arange(q.shape[-2])
    keep = (pos[:, None] // 64 == pos[None, :] // 64) & (pos[None, :] <= pos[:, None])
    return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, -math.inf), dim=-1) @ v


def _strided_window(q, k, v):  # every 4th key among the last 100 (a strided sparse pattern)
    pos = torch.arange(q.shape[-2])
    d = pos[:, None] - pos[None, :]
    keep = (torch.remainder(d, 4) == 0) & (d >= 0) & (d <= 100)
    return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, -math.inf), dim=-1) @ v


def _float_blocks(q, k, v):  # block-diagonal, the block index computed in float
    block = torch.div(torch.arange(q.shape[-2]).float(), 32.0, rounding_mode="floor")
    keep = block[:, None] == block[None, :]
    return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, -math.inf), dim=-1) @ v


@pytest.mark.parametrize("fn", [_chunked_causal, _strided_window, _float_blocks])
def test_masks_with_floor_division_and_remainder_are_bounded(fn):
    """``//`` and ``%`` by a positive constant are bounded over a tile (monotone; in
    ``[0, c)``), so these masks get skipping and full tiles, and stay exact."""
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(2, 2, 300, 16, generator=g) for _ in range(3))
    kernel = _kernel_of(fn, q, k, v)
    assert kernel.live is not None and kernel.full is not None
    with torch.no_grad():
        out = flashlight.compile(fn)(q, k, v)
    torch.testing.assert_close(out.double(), fn(q.double(), k.double(), v.double()), rtol=1e-5, atol=1e-5)


def _window_by_boolean_minimum(q, k, v):  # "and" written as a minimum of booleans
    pos = torch.arange(q.shape[-2])
    keep = torch.minimum(pos[:, None] >= pos[None, :], pos[None, :] > pos[:, None] - 40)
    return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, -math.inf), dim=-1) @ v


def _window_by_boolean_maximum(q, k, v):  # "or" written as a maximum of booleans
    pos = torch.arange(q.shape[-2])
    drop = torch.maximum(pos[:, None] < pos[None, :], pos[None, :] <= pos[:, None] - 40)
    return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(drop, -math.inf), dim=-1) @ v


@pytest.mark.parametrize("fn", [_window_by_boolean_minimum, _window_by_boolean_maximum])
def test_a_minimum_or_maximum_of_boolean_masks_is_bounded_as_and_or(fn):
    """On booleans a minimum is "and" and a maximum "or": a tile is full only where both
    masks keep it whole (bounded as numbers, a minimum of may-be-false flags once let
    tiles one mask cuts run unmasked)."""
    g = torch.Generator().manual_seed(29)
    q, k, v = (torch.randn(1, 2, 150, 16, generator=g) for _ in range(3))
    assert _kernel_of(fn, q, k, v).full is not None
    _assert_close_to_float64(fn, (q, k, v), fn.__name__)


def test_chunks_never_read_the_keys_of_other_chunks():
    g = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(2, 2, 300, 16, generator=g) for _ in range(3))
    v[..., 299, :] = float("nan")  # [B, H, L, D]: a key of the last chunk (256..299)
    with torch.no_grad():
        out = flashlight.compile(_chunked_causal)(q, k, v)
    assert torch.isnan(out[..., 299, :]).all()
    assert torch.isfinite(out[..., :256, :]).all()  # eager: NaN everywhere (0 * NaN)


def test_kernels_with_a_running_max_start_and_rounding_divisions_compile_for_hopper():
    """The interpreter accepts code the GPU compiler rejects (Python scalars used as
    tensors, mixed integer types): the scan with ``//`` and ``%`` bounds, the loop max
    started from a value, the elementary functions and ``cdist`` must also build for
    sm_90 (no GPU needed)."""
    from tests.helpers import cdist_scores as _cdist_scores
    from tests.helpers import elementary_functions as _elementary_functions
    from tests.helpers import rounding_divisions as _rounding_divisions

    g = torch.Generator().manual_seed(19)
    q, k, v = (torch.randn(2, 3, 40, 16, generator=g) for _ in range(3))
    sink, keep = torch.randn(3, generator=g), torch.rand(2, 40, generator=g) > 0.3
    for fn, args in [(_sink_attention, (q, k, v, sink, keep)), (_strided_window, (q, k, v)), (_float_blocks, (q, k, v)),
                     (_elementary_functions, (q, k, v)), (_rounding_divisions, (q, k, v)), (_cdist_scores, (q, k, v))]:
        (kernel,) = flashlight.explain(fn, *args).kernels
        assert kernel.aot_compile(90).shared > 0, fn.__name__

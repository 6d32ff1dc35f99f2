"""The online pass: a loop reduction over several dims runs as one loop.

A contraction over a flattened axis (an output projection over the heads and their
width) reduces over two dims; the pass rewrites it over one dim of their product
([Note: a loop over several dims] in flashlight/passes/loop_dims.py), reading operands
that keep the dims apart at computed positions. A gate computed from the input by a
projection, times an attention output and projected back (OpenFold's global attention,
a gated output projection) is then one kernel whose loop runs over the gate's channels;
before, the projection failed as "a loop reduction over 2 dims" and the gate, its
sigmoid, the product and the projection ran as separate operations.
"""
from __future__ import annotations

import pytest
import torch

from flashlight.ir import Dim, Gather, Iota, Load, Pointwise, Reduce, dim_names, walk
from flashlight.passes.loop_dims import MergeFailed, merge_loop_dims
from flashlight.pipeline import recomputes_across_grid, repeats_loop_work
from tests.helpers import matches_float64, plan_of, rand

pytest.importorskip("triton")

B, L, H, D, C = 2, 29, 3, 8, 16


def _attention(q, k, v):  # [B, H, L, D]
    return torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, dim=-1) @ v


def gated_heads_first(x, q, k, v, w_g, b_g, w_o, b_o):
    # x: [B, L, C]; the attention output's heads flattened as (H, D), gated per token
    o = _attention(q, k, v).transpose(1, 2).flatten(-2)  # [B, L, H * D]
    return (o * torch.sigmoid(x @ w_g.t() + b_g)) @ w_o.t() + b_o  # [B, L, C]


def gated_width_first(x, q, k, v, w_g, b_g, w_o, b_o):
    # the same with the flattened axis ordered (D, H): the merged dims in the other order
    o = _attention(q, k, v).permute(0, 2, 3, 1).flatten(-2)  # [B, L, D * H]
    return (o * torch.sigmoid(x @ w_g.t() + b_g)) @ w_o.t() + b_o


def _inputs(seed):
    return (rand(B, L, C, seed=seed), *(rand(B, H, L, D, seed=seed + k) for k in (1, 2, 3)),
            rand(H * D, C, seed=seed + 4) * C ** -0.5, rand(H * D, seed=seed + 5),
            rand(C, H * D, seed=seed + 6) * (H * D) ** -0.5, rand(C, seed=seed + 7))


@pytest.mark.parametrize("fn", [gated_heads_first, gated_width_first], ids=lambda f: f.__name__)
def test_a_gated_output_projection_over_flattened_heads_is_one_kernel(fn):
    args = _inputs(3)
    matches_float64(fn, args)
    plan = plan_of(fn, args)
    gated = [t for t in plan.kernels.values() if any(o.startswith("sigmoid") for o in t.kernel.origins)]
    assert len(gated) == 1, plan.rejected
    assert gated[0].tiling.dots == 2, gated[0].tiling  # the gate's projection and the output's
    assert not any(node.startswith(("sigmoid", "mm")) for node in plan.rejected), plan.rejected
    for tiled in plan.kernels.values():
        assert not recomputes_across_grid(tiled) and not repeats_loop_work(tiled), tiled.tiling


def test_merged_dims_read_together_load_and_apart_gather():
    with dim_names():
        h, d, f = Dim.fresh(3), Dim.fresh(8), Dim.fresh(5)
        weight = Load("w", ((f,), (h, d)), torch.float32)  # [F, H * D], the dims together
        x = Load("x", ((h,), (d,)), torch.float32)  # [H, D], apart
        swapped = Load("y", ((d, h),), torch.float32)  # [D * H]: together, the other order
        red = Reduce("sum", Pointwise("mul", (Pointwise("mul", (x, weight), torch.float32), swapped),
                                      torch.float32), (h, d), torch.float32)
        merged = merge_loop_dims(red)
    (j,) = merged.dims
    assert j.size == 24
    loads = [n for n in walk(merged.body) if isinstance(n, Load)]
    assert [load.index for load in loads] == [((f,), (j,))]
    gathers = {g.base: g for g in walk(merged.body) if isinstance(g, Gather)}
    assert set(gathers) == {"x", "y"} and gathers["x"].extents == (3, 8) and gathers["y"].extents == (24,)
    assert all(n.axis == (j,) for g in gathers.values() for n in walk(g) if isinstance(n, Iota))


def test_a_dynamic_inner_dim_is_not_merged():
    with dim_names():
        h, d = Dim.fresh(3), Dim.fresh("s0")
        red = Reduce("sum", Load("x", ((h,), (d,)), torch.float32), (h, d), torch.float32)
        with pytest.raises(MergeFailed):
            merge_loop_dims(red)


def _point_distance_attention(q, k, v, a, b, w):
    # invariant point attention's squared distances: a, b [B, H, L, P * 3] (points, xyz)
    d2 = ((a.unflatten(-1, (-1, 3))[:, :, :, None] - b.unflatten(-1, (-1, 3))[:, :, None]) ** 2).sum((-1, -2))
    s = q @ k.transpose(-1, -2) * D ** -0.5 - 0.5 * torch.nn.functional.softplus(w)[:, None, None] * d2
    e = torch.exp(s - s.amax(-1, keepdim=True))  # numerator and denominator written apart
    return (e / e.sum(-1, keepdim=True)) @ v


def test_every_copy_of_an_inner_sum_over_several_dims_merges_alike():
    """[Note: a sum over several dims inside the loop]: the distance sum, inlined into the
    max and both sums of the softmax, is rewritten over one merged dim in every copy, so
    the loop runs one max and the distances once per step (with a dim per copy the kernel
    ran two maxes and computed the distances four times)."""
    args = (*(rand(B, H, L, D, seed=20 + n) for n in range(3)), rand(B, H, L, 12, seed=23),
            rand(B, H, L, 12, seed=24), rand(H, seed=25))
    matches_float64(_point_distance_attention, args)
    (tiled,) = plan_of(_point_distance_attention, args).kernels.values()
    loop = tiled.kernel.loop
    assert [red.op for red in loop].count("max") == 1, loop
    distance_sums = {node for red in loop for node in walk(red.body)
                     if isinstance(node, Reduce) and node.op == "sum" and node.dims[0].size == 12}
    assert len(distance_sums) == 1, distance_sums


@pytest.mark.parametrize("positions", [12, 24])  # 4 and 8 points: a loop of contractions takes at most 16
def test_a_distance_sum_in_the_scores_loops_and_the_rows_take_a_tile(positions):
    """[Note: elementwise inner loops] (passes/tiling.py): the squared distances, a sum of
    an elementwise value over rows, keys and 12 or 24 positions, run as an inner loop of
    the key loop's body; the queries keep their row tile and ``q k^T`` its ``tl.dot`` (the
    rows went to the grid, one query per program, and no product ran as a dot)."""
    args = (*(rand(B, H, L, D, seed=30 + n) for n in range(3)), rand(B, H, L, positions, seed=33),
            rand(B, H, L, positions, seed=34), rand(H, seed=35))
    matches_float64(_point_distance_attention, args)
    (tiled,) = plan_of(_point_distance_attention, args).kernels.values()
    assert tiled.tiling.row is not None, tiled.tiling
    assert [d.size for d in tiled.tiling.inner_loops] == [positions], tiled.tiling
    assert tiled.tiling.dots >= 2, tiled.tiling  # q k^T and p v

"""Evoformer (AlphaFold2 / OpenFold) gated attentions as OpenFold computes them; the catalog
entries ``EVOFORMER_VARIANTS`` (see :mod:`bench.variants`)."""
from __future__ import annotations

import math

import torch
from torch.nn.attention.flex_attention import flex_attention

from bench.variants_base import (
    Variant,
    attn_flops,
    random_keep_mask,
    random_normal,
    sdpa_any_batch,
    sizes_of,
)

# ----------------------------------------------------------------------------------------
# Evoformer (AlphaFold2 / OpenFold) gated attention
# ----------------------------------------------------------------------------------------


def msa_row_pair_bias(q, k, v, mask, pair_bias, g):
    # MSARowAttentionWithPairBias. q, k, v: [B, S, H, L, c], q already scaled by c**-0.5
    # (OpenFold scales it while projecting); mask: [B, S, L], 1 for present residues;
    # pair_bias: [B, 1, H, L, L]; g: [B, S, L, H, c] gate logits
    mask_bias = (1e9 * (mask - 1))[..., :, None, None, :]  # [B, S, 1, 1, L]
    a = torch.matmul(q, k.transpose(-1, -2))  # [B, S, H, L, L]
    a = a + mask_bias + pair_bias
    a = torch.softmax(a, dim=-1)
    o = torch.matmul(a, v)  # [B, S, H, L, c]
    o = o.transpose(-2, -3)  # [B, S, L, H, c]
    return o * torch.sigmoid(g)


def _projected(shape5, dtype, device, generator, std: float = 1.0):
    """A ``[*, X, Y, H, c]`` projection viewed as ``[*, X, H, Y, c]`` (OpenFold's layout)."""
    return random_normal(shape5, dtype, device, generator, std).transpose(-2, -3)


def _msa_row_inputs(shape, dtype, device, generator):
    B, S, L, H, c = sizes_of(shape, "B", "S", "L", "H", "c")
    q = _projected((B, S, L, H, c), dtype, device, generator, std=c ** -0.5)  # [B, S, H, L, c]
    k = _projected((B, S, L, H, c), dtype, device, generator)
    v = _projected((B, S, L, H, c), dtype, device, generator)
    mask = random_keep_mask((B, S, L), generator).to(device=device, dtype=dtype)
    # linear_z(z): [B, L, L, H], permuted to [B, H, L, L] and unsqueezed
    pair_bias = random_normal((B, L, L, H), dtype, device, generator).permute(0, 3, 1, 2).unsqueeze(1)
    g = random_normal((B, S, L, H, c), dtype, device, generator)
    return q, k, v, mask, pair_bias, g


def _msa_row_flops(s):
    return attn_flops(s["B"] * s["S"] * s["H"], s["L"], s["L"], s["c"], s["c"])


def _msa_row_flex(q, k, v, mask, pair_bias, g):
    B, S, H, L, c = q.shape
    mask_bias = (1e9 * (mask - 1)).reshape(B * S, L)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + mask_bias[b, kv_idx] + pair_bias[b // S, 0, h, q_idx, kv_idx]

    o = flex_attention(q.reshape(B * S, H, L, c), k.reshape(B * S, H, L, c), v.reshape(B * S, H, L, c),
                       score_mod=score_mod, scale=1.0)
    return o.reshape(B, S, H, L, c).transpose(-2, -3) * torch.sigmoid(g)


def _msa_row_sdpa(q, k, v, mask, pair_bias, g):
    bias = (1e9 * (mask - 1))[..., :, None, None, :] + pair_bias  # [B, S, H, L, L]
    o = sdpa_any_batch(q, k, v, attn_mask=bias, scale=1.0)
    return o.transpose(-2, -3) * torch.sigmoid(g)


def msa_column(q, k, v, mask, g):
    # MSAColumnAttention. q, k, v, g: [B, S, L, H, c] projections of the MSA (S sequences,
    # L residues); mask: [B, S, L]. Attention runs along S, separately for each residue.
    c = q.shape[-1]
    q = q.permute(0, 2, 3, 1, 4) / math.sqrt(c)  # [B, L, H, S, c]
    k = k.permute(0, 2, 3, 1, 4)
    v = v.permute(0, 2, 3, 1, 4)
    mask_bias = (1e9 * (mask.transpose(-1, -2) - 1))[..., :, None, None, :]  # [B, L, 1, 1, S]
    a = torch.softmax(q @ k.transpose(-1, -2) + mask_bias, dim=-1)  # [B, L, H, S, S]
    o = (a @ v).permute(0, 3, 1, 2, 4)  # [B, S, L, H, c]
    return o * torch.sigmoid(g)


def _msa_column_inputs(shape, dtype, device, generator):
    B, S, L, H, c = sizes_of(shape, "B", "S", "L", "H", "c")
    q, k, v = (random_normal((B, S, L, H, c), dtype, device, generator) for _ in range(3))
    # mask: each residue column keeps at least one sequence
    mask = random_keep_mask((B, L, S), generator).transpose(-1, -2).to(device=device, dtype=dtype)
    g = random_normal((B, S, L, H, c), dtype, device, generator)
    return q, k, v, mask, g


def _msa_column_flops(s):
    return attn_flops(s["B"] * s["L"] * s["H"], s["S"], s["S"], s["c"], s["c"])


def _msa_column_flex(q, k, v, mask, g):
    B, S, L, H, c = q.shape
    qt, kt, vt = (t.permute(0, 2, 3, 1, 4).reshape(B * L, H, S, c) for t in (q, k, v))
    mask_bias = (1e9 * (mask.transpose(-1, -2) - 1)).reshape(B * L, S)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + mask_bias[b, kv_idx]

    o = flex_attention(qt, kt, vt, score_mod=score_mod)
    return o.reshape(B, L, H, S, c).permute(0, 3, 1, 2, 4) * torch.sigmoid(g)


def _msa_column_sdpa(q, k, v, mask, g):
    qt, kt, vt = (t.permute(0, 2, 3, 1, 4) for t in (q, k, v))
    mask_bias = (1e9 * (mask.transpose(-1, -2) - 1))[..., :, None, None, :]
    o = sdpa_any_batch(qt, kt, vt, attn_mask=mask_bias.to(q.dtype))
    return o.permute(0, 3, 1, 2, 4) * torch.sigmoid(g)


def triangle_start(q, k, v, mask, tri_bias, g):
    # TriangleAttention, starting node. q, k, v, g: [B, I, J, H, c] projections of the pair
    # representation z [B, I, J, C]; mask: [B, I, J]; tri_bias: [B, I, J, H] = linear(z).
    # Edge ij attends to edges ik, biased by z_jk.
    q = q.transpose(-2, -3) * q.shape[-1] ** -0.5  # [B, I, H, J, c]
    k = k.transpose(-2, -3)
    v = v.transpose(-2, -3)
    mask_bias = (1e9 * (mask - 1))[..., :, None, None, :]  # [B, I, 1, 1, J]
    bias = tri_bias.permute(0, 3, 1, 2).unsqueeze(-4)  # [B, 1, H, J, K]
    a = torch.matmul(q, k.transpose(-1, -2)) + mask_bias + bias  # [B, I, H, J, K]
    a = torch.softmax(a, dim=-1)
    o = torch.matmul(a, v).transpose(-2, -3)  # [B, I, J, H, c]
    return o * torch.sigmoid(g)


def triangle_end(q, k, v, mask, tri_bias, g):
    # TriangleAttention, ending node: the starting-node computation on the transposed pair
    # representation (edge ij attends to edges kj, biased by z_ki). Inputs as for
    # triangle_start, in z's layout; the output is returned in z's layout too.
    q, k, v, g = q.transpose(-4, -3), k.transpose(-4, -3), v.transpose(-4, -3), g.transpose(-4, -3)
    mask = mask.transpose(-1, -2)  # [B, J, I]
    tri_bias = tri_bias.transpose(-2, -3)  # [B, J, I, H]
    c = q.shape[-1]
    q = q.transpose(-2, -3) / math.sqrt(c)  # [B, J, H, I, c]
    k = k.transpose(-2, -3)
    v = v.transpose(-2, -3)
    mask_bias = (1e9 * (mask - 1))[..., :, None, None, :]  # [B, J, 1, 1, I]
    bias = tri_bias.permute(0, 3, 1, 2).unsqueeze(-4)  # [B, 1, H, I, K]
    a = torch.softmax(q @ k.transpose(-1, -2) + mask_bias + bias, dim=-1)  # [B, J, H, I, K]
    o = (a @ v).transpose(-2, -3) * torch.sigmoid(g)  # [B, J, I, H, c]
    return o.transpose(-4, -3)  # [B, I, J, H, c]


def _triangle_inputs(shape, dtype, device, generator):
    B, N, H, c = sizes_of(shape, "B", "N", "H", "c")
    q, k, v = (random_normal((B, N, N, H, c), dtype, device, generator) for _ in range(3))
    mask = random_keep_mask((B, N, N), generator).to(device=device, dtype=dtype)
    tri_bias = random_normal((B, N, N, H), dtype, device, generator)
    g = random_normal((B, N, N, H, c), dtype, device, generator)
    return q, k, v, mask, tri_bias, g


def _triangle_end_inputs(shape, dtype, device, generator):
    q, k, v, mask, tri_bias, g = _triangle_inputs(shape, dtype, device, generator)
    # every column of the mask (a row after the transpose) keeps at least one position
    mask = random_keep_mask(mask.shape, generator).transpose(-1, -2).to(device=device, dtype=dtype)
    return q, k, v, mask, tri_bias, g


def _triangle_flops(s):
    return attn_flops(s["B"] * s["N"] * s["H"], s["N"], s["N"], s["c"], s["c"])


def _triangle_start_flex(q, k, v, mask, tri_bias, g):
    B, N, _, H, c = q.shape
    qt, kt, vt = (t.transpose(-2, -3).reshape(B * N, H, N, c) for t in (q, k, v))
    mask_bias = (1e9 * (mask - 1)).reshape(B * N, N)
    bias = tri_bias.permute(0, 3, 1, 2)  # [B, H, J, K]

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + mask_bias[b, kv_idx] + bias[b // N, h, q_idx, kv_idx]

    o = flex_attention(qt, kt, vt, score_mod=score_mod)
    return o.reshape(B, N, H, N, c).transpose(-2, -3) * torch.sigmoid(g)


def _triangle_end_flex(q, k, v, mask, tri_bias, g):
    t = lambda x: x.transpose(-4, -3)  # noqa: E731
    o = _triangle_start_flex(t(q), t(k), t(v), mask.transpose(-1, -2), tri_bias.transpose(-2, -3), t(g))
    return t(o)


def _triangle_start_sdpa(q, k, v, mask, tri_bias, g):
    qt, kt, vt = (t.transpose(-2, -3) for t in (q, k, v))
    bias = (1e9 * (mask - 1))[..., :, None, None, :] + tri_bias.permute(0, 3, 1, 2).unsqueeze(-4)
    o = sdpa_any_batch(qt, kt, vt, attn_mask=bias)
    return o.transpose(-2, -3) * torch.sigmoid(g)


def _triangle_end_sdpa(q, k, v, mask, tri_bias, g):
    t = lambda x: x.transpose(-4, -3)  # noqa: E731
    o = _triangle_start_sdpa(t(q), t(k), t(v), mask.transpose(-1, -2), tri_bias.transpose(-2, -3), t(g))
    return t(o)



_TRIANGLE_SHAPES: tuple[dict, ...] = (
    {"B": 1, "N": 256, "H": 4, "c": 32},
    {"B": 1, "N": 512, "H": 4, "c": 32},
    {"B": 1, "N": 1024, "H": 4, "c": 32},
    {"B": 1, "N": 256, "H": 4, "c": 16},  # template pair stack
    {"B": 1, "N": 256, "H": 4, "c": 64},  # the paper's configuration
    {"B": 1, "N": 384, "H": 4, "c": 32},
    {"B": 1, "N": 2048, "H": 4, "c": 32},  # scores of 64 GiB in bf16: only fused kernels fit
)

EVOFORMER_VARIANTS: tuple[Variant, ...] = (
    Variant(
        name="msa_row_pair_bias",
        fn=msa_row_pair_bias,
        make_inputs=_msa_row_inputs,
        default_shape={"B": 2, "S": 3, "L": 23, "H": 2, "c": 16},
        bench_shapes=(
            {"B": 1, "S": 512, "L": 256, "H": 8, "c": 32},
            {"B": 1, "S": 512, "L": 1024, "H": 8, "c": 32},
            {"B": 1, "S": 256, "L": 256, "H": 4, "c": 64},  # the paper's configuration ...
            {"B": 1, "S": 5120, "L": 256, "H": 8, "c": 8},  # extra-MSA stack
            {"B": 8, "S": 256, "L": 256, "H": 4, "c": 64},  # ... at batch 8 and 32
            {"B": 32, "S": 256, "L": 256, "H": 4, "c": 64},
            {"B": 1, "S": 256, "L": 256, "H": 4, "c": 128},  # ... with c 128
            {"B": 32, "S": 256, "L": 256, "H": 4, "c": 128},
        ),
        flops=_msa_row_flops,
        flex=_msa_row_flex,
        sdpa=_msa_row_sdpa,
    ),
    Variant(
        name="msa_column",
        fn=msa_column,
        make_inputs=_msa_column_inputs,
        default_shape={"B": 1, "S": 21, "L": 5, "H": 2, "c": 8},
        bench_shapes=(
            {"B": 1, "S": 512, "L": 256, "H": 8, "c": 32},
            {"B": 1, "S": 512, "L": 1024, "H": 8, "c": 32},
        ),
        flops=_msa_column_flops,
        flex=_msa_column_flex,
        sdpa=_msa_column_sdpa,
    ),
    Variant(
        name="triangle_start",
        fn=triangle_start,
        make_inputs=_triangle_inputs,
        default_shape={"B": 1, "N": 13, "H": 4, "c": 32},
        bench_shapes=_TRIANGLE_SHAPES,
        flops=_triangle_flops,
        flex=_triangle_start_flex,
        sdpa=_triangle_start_sdpa,
    ),
    Variant(
        name="triangle_end",
        fn=triangle_end,
        make_inputs=_triangle_end_inputs,
        default_shape={"B": 1, "N": 14, "H": 4, "c": 32},
        bench_shapes=_TRIANGLE_SHAPES,
        flops=_triangle_flops,
        flex=_triangle_end_flex,
        sdpa=_triangle_end_sdpa,
    ),
)

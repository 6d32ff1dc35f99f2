"""Attention beyond one output, plain loads and precomputed queries, written
as their users write them; the catalog entries ``GENERAL_VARIANTS`` (see
:mod:`bench.variants`):

- ``attention_lse``: causal attention returning its output and the row log-sum-exp (what
  a training forward keeps for the backward);
- ``rotary``: rotary position embeddings in rotate-half form applied to q and k inside
  the function (``torch.cat((-x2, x1), -1)`` on the halves of the head dim), then causal
  attention;
- ``relative_bias``: a learned ``[H, buckets]`` table of biases looked up by the clamped
  distance between key and query positions (T5 / ALiBi-like relative positions);
- ``global_column``: OpenFold's global column attention (the extra-MSA stack) as a whole
  module: a masked mean over the sequences projected to one query per head, one key and
  value head shared by the heads, a mask bias, a sigmoid gate per sequence and the output
  projection.

FlexAttention and SDPA forms do in plain PyTorch what one call of theirs cannot (the
rotary embedding, the pooled query and the projections), then call it once.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

try:  # the log-sum-exp's request since torch 2.9 (``return_lse`` is deprecated)
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:
    AuxRequest = None

from bench.variants_base import (
    LM_SHAPES,
    Variant,
    attn_flops,
    bhld_flops,
    bhld_inputs,
    random_keep_mask,
    random_normal,
    sdpa_any_batch,
    sizes_of,
    static_block_mask,
)

# output and log-sum-exp ------------------------------------------------------------------


def attention_lse(q, k, v):
    # q, k, v: [B, H, L, D]; causal; returns the output [B, H, L, D] and the log-sum-exp of
    # each row of scores [B, H, L], which the backward recomputes the probabilities from
    L = q.shape[-2]
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5  # [B, H, L, L]
    future = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
    s = s.masked_fill(future, float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def _attention_lse_flex(q, k, v):
    bm = static_block_mask("causal", q.shape[-2], k.shape[-2], str(q.device))
    if AuxRequest is None:  # torch before 2.9
        out, lse = flex_attention(q, k, v, block_mask=bm, return_lse=True)
    else:
        out, aux = flex_attention(q, k, v, block_mask=bm, return_aux=AuxRequest(lse=True))
        lse = aux.lse  # float32 [B, H, L]
    return out, lse.to(q.dtype)


# rotary embeddings, rotate-half form -------------------------------------------------------

ROPE_BASE = 10000.0


def rotate_half(x):
    # [..., D] -> [..., D]: the halves of the last dim swapped, the new first half negated
    x1, x2 = x.chunk(2, dim=-1)  # [..., D / 2] each
    return torch.cat((-x2, x1), dim=-1)


def rotary(q, k, v, cos, sin):
    # q, k, v: [B, H, L, D]; cos, sin: [L, D], the angle of each position and frequency,
    # each frequency twice (both halves), as LLaMA's rotary embedding module returns them
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    L = q.shape[-2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, H, L, L]
    future = torch.triu(torch.ones(L, L, dtype=torch.bool, device=q.device), diagonal=1)
    s = s.masked_fill(future, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _rotary_inputs(shape, dtype, device, generator):
    L, D = shape["L"], shape["D"]
    inv_freq = ROPE_BASE ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)  # [D / 2]
    angle = torch.arange(L, dtype=torch.float32)[:, None] * inv_freq[None, :]  # [L, D / 2]
    angle = torch.cat((angle, angle), dim=-1)  # [L, D]
    cos, sin = (t.to(device=device, dtype=dtype) for t in (angle.cos(), angle.sin()))
    return (*bhld_inputs(shape, dtype, device, generator), cos, sin)


def _rotated(q, k, cos, sin):
    """q and k rotated in PyTorch (what a Flex or SDPA user runs before the call)."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _rotary_flex(q, k, v, cos, sin):
    q, k = _rotated(q, k, cos, sin)
    bm = static_block_mask("causal", q.shape[-2], k.shape[-2], str(q.device))
    return flex_attention(q, k, v, block_mask=bm)


def _rotary_sdpa(q, k, v, cos, sin):
    q, k = _rotated(q, k, cos, sin)
    return sdpa_any_batch(q, k, v, is_causal=True)


# relative-position bias from a table ---------------------------------------------------------

MAX_DISTANCE = 32  # distances beyond it share the last bucket on their side


def clamped_distance(L: int, max_distance: int, device):
    # [L, L]: key position minus query position, clamped to +-max_distance, as a table index
    pos = torch.arange(L, device=device)
    return (pos[None, :] - pos[:, None]).clamp(-max_distance, max_distance) + max_distance


def relative_bias(q, k, v, table):
    # q, k, v: [B, H, L, D]; table: [H, 2 * 32 + 1], a learned bias per head and clamped
    # distance (key position minus query position), bidirectional
    bias = table[:, clamped_distance(q.shape[-2], (table.shape[-1] - 1) // 2, q.device)]  # [H, L, L]
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 + bias
    return torch.softmax(s, dim=-1) @ v


def _relative_inputs(shape, dtype, device, generator):
    H = shape["H"]
    table = random_normal((H, 2 * MAX_DISTANCE + 1), dtype, device, generator)  # [H, buckets]
    return (*bhld_inputs(shape, dtype, device, generator), table)


def _relative_flex(q, k, v, table):
    def score_mod(score, b, h, q_idx, kv_idx):
        bucket = torch.clamp(kv_idx - q_idx, -MAX_DISTANCE, MAX_DISTANCE) + MAX_DISTANCE
        return score + table[h, bucket]

    return flex_attention(q, k, v, score_mod=score_mod)


def _relative_sdpa(q, k, v, table):
    bucket = clamped_distance(q.shape[-2], MAX_DISTANCE, q.device)  # [L, L]
    return sdpa_any_batch(q, k, v, attn_mask=table[:, bucket])  # bias [H, L, L]


# OpenFold global column attention ------------------------------------------------------------

GLOBAL_EPS = 1e-10  # OpenFold's GlobalAttention adds it to the number of sequences pooled
GLOBAL_INF = 1e9


def global_column(m, mask, w_q, w_k, w_v, w_g, b_g, w_o, b_o):
    # OpenFold's GlobalAttention: m [B, R, S, C] (each residue's column of S sequences);
    # mask [B, R, S], 1 for sequences present; nn.Linear weights [out, in]:
    # w_q [H * c, C], w_k and w_v [c, C] (one key/value head), w_g [H * c, C], b_g [H * c],
    # w_o [C, H * c], b_o [C]
    c = w_k.shape[0]
    H = w_q.shape[0] // c
    q = torch.sum(m * mask.unsqueeze(-1), dim=-2) / (torch.sum(mask, dim=-1)[..., None] + GLOBAL_EPS)  # [B, R, C]
    q = F.linear(q, w_q) * c ** -0.5  # [B, R, H * c]
    q = q.view(q.shape[:-1] + (H, c))  # [B, R, H, c]
    k = F.linear(m, w_k)  # [B, R, S, c]
    v = F.linear(m, w_v)
    bias = (GLOBAL_INF * (mask - 1))[..., :, None, :]  # [B, R, 1, S]
    a = torch.matmul(q, k.transpose(-1, -2)) + bias  # [B, R, H, S]
    a = torch.softmax(a, dim=-1)
    o = torch.matmul(a, v)  # [B, R, H, c]
    g = torch.sigmoid(F.linear(m, w_g, b_g))  # [B, R, S, H * c]
    g = g.view(g.shape[:-1] + (H, c))  # [B, R, S, H, c]
    o = o.unsqueeze(-3) * g  # [B, R, S, H, c]
    o = o.reshape(o.shape[:-2] + (-1,))  # [B, R, S, H * c]
    return F.linear(o, w_o, b_o)  # [B, R, S, C]


def _global_inputs(shape, dtype, device, generator):
    B, R, S, C, H, c = sizes_of(shape, "B", "R", "S", "C", "H", "c")
    # the sequences of an alignment column share a component (what the pooled query sees)
    m = random_normal((B, R, 1, C), torch.float32, device, generator) + random_normal(
        (B, R, S, C), torch.float32, device, generator)  # [B, R, S, C]
    mask = random_keep_mask((B, R, S), generator).to(device=device, dtype=dtype)  # each column keeps one
    weights = [random_normal(size, dtype, device, generator, std=fan_in ** -0.5)  # nn.Linear-like scales
               for size, fan_in in (((H * c, C), C), ((c, C), C), ((c, C), C), ((H * c, C), C))]
    b_g = random_normal((H * c,), dtype, device, generator)
    w_o = random_normal((C, H * c), dtype, device, generator, std=(H * c) ** -0.5)
    b_o = random_normal((C,), dtype, device, generator, std=0.1)
    return (m.to(dtype), mask, *weights, b_g, w_o, b_o)


def _global_flops(s):
    B, R, S, C, H, c = sizes_of(s, "B", "R", "S", "C", "H", "c")
    projections = 2.0 * B * R * (C * H * c + S * C * (2 * c + 2 * H * c))  # q; k, v, gate, output
    return attn_flops(B * R, H, S, c, c) + projections


def _global_pooled(m, mask, w_q, w_k, w_v):
    """The pooled query [B, R, H, c], keys and values [B, R, S, c], and the mask bias
    [B, R, S], in PyTorch (what a Flex or SDPA user computes before the call)."""
    c = w_k.shape[0]
    q = torch.sum(m * mask.unsqueeze(-1), dim=-2) / (torch.sum(mask, dim=-1)[..., None] + GLOBAL_EPS)
    q = (F.linear(q, w_q) * c ** -0.5).unflatten(-1, (-1, c))
    return q, F.linear(m, w_k), F.linear(m, w_v), GLOBAL_INF * (mask - 1)


def _global_gated(o, m, w_g, b_g, w_o, b_o):
    # o: [B, R, H, c] -> the gated output projection [B, R, S, C]
    g = torch.sigmoid(F.linear(m, w_g, b_g)).unflatten(-1, o.shape[-2:])  # [B, R, S, H, c]
    return F.linear((o.unsqueeze(-3) * g).flatten(-2), w_o, b_o)


def _global_flex(m, mask, w_q, w_k, w_v, w_g, b_g, w_o, b_o):
    # each column a batch row with one head; its H pooled queries are the query positions
    q, k, v, mask_bias = _global_pooled(m, mask, w_q, w_k, w_v)
    B, R, H, c = q.shape
    S = k.shape[-2]
    mask_bias = mask_bias.reshape(B * R, S)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + mask_bias[b, kv_idx]

    o = flex_attention(q.reshape(B * R, 1, H, c), k.reshape(B * R, 1, S, c), v.reshape(B * R, 1, S, c),
                       score_mod=score_mod, scale=1.0)  # [B * R, 1, H, c]
    return _global_gated(o.view(B, R, H, c), m, w_g, b_g, w_o, b_o)


def _global_sdpa(m, mask, w_q, w_k, w_v, w_g, b_g, w_o, b_o):
    q, k, v, mask_bias = _global_pooled(m, mask, w_q, w_k, w_v)
    o = sdpa_any_batch(q[..., None, :, :], k[..., None, :, :], v[..., None, :, :],  # [B, R, 1, H | S, c]
                       attn_mask=mask_bias[..., None, None, :].to(q.dtype), scale=1.0)
    return _global_gated(o[..., 0, :, :], m, w_g, b_g, w_o, b_o)


GENERAL_VARIANTS: tuple[Variant, ...] = (
    Variant(
        name="attention_lse",
        fn=attention_lse,
        make_inputs=bhld_inputs,
        default_shape={"B": 2, "H": 2, "L": 27, "D": 16},
        bench_shapes=LM_SHAPES,
        flops=bhld_flops(0.5),
        flex=_attention_lse_flex,
        sdpa=None,  # F.scaled_dot_product_attention returns no log-sum-exp
    ),
    Variant(
        name="rotary",
        fn=rotary,
        make_inputs=_rotary_inputs,
        default_shape={"B": 1, "H": 3, "L": 25, "D": 16},
        bench_shapes=LM_SHAPES,
        flops=bhld_flops(0.5),
        flex=_rotary_flex,
        sdpa=_rotary_sdpa,
    ),
    Variant(
        name="relative_bias",
        fn=relative_bias,
        make_inputs=_relative_inputs,
        default_shape={"B": 2, "H": 2, "L": 45, "D": 16},  # longer than 32: clamped distances
        bench_shapes=LM_SHAPES,
        flops=bhld_flops(1.0),
        flex=_relative_flex,
        sdpa=_relative_sdpa,
    ),
    Variant(
        name="global_column",
        fn=global_column,
        make_inputs=_global_inputs,
        default_shape={"B": 1, "R": 5, "S": 23, "C": 16, "H": 4, "c": 8},
        bench_shapes=(  # AlphaFold2's extra-MSA stack: c_e 64, 8 heads of 8
            {"B": 1, "R": 256, "S": 1024, "C": 64, "H": 8, "c": 8},
            {"B": 1, "R": 256, "S": 5120, "C": 64, "H": 8, "c": 8},
            {"B": 1, "R": 512, "S": 5120, "C": 64, "H": 8, "c": 8},
            {"B": 1, "R": 1024, "S": 5120, "C": 64, "H": 8, "c": 8},
        ),
        flops=_global_flops,
        flex=_global_flex,
        sdpa=_global_sdpa,
    ),
)

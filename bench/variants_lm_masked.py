"""Language-model attention variants whose masks come from positions or data (sliding
window, prefix LM, packed documents, cross attention with key padding), written as their
users write them; ``LM_VARIANTS`` in :mod:`bench.variants_lm` includes them."""
from __future__ import annotations

import math

import torch
from torch.nn.attention.flex_attention import flex_attention

from bench.variants_base import (
    LM_SHAPES,
    SLIDING_WINDOW,
    Variant,
    attn_flops,
    bhld_inputs,
    data_block_mask,
    gen_device,
    prefix_density,
    random_int,
    random_normal,
    sdpa_any_batch,
    sizes_of,
    static_block_mask,
    window_density,
)

# sliding window ------------------------------------------------------------------------


def sliding_window(q, k, v):
    # q, k, v: [B, H, L, D]; causal sliding window of 16 tokens (a model constant)
    window = 16
    L = q.shape[-2]
    i = torch.arange(L, device=q.device)
    d = i[:, None] - i[None, :]  # [L, L], i - j
    keep = (d >= 0) & (d < window)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _sliding_window_flex(q, k, v):
    bm = static_block_mask("sliding_window", q.shape[-2], k.shape[-2], str(q.device))
    return flex_attention(q, k, v, block_mask=bm)


def _sliding_window_sdpa(q, k, v):
    L = q.shape[-2]
    i = torch.arange(L, device=q.device)
    d = i[:, None] - i[None, :]
    return sdpa_any_batch(q, k, v, attn_mask=(d >= 0) & (d < SLIDING_WINDOW))


# prefix-LM -------------------------------------------------------------------------------


def prefix_lm(q, k, v, prefix_len):
    # q, k, v: [B, H, L, D]; prefix_len: [B] int64. Tokens of the prefix (the prompt) see
    # the whole prefix; the rest are causal.
    L = q.shape[-2]
    pos = torch.arange(L, device=q.device)
    causal = pos[None, :, None] >= pos[None, None, :]  # [1, L, L]
    in_prefix = pos[None, None, :] < prefix_len[:, None, None]  # [B, 1, L]
    keep = (causal | in_prefix)[:, None]  # [B, 1, L, L]
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _prefix_inputs(shape, dtype, device, generator):
    B, L, P = shape["B"], shape["L"], shape["P"]
    q, k, v = bhld_inputs(shape, dtype, device, generator)
    lo, hi = P // 2, min(L, P + P // 2) + 1
    return q, k, v, random_int(lo, hi, (B,), device, generator)


def _prefix_mod(prefix_len):
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) | (kv_idx < prefix_len[b])

    return mask_mod


def _prefix_flex(q, k, v, prefix_len):
    bm = data_block_mask(_prefix_mod, prefix_len, q.shape[0], q.shape[-2], k.shape[-2])
    return flex_attention(q, k, v, block_mask=bm)


def _prefix_sdpa(q, k, v, prefix_len):
    L = q.shape[-2]
    pos = torch.arange(L, device=q.device)
    keep = (pos[None, :, None] >= pos[None, None, :]) | (pos[None, None, :] < prefix_len[:, None, None])
    return sdpa_any_batch(q, k, v, attn_mask=keep[:, None])


# document mask (packed sequences) ------------------------------------------------------


def document_mask(q, k, v, doc):
    # q, k, v: [H, L, D], several documents packed into one sequence (no batch dim);
    # doc: [L] int64 document id of each token. Causal within each document.
    L = q.shape[-2]
    pos = torch.arange(L, device=q.device)
    same_doc = doc[:, None] == doc[None, :]  # [L, L]
    causal = pos[:, None] >= pos[None, :]
    s = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # [H, L, L]
    s = s.masked_fill(~(same_doc & causal), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _document_inputs(shape, dtype, device, generator):
    H, L, D, n = shape["H"], shape["L"], shape["D"], shape["n_docs"]
    q, k, v = (random_normal((H, L, D), dtype, device, generator) for _ in range(3))
    # n - 1 distinct cut points in 1..L-1: documents of random lengths, in order
    cuts = torch.randperm(L - 1, generator=generator, device=gen_device(generator))[: n - 1] + 1
    starts = torch.zeros(L, dtype=torch.int64, device=cuts.device)
    starts[cuts] = 1
    return q, k, v, torch.cumsum(starts, 0).to(device)


def _document_mod(doc):
    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    return mask_mod


def _document_flex(q, k, v, doc):
    bm = data_block_mask(_document_mod, doc, None, q.shape[-2], k.shape[-2])
    return flex_attention(q[None], k[None], v[None], block_mask=bm)[0]


def _document_sdpa(q, k, v, doc):
    L = q.shape[-2]
    pos = torch.arange(L, device=q.device)
    keep = (doc[:, None] == doc[None, :]) & (pos[:, None] >= pos[None, :])
    return sdpa_any_batch(q, k, v, attn_mask=keep)



# cross attention -------------------------------------------------------------------------


def cross_attention(q, k, v, kv_mask):
    # q: [B, H, Lq, D] (decoder); k: [B, H, Lkv, D], v: [B, H, Lkv, Dv] (encoder);
    # kv_mask: [B, Lkv] bool, False on encoder padding
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5  # [B, H, Lq, Lkv]
    s = s.masked_fill(~kv_mask[:, None, None, :], float("-inf"))
    return torch.softmax(s, dim=-1) @ v  # [B, H, Lq, Dv]


def _cross_inputs(shape, dtype, device, generator):
    B, H, Lq, Lkv, D, Dv = sizes_of(shape, "B", "H", "Lq", "Lkv", "D", "Dv")
    q = random_normal((B, H, Lq, D), dtype, device, generator)
    k = random_normal((B, H, Lkv, D), dtype, device, generator)
    v = random_normal((B, H, Lkv, Dv), dtype, device, generator)
    # padded batch: each encoder sequence has a random length, padding at the end
    lengths = random_int(max(1, Lkv // 2), Lkv + 1, (B,), device, generator)
    kv_mask = torch.arange(Lkv, device=device)[None, :] < lengths[:, None]
    return q, k, v, kv_mask


def _cross_flops(s):
    return attn_flops(s["B"] * s["H"], s["Lq"], s["Lkv"], s["D"], s["Dv"])


def _cross_mod(kv_mask):
    def mask_mod(b, h, q_idx, kv_idx):
        return kv_mask[b, kv_idx]

    return mask_mod


def _cross_flex(q, k, v, kv_mask):
    bm = data_block_mask(_cross_mod, kv_mask, q.shape[0], q.shape[-2], k.shape[-2])
    return flex_attention(q, k, v, block_mask=bm)


def _cross_sdpa(q, k, v, kv_mask):
    return sdpa_any_batch(q, k, v, attn_mask=kv_mask[:, None, None, :])


MASKED_LM_VARIANTS: tuple[Variant, ...] = (
    Variant(
        name="sliding_window",
        fn=sliding_window,
        make_inputs=bhld_inputs,
        default_shape={"B": 1, "H": 2, "L": 39, "D": 16},
        bench_shapes=LM_SHAPES,
        flops=lambda s: attn_flops(s["B"] * s["H"], s["L"], s["L"], s["D"], s["D"],
                                    window_density(s["L"], SLIDING_WINDOW)),
        flex=_sliding_window_flex,
        sdpa=_sliding_window_sdpa,
    ),
    Variant(
        name="prefix_lm",
        fn=prefix_lm,
        make_inputs=_prefix_inputs,
        default_shape={"B": 3, "H": 1, "L": 25, "D": 16, "P": 9},
        bench_shapes=tuple({**s, "P": s["L"] // 4} for s in LM_SHAPES),
        flops=lambda s: attn_flops(s["B"] * s["H"], s["L"], s["L"], s["D"], s["D"],
                                    prefix_density(s["L"], s["P"])),
        flex=_prefix_flex,
        sdpa=_prefix_sdpa,
    ),
    Variant(
        name="document_mask",
        fn=document_mask,
        make_inputs=_document_inputs,
        default_shape={"H": 2, "L": 35, "D": 16, "n_docs": 4},
        bench_shapes=(
            {"H": 16, "L": 4096, "D": 64, "n_docs": 4},
            {"H": 16, "L": 16384, "D": 64, "n_docs": 12},
            {"H": 32, "L": 16384, "D": 128, "n_docs": 32},
        ),
        # documents of about equal length, causal inside each
        flops=lambda s: attn_flops(s["H"], s["L"], s["L"], s["D"], s["D"], 0.5 / s["n_docs"]),
        flex=_document_flex,
        sdpa=_document_sdpa,
    ),
    Variant(
        name="cross_attention",
        fn=cross_attention,
        make_inputs=_cross_inputs,
        default_shape={"B": 2, "H": 2, "Lq": 19, "Lkv": 34, "D": 24, "Dv": 8},
        bench_shapes=(
            {"B": 4, "H": 8, "Lq": 4096, "Lkv": 77, "D": 64, "Dv": 64},  # text-to-image
            {"B": 8, "H": 16, "Lq": 1024, "Lkv": 4096, "D": 64, "Dv": 128},
            {"B": 1, "H": 16, "Lq": 4096, "Lkv": 16384, "D": 192, "Dv": 128},  # MLA-style dims
        ),
        flops=_cross_flops,
        flex=_cross_flex,
        sdpa=_cross_sdpa,
    ),
)

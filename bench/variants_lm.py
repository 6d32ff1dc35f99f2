"""Language-model attention variants (q, k, v ``[B, H, L, D]`` unless noted), written as
their users write them; the catalog entries ``LM_VARIANTS`` (see :mod:`bench.variants`)."""
from __future__ import annotations

import math

import torch
from torch.nn.attention.flex_attention import flex_attention

from bench.variants_base import (
    LM_SHAPES,
    Variant,
    attn_flops,
    bhld_flops,
    bhld_inputs,
    gen_device,
    random_normal,
    sdpa_any_batch,
    sizes_of,
    static_block_mask,
)
from bench.variants_lm_masked import MASKED_LM_VARIANTS

# ----------------------------------------------------------------------------------------
# Language-model variants: q, k, v [B, H, L, D] unless noted
# ----------------------------------------------------------------------------------------


# vanilla ---------------------------------------------------------------------------------


def vanilla(q, k, v):
    # q, k, v: [B, H, L, D]
    scale = q.shape[-1] ** -0.5
    s = q @ k.transpose(-2, -1) * scale  # [B, H, L, L]
    p = torch.softmax(s, dim=-1)
    return p @ v  # [B, H, L, D]


def _vanilla_flex(q, k, v, kernel_options=None):
    return flex_attention(q, k, v, kernel_options=kernel_options)


def _vanilla_sdpa(q, k, v):
    return sdpa_any_batch(q, k, v)


# causal, three ways --------------------------------------------------------------------


def causal_tril(q, k, v):
    # q, k, v: [B, H, L, D]; bool mask from torch.tril, filled with -inf
    L = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # [B, H, L, L]
    keep = torch.tril(torch.ones(L, L, dtype=torch.bool, device=q.device))  # [L, L]
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def causal_triu(q, k, v):
    # q, k, v: [B, H, L, D]; additive float mask, -inf above the diagonal
    # (the nn.Transformer "square subsequent mask" form); q scaled before the product
    L = q.shape[-2]
    q = q * q.shape[-1] ** -0.5
    mask = torch.triu(torch.full((L, L), float("-inf"), dtype=q.dtype, device=q.device), diagonal=1)
    s = q @ k.transpose(-2, -1) + mask  # [B, H, L, L]
    return s.softmax(dim=-1) @ v


def _causal_flex(q, k, v, kernel_options=None):
    bm = static_block_mask("causal", q.shape[-2], k.shape[-2], str(q.device))
    return flex_attention(q, k, v, block_mask=bm, kernel_options=kernel_options)


def _causal_sdpa(q, k, v):
    return sdpa_any_batch(q, k, v, is_causal=True)


def causal_index(q, k, v):
    # q, k, v: [B, L, H, D], the layout projections produce; mask from index comparison
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, L, D]
    L = q.shape[-2]
    i = torch.arange(L, device=q.device)
    causal = i[:, None] >= i[None, :]  # [L, L]
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    s = torch.where(causal, s, float("-inf"))
    o = torch.softmax(s, dim=-1) @ v  # [B, H, L, D]
    return o.transpose(1, 2)  # [B, L, H, D]


def _blhd_inputs(shape, dtype, device, generator):
    B, H, L, D = sizes_of(shape, "B", "H", "L", "D")
    return tuple(random_normal((B, L, H, D), dtype, device, generator) for _ in range(3))


def _causal_index_flex(q, k, v):
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return _causal_flex(q, k, v).transpose(1, 2)


def _causal_index_sdpa(q, k, v):
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return _causal_sdpa(q, k, v).transpose(1, 2)


# attention sinks -------------------------------------------------------------------------


def attention_sinks(q, k, v, sink):
    # q, k, v: [B, H, L, D]; sink: [H] a learned logit per head for a key that carries no
    # value and that every query sees (gpt-oss), written as the max and sum it enters; causal
    L = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # [B, H, L, L]
    pos = torch.arange(L, device=q.device)
    s = s.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    sink = sink[:, None, None]  # [H, 1, 1]
    m = torch.maximum(s.amax(-1, keepdim=True), sink)  # [B, H, L, 1]
    e = torch.exp(s - m)
    return (e @ v) / (e.sum(-1, keepdim=True) + torch.exp(sink - m))


def sink_column(q, k, v, sink):
    # the same attention as gpt-oss writes it: the sink logit concatenated as one more key
    # column of the causal scores, the softmax over L + 1 columns, that column dropped
    B, H, L, _ = q.shape
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # [B, H, L, L]
    pos = torch.arange(L, device=q.device)
    s = s.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    s = torch.cat([s, sink.reshape(1, H, 1, 1).expand(B, H, L, 1)], dim=-1)  # [B, H, L, L + 1]
    return torch.softmax(s, dim=-1)[..., :-1] @ v


def _sink_inputs(shape, dtype, device, generator):
    H = sizes_of(shape, "H")[0]
    return (*bhld_inputs(shape, dtype, device, generator), random_normal((H,), dtype, device, generator))


def _sinks_flex(q, k, v, sink):
    # softmax over the keys, then the sink's share of the denominator from the row's
    # log-sum-exp: sum / (sum + exp(sink)) = sigmoid(lse - sink)
    bm = static_block_mask("causal", q.shape[-2], k.shape[-2], str(q.device))
    out, lse = flex_attention(q, k, v, block_mask=bm, return_lse=True)  # [B, H, L, D], [B, H, L]
    return out * torch.sigmoid(lse - sink[:, None].float())[..., None].to(out.dtype)


# ALiBi -----------------------------------------------------------------------------------


def alibi(q, k, v):
    # q, k, v: [B, H, L, D]; causal ALiBi (BLOOM): bias slope_h * (j - i), slopes 2^(-8h/H)
    B, H, L, D = q.shape
    slopes = 2.0 ** (-8.0 * torch.arange(1, H + 1, dtype=torch.float32, device=q.device) / H)  # [H]
    pos = torch.arange(L, device=q.device)
    dist = (pos[None, :] - pos[:, None]).to(torch.float32)  # [L, L], j - i
    bias = slopes[:, None, None] * dist  # [H, L, L]
    s = (q @ k.transpose(-1, -2)) * D ** -0.5 + bias  # float32 (or wider) scores
    s = s.masked_fill(dist > 0, float("-inf"))
    p = torch.softmax(s, dim=-1).to(v.dtype)
    return p @ v


def _alibi_slopes(H: int, device) -> torch.Tensor:
    return 2.0 ** (-8.0 * torch.arange(1, H + 1, dtype=torch.float32, device=device) / H)


def _alibi_flex(q, k, v):
    slopes = _alibi_slopes(q.shape[1], q.device)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    bm = static_block_mask("causal", q.shape[-2], k.shape[-2], str(q.device))
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)


def _alibi_sdpa(q, k, v):
    H, L = q.shape[1], q.shape[-2]
    pos = torch.arange(L, device=q.device)
    dist = (pos[None, :] - pos[:, None]).to(torch.float32)
    bias = _alibi_slopes(H, q.device)[:, None, None] * dist
    bias = bias.masked_fill(dist > 0, float("-inf")).to(q.dtype)
    return sdpa_any_batch(q, k, v, attn_mask=bias)


# tanh soft-capping -----------------------------------------------------------------------

SOFTCAP = 30.0


def softcap(q, k, v):
    # q, k, v: [B, H, L, D]; logits soft-capped to (-cap, cap) as in Gemma 2 / Grok-1
    cap = 30.0
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    s = cap * torch.tanh(s / cap)
    return torch.softmax(s, dim=-1) @ v


def _softcap_inputs(shape, dtype, device, generator):
    # q a little wider than unit variance so the cap bends the logits measurably in float32,
    # while bfloat16 rounding of the logits stays within the tests' tolerance
    B, H, L, D = sizes_of(shape, "B", "H", "L", "D")
    q = random_normal((B, H, L, D), dtype, device, generator, std=1.25)
    return (q, random_normal((B, H, L, D), dtype, device, generator), random_normal((B, H, L, D), dtype, device, generator))


def _softcap_flex(q, k, v):
    def score_mod(score, b, h, q_idx, kv_idx):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    return flex_attention(q, k, v, score_mod=score_mod)


# grouped-query and multi-query attention -----------------------------------------------


def gqa(q, k, v):
    # q: [B, H, L, D]; k, v: [B, Hkv, L, D], each kv head serving H // Hkv query heads
    # (expanded as Hugging Face's repeat_kv does); causal, mask from torch.triu
    B, Hkv, L, D = k.shape
    n_rep = q.shape[1] // Hkv
    k = k[:, :, None].expand(B, Hkv, n_rep, L, D).reshape(B, Hkv * n_rep, L, D)
    v = v[:, :, None].expand(B, Hkv, n_rep, L, D).reshape(B, Hkv * n_rep, L, D)
    s = q @ k.transpose(2, 3) / math.sqrt(D)
    future = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(diagonal=1)
    s = s.masked_fill(future, float("-inf"))
    return torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def _gqa_inputs(shape, dtype, device, generator):
    B, H, Hkv, L, D = sizes_of(shape, "B", "H", "Hkv", "L", "D")
    return (
        random_normal((B, H, L, D), dtype, device, generator),
        random_normal((B, Hkv, L, D), dtype, device, generator),
        random_normal((B, Hkv, L, D), dtype, device, generator),
    )


def _gqa_flops(s):
    return attn_flops(s["B"] * s["H"], s["L"], s["L"], s["D"], s["D"], 0.5)


def _gqa_flex(q, k, v):
    bm = static_block_mask("causal", q.shape[-2], k.shape[-2], str(q.device))
    return flex_attention(q, k, v, block_mask=bm, enable_gqa=True)


def _gqa_sdpa(q, k, v):
    return sdpa_any_batch(q, k, v, is_causal=True, enable_gqa=True)


def mqa(q, k, v):
    # q: [B, H, L, D]; k, v: [B, 1, L, D], one kv head shared by all query heads
    H = q.shape[1]
    k = k.repeat_interleave(H, dim=1)
    v = v.repeat_interleave(H, dim=1)
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    return torch.softmax(s, dim=-1) @ v


def _mqa_inputs(shape, dtype, device, generator):
    return _gqa_inputs({**shape, "Hkv": 1}, dtype, device, generator)


def _mqa_flex(q, k, v):
    return flex_attention(q, k, v, enable_gqa=True)


def _mqa_sdpa(q, k, v):
    return sdpa_any_batch(q, k, v, enable_gqa=True)


# differential attention ----------------------------------------------------------------


def differential(q1, k1, q2, k2, v, lam):
    # q1, k1, q2, k2: [B, H, L, D]; v: [B, H, L, Dv]; lam: [] (the learned scalar lambda)
    # Differential Transformer: difference of two causal softmax attentions over one v.
    L = q1.shape[-2]
    scale = q1.shape[-1] ** -0.5
    future = torch.triu(torch.ones(L, L, dtype=torch.bool, device=q1.device), diagonal=1)
    s1 = (q1 @ k1.transpose(-1, -2) * scale).masked_fill(future, float("-inf"))
    s2 = (q2 @ k2.transpose(-1, -2) * scale).masked_fill(future, float("-inf"))
    return torch.softmax(s1, dim=-1) @ v - lam * (torch.softmax(s2, dim=-1) @ v)


def differential_norm(q1, k1, q2, k2, v, lam, w):
    # the Differential Transformer's whole head: the difference above, an RMS norm over each
    # head's value width with a learned weight w [Dv], and the fixed (1 - lambda_init) scale
    o = differential(q1, k1, q2, k2, v, lam)
    return torch.nn.functional.rms_norm(o, (o.shape[-1],), w, eps=1e-5) * (1 - 0.8)


def _differential_norm_inputs(shape, dtype, device, generator):
    w = 1.0 + 0.1 * random_normal((shape["Dv"],), dtype, device, generator)
    return (*_differential_inputs(shape, dtype, device, generator), w)


def _differential_inputs(shape, dtype, device, generator):
    B, H, L, D, Dv = sizes_of(shape, "B", "H", "L", "D", "Dv")
    qk = [random_normal((B, H, L, D), dtype, device, generator) for _ in range(4)]
    v = random_normal((B, H, L, Dv), dtype, device, generator)
    lam = (0.8 + 0.1 * torch.randn((), generator=generator, device=gen_device(generator)))
    return (*qk, v, lam.to(device=device, dtype=dtype))


def _differential_flops(s):
    return 2 * attn_flops(s["B"] * s["H"], s["L"], s["L"], s["D"], s["Dv"], 0.5)


# hand-written softmax, no batch dims ---------------------------------------------------


def manual_softmax(q, k, v):
    # q: [L, D]; k: [L, D]; v: [L, Dv]: one head, no batch dims, softmax written out
    s = q @ k.T / math.sqrt(q.shape[-1])  # [L, L]
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
    p = e / e.sum(dim=-1, keepdim=True)
    return p @ v  # [L, Dv]


def _manual_inputs(shape, dtype, device, generator):
    L, D, Dv = sizes_of(shape, "L", "D", "Dv")
    return (
        random_normal((L, D), dtype, device, generator),
        random_normal((L, D), dtype, device, generator),
        random_normal((L, Dv), dtype, device, generator),
    )


def _manual_flops(s):
    return attn_flops(1, s["L"], s["L"], s["D"], s["Dv"])


def _manual_flex(q, k, v):
    return flex_attention(q[None, None], k[None, None], v[None, None])[0, 0]


def _manual_sdpa(q, k, v):
    return sdpa_any_batch(q[None], k[None], v[None])[0]



_DENSE_LM_VARIANTS: tuple[Variant, ...] = (
    Variant(
        name="vanilla",
        fn=vanilla,
        make_inputs=bhld_inputs,
        default_shape={"B": 2, "H": 2, "L": 29, "D": 16},
        bench_shapes=LM_SHAPES,
        flops=bhld_flops(1.0),
        flex=_vanilla_flex,
        sdpa=_vanilla_sdpa,
    ),
    Variant(
        name="causal_tril",
        fn=causal_tril,
        make_inputs=bhld_inputs,
        default_shape={"B": 1, "H": 3, "L": 37, "D": 16},
        bench_shapes=LM_SHAPES,
        flops=bhld_flops(0.5),
        flex=_causal_flex,
        sdpa=_causal_sdpa,
    ),
    Variant(
        name="causal_triu",
        fn=causal_triu,
        make_inputs=bhld_inputs,
        default_shape={"B": 2, "H": 1, "L": 33, "D": 32},
        bench_shapes=LM_SHAPES,
        flops=bhld_flops(0.5),
        flex=_causal_flex,
        sdpa=_causal_sdpa,
    ),
    Variant(
        name="causal_index",
        fn=causal_index,
        make_inputs=_blhd_inputs,
        default_shape={"B": 2, "H": 2, "L": 27, "D": 8},
        bench_shapes=LM_SHAPES,
        flops=bhld_flops(0.5),
        flex=_causal_index_flex,
        sdpa=_causal_index_sdpa,
    ),
    Variant(
        name="attention_sinks",
        fn=attention_sinks,
        make_inputs=_sink_inputs,
        default_shape={"B": 2, "H": 3, "L": 35, "D": 16},
        bench_shapes=LM_SHAPES,
        flops=bhld_flops(0.5),
        flex=_sinks_flex,
        sdpa=None,  # SDPA returns no log-sum-exp to add the sink's share with
    ),
    Variant(
        name="sink_column",
        fn=sink_column,
        make_inputs=_sink_inputs,
        default_shape={"B": 2, "H": 3, "L": 35, "D": 16},
        bench_shapes=LM_SHAPES[1:3],
        flops=bhld_flops(0.5),
        flex=_sinks_flex,  # the same values: Flex's log-sum-exp with the sink's share added
        sdpa=None,
    ),
    Variant(
        name="alibi",
        fn=alibi,
        make_inputs=bhld_inputs,
        default_shape={"B": 1, "H": 4, "L": 31, "D": 16},
        bench_shapes=LM_SHAPES,
        flops=bhld_flops(0.5),
        flex=_alibi_flex,
        sdpa=_alibi_sdpa,
    ),
    Variant(
        name="softcap",
        fn=softcap,
        make_inputs=_softcap_inputs,
        default_shape={"B": 2, "H": 2, "L": 21, "D": 16},
        bench_shapes=LM_SHAPES,
        flops=bhld_flops(1.0),
        flex=_softcap_flex,
        sdpa=None,  # no additive bias or mask expresses tanh
    ),
    Variant(
        name="gqa",
        fn=gqa,
        make_inputs=_gqa_inputs,
        default_shape={"B": 1, "H": 4, "Hkv": 2, "L": 23, "D": 16},
        bench_shapes=(
            {"B": 16, "H": 32, "Hkv": 8, "L": 1024, "D": 128},
            {"B": 4, "H": 32, "Hkv": 8, "L": 4096, "D": 128},
            {"B": 1, "H": 32, "Hkv": 8, "L": 16384, "D": 128},
        ),
        flops=_gqa_flops,
        flex=_gqa_flex,
        sdpa=_gqa_sdpa,
    ),
    Variant(
        name="mqa",
        fn=mqa,
        make_inputs=_mqa_inputs,
        default_shape={"B": 2, "H": 3, "L": 19, "D": 16},
        bench_shapes=(
            {"B": 16, "H": 16, "L": 1024, "D": 128},
            {"B": 4, "H": 16, "L": 4096, "D": 128},
            {"B": 1, "H": 16, "L": 16384, "D": 128},
        ),
        flops=bhld_flops(1.0),
        flex=_mqa_flex,
        sdpa=_mqa_sdpa,
    ),
    Variant(
        name="differential",
        fn=differential,
        make_inputs=_differential_inputs,
        default_shape={"B": 1, "H": 2, "L": 26, "D": 16, "Dv": 32},
        bench_shapes=(
            {"B": 16, "H": 8, "L": 1024, "D": 64, "Dv": 128},
            {"B": 4, "H": 8, "L": 4096, "D": 64, "Dv": 128},
            {"B": 1, "H": 8, "L": 16384, "D": 64, "Dv": 128},
            # the paper's configurations: model dim 2048 = 2 x heads x head dim (q/k of
            # the head dim, v twice as wide), from (batch 32, length 512) to (1, 16384)
            {"B": 32, "H": 16, "L": 512, "D": 64, "Dv": 128},
            {"B": 1, "H": 16, "L": 16384, "D": 64, "Dv": 128},
            {"B": 32, "H": 8, "L": 512, "D": 128, "Dv": 256},
            {"B": 1, "H": 8, "L": 16384, "D": 128, "Dv": 256},
        ),
        flops=_differential_flops,
        flex=None,  # two softmaxes: two flex_attention calls
        sdpa=None,
    ),
    Variant(
        name="differential_norm",
        fn=differential_norm,
        make_inputs=_differential_norm_inputs,
        default_shape={"B": 1, "H": 2, "L": 26, "D": 16, "Dv": 32},
        bench_shapes=(
            {"B": 4, "H": 8, "L": 4096, "D": 64, "Dv": 128},
            {"B": 32, "H": 16, "L": 512, "D": 64, "Dv": 128},
        ),
        flops=_differential_flops,
        flex=None,  # two softmaxes: two flex_attention calls, then the norm
        sdpa=None,
    ),
    Variant(
        name="manual_softmax",
        fn=manual_softmax,
        make_inputs=_manual_inputs,
        default_shape={"L": 40, "D": 8, "Dv": 16},
        bench_shapes=(
            {"L": 4096, "D": 64, "Dv": 64},
            {"L": 16384, "D": 128, "Dv": 128},
        ),
        flops=_manual_flops,
        flex=_manual_flex,
        sdpa=_manual_sdpa,
    ),
)

# the catalog's order (benchmark runs and report tables follow it)
_ORDER = ("vanilla", "causal_tril", "causal_triu", "causal_index", "attention_sinks", "sink_column", "alibi",
          "softcap", "sliding_window", "prefix_lm", "document_mask", "gqa", "mqa", "differential",
          "differential_norm", "cross_attention", "manual_softmax")
LM_VARIANTS: tuple[Variant, ...] = tuple(sorted((*_DENSE_LM_VARIANTS, *MASKED_LM_VARIANTS),
                                                key=lambda v: _ORDER.index(v.name)))

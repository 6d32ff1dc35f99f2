"""The attention variants Flashlight is built for, written the way their users write them.

Each :class:`Variant` bundles

- ``fn``: the computation in plain PyTorch (no Flashlight helpers), ``fn(*inputs)``;
- ``make_inputs(shape, dtype, device, generator)``: fresh random inputs for a shape dict
  (normal values for floating tensors; masks random, with some positions masked and
  never a fully masked row);
- ``default_shape``: a small shape for CPU tests, lengths not multiples of any tile size;
- ``bench_shapes``: realistic GPU shapes (AlphaFold2 sizes for the Evoformer variants,
  lengths 256..16k for language-model variants, the paper's configurations);
- ``flops(shape)``: useful forward FLOPs, ``2 * batch * Lq * Lkv * (D + Dv)`` for the two
  contractions (``4 * B * H * L * L * D`` when ``Dv == D``), scaled by the fraction of
  (query, key) pairs a mask keeps (causal: one half);
- ``flex``: the same computation through one ``flex_attention`` call (``score_mod`` /
  ``block_mask``), plus the plain PyTorch layout changes and gating around it; ``None``
  when one call cannot express it;
- ``sdpa``: the same through ``F.scaled_dot_product_attention`` with a float bias or a
  bool mask; ``None`` when it cannot express it.

Shape dict keys: ``B`` batch, ``H`` heads (``Hkv`` key/value heads), ``L`` sequence length,
``Lq``/``Lkv`` query/key lengths, ``D`` query/key head dim, ``Dv`` value head dim,
``P`` prefix length, ``n_docs`` documents per packed sequence; Evoformer: ``S`` MSA
sequences, ``L`` residues, ``N`` residues of the pair representation, ``c`` head dim.

Tensor shapes are noted as ``# [B, H, L, D]``. ``fn`` must accept inputs in any dtype
(the tests evaluate it in float64 as the reference), so constants it creates either
take the inputs' dtype or are float32 tensors that type promotion absorbs.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


@dataclass(frozen=True)
class Variant:
    name: str
    fn: Callable[..., torch.Tensor]
    make_inputs: Callable[..., tuple]
    default_shape: dict
    bench_shapes: tuple[dict, ...]
    flops: Callable[[dict], float]
    flex: Callable | None = None
    sdpa: Callable | None = None


# ----------------------------------------------------------------------------------------
# Random inputs
# ----------------------------------------------------------------------------------------


def _gen_device(generator: torch.Generator | None) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


def _randn(shape, dtype, device, generator, std: float = 1.0) -> torch.Tensor:
    """Normal values drawn in float32 (so every dtype sees the same draw), then cast."""
    x = torch.randn(tuple(shape), generator=generator, device=_gen_device(generator))
    if std != 1.0:
        x = x * std
    return x.to(device=device, dtype=dtype)


def _rand(shape, generator) -> torch.Tensor:
    return torch.rand(tuple(shape), generator=generator, device=_gen_device(generator))


def _randint(low: int, high: int, shape, device, generator) -> torch.Tensor:
    """Integers in ``[low, high)``, int64."""
    x = torch.randint(low, high, tuple(shape), generator=generator, device=_gen_device(generator))
    return x.to(device)


def _keep_mask(shape, generator, p_keep: float = 0.8) -> torch.Tensor:
    """Bool mask over the last dim, ``True`` = keep; each row keeps at least one position
    and, when the row has more than one, masks at least one."""
    keep = _rand(shape, generator) < p_keep
    n = shape[-1]
    rows = keep.reshape(-1, n)
    idx = torch.arange(rows.shape[0], device=rows.device)
    forced_on = torch.randint(0, n, (rows.shape[0],), generator=generator, device=rows.device)
    if n > 1:
        forced_off = (forced_on + torch.randint(1, n, (rows.shape[0],), generator=generator,
                                                device=rows.device)) % n
        rows[idx, forced_off] = False
    rows[idx, forced_on] = True
    return rows.reshape(shape)


def _lengths(shape: dict, *keys: str) -> tuple[int, ...]:
    return tuple(shape[k] for k in keys)


# ----------------------------------------------------------------------------------------
# FLOPs
# ----------------------------------------------------------------------------------------


def _attn_flops(batch: float, lq: int, lkv: int, d: int, dv: int, density: float = 1.0) -> float:
    """Two contractions, ``S = Q K^T`` and ``O = P V``, over the kept (query, key) pairs."""
    return 2.0 * batch * lq * lkv * (d + dv) * density


def _window_density(length: int, window: int) -> float:
    """Fraction of pairs with ``0 <= i - j < window`` in an ``length x length`` grid."""
    w = min(window, length)
    kept = w * (w + 1) / 2 + (length - w) * w
    return kept / (length * length)


def _prefix_density(length: int, prefix: int) -> float:
    """Fraction of pairs a prefix-LM mask keeps (prefix block full, the rest causal)."""
    p = min(prefix, length)
    kept = p * p + sum(range(p + 1, length + 1))
    return kept / (length * length)


def sdpa_any_batch(query, key, value, attn_mask=None, enable_gqa=False, **kwargs):
    """``F.scaled_dot_product_attention`` in the form its fused CUDA kernels accept.

    They take ``[batch, heads, L, D]`` inputs, a mask whose last dim has stride 1 and
    (the memory-efficient one) equal head counts, so: inputs with fewer dims get
    leading size-1 dims, inputs with more have their leading dims merged (the mask is
    broadcast to match), a mask strided in its last dim is copied, and grouped key/value heads are
    repeated (as ``enable_gqa`` maps them: query head ``h`` reads key head
    ``h // (Hq / Hkv)``). This is what a user of SDPA writes for these variants, so it
    is part of SDPA's measured time. The output gets the query's leading dims back.
    """
    lead, (heads, lq, _), lkv = query.shape[:-3], query.shape[-3:] if query.dim() >= 3 else (1, *query.shape), key.shape[-2]
    q, k, v = (t.reshape(-1, *t.shape[-3:]) if t.dim() >= 3 else t[None, None] for t in (query, key, value))
    if enable_gqa and k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))  # [B', H, Lkv, D]
    if attn_mask is not None:
        if attn_mask.stride(-1) != 1:
            attn_mask = attn_mask.contiguous()  # before broadcasting: copies the small tensor only
        if query.dim() > 4:  # a view where the mask is broadcast over the merged dims
            attn_mask = attn_mask.expand(*lead, heads, lq, lkv).reshape(-1, heads, lq, lkv)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask, **kwargs)  # [B', H, Lq, Dv]
    return out.reshape(*lead, *out.shape[-3:]) if query.dim() >= 3 else out[0, 0]


# ----------------------------------------------------------------------------------------
# Block masks for the FlexAttention versions (cached when they depend on shapes only)
# ----------------------------------------------------------------------------------------


def _causal_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


SLIDING_WINDOW = 16  # tokens each query sees, itself included (see ``sliding_window``)


def _sliding_window_mod(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < SLIDING_WINDOW)


# Block masks are built eagerly and once per distinct mask input, outside the compiled
# Flex call: a model builds its block mask once per forward and reuses it in every layer,
# so the Flex timings measure attention alone. (Building one inside torch.compile with a
# mask_mod that indexes a captured tensor is also known to fault with an illegal memory
# access, pytorch/pytorch#160018; on the H200 it did, for the prefix-LM mask.)


@torch.compiler.disable
@functools.lru_cache(maxsize=32)
def _static_block_mask(kind: str, lq: int, lkv: int, device: str):
    mod = {"causal": _causal_mod, "sliding_window": _sliding_window_mod}[kind]
    return create_block_mask(mod, None, None, lq, lkv, device=device)


_DATA_BLOCK_MASKS: dict[tuple, tuple] = {}


@torch.compiler.disable
def _data_block_mask(make_mod: Callable, data: torch.Tensor, batch: int | None, lq: int, lkv: int):
    """The block mask of ``make_mod(data)`` (a mask_mod reading ``data``), cached per
    state of ``data``: its address, version counter, shape and strides, and the lengths.
    The cache holds ``data`` itself, so no other tensor can take its address meanwhile."""
    key = (make_mod, data.data_ptr(), data._version, tuple(data.shape), data.stride(), data.dtype, batch, lq, lkv)
    if key not in _DATA_BLOCK_MASKS:
        if len(_DATA_BLOCK_MASKS) >= 32:
            _DATA_BLOCK_MASKS.clear()
        mask = create_block_mask(make_mod(data), batch, None, lq, lkv, device=data.device)
        _DATA_BLOCK_MASKS[key] = (data, mask)
    return _DATA_BLOCK_MASKS[key][1]


# ----------------------------------------------------------------------------------------
# Language-model variants: q, k, v [B, H, L, D] unless noted
# ----------------------------------------------------------------------------------------

_LM_SHAPES: tuple[dict, ...] = (
    {"B": 64, "H": 16, "L": 256, "D": 64},
    {"B": 16, "H": 16, "L": 1024, "D": 64},
    {"B": 4, "H": 16, "L": 4096, "D": 64},
    {"B": 1, "H": 16, "L": 16384, "D": 64},
)


def _bhld_inputs(shape, dtype, device, generator):
    B, H, L, D = _lengths(shape, "B", "H", "L", "D")
    return tuple(_randn((B, H, L, D), dtype, device, generator) for _ in range(3))


def _bhld_flops(density: float) -> Callable[[dict], float]:
    return lambda s: _attn_flops(s["B"] * s["H"], s["L"], s["L"], s["D"], s["D"], density)


# vanilla ---------------------------------------------------------------------------------


def vanilla(q, k, v):
    # q, k, v: [B, H, L, D]
    scale = q.shape[-1] ** -0.5
    s = q @ k.transpose(-2, -1) * scale  # [B, H, L, L]
    p = torch.softmax(s, dim=-1)
    return p @ v  # [B, H, L, D]


def _vanilla_flex(q, k, v):
    return flex_attention(q, k, v)


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


def _causal_flex(q, k, v):
    bm = _static_block_mask("causal", q.shape[-2], k.shape[-2], str(q.device))
    return flex_attention(q, k, v, block_mask=bm)


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
    B, H, L, D = _lengths(shape, "B", "H", "L", "D")
    return tuple(_randn((B, L, H, D), dtype, device, generator) for _ in range(3))


def _causal_index_flex(q, k, v):
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return _causal_flex(q, k, v).transpose(1, 2)


def _causal_index_sdpa(q, k, v):
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return _causal_sdpa(q, k, v).transpose(1, 2)


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

    bm = _static_block_mask("causal", q.shape[-2], k.shape[-2], str(q.device))
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
    B, H, L, D = _lengths(shape, "B", "H", "L", "D")
    q = _randn((B, H, L, D), dtype, device, generator, std=1.25)
    return (q, _randn((B, H, L, D), dtype, device, generator), _randn((B, H, L, D), dtype, device, generator))


def _softcap_flex(q, k, v):
    def score_mod(score, b, h, q_idx, kv_idx):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    return flex_attention(q, k, v, score_mod=score_mod)


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
    bm = _static_block_mask("sliding_window", q.shape[-2], k.shape[-2], str(q.device))
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
    q, k, v = _bhld_inputs(shape, dtype, device, generator)
    lo, hi = P // 2, min(L, P + P // 2) + 1
    return q, k, v, _randint(lo, hi, (B,), device, generator)


def _prefix_mod(prefix_len):
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) | (kv_idx < prefix_len[b])

    return mask_mod


def _prefix_flex(q, k, v, prefix_len):
    bm = _data_block_mask(_prefix_mod, prefix_len, q.shape[0], q.shape[-2], k.shape[-2])
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
    q, k, v = (_randn((H, L, D), dtype, device, generator) for _ in range(3))
    # n - 1 distinct cut points in 1..L-1: documents of random lengths, in order
    cuts = torch.randperm(L - 1, generator=generator, device=_gen_device(generator))[: n - 1] + 1
    starts = torch.zeros(L, dtype=torch.int64, device=cuts.device)
    starts[cuts] = 1
    return q, k, v, torch.cumsum(starts, 0).to(device)


def _document_mod(doc):
    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    return mask_mod


def _document_flex(q, k, v, doc):
    bm = _data_block_mask(_document_mod, doc, None, q.shape[-2], k.shape[-2])
    return flex_attention(q[None], k[None], v[None], block_mask=bm)[0]


def _document_sdpa(q, k, v, doc):
    L = q.shape[-2]
    pos = torch.arange(L, device=q.device)
    keep = (doc[:, None] == doc[None, :]) & (pos[:, None] >= pos[None, :])
    return sdpa_any_batch(q, k, v, attn_mask=keep)


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
    B, H, Hkv, L, D = _lengths(shape, "B", "H", "Hkv", "L", "D")
    return (
        _randn((B, H, L, D), dtype, device, generator),
        _randn((B, Hkv, L, D), dtype, device, generator),
        _randn((B, Hkv, L, D), dtype, device, generator),
    )


def _gqa_flops(s):
    return _attn_flops(s["B"] * s["H"], s["L"], s["L"], s["D"], s["D"], 0.5)


def _gqa_flex(q, k, v):
    bm = _static_block_mask("causal", q.shape[-2], k.shape[-2], str(q.device))
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


def _differential_inputs(shape, dtype, device, generator):
    B, H, L, D, Dv = _lengths(shape, "B", "H", "L", "D", "Dv")
    qk = [_randn((B, H, L, D), dtype, device, generator) for _ in range(4)]
    v = _randn((B, H, L, Dv), dtype, device, generator)
    lam = (0.8 + 0.1 * torch.randn((), generator=generator, device=_gen_device(generator)))
    return (*qk, v, lam.to(device=device, dtype=dtype))


def _differential_flops(s):
    return 2 * _attn_flops(s["B"] * s["H"], s["L"], s["L"], s["D"], s["Dv"], 0.5)


# cross attention -------------------------------------------------------------------------


def cross_attention(q, k, v, kv_mask):
    # q: [B, H, Lq, D] (decoder); k: [B, H, Lkv, D], v: [B, H, Lkv, Dv] (encoder);
    # kv_mask: [B, Lkv] bool, False on encoder padding
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5  # [B, H, Lq, Lkv]
    s = s.masked_fill(~kv_mask[:, None, None, :], float("-inf"))
    return torch.softmax(s, dim=-1) @ v  # [B, H, Lq, Dv]


def _cross_inputs(shape, dtype, device, generator):
    B, H, Lq, Lkv, D, Dv = _lengths(shape, "B", "H", "Lq", "Lkv", "D", "Dv")
    q = _randn((B, H, Lq, D), dtype, device, generator)
    k = _randn((B, H, Lkv, D), dtype, device, generator)
    v = _randn((B, H, Lkv, Dv), dtype, device, generator)
    # padded batch: each encoder sequence has a random length, padding at the end
    lengths = _randint(max(1, Lkv // 2), Lkv + 1, (B,), device, generator)
    kv_mask = torch.arange(Lkv, device=device)[None, :] < lengths[:, None]
    return q, k, v, kv_mask


def _cross_flops(s):
    return _attn_flops(s["B"] * s["H"], s["Lq"], s["Lkv"], s["D"], s["Dv"])


def _cross_mod(kv_mask):
    def mask_mod(b, h, q_idx, kv_idx):
        return kv_mask[b, kv_idx]

    return mask_mod


def _cross_flex(q, k, v, kv_mask):
    bm = _data_block_mask(_cross_mod, kv_mask, q.shape[0], q.shape[-2], k.shape[-2])
    return flex_attention(q, k, v, block_mask=bm)


def _cross_sdpa(q, k, v, kv_mask):
    return sdpa_any_batch(q, k, v, attn_mask=kv_mask[:, None, None, :])


# hand-written softmax, no batch dims ---------------------------------------------------


def manual_softmax(q, k, v):
    # q: [L, D]; k: [L, D]; v: [L, Dv]: one head, no batch dims, softmax written out
    s = q @ k.T / math.sqrt(q.shape[-1])  # [L, L]
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
    p = e / e.sum(dim=-1, keepdim=True)
    return p @ v  # [L, Dv]


def _manual_inputs(shape, dtype, device, generator):
    L, D, Dv = _lengths(shape, "L", "D", "Dv")
    return (
        _randn((L, D), dtype, device, generator),
        _randn((L, D), dtype, device, generator),
        _randn((L, Dv), dtype, device, generator),
    )


def _manual_flops(s):
    return _attn_flops(1, s["L"], s["L"], s["D"], s["Dv"])


def _manual_flex(q, k, v):
    return flex_attention(q[None, None], k[None, None], v[None, None])[0, 0]


def _manual_sdpa(q, k, v):
    return sdpa_any_batch(q[None], k[None], v[None])[0]


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
    return _randn(shape5, dtype, device, generator, std).transpose(-2, -3)


def _msa_row_inputs(shape, dtype, device, generator):
    B, S, L, H, c = _lengths(shape, "B", "S", "L", "H", "c")
    q = _projected((B, S, L, H, c), dtype, device, generator, std=c ** -0.5)  # [B, S, H, L, c]
    k = _projected((B, S, L, H, c), dtype, device, generator)
    v = _projected((B, S, L, H, c), dtype, device, generator)
    mask = _keep_mask((B, S, L), generator).to(device=device, dtype=dtype)
    # linear_z(z): [B, L, L, H], permuted to [B, H, L, L] and unsqueezed
    pair_bias = _randn((B, L, L, H), dtype, device, generator).permute(0, 3, 1, 2).unsqueeze(1)
    g = _randn((B, S, L, H, c), dtype, device, generator)
    return q, k, v, mask, pair_bias, g


def _msa_row_flops(s):
    return _attn_flops(s["B"] * s["S"] * s["H"], s["L"], s["L"], s["c"], s["c"])


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
    B, S, L, H, c = _lengths(shape, "B", "S", "L", "H", "c")
    q, k, v = (_randn((B, S, L, H, c), dtype, device, generator) for _ in range(3))
    # mask: each residue column keeps at least one sequence
    mask = _keep_mask((B, L, S), generator).transpose(-1, -2).to(device=device, dtype=dtype)
    g = _randn((B, S, L, H, c), dtype, device, generator)
    return q, k, v, mask, g


def _msa_column_flops(s):
    return _attn_flops(s["B"] * s["L"] * s["H"], s["S"], s["S"], s["c"], s["c"])


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
    B, N, H, c = _lengths(shape, "B", "N", "H", "c")
    q, k, v = (_randn((B, N, N, H, c), dtype, device, generator) for _ in range(3))
    mask = _keep_mask((B, N, N), generator).to(device=device, dtype=dtype)
    tri_bias = _randn((B, N, N, H), dtype, device, generator)
    g = _randn((B, N, N, H, c), dtype, device, generator)
    return q, k, v, mask, tri_bias, g


def _triangle_end_inputs(shape, dtype, device, generator):
    q, k, v, mask, tri_bias, g = _triangle_inputs(shape, dtype, device, generator)
    # every column of the mask (a row after the transpose) keeps at least one position
    mask = _keep_mask(mask.shape, generator).transpose(-1, -2).to(device=device, dtype=dtype)
    return q, k, v, mask, tri_bias, g


def _triangle_flops(s):
    return _attn_flops(s["B"] * s["N"] * s["H"], s["N"], s["N"], s["c"], s["c"])


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


# ----------------------------------------------------------------------------------------
# The catalog
# ----------------------------------------------------------------------------------------

_TRIANGLE_SHAPES: tuple[dict, ...] = (
    {"B": 1, "N": 256, "H": 4, "c": 32},
    {"B": 1, "N": 512, "H": 4, "c": 32},
    {"B": 1, "N": 1024, "H": 4, "c": 32},
    {"B": 1, "N": 256, "H": 4, "c": 16},  # template pair stack
    {"B": 1, "N": 256, "H": 4, "c": 64},  # the paper's configuration
    {"B": 1, "N": 384, "H": 4, "c": 32},
    {"B": 1, "N": 2048, "H": 4, "c": 32},  # scores of 64 GiB in bf16: only fused kernels fit
)

_ALL = (
    Variant(
        name="vanilla",
        fn=vanilla,
        make_inputs=_bhld_inputs,
        default_shape={"B": 2, "H": 2, "L": 29, "D": 16},
        bench_shapes=_LM_SHAPES,
        flops=_bhld_flops(1.0),
        flex=_vanilla_flex,
        sdpa=_vanilla_sdpa,
    ),
    Variant(
        name="causal_tril",
        fn=causal_tril,
        make_inputs=_bhld_inputs,
        default_shape={"B": 1, "H": 3, "L": 37, "D": 16},
        bench_shapes=_LM_SHAPES,
        flops=_bhld_flops(0.5),
        flex=_causal_flex,
        sdpa=_causal_sdpa,
    ),
    Variant(
        name="causal_triu",
        fn=causal_triu,
        make_inputs=_bhld_inputs,
        default_shape={"B": 2, "H": 1, "L": 33, "D": 32},
        bench_shapes=_LM_SHAPES,
        flops=_bhld_flops(0.5),
        flex=_causal_flex,
        sdpa=_causal_sdpa,
    ),
    Variant(
        name="causal_index",
        fn=causal_index,
        make_inputs=_blhd_inputs,
        default_shape={"B": 2, "H": 2, "L": 27, "D": 8},
        bench_shapes=_LM_SHAPES,
        flops=_bhld_flops(0.5),
        flex=_causal_index_flex,
        sdpa=_causal_index_sdpa,
    ),
    Variant(
        name="alibi",
        fn=alibi,
        make_inputs=_bhld_inputs,
        default_shape={"B": 1, "H": 4, "L": 31, "D": 16},
        bench_shapes=_LM_SHAPES,
        flops=_bhld_flops(0.5),
        flex=_alibi_flex,
        sdpa=_alibi_sdpa,
    ),
    Variant(
        name="softcap",
        fn=softcap,
        make_inputs=_softcap_inputs,
        default_shape={"B": 2, "H": 2, "L": 21, "D": 16},
        bench_shapes=_LM_SHAPES,
        flops=_bhld_flops(1.0),
        flex=_softcap_flex,
        sdpa=None,  # no additive bias or mask expresses tanh
    ),
    Variant(
        name="sliding_window",
        fn=sliding_window,
        make_inputs=_bhld_inputs,
        default_shape={"B": 1, "H": 2, "L": 39, "D": 16},
        bench_shapes=_LM_SHAPES,
        flops=lambda s: _attn_flops(s["B"] * s["H"], s["L"], s["L"], s["D"], s["D"],
                                    _window_density(s["L"], SLIDING_WINDOW)),
        flex=_sliding_window_flex,
        sdpa=_sliding_window_sdpa,
    ),
    Variant(
        name="prefix_lm",
        fn=prefix_lm,
        make_inputs=_prefix_inputs,
        default_shape={"B": 3, "H": 1, "L": 25, "D": 16, "P": 9},
        bench_shapes=tuple({**s, "P": s["L"] // 4} for s in _LM_SHAPES),
        flops=lambda s: _attn_flops(s["B"] * s["H"], s["L"], s["L"], s["D"], s["D"],
                                    _prefix_density(s["L"], s["P"])),
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
        flops=lambda s: _attn_flops(s["H"], s["L"], s["L"], s["D"], s["D"], 0.5 / s["n_docs"]),
        flex=_document_flex,
        sdpa=_document_sdpa,
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
        flops=_bhld_flops(1.0),
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

VARIANTS: dict[str, Variant] = {v.name: v for v in _ALL}

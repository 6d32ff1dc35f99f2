"""The bare Evoformer attention core, for comparing attention kernels like for like.

``evoformer_core``: q, k, v contiguous ``[N, H, L, c]`` (N rows: MSA sequences or pair
rows), a mask bias ``[N, 1, 1, L]`` (0 or -1e9) and a pair bias ``[1, H, L, L]``, both
contiguous, scale ``c ** -0.5``; no gate and no layout work, so every implementation
(Flashlight, FlexAttention, SDPA, cuEquivariance, trifast, DS4Sci) reads the same
tensors and does only the attention. The Evoformer variants of
:mod:`bench.variants_evoformer` time the whole module as OpenFold computes it instead.
"""
from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import flex_attention

from bench.variants_base import Variant, attn_flops, random_keep_mask, random_normal, sizes_of


def evoformer_core(q, k, v, mask_bias, pair_bias):
    # q, k, v: [N, H, L, c]; mask_bias: [N, 1, 1, L]; pair_bias: [1, H, L, L]
    c = q.shape[-1]
    a = torch.matmul(q, k.transpose(-1, -2)) * c ** -0.5 + mask_bias + pair_bias  # [N, H, L, L]
    return torch.matmul(torch.softmax(a, dim=-1), v)  # [N, H, L, c]


def _core_inputs(shape, dtype, device, generator):
    N, L, H, c = sizes_of(shape, "N", "L", "H", "c")
    q, k, v = (random_normal((N, H, L, c), dtype, device, generator) for _ in range(3))
    keep = random_keep_mask((N, L), generator).to(device)
    mask_bias = (1e9 * (keep.to(dtype) - 1)).reshape(N, 1, 1, L)
    pair_bias = random_normal((1, H, L, L), dtype, device, generator)
    return q, k, v, mask_bias, pair_bias


def _core_flops(s):
    return attn_flops(s["N"] * s["H"], s["L"], s["L"], s["c"], s["c"])


def _core_flex(q, k, v, mask_bias, pair_bias, kernel_options=None):
    N, H, L, c = q.shape
    mb = mask_bias.view(N, L)
    pb = pair_bias.view(H, L, L)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + mb[b, kv_idx] + pb[h, q_idx, kv_idx]

    return flex_attention(q, k, v, score_mod=score_mod, kernel_options=kernel_options)


def _core_sdpa(q, k, v, mask_bias, pair_bias):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask_bias + pair_bias)  # bias [N, H, L, L]


CORE_SHAPES: tuple[dict, ...] = (
    {"N": 512, "L": 256, "H": 8, "c": 32},  # MSA row attention at AlphaFold2's sizes
    {"N": 256, "L": 256, "H": 4, "c": 32},  # triangle attention, 256 residues
    {"N": 1024, "L": 1024, "H": 4, "c": 32},  # triangle attention, 1024 residues
    {"N": 512, "L": 1024, "H": 8, "c": 32},  # MSA row attention, 1024 residues
    {"N": 256, "L": 256, "H": 4, "c": 64},  # the paper's configuration
)

CORE_VARIANTS: tuple[Variant, ...] = (
    Variant(
        name="evoformer_core",
        fn=evoformer_core,
        make_inputs=_core_inputs,
        default_shape={"N": 3, "L": 19, "H": 2, "c": 16},
        bench_shapes=CORE_SHAPES,
        flops=_core_flops,
        flex=_core_flex,
        sdpa=_core_sdpa,
    ),
)

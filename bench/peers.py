"""Hand-written attention kernels from other projects, wrapped to the catalog's inputs.

Each adapter takes exactly the inputs ``bench.variants`` makes for a variant and
returns the same output as the variant's ``fn`` (gating included), so it is timed and
checked like every other implementation. Layout changes a peer needs (its own head-dim
order, a bool mask) happen inside the adapter and are part of its time.

- ``cuequivariance``: NVIDIA cuEquivariance's ``triangle_attention`` (q, k, v
  ``[B, N, H, Q, c]``, one bias ``[B, 1, H, Q, K]``, a bool keep-mask ``[B, N, 1, 1, K]``).
  Used for the triangle attentions and MSA row attention with pair bias; MSA column
  attention has no pair bias to pass.
- ``trifast``: trifast's Triton ``triangle_attention`` (q, k, v ``[B, H, N, N, c]``, bias
  ``[B, H, N, N]``, a bool mask ``[B, N, N]`` with ``True`` = masked, scale fixed at
  ``c ** -0.5``). Square pair representations only, so the triangle attentions.
- ``ds4sci``: DeepSpeed's ``DS4Sci_EvoformerAttention`` (q, k, v ``[B, N, L, H, c]``,
  biases ``[B, N, 1, 1, L]`` and ``[B, 1, H, L, L]``, scale fixed at ``c ** -0.5``, bf16
  and fp16 only, more than 16 positions, head widths up to 64), through
  :mod:`bench.ds4sci`, which builds its CUDA op once per machine. The MSA row attention's q comes pre-scaled (OpenFold scales
  it while projecting), so the adapter scales it back by ``c ** 0.5``.

The ``evoformer_core`` variant (:mod:`bench.variants_core`: q, k, v ``[N, H, L, c]``,
mask bias ``[N, 1, 1, L]``, pair bias ``[1, H, L, L]``, no gate) has an adapter for each
peer too: cuEquivariance takes a bool keep-mask (``mask_bias == 0``), trifast square
inputs only (``N == L``) in its ``[1, H, N, L, c]`` layout, DS4Sci its ``[1, N, L, H, c]``.
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch

PEERS = ("cuequivariance", "trifast", "ds4sci")

ABSENT: dict[str, str] = {}
DS4SCI_DTYPES = (torch.bfloat16, torch.float16)


def availability(peer: str) -> str | None:
    """``None`` when ``peer`` can run here, else why not."""
    if peer == "ds4sci":
        from bench import ds4sci

        return ds4sci.availability()
    module = {"cuequivariance": "cuequivariance_torch", "trifast": "trifast"}[peer]
    if not torch.cuda.is_available():
        return f"{peer} needs a CUDA GPU"
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means absent
        return f"{peer} is not importable ({type(exc).__name__}: {str(exc)[:200]}); scripts/gpu_fetch.sh carries it"
    return None


# ---------------------------------------------------------------------------- cuEquivariance


def _cueq():
    from cuequivariance_torch import triangle_attention

    return triangle_attention


def _cueq_msa_row(q, k, v, mask, pair_bias, g):
    # q, k, v: [B, S, H, L, c] (q pre-scaled); mask [B, S, L]; pair_bias [B, 1, H, L, L]
    keep = mask.bool()[:, :, None, None, :]  # [B, S, 1, 1, L]
    o = _cueq()(q, k, v, pair_bias, keep, scale=1.0)  # [B, S, H, L, c]
    return o.transpose(-2, -3) * torch.sigmoid(g)


def _cueq_triangle_start(q, k, v, mask, tri_bias, g):
    # q, k, v, g: [B, I, J, H, c]; mask [B, I, J]; tri_bias [B, J, K, H]
    c = q.shape[-1]
    qt, kt, vt = (t.transpose(-2, -3) for t in (q, k, v))  # [B, I, H, J, c]
    bias = tri_bias.permute(0, 3, 1, 2).unsqueeze(1)  # [B, 1, H, J, K]
    keep = mask.bool()[:, :, None, None, :]  # [B, I, 1, 1, K]
    o = _cueq()(qt, kt, vt, bias, keep, scale=c ** -0.5)
    return o.transpose(-2, -3) * torch.sigmoid(g)


def _cueq_triangle_end(q, k, v, mask, tri_bias, g):
    t = lambda x: x.transpose(-4, -3)  # noqa: E731
    o = _cueq_triangle_start(t(q), t(k), t(v), mask.transpose(-1, -2), tri_bias.transpose(-2, -3), t(g))
    return t(o)


# ---------------------------------------------------------------------------- trifast


def _trifast():
    from trifast import triangle_attention

    return triangle_attention


def _trifast_triangle_start(q, k, v, mask, tri_bias, g):
    # trifast wants [B, H, I, J, c], bias [B, H, J, K], mask [B, I, K] True = masked
    qt, kt, vt = (t.permute(0, 3, 1, 2, 4) for t in (q, k, v))
    bias = tri_bias.permute(0, 3, 1, 2)
    masked = mask == 0
    o = _trifast()(qt, kt, vt, bias, masked)  # [B, H, I, J, c]
    return o.permute(0, 2, 3, 1, 4) * torch.sigmoid(g)


def _trifast_triangle_end(q, k, v, mask, tri_bias, g):
    t = lambda x: x.transpose(-4, -3)  # noqa: E731
    o = _trifast_triangle_start(t(q), t(k), t(v), mask.transpose(-1, -2), tri_bias.transpose(-2, -3), t(g))
    return t(o)


# ---------------------------------------------------------------------------- DS4Sci


def _ds4sci(q, k, v, biases):
    from bench import ds4sci

    return ds4sci.attention(q, k, v, biases)


def _ds4sci_msa_row(q, k, v, mask, pair_bias, g):
    # q, k, v: [B, S, H, L, c] (q pre-scaled by c**-0.5, which DS4Sci applies itself)
    c = q.shape[-1]
    qt = (q * c ** 0.5).transpose(-2, -3)  # [B, S, L, H, c]
    kt, vt = k.transpose(-2, -3), v.transpose(-2, -3)
    mask_bias = (1e9 * (mask - 1))[:, :, None, None, :]  # [B, S, 1, 1, L]
    o = _ds4sci(qt, kt, vt, [mask_bias, pair_bias])  # pair_bias [B, 1, H, L, L]
    return o * torch.sigmoid(g)


def _ds4sci_msa_column(q, k, v, mask, g):
    # q, k, v, g: [B, S, L, H, c]: attention along S for each residue -> rows [B, L, S, H, c]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    mask_bias = (1e9 * (mask.transpose(-1, -2) - 1))[:, :, None, None, :]  # [B, L, 1, 1, S]
    o = _ds4sci(qt, kt, vt, [mask_bias])  # [B, L, S, H, c]
    return o.transpose(1, 2) * torch.sigmoid(g)


def _ds4sci_triangle_start(q, k, v, mask, tri_bias, g):
    # q, k, v, g: [B, I, J, H, c] is DS4Sci's layout already; tri_bias [B, J, K, H]
    mask_bias = (1e9 * (mask - 1))[:, :, None, None, :]  # [B, I, 1, 1, K]
    bias = tri_bias.permute(0, 3, 1, 2).unsqueeze(1)  # [B, 1, H, J, K]
    return _ds4sci(q, k, v, [mask_bias, bias]) * torch.sigmoid(g)


def _ds4sci_triangle_end(q, k, v, mask, tri_bias, g):
    t = lambda x: x.transpose(-4, -3)  # noqa: E731
    o = _ds4sci_triangle_start(t(q), t(k), t(v), mask.transpose(-1, -2), tri_bias.transpose(-2, -3), t(g))
    return t(o)


# ---------------------------------------------------------------------------- the bare core


def _cueq_core(q, k, v, mask_bias, pair_bias):
    # q, k, v: [N, H, L, c]; mask_bias [N, 1, 1, L]; pair_bias [1, H, L, L]
    keep = (mask_bias == 0)[None]  # [1, N, 1, 1, L]
    o = _cueq()(q[None], k[None], v[None], pair_bias[None], keep, scale=q.shape[-1] ** -0.5)
    return o[0]


def _trifast_core(q, k, v, mask_bias, pair_bias):
    # trifast: [1, H, N, L, c] with N == L, bias [1, H, L, L], mask [1, N, L] True = masked
    qt, kt, vt = (t.transpose(0, 1)[None] for t in (q, k, v))
    masked = (mask_bias[:, 0, 0, :] != 0)[None]
    return _trifast()(qt, kt, vt, pair_bias, masked)[0].transpose(0, 1)


def _ds4sci_core(q, k, v, mask_bias, pair_bias):
    qt, kt, vt = (t.transpose(1, 2)[None] for t in (q, k, v))  # [1, N, L, H, c]
    return _ds4sci(qt, kt, vt, [mask_bias[None], pair_bias[None]])[0].transpose(1, 2)


ADAPTERS: dict[str, dict[str, Callable]] = {
    "cuequivariance": {
        "msa_row_pair_bias": _cueq_msa_row,
        "triangle_start": _cueq_triangle_start,
        "triangle_end": _cueq_triangle_end,
        "evoformer_core": _cueq_core,
    },
    "trifast": {
        "triangle_start": _trifast_triangle_start,
        "triangle_end": _trifast_triangle_end,
        "evoformer_core": _trifast_core,
    },
    "ds4sci": {
        "msa_row_pair_bias": _ds4sci_msa_row,
        "msa_column": _ds4sci_msa_column,
        "triangle_start": _ds4sci_triangle_start,
        "triangle_end": _ds4sci_triangle_end,
        "evoformer_core": _ds4sci_core,
    },
}


def adapter(peer: str, variant: str) -> Callable | None:
    return ADAPTERS.get(peer, {}).get(variant)


# DeepSpeed 0.19.8 instantiates its forward kernel for one pass over the value's width
# per 64-key block (CUTLASS's kSingleValueIteration with 64 keys per block): wider heads
# are not checked and come back non-finite (measured: c 128 on an H200).
DS4SCI_MAX_HEAD = 64
DS4SCI_HEAD_LIMIT = f"DS4Sci_EvoformerAttention's kernel takes head widths up to {DS4SCI_MAX_HEAD}"


def not_applicable(peer: str, variant: str, shape: dict, dtype: torch.dtype) -> str | None:
    """Why ``peer`` cannot compute this cell (a shape or dtype it does not take), else ``None``."""
    if peer == "trifast" and variant == "evoformer_core" and shape["N"] != shape["L"]:
        return "trifast takes square pair representations only (N == L)"
    if peer == "ds4sci":
        if dtype not in DS4SCI_DTYPES:
            return "DS4Sci_EvoformerAttention computes in bf16 and fp16 only"
        length = shape.get("S") if variant == "msa_column" else shape.get("L", shape.get("N"))
        if length is not None and length <= 16:
            return "DS4Sci_EvoformerAttention needs more than 16 positions"
        if shape.get("c", 0) > DS4SCI_MAX_HEAD:
            return DS4SCI_HEAD_LIMIT
    return None

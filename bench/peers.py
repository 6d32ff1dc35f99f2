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
- DeepSpeed's ``DS4Sci_EvoformerAttention`` is not included: it compiles CUDA kernels
  against CUTLASS at first use, and neither DeepSpeed's sdist build nor CUTLASS is
  carried to the GPU machine (see bench/README.md).
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch

PEERS = ("cuequivariance", "trifast")

ABSENT = {
    "deepspeed_evoformer": (
        "DeepSpeed's DS4Sci_EvoformerAttention builds its CUDA kernels against CUTLASS at "
        "first use; DeepSpeed (an sdist with a CUDA build) and CUTLASS are not carried to "
        "the GPU machine, so it is not measured"
    ),
}


def availability(peer: str) -> str | None:
    """``None`` when ``peer`` can run here, else why not."""
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


ADAPTERS: dict[str, dict[str, Callable]] = {
    "cuequivariance": {
        "msa_row_pair_bias": _cueq_msa_row,
        "triangle_start": _cueq_triangle_start,
        "triangle_end": _cueq_triangle_end,
    },
    "trifast": {
        "triangle_start": _trifast_triangle_start,
        "triangle_end": _trifast_triangle_end,
    },
}


def adapter(peer: str, variant: str) -> Callable | None:
    return ADAPTERS.get(peer, {}).get(variant)

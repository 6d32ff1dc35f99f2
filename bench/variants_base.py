"""What the attention variants share: the :class:`Variant` record, random inputs, FLOP
counts, the SDPA batch adapter and FlexAttention block masks (see :mod:`bench.variants`)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask


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


def as_outputs(result) -> tuple[torch.Tensor, ...]:
    """A variant's result as a tuple of tensors (one, or several: an output and its
    row log-sum-exp)."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


# ----------------------------------------------------------------------------------------
# Random inputs
# ----------------------------------------------------------------------------------------


def gen_device(generator: torch.Generator | None) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


def random_normal(shape, dtype, device, generator, std: float = 1.0) -> torch.Tensor:
    """Normal values drawn in float32 (so every dtype sees the same draw), then cast."""
    x = torch.randn(tuple(shape), generator=generator, device=gen_device(generator))
    if std != 1.0:
        x = x * std
    return x.to(device=device, dtype=dtype)


def random_uniform(shape, generator) -> torch.Tensor:
    return torch.rand(tuple(shape), generator=generator, device=gen_device(generator))


def random_int(low: int, high: int, shape, device, generator) -> torch.Tensor:
    """Integers in ``[low, high)``, int64."""
    x = torch.randint(low, high, tuple(shape), generator=generator, device=gen_device(generator))
    return x.to(device)


def random_keep_mask(shape, generator, p_keep: float = 0.8) -> torch.Tensor:
    """Bool mask over the last dim, ``True`` = keep; each row keeps at least one position
    and, when the row has more than one, masks at least one."""
    keep = random_uniform(shape, generator) < p_keep
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


def sizes_of(shape: dict, *keys: str) -> tuple[int, ...]:
    return tuple(shape[k] for k in keys)


# ----------------------------------------------------------------------------------------
# FLOPs
# ----------------------------------------------------------------------------------------


def attn_flops(batch: float, lq: int, lkv: int, d: int, dv: int, density: float = 1.0) -> float:
    """Two contractions, ``S = Q K^T`` and ``O = P V``, over the kept (query, key) pairs."""
    return 2.0 * batch * lq * lkv * (d + dv) * density


def window_density(length: int, window: int) -> float:
    """Fraction of pairs with ``0 <= i - j < window`` in an ``length x length`` grid."""
    w = min(window, length)
    kept = w * (w + 1) / 2 + (length - w) * w
    return kept / (length * length)


def prefix_density(length: int, prefix: int) -> float:
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


def causal_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


SLIDING_WINDOW = 16  # tokens each query sees, itself included (see ``sliding_window``)


def sliding_window_mod(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < SLIDING_WINDOW)


# Block masks are built eagerly and once per distinct mask input, outside the compiled
# Flex call: a model builds its block mask once per forward and reuses it in every layer,
# so the Flex timings measure attention alone. (Building one inside torch.compile with a
# mask_mod that indexes a captured tensor is also known to fault with an illegal memory
# access, pytorch/pytorch#160018; on the H200 it did, for the prefix-LM mask.)


@torch.compiler.disable
@functools.lru_cache(maxsize=32)
def static_block_mask(kind: str, lq: int, lkv: int, device: str):
    mod = {"causal": causal_mod, "sliding_window": sliding_window_mod}[kind]
    return create_block_mask(mod, None, None, lq, lkv, device=device)


_DATA_BLOCK_MASKS: dict[tuple, tuple] = {}


@torch.compiler.disable
def data_block_mask(make_mod: Callable, data: torch.Tensor, batch: int | None, lq: int, lkv: int):
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
# Language-model variants: q, k, v [B, H, L, D], the lengths 256..16k
# ----------------------------------------------------------------------------------------

LM_SHAPES: tuple[dict, ...] = (
    {"B": 64, "H": 16, "L": 256, "D": 64},
    {"B": 16, "H": 16, "L": 1024, "D": 64},
    {"B": 4, "H": 16, "L": 4096, "D": 64},
    {"B": 1, "H": 16, "L": 16384, "D": 64},
)


def bhld_inputs(shape, dtype, device, generator):
    B, H, L, D = sizes_of(shape, "B", "H", "L", "D")
    return tuple(random_normal((B, H, L, D), dtype, device, generator) for _ in range(3))  # [B, H, L, D] each


def bhld_flops(density: float) -> Callable[[dict], float]:
    return lambda s: attn_flops(s["B"] * s["H"], s["L"], s["L"], s["D"], s["D"], density)

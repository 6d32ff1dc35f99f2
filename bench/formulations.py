"""Every formulation of a FlexAttention or SDPA peer a competent user would try.

The catalog's ``flex`` / ``sdpa`` forms (:mod:`bench.variants_evoformer`) read OpenFold's
tensors as they come: q, k, v as strided views and, for Flex, the permuted pair bias
``[B, L, L, H]`` inside ``score_mod`` (strided loads). The kernel benchmark times every
formulation listed here for a peer and keeps the fastest per cell, recording which won
(``formulation``) and each one's time and error against float64 (``formulations``):

- ``catalog``: the catalog's form;
- ``bias_contiguous``: one contiguous copy of the shared pair bias per call, inside the
  timed call, which ``score_mod`` (Flex) or the bias sum (SDPA) then reads;
- ``qkv_contiguous``: that, plus contiguous ``[rows, H, L, c]`` copies of q, k and v; the
  output is gated as before;
- ``compiled_call``: the same copies made eagerly, around ``torch.compile(flex_attention)``
  alone (the usage FlexAttention's documentation shows). Compiling the whole form lets
  Inductor fuse the copies into the kernel's loads, which reads the pair bias strided
  again; this form keeps them copies;
- ``bias_input``: the pair bias's copy made eagerly, and the rest of the form (masking,
  the attention over q, k, v as they come, the gate) compiled whole with the copy as an
  input, so Inductor fuses the gate but cannot fold the copy back.

The forms compiled whole by the caller are plain functions; the last two compile inside
(``compile_inside``, :func:`compiles_itself`) and are called as they are.
``compile_inside=None`` runs their eager twin (the same arithmetic), which the CPU tests
check.

``flex_flash`` (FlexAttention's ``BACKEND="FLASH"``, CuTeDSL) uses the Flex forms with
``kernel_options={"BACKEND": "FLASH"}``. Each form takes the variant's inputs and returns
its output, gate included; ``tests/test_bench_smoke.py`` checks them in float64.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.nn.attention.flex_attention import flex_attention

from bench.variants_base import sdpa_any_batch

FLASH_OPTIONS = {"BACKEND": "FLASH"}


# ---------------------------------------------------------------------------- FlexAttention


_compiled = functools.cache(torch.compile)  # one compiled callable per function


def _attend(compile_inside: str | None) -> Callable:
    """``flex_attention`` itself, or compiled alone (a ``compiled_call`` form)."""
    return _compiled(flex_attention) if compile_inside == "flex_call" else flex_attention


def _after_copy(fn: Callable, compile_inside: str | None) -> Callable:
    """``fn`` (the form after its bias copy), compiled whole in a ``bias_input`` form."""
    return _compiled(fn) if compile_inside == "after_bias_copy" else fn


def compiles_itself(form: Callable) -> bool:
    """Whether ``form`` compiles inside (a ``compiled_call`` or ``bias_input`` form)."""
    return bool(getattr(form, "keywords", {}).get("compile_inside"))


def _flex_rows(q, k, v, mask_bias, bias, rows_per_bias: int, scale, kernel_options, contiguous_qkv: bool,
               compile_inside: str | None = None):
    """Flex over ``[R, H, L, c]`` rows; ``mask_bias`` [R, L]; ``bias`` [R // rows_per_bias, H, L, L]."""
    if contiguous_qkv:
        q, k, v = (t.contiguous() for t in (q, k, v))

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + mask_bias[b, kv_idx] + bias[b // rows_per_bias, h, q_idx, kv_idx]

    return _attend(compile_inside)(q, k, v, score_mod=score_mod, scale=scale, kernel_options=kernel_options)


def msa_row_flex(q, k, v, mask, pair_bias, g, *, compile_inside=None, **options):
    # q, k, v: [B, S, H, L, c] (q pre-scaled); pair_bias [B, 1, H, L, L] (a permuted view)
    bias = pair_bias[:, 0].contiguous()  # [B, H, L, L]: the one copy per call
    return _after_copy(_msa_row_after_copy, compile_inside)(q, k, v, mask, bias, g, compile_inside=compile_inside,
                                                           **options)


def _msa_row_after_copy(q, k, v, mask, bias, g, *, contiguous_qkv=False, kernel_options=None, compile_inside=None):
    B, S, H, L, c = q.shape
    mask_bias = (1e9 * (mask - 1)).reshape(B * S, L)
    rows = [t.reshape(B * S, H, L, c) for t in (q, k, v)]
    o = _flex_rows(*rows, mask_bias, bias, S, 1.0, kernel_options, contiguous_qkv, compile_inside)
    return o.reshape(B, S, H, L, c).transpose(-2, -3) * torch.sigmoid(g)


def msa_column_flex(q, k, v, mask, g, *, kernel_options=None, compile_inside=None, **_):
    # q, k, v, g: [B, S, L, H, c]; contiguous [B * L, H, S, c] copies (the permute needs one anyway)
    B, S, L, H, c = q.shape
    qt, kt, vt = (t.permute(0, 2, 3, 1, 4).contiguous().reshape(B * L, H, S, c) for t in (q, k, v))
    mask_bias = (1e9 * (mask.transpose(-1, -2) - 1)).reshape(B * L, S).contiguous()

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + mask_bias[b, kv_idx]

    o = _attend(compile_inside)(qt, kt, vt, score_mod=score_mod, kernel_options=kernel_options)
    return o.reshape(B, L, H, S, c).permute(0, 3, 1, 2, 4) * torch.sigmoid(g)


def triangle_start_flex(q, k, v, mask, tri_bias, g, *, compile_inside=None, **options):
    # q, k, v, g: [B, I, J, H, c]; tri_bias [B, J, K, H]
    bias = tri_bias.permute(0, 3, 1, 2).contiguous()  # [B, H, J, K]: the one copy per call
    return _after_copy(_triangle_after_copy, compile_inside)(q, k, v, mask, bias, g, compile_inside=compile_inside,
                                                            **options)


def _triangle_after_copy(q, k, v, mask, bias, g, *, contiguous_qkv=False, kernel_options=None, compile_inside=None):
    B, N, _, H, c = q.shape
    rows = [t.transpose(-2, -3).reshape(B * N, H, N, c) for t in (q, k, v)]
    mask_bias = (1e9 * (mask - 1)).reshape(B * N, N)
    o = _flex_rows(*rows, mask_bias, bias, N, c ** -0.5, kernel_options, contiguous_qkv, compile_inside)
    return o.reshape(B, N, H, N, c).transpose(-2, -3) * torch.sigmoid(g)


def triangle_end_flex(q, k, v, mask, tri_bias, g, **options):
    t = lambda x: x.transpose(-4, -3)  # noqa: E731
    return t(triangle_start_flex(t(q), t(k), t(v), mask.transpose(-1, -2), tri_bias.transpose(-2, -3), t(g),
                                 **options))


# ---------------------------------------------------------------------------- SDPA


def msa_row_sdpa(q, k, v, mask, pair_bias, g):
    bias = (1e9 * (mask - 1))[..., :, None, None, :] + pair_bias.contiguous()  # [B, S, H, L, L]
    o = sdpa_any_batch(q.contiguous(), k.contiguous(), v.contiguous(), attn_mask=bias, scale=1.0)
    return o.transpose(-2, -3) * torch.sigmoid(g)


def msa_column_sdpa(q, k, v, mask, g):
    qt, kt, vt = (t.permute(0, 2, 3, 1, 4).contiguous() for t in (q, k, v))
    mask_bias = (1e9 * (mask.transpose(-1, -2) - 1))[..., :, None, None, :].contiguous()
    o = sdpa_any_batch(qt, kt, vt, attn_mask=mask_bias.to(q.dtype))
    return o.permute(0, 3, 1, 2, 4) * torch.sigmoid(g)


def triangle_start_sdpa(q, k, v, mask, tri_bias, g):
    qt, kt, vt = (t.transpose(-2, -3).contiguous() for t in (q, k, v))
    bias = (1e9 * (mask - 1))[..., :, None, None, :] + tri_bias.permute(0, 3, 1, 2).contiguous().unsqueeze(-4)
    o = sdpa_any_batch(qt, kt, vt, attn_mask=bias)
    return o.transpose(-2, -3) * torch.sigmoid(g)


def triangle_end_sdpa(q, k, v, mask, tri_bias, g):
    t = lambda x: x.transpose(-4, -3)  # noqa: E731
    return t(triangle_start_sdpa(t(q), t(k), t(v), mask.transpose(-1, -2), tri_bias.transpose(-2, -3), t(g)))


# ---------------------------------------------------------------------------- the table

def _flex_forms(fn: Callable, bias_copy: bool = True) -> dict[str, Callable]:
    forms = {"bias_contiguous": fn} if bias_copy else {}
    forms["qkv_contiguous"] = functools.partial(fn, contiguous_qkv=True) if bias_copy else fn
    forms["compiled_call"] = functools.partial(fn, contiguous_qkv=True, compile_inside="flex_call")
    if bias_copy:
        forms["bias_input"] = functools.partial(fn, compile_inside="after_bias_copy")
    return forms


_FLEX_EXTRA: dict[str, dict[str, Callable]] = {
    "msa_row_pair_bias": _flex_forms(msa_row_flex),
    "msa_column": _flex_forms(msa_column_flex, bias_copy=False),
    "triangle_start": _flex_forms(triangle_start_flex),
    "triangle_end": _flex_forms(triangle_end_flex),
}
_SDPA_EXTRA: dict[str, dict[str, Callable]] = {
    "msa_row_pair_bias": {"qkv_contiguous": msa_row_sdpa},
    "msa_column": {"qkv_contiguous": msa_column_sdpa},
    "triangle_start": {"qkv_contiguous": triangle_start_sdpa},
    "triangle_end": {"qkv_contiguous": triangle_end_sdpa},
}
# Flex forms that take kernel_options (of the catalog's own flex forms: the core's, vanilla and causal)
_TAKES_OPTIONS = {"evoformer_core", "vanilla", "causal_tril", "causal_triu"}


def forms(variant, impl: str) -> dict[str, Callable]:
    """Formulation name -> callable for ``impl`` in ``("flex", "flex_flash", "sdpa")``;
    eager callables (``flex`` forms are compiled by the caller unless they
    :func:`compiles_itself`). Empty when the variant has
    no such peer."""
    if impl == "sdpa":
        if variant.sdpa is None:
            return {}
        return {"catalog": variant.sdpa, **_SDPA_EXTRA.get(variant.name, {})}
    if variant.flex is None:
        return {}
    if impl == "flex":
        return {"catalog": variant.flex, **_FLEX_EXTRA.get(variant.name, {})}
    if impl == "flex_flash":
        found = {}
        if variant.name in _TAKES_OPTIONS:
            found["catalog"] = functools.partial(variant.flex, kernel_options=FLASH_OPTIONS)
        for name, fn in _FLEX_EXTRA.get(variant.name, {}).items():
            found[name] = functools.partial(fn, kernel_options=FLASH_OPTIONS)  # keeps fn's keywords
        return found
    raise ValueError(f"no formulations for {impl!r}")


def flash_availability() -> str | None:
    """``None`` when FlexAttention's FLASH backend can run here, else why not."""
    import importlib.util

    if not torch.cuda.is_available():
        return "FlexAttention's FLASH backend needs a CUDA GPU"
    try:
        found = importlib.util.find_spec("flash_attn.cute") is not None
    except ImportError:
        found = False
    if not found:
        return ("FlexAttention's FLASH backend needs flash-attn-4 (flash_attn.cute) and CuTeDSL: on the GPU "
                "machine, carry .gpuflash/a and .gpuflash/b (scripts/gpu_fetch.sh --flash) in calls of their "
                "own, then run with scripts/gpu_run.sh --flash")
    return None


def pick(results: dict[str, dict]) -> str | None:
    """The winning formulation: the fastest of those that ran, gave finite values and are
    no less accurate than 4x the most accurate one (plus 1e-6), so a wrong form never wins."""
    ok = {n: r for n, r in results.items() if r.get("status") == "ok" and not r.get("nonfinite")}
    if not ok:
        return None
    errs = [r["max_rel_err"] for r in ok.values() if r.get("max_rel_err") is not None]
    bound = 4 * min(errs) + 1e-6 if errs else float("inf")
    fair = {n: r for n, r in ok.items() if r.get("max_rel_err") is None or r["max_rel_err"] <= bound}
    return min(fair, key=lambda n: fair[n]["ms"])

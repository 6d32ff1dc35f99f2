"""Attention forms the compiler fuses whole, against eager PyTorch and default
``torch.compile`` (both of which write an ``L x L`` matrix per head to memory) and, where
it can express them, FlexAttention written as its users would (``FLEX_FORMS``):

- ``talking_heads``: scores mixed over heads by a learned ``[H, H]`` matrix before the
  softmax ([Note: inner loops] in ``flashlight/passes/tiling.py``);
- ``latent``: multi-head latent attention with the up-projections absorbed,
  ``(q W_uk) c^T + q_pe k_pe^T`` over a latent ``c`` shared by the heads, the output
  up-projected per head (the projection runs after the kernel);
- ``disentangled``: DeBERTa's content and relative-position scores, ``q @ pos_k^T`` and
  ``k @ pos_q^T`` over ``2P`` positions looked up by clamped distance
  ([Note: gathers] in ``flashlight/lower_gather.py``).

    python -m bench.new_forms [--out bench/results/new_forms.json] [--forms talking_heads,latent]
                              [--shapes 4x8x1024x64,2x8x2048x64] [--dtype bf16]

Per form and shape ``BxHxLxD``: the median time of each implementation
(``bench.common.bench_ms``), all in one process, each checked against float64; the peak
memory each allocates above its inputs; what Flashlight's autotuner chose (its kernel, or
the unfused graph where that timed faster) with both timings; and Flashlight's kernels
and the operations left outside them.
"""
from __future__ import annotations

import argparse
import pathlib

import torch

from bench.common import atomic_write_json, bench_ms, environment, peak_bytes

IMPLS = ("eager", "torch_compile", "flex", "flashlight")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# per head width D: the latent width (512 at D 64, as DeepSeek's), the rotary width and
# the relative positions (2P: 256 at D 64, as DeBERTa's)
LATENT, ROPE, POSITIONS = 8, 1, 4


def talking_heads(q, k, v, mix):
    s = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5  # [B, H, L, L]
    return torch.softmax(torch.einsum("bhij,hg->bgij", s, mix), -1) @ v  # [B, H, L, D]


def latent(q_nope, q_pe, c_kv, k_pe, w_uk, w_uv):
    q_latent = torch.einsum("bhld,hdc->bhlc", q_nope, w_uk)  # [B, H, L, C]
    s = torch.einsum("bhlc,bmc->bhlm", q_latent, c_kv) + torch.einsum("bhlr,bmr->bhlm", q_pe, k_pe)
    p = torch.softmax(s * (q_nope.shape[-1] + q_pe.shape[-1]) ** -0.5, -1)
    return torch.einsum("bhlc,hcd->bhld", torch.einsum("bhlm,bmc->bhlc", p, c_kv), w_uv)  # [B, H, L, D]


def disentangled(q, k, v, pos_q, pos_k):
    L, half = q.shape[-2], pos_k.shape[-2] // 2
    i = torch.arange(L, device=q.device)
    index = ((i[:, None] - i[None, :]).clamp(-half, half - 1) + half).expand(*q.shape[:-1], L)  # [B, H, L, L]
    c2p = torch.gather(q @ pos_k.transpose(-1, -2), -1, index)
    p2c = torch.gather(k @ pos_q.transpose(-1, -2), -1, index).transpose(-1, -2)
    return torch.softmax((q @ k.transpose(-1, -2) + c2p + p2c) / (3 * q.shape[-1]) ** 0.5, -1) @ v


def latent_flex(q_nope, q_pe, c_kv, k_pe, w_uk, w_uv):
    """``latent`` as a FlexAttention user writes it: the query's latent projection first,
    then one attention over the concatenated latent and rotary widths, the latent keys
    shared by the heads, the output projected after."""
    from torch.nn.attention.flex_attention import flex_attention

    H = q_nope.shape[1]
    q = torch.cat([torch.einsum("bhld,hdc->bhlc", q_nope, w_uk), q_pe], -1)  # [B, H, L, C + R]
    k = torch.cat([c_kv, k_pe], -1)[:, None].expand(-1, H, -1, -1)  # [B, H, L, C + R]
    v = c_kv[:, None].expand(-1, H, -1, -1)  # [B, H, L, C]
    o = flex_attention(q, k, v, scale=(q_nope.shape[-1] + q_pe.shape[-1]) ** -0.5)
    return torch.einsum("bhlc,hcd->bhld", o, w_uv)  # [B, H, L, D]


def disentangled_flex(q, k, v, pos_q, pos_k):
    """``disentangled`` as a FlexAttention user writes it: both relative-position products
    first (``[B, H, L, 2P]`` each), looked up by clamped distance inside ``score_mod``."""
    from torch.nn.attention.flex_attention import flex_attention

    half = pos_k.shape[-2] // 2
    c2p, p2c = q @ pos_k.transpose(-1, -2), k @ pos_q.transpose(-1, -2)  # [B, H, L, 2P]
    scale = (3 * q.shape[-1]) ** -0.5

    def score_mod(score, b, h, i, j):
        return score + scale * (c2p[b, h, i, (i - j).clamp(-half, half - 1) + half]
                                + p2c[b, h, j, (j - i).clamp(-half, half - 1) + half])

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale)


def _inputs(form: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple:
    B, H, L, D = shape
    gen = torch.Generator(device=device).manual_seed(L)

    def randn(*size, scale=1.0):
        return (scale * torch.randn(*size, device=device, generator=gen)).to(dtype)

    if form == "talking_heads":
        return (randn(B, H, L, D), randn(B, H, L, D), randn(B, H, L, D),
                torch.eye(H, device=device, dtype=dtype) + randn(H, H, scale=0.3))
    if form == "latent":
        C, R = LATENT * D, ROPE * D
        return (randn(B, H, L, D), randn(B, H, L, R), randn(B, L, C, scale=0.2), randn(B, L, R),
                randn(H, D, C, scale=D ** -0.5), randn(H, C, D, scale=C ** -0.5))
    return (randn(B, H, L, D), randn(B, H, L, D), randn(B, H, L, D),
            randn(H, POSITIONS * D, D), randn(H, POSITIONS * D, D))


FORMS = {"talking_heads": talking_heads, "latent": latent, "disentangled": disentangled}
# FlexAttention's form of each form it can express, compiled whole (talking heads mixes the
# heads' scores before the softmax: no score_mod sees another head's score)
FLEX_FORMS = {"latent": latent_flex, "disentangled": disentangled_flex}


def _row(form: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> dict:
    import flashlight
    from flashlight import runtime

    fn = FORMS[form]
    inputs = _inputs(form, shape, dtype, device)
    want = fn(*(t.double() for t in inputs))
    impls = {"eager": fn, "torch_compile": torch.compile(fn), "flashlight": flashlight.compile(fn)}
    if form in FLEX_FORMS:
        impls["flex"] = torch.compile(FLEX_FORMS[form])
    row: dict = {"form": form, **dict(zip("BHLD", shape))}
    events = len(runtime.TUNING_EVENTS)
    for name, impl in impls.items():
        with torch.no_grad():
            try:
                out = impl(*inputs)
            except Exception as error:  # noqa: BLE001 - a peer that cannot run this shape says why
                row[name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
                continue
            err = float((out.double() - want).abs().max() / want.abs().max())
            ms = bench_ms(lambda: impl(*inputs), device.type, rep_ms=200)
            peak = round(peak_bytes(lambda: impl(*inputs)) / 2**20, 1) if device.type == "cuda" else None
        row[name] = {"ms": round(ms, 4), "max_rel_err": err, "peak_mib_above_inputs": peak}
    row["flashlight_tuning"] = [{k: e[k] for k in ("choice", "kernel_ms", "eager_ms", "candidates")}
                                for e in runtime.TUNING_EVENTS[events:]]
    with torch.no_grad():
        report = flashlight.explain(fn, *inputs)
    row["flashlight_kernels"] = [list(k.aten_ops) for k in report.kernels]
    row["flashlight_outside"] = [op.name for op in report.fallback_ops]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.new_forms")
    p.add_argument("--out", default="bench/results/new_forms.json")
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--shapes", default="4x8x1024x64,2x8x2048x64", help="BxHxLxD, comma-separated")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    rows = []
    for form in args.forms.split(","):
        for text in args.shapes.split(","):
            torch.compiler.reset()
            row = _row(form, tuple(int(x) for x in text.split("x")), DTYPES[args.dtype], device)
            rows.append(row)
            print(f"{form} {text} {args.dtype}: "
                  + ", ".join(f"{n} {row[n]['ms']:.3f} ms ({row[n]['peak_mib_above_inputs']} MiB)"
                              if "ms" in row[n] else f"{n} {row[n]['error']}" for n in IMPLS if n in row)
                  + f"; {len(row['flashlight_kernels'])} kernel(s), outside {row['flashlight_outside']}", flush=True)
    meta = {**environment(device.type), "dtype": args.dtype}
    atomic_write_json(pathlib.Path(args.out), {"schema": "flashlight-bench-new-forms/1", "meta": meta, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

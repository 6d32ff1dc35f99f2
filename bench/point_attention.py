"""Attention biased by squared distances between points (invariant point attention's
form), forward: Flashlight against eager, default ``torch.compile`` and SDPA on the
expanded distances (:func:`point_attention_sdpa`).

    python -m bench.point_attention [--out bench/results/point_attention.json] [--device cuda]

``s = q k^T / sqrt(c) - softplus(w_h) / 2 * sum_{p, x} (a_ipx - b_jpx)^2``, softmax over
the keys, times the values: q/k/v ``[B, H, L, c]``, points ``[B, H, L, P * 3]`` (a view
splits them), a learned weight per head. The distance sum is the case of [Note:
elementwise inner loops] in flashlight/passes/tiling.py. Median of ``do_bench`` for each
form in one process, each checked against float64; the configuration autotuning kept
for each Flashlight kernel is recorded with its time.
"""
from __future__ import annotations

import argparse
import math
import pathlib

import torch
import torch.nn.functional as F

from bench.common import atomic_write_json, bench_ms, environment, set_precision

SHAPES = ((1, 12, 256, 16, 4), (1, 12, 512, 16, 4), (1, 12, 1024, 16, 8))  # B, H, L, c, points
SMALL_SHAPES = ((1, 2, 24, 16, 4),)
DTYPES = ("bf16", "tf32")


def point_attention(q, k, v, a, b, w):
    """[B, H, L, c] queries, keys and values; [B, H, L, P * 3] points; [H] weights."""
    pa, pb = a.unflatten(-1, (-1, 3)), b.unflatten(-1, (-1, 3))  # [B, H, L, P, 3]
    d2 = ((pa[:, :, :, None] - pb[:, :, None]) ** 2).sum((-1, -2))  # [B, H, L, L]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) - 0.5 * F.softplus(w)[:, None, None] * d2
    return torch.softmax(s, -1) @ v


def point_attention_sdpa(q, k, v, a, b, w):
    """The same scores as a competent user hands them to SDPA: ``|a_i - b_j|^2 = |a_i|^2 +
    |b_j|^2 - 2 a_i.b_j``; the ``|a_i|^2`` term is constant along a softmax row and
    cancels, ``a_i.b_j`` joins the features of the queries and keys, ``|b_j|^2`` is a
    per-key bias. Exact in real arithmetic; in 16 bits the expansion cancels."""
    gamma = F.softplus(w)[:, None]  # [H, 1]
    q2 = torch.cat([q / math.sqrt(q.shape[-1]), gamma[..., None] * a], -1)  # [B, H, L, c + 3P]
    k2 = torch.cat([k, b], -1)
    bias = (-0.5 * gamma * (b * b).sum(-1))[:, :, None, :]  # [B, H, 1, L]
    return F.scaled_dot_product_attention(q2, k2, v, attn_mask=bias.to(q.dtype), scale=1.0)


def _inputs(shape, dtype, device, gen):
    B, H, L, c, P = shape
    qkv = [torch.randn(B, H, L, c, generator=gen, device=device) for _ in range(3)]
    points = [3.0 * torch.randn(B, H, L, P * 3, generator=gen, device=device) for _ in range(2)]
    w = torch.randn(H, generator=gen, device=device) - 2.0
    return [t.to(dtype) for t in (*qkv, *points)] + [w.to(dtype)]


def _configs(report) -> str:
    """Each kernel's configuration per call shape, as autotuning chose it."""
    return "; ".join(f"{k.name}: {k.chosen_configs()}" for k in report.kernels) if report.kernels else "none"


def main(argv=None) -> int:
    import flashlight
    from flashlight.report import ExplainReport

    p = argparse.ArgumentParser(prog="python -m bench.point_attention")
    p.add_argument("--out", default="bench/results/point_attention.json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    shapes = SHAPES if args.device == "cuda" else SMALL_SHAPES
    rows = []
    for dtype_name in DTYPES:
        dtype = set_precision(dtype_name)
        for shape in shapes:
            gen = torch.Generator(device=args.device).manual_seed(shape[2])
            x = _inputs(shape, dtype, args.device, gen)
            with torch.no_grad():
                want = point_attention(*[t.double() for t in x])
                report = ExplainReport()
                forms = {"eager": point_attention, "torch.compile": torch.compile(point_attention),
                         "sdpa (expanded)": point_attention_sdpa,
                         "flashlight": flashlight.compile(point_attention, report=report)}
                for name, fn in forms.items():
                    out = fn(*x)
                    err = ((out.double() - want).abs().max() / want.abs().max()).item()
                    ms = bench_ms(lambda: fn(*x), args.device)
                    rows.append({"dtype": dtype_name, "shape": "B{} H{} L{} c{} P{}".format(*shape), "impl": name,
                                 "ms": round(ms, 4), "max_rel_err": err,
                                 "kernels": _configs(report) if name == "flashlight" else None})
                    print(f"{dtype_name} {rows[-1]['shape']:22s} {name:14s} {ms:9.4f} ms  err {err:.1e}", flush=True)
            torch.compiler.reset()
    atomic_write_json(pathlib.Path(args.out), {"environment": environment(args.device), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

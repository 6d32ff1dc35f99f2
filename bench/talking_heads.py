"""Talking-heads attention (scores mixed over heads before the softmax): Flashlight's one
kernel ([Note: unrolled sums] in ``flashlight/passes/tiling.py``) against eager PyTorch
and default ``torch.compile``, which both write the ``[B, H, L, L]`` scores to memory.

    python -m bench.talking_heads [--out bench/results/talking_heads.json]
                                  [--shapes 4x8x1024x64,2x8x2048x64] [--dtype bf16]

``o = softmax(mix_h(q k^T / sqrt(D))) v`` with q/k/v ``[B, H, L, D]`` and a learned
``[H, H]`` mixing matrix; median time per form (``bench.common.bench_ms``), all in one process,
each checked against float64; the peak memory each form allocates above its inputs; and
what Flashlight's autotuner chose for each shape (its kernel, or the unfused graph where
that timed faster), with both timings.
"""
from __future__ import annotations

import argparse
import pathlib

import torch

from bench.common import atomic_write_json, bench_ms, environment, peak_bytes

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def talking_heads(q, k, v, mix):
    s = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5  # [B, H, L, L]
    return torch.softmax(torch.einsum("bhij,hg->bgij", s, mix), -1) @ v  # [B, H, L, D]


def _row(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, forms: dict) -> dict:
    from flashlight import runtime

    B, H, L, D = shape
    gen = torch.Generator(device=device).manual_seed(L)
    q, k, v = (torch.randn(B, H, L, D, device=device, generator=gen, dtype=dtype) for _ in range(3))
    mix = (torch.eye(H, device=device) + 0.3 * torch.randn(H, H, device=device, generator=gen)).to(dtype)
    inputs = (q, k, v, mix)
    want = talking_heads(*(t.double() for t in inputs))
    row: dict = {"B": B, "H": H, "L": L, "D": D}
    events = len(runtime.TUNING_EVENTS)
    for name, fn in forms.items():
        with torch.no_grad():
            out = fn(*inputs)
            err = float((out.double() - want).abs().max() / want.abs().max())
            ms = bench_ms(lambda: fn(*inputs), device.type, rep_ms=200)
            peak = round(peak_bytes(lambda: fn(*inputs)) / 2**20, 1) if device.type == "cuda" else None
        row[name] = {"ms": round(ms, 4), "max_rel_err": err, "peak_mib_above_inputs": peak}
    row["flashlight_tuning"] = [{k: e[k] for k in ("choice", "kernel_ms", "eager_ms", "candidates")}
                                for e in runtime.TUNING_EVENTS[events:]]
    return row


def main(argv=None) -> int:
    import flashlight

    p = argparse.ArgumentParser(prog="python -m bench.talking_heads")
    p.add_argument("--out", default="bench/results/talking_heads.json")
    p.add_argument("--shapes", default="4x8x1024x64,2x8x2048x64", help="BxHxLxD, comma-separated")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    forms = {"eager": talking_heads, "torch_compile": torch.compile(talking_heads),
             "flashlight": flashlight.compile(talking_heads)}
    rows = []
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        row = _row(shape, DTYPES[args.dtype], device, forms)
        rows.append(row)
        print(f"B{row['B']} H{row['H']} L{row['L']} D{row['D']} {args.dtype}: "
              + ", ".join(f"{n} {row[n]['ms']:.3f} ms ({row[n]['peak_mib_above_inputs']} MiB)" for n in forms)
              + f"; tuning {row['flashlight_tuning']}", flush=True)
    report = flashlight.explain(talking_heads, *(torch.randn(1, 2, 32, 16, device=device) for _ in range(3)),
                                torch.randn(2, 2, device=device))
    meta = {**environment(device.type), "dtype": args.dtype, "flashlight_kernels": len(report.kernels),
            "flashlight_fallback_ops": [op.name for op in report.fallback_ops]}
    atomic_write_json(pathlib.Path(args.out), {"schema": "flashlight-bench-talking-heads/1", "meta": meta, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

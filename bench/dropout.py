"""Attention with dropout on its probabilities, forward + backward: Flashlight against
eager PyTorch, default ``torch.compile`` and SDPA with ``dropout_p`` (PyTorch's fused
kernels; FlexAttention has no dropout).

    python -m bench.dropout [--out bench/results/dropout.json] [--device cuda]

``o = dropout(softmax(q k^T / sqrt(D) + bias), p) @ v``, q/k/v ``[B, H, L, D]`` and a
key-padding bias ``[B, 1, 1, L]`` in bf16 (SDPA takes the bias as its ``attn_mask``),
``p`` 0.1, training mode; each form's median time for one forward and backward
(``torch.autograd.grad`` of q, k, v for a random output gradient) and its peak memory
above what was allocated before the call. The draws differ between forms (each draws
its own mask), so each is checked against float64 with its keep fraction and, for
Flashlight, against float64 with the mask it drew (``tests/test_dropout.py`` checks that
on the CPU); here each form records ``mean |o|`` against the no-dropout output's (about
1: dropout keeps the expected output) and whether its gradients are finite. On a CPU
(``--device cpu``, interpreter) it runs one small shape, without ``torch.compile``, as a
smoke test.
"""
from __future__ import annotations

import argparse
import pathlib

import torch
import torch.nn.functional as F

from bench.common import atomic_write_json, bench_ms, environment, peak_bytes, short_error

P = 0.1
SHAPES = ((4, 8, 1024, 64), (8, 16, 512, 64), (2, 8, 4096, 64))
SMALL = ((1, 2, 33, 16),)


def attention_dropout(q, k, v, bias):
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias
    return F.dropout(torch.softmax(s, -1), P, training=True) @ v


def sdpa_dropout(q, k, v, bias):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=P)


def _forms(device: str):
    """The forms timed; on a CPU not ``torch.compile`` (its C++ build is a GPU run's
    business, not a smoke test's)."""
    import flashlight

    forms = {"eager": attention_dropout, "torch_compile": torch.compile(attention_dropout),
             "sdpa": sdpa_dropout, "flashlight": flashlight.compile(attention_dropout)}
    if device != "cuda":
        del forms["torch_compile"]
    return forms


def run_shape(shape, device: str, dtype: torch.dtype) -> dict:
    B, H, L, D = shape
    gen = torch.Generator(device=device).manual_seed(L)
    q, k, v = (torch.randn(B, H, L, D, device=device, generator=gen, dtype=dtype).requires_grad_() for _ in range(3))
    bias = torch.where(torch.rand(B, 1, 1, L, device=device, generator=gen) < 0.1, -1e4, 0.0).to(dtype)
    grad_out = torch.randn(B, H, L, D, device=device, generator=gen, dtype=dtype)
    with torch.no_grad():
        plain = (torch.softmax((q.double() @ k.double().transpose(-1, -2)) * D ** -0.5 + bias.double(), -1)
                 @ v.double()).abs().mean().item()
    row = {"B": B, "H": H, "L": L, "D": D}
    for name, fn in _forms(device).items():
        def step():
            out = fn(q, k, v, bias)
            return torch.autograd.grad(out, (q, k, v), grad_out)

        try:
            out = fn(q, k, v, bias)
            scale = out.double().abs().mean().item() / plain
            grads = torch.autograd.grad(out, (q, k, v), grad_out)
            finite = all(bool(torch.isfinite(g).all()) for g in grads)
            peak = round(peak_bytes(step) / 2**20, 1) if device == "cuda" else None
            row[name] = {"ms": round(bench_ms(step, device), 4), "peak_mib": peak,
                         "mean_abs_vs_no_dropout": round(scale, 4), "finite_gradients": finite}
        except Exception as exc:  # noqa: BLE001 - recorded
            row[name] = {"error": short_error(exc)}
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/dropout.json"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    rows = [run_shape(shape, args.device, dtype) for shape in (SHAPES if args.device == "cuda" else SMALL)]
    atomic_write_json(args.out, {"schema": "flashlight-bench-dropout/1", "environment": environment(args.device),
                                 "config": {"p": P, "dtype": str(dtype)}, "results": rows})
    for row in rows:
        cells = ", ".join(f"{n} {r['ms']:.3f} ms" if "ms" in r else f"{n} failed" for n, r in row.items()
                          if isinstance(r, dict))
        print(f"B{row['B']} H{row['H']} L{row['L']} D{row['D']}: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

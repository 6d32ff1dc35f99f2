"""Quick GPU check: every catalog variant at one realistic shape, correctness and speed.

    python -m bench.gpu_smoke [--variants a,b] [--dtypes bf16,fp32] [--out FILE]

For each variant: Flashlight's output against float64 eager (max abs error), the number
of Flashlight kernels, and median forward time (``triton.testing.do_bench``) of
Flashlight, eager, default ``torch.compile`` and FlexAttention (when the catalog has a
Flex formulation; ``--no-peers`` skips them). Prints a table and writes JSON. With
``FLASHLIGHT_CHECK_BOUNDS=1`` every Flashlight kernel (each autotuned configuration)
also checks that its loads and stores stay inside their tensors.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import time

import torch
import triton
from triton.testing import do_bench

import flashlight
from bench.variants import VARIANTS
from bench.variants_base import as_outputs

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}


def _time(fn, *args) -> float:
    return do_bench(lambda: fn(*args), warmup=25, rep=100, return_mode="median")


def _peer(name, make, args, row):
    try:
        t0 = time.perf_counter()
        fn = make()
        fn(*args)
        torch.cuda.synchronize()
        row[f"{name}_first_s"] = round(time.perf_counter() - t0, 2)
        row[f"{name}_ms"] = _time(fn, *args)
    except Exception as exc:  # noqa: BLE001 - a peer failing is a result, recorded as such
        row[f"{name}_ms"] = None
        row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"


def run_case(variant, shape, dtype_name, peers: bool = True) -> dict:
    dtype = DTYPES[dtype_name]
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
    gen = torch.Generator(device="cuda").manual_seed(0)
    args = variant.make_inputs(shape, dtype, "cuda", gen)
    row = {"variant": variant.name, "shape": shape, "dtype": dtype_name}
    torch.compiler.reset()
    report = flashlight.explain(variant.fn, *args)
    row["kernels"] = len(report.kernels)
    row["fallback_ops"] = [f"{op.name}: {op.reason}" for op in report.fallback_ops]
    compiled = flashlight.compile(variant.fn)
    outs = as_outputs(compiled(*args))
    refs = as_outputs(variant.fn(*[a.double() if a.is_floating_point() else a for a in args]))
    row["max_abs_err"] = max((o.double() - r).abs().max().item() for o, r in zip(outs, refs, strict=True))
    row["finite"] = all(bool(torch.isfinite(o).all()) for o in outs)
    row["flashlight_ms"] = _time(compiled, *args)
    row["tflops"] = variant.flops(shape) / row["flashlight_ms"] / 1e9
    if not peers:
        return row
    _peer("eager", lambda: variant.fn, args, row)
    _peer("torch_compile", lambda: torch.compile(variant.fn), args, row)
    if variant.flex is not None:
        _peer("flex", lambda: torch.compile(variant.flex), args, row)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--dtypes", default="bf16")
    parser.add_argument("--shape-index", type=int, default=0)
    parser.add_argument("--out", default="bench/results/gpu_smoke.json")
    parser.add_argument("--no-peers", action="store_true", help="time Flashlight only")
    args = parser.parse_args()
    rows = []
    for name in args.variants.split(","):
        variant = VARIANTS[name]
        shape = variant.bench_shapes[min(args.shape_index, len(variant.bench_shapes) - 1)]
        for dtype_name in args.dtypes.split(","):
            try:
                row = run_case(variant, shape, dtype_name, peers=not args.no_peers)
            except Exception as exc:  # noqa: BLE001
                row = {"variant": name, "shape": shape, "dtype": dtype_name,
                       "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": datetime.date.today().isoformat()}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"\n{meta}")
    print(f"{'variant':22s} {'dtype':5s} {'k':>2s} {'err':>9s} {'flash':>8s} {'eager':>8s} {'compile':>8s} {'flex':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:22s} {r['dtype']:5s} ERROR {r['error'][:120]}")
            continue
        fmt = lambda v: f"{v:8.3f}" if isinstance(v, float) else f"{'-':>8s}"  # noqa: E731
        print(f"{r['variant']:22s} {r['dtype']:5s} {r['kernels']:2d} {r['max_abs_err']:9.2e} {fmt(r['flashlight_ms'])} "
              f"{fmt(r.get('eager_ms'))} {fmt(r.get('torch_compile_ms'))} {fmt(r.get('flex_ms'))}")


if __name__ == "__main__":
    main()

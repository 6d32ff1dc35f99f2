"""Forward + backward of the Evoformer attentions at AlphaFold2's training sizes.

Each implementation computes the catalog variant (``bench.variants``) and the gradients
of every learned input (q, k, v, the pair or triangle bias, the gate; never the masks)
for a random output gradient, through ``torch.autograd.grad``. Timed as one call of
forward and backward (median, CUDA events, ``bench.common.bench_ms``); peak memory is
what one call allocates above what was allocated before it; the first call (compiles
included) is timed once. Gradients are checked against float32 eager (TF32 off).

    python -m bench.training --out bench/results/training.json [--dtypes bf16,fp32]
"""
from __future__ import annotations

import argparse
import inspect
import json
import pathlib
import time

import torch

from bench.common import atomic_write_json, bench_ms, environment, peak_bytes, set_precision, short_error

CASES = (  # AlphaFold2 training: crop 256, 128 MSA clusters; MSA H 8 c 32, triangle H 4 c 32
    ("msa_row_pair_bias", {"B": 1, "S": 128, "L": 256, "H": 8, "c": 32}),
    ("msa_column", {"B": 1, "S": 128, "L": 256, "H": 8, "c": 32}),
    ("triangle_start", {"B": 1, "N": 256, "H": 4, "c": 32}),
    ("triangle_end", {"B": 1, "N": 256, "H": 4, "c": 32}),
    ("evoformer_core", {"N": 256, "L": 256, "H": 4, "c": 64}),  # the paper's c 64 config
)
# opt-in (``--cases``), at language-model sizes: keys shared by groups of query heads,
# whose gradients sum the group's repeats ([Note: the repeats outside the key loop] in
# flashlight/passes/tiling.py), and masks whose dead tiles the backward skips too
# ([Note: tile skipping] in flashlight/passes/skipping.py)
LM_CASES = (
    ("gqa", {"B": 4, "H": 32, "Hkv": 8, "L": 1024, "D": 128}),
    ("mqa", {"B": 4, "H": 16, "L": 1024, "D": 128}),
    ("causal_tril", {"B": 4, "H": 16, "L": 2048, "D": 128}),
    ("document_mask", {"H": 16, "L": 8192, "D": 64, "n_docs": 12}),
)
IMPLS = ("eager", "torch_compile", "flex", "flashlight", "cuequivariance", "trifast")


def learned(variant, args) -> list[int]:
    """Positions of the inputs that carry gradients: floating tensors that are not masks."""
    names = list(inspect.signature(variant.fn).parameters)
    return [k for k, (name, x) in enumerate(zip(names, args))
            if torch.is_tensor(x) and x.is_floating_point() and "mask" not in name]


def one_cell(variant, shape, dtype, impl, inputs, grad_out, want) -> dict:
    from bench.kernels import applicable, make_impl

    if not applicable(variant, impl):
        return {"status": "n/a"}
    fn = make_impl(variant, impl, "cuda", None)
    positions = learned(variant, inputs)
    args = [x.detach().to(dtype).requires_grad_() if k in positions else
            (x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x) for k, x in enumerate(inputs)]
    leaves = [args[k] for k in positions]

    def step():
        out = fn(*args)
        return torch.autograd.grad(out, leaves, grad_out.to(out.dtype))

    start = time.perf_counter()
    grads = step()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    errors = [float((g.float() - w).abs().max() / w.abs().max().clamp_min(1e-30)) for g, w in zip(grads, want)]
    del grads
    peak = peak_bytes(step)
    ms = bench_ms(step, "cuda", rep_ms=200)
    kernels = _kernel_times(step) if impl == "flashlight" else None
    host_ms, host_profile = _host_time(step, profile=impl == "flashlight")
    return {"kernels_us": kernels, "status": "ok", "ms": round(ms, 4), "host_ms": round(host_ms, 4),
            "peak_mib": round(peak / 2**20, 1), "first_call_s": round(first_s, 2),
            "max_rel_grad_error": max(errors), "host_profile": host_profile}


def _host_time(step, calls: int = 20, profile: bool = False) -> tuple[float, str | None]:
    """Milliseconds the host takes to issue one call (``calls`` calls back to back, no
    synchronisation between them: when this is as long as ``ms`` the call is bound by the
    host), and with ``profile`` the Python functions that time goes to (cProfile, own
    time, as text)."""
    from bench.module_host import host_profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    host_ms = 1e3 * (time.perf_counter() - start) / calls
    torch.cuda.synchronize()
    return host_ms, (host_profile(step, calls, top=25) if profile else None)


def _kernel_times(step) -> dict[str, float]:
    """GPU time per kernel name of one call (microseconds), largest first."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_time_total > 0:
            times[event.key[:60]] = round(event.device_time_total, 1)
    return dict(sorted(times.items(), key=lambda kv: -kv[1])[:10])


def main(argv=None) -> int:
    from bench.variants import VARIANTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/training.json"))
    parser.add_argument("--dtypes", default="bf16")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--cases", default=",".join(name for name, _ in CASES),
                        help="comma list; also " + ", ".join(name for name, _ in LM_CASES))
    args = parser.parse_args(argv)
    cells = []
    for dtype_name in args.dtypes.split(","):
        for name, shape in CASES + LM_CASES:
            if name not in args.cases.split(","):
                continue
            variant = VARIANTS[name]
            gen = torch.Generator("cuda").manual_seed(0)
            inputs = variant.make_inputs(shape, torch.float32, "cuda", gen)
            positions = learned(variant, inputs)
            set_precision("fp32")  # the reference: float32, TF32 off
            torch.backends.cuda.matmul.allow_tf32 = False
            reference = [x.detach().requires_grad_() if k in positions else x for k, x in enumerate(inputs)]
            out = variant.fn(*reference)
            grad_out = torch.randn(out.shape, generator=gen, device="cuda")
            want = torch.autograd.grad(out, [reference[k] for k in positions], grad_out)
            del out, reference
            dtype = set_precision(dtype_name)
            for impl in args.impls.split(","):
                torch.compiler.reset()
                try:
                    cell = one_cell(variant, shape, dtype, impl, inputs, grad_out, want)
                except Exception as exc:  # noqa: BLE001 - recorded with the error
                    cell = {"status": "error", "error": short_error(exc)}
                cell.update(variant=name, shape=shape, dtype=dtype_name, impl=impl)
                cells.append(cell)
                print(json.dumps({k: v for k, v in cell.items() if k != "host_profile"}), flush=True)
                torch.cuda.empty_cache()
    atomic_write_json(args.out, {"schema": "flashlight-bench-training/1", "environment": environment("cuda"),
                                 "cells": cells})
    print_table(cells)
    return 0


def print_table(cells) -> None:
    rows = {}
    for c in cells:
        rows.setdefault((c["variant"], c["dtype"]), {})[c["impl"]] = c
    impls = [i for i in IMPLS if any(i in r for r in rows.values())]
    print("case | dtype | " + " | ".join(impls) + " | flashlight vs fastest peer")
    for (name, dtype), row in rows.items():
        times = {i: row[i]["ms"] for i in impls if row.get(i, {}).get("status") == "ok"}
        peers = [t for i, t in times.items() if i != "flashlight"]
        ratio = f"{min(peers) / times['flashlight']:.2f}x" if peers and "flashlight" in times else "-"
        cols = [f"{times[i]:.3f} ({row[i]['peak_mib']:.0f} MiB)" if i in times else row.get(i, {}).get("status", "-")
                for i in impls]
        print(f"{name} | {dtype} | " + " | ".join(cols) + f" | {ratio}")


if __name__ == "__main__":
    raise SystemExit(main())

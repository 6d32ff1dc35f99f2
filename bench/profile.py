"""Where the time of one variant goes on the GPU: the CUDA kernels of one call.

    python -m bench.profile --variants triangle_end --dtypes bf16 [--impls flashlight,flex] [--host]

For each variant, dtype and implementation, runs the call a few times under
``torch.profiler`` and prints its CUDA kernels with their mean time per call, so an
extra copy, a second kernel or a slow main kernel shows at a glance. ``--host`` also
measures the CPU time one call takes to launch its work (calls issued back to back,
no synchronisation) and the Python functions that time goes to (cProfile): a call
whose launch takes longer than its kernels is bound by the host, not the GPU.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench.common import set_precision
from bench.kernels import applicable, make_impl
from bench.variants import VARIANTS

CALLS = 20


def profile_one(variant, shape: dict, dtype_name: str, impl: str, host: bool = False) -> None:
    if not applicable(variant, impl):
        return
    dtype = set_precision(dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(0)
    args = variant.make_inputs(shape, dtype, "cuda", gen)
    fn = make_impl(variant, impl, "cuda", None)
    for _ in range(3):  # compile, autotune, warm up
        fn(*args)
    torch.cuda.synchronize()
    print_kernels(fn, args, f"{variant.name} {dtype_name} {impl} {shape}")
    if host:
        profile_host(fn, args)


def print_kernels(fn, args, title: str) -> float:
    """Print the CUDA kernels of one call of ``fn(*args)`` (means over ``CALLS`` calls);
    returns their summed time per call in ms."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn(*args)
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows) / CALLS / 1e3
    print(f"\n{title}: {total:.3f} ms of kernels per call")
    for e in rows[:6]:
        print(f"  {e.device_time_total / CALLS / 1e3:8.3f} ms  x{e.count // CALLS:<2d} {e.key[:90]}")
    return total


def profile_host(fn, args, calls: int = 200, functions: bool = True) -> float:
    """Print (and return, in ms) the host time to issue one call of ``fn(*args)``, calls
    back to back without synchronising; with ``functions``, also the Python functions
    that time goes to (cProfile)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    issued = (time.perf_counter() - t0) / calls
    torch.cuda.synchronize()
    print(f"  host: {issued * 1e3:.3f} ms to issue one call")
    if not functions:
        return issued * 1e3
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn(*args)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
    print("\n".join("    " + line for line in text.getvalue().splitlines() if line.strip())[:3000])
    return issued * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", required=True)
    parser.add_argument("--dtypes", default="bf16")
    parser.add_argument("--impls", default="flashlight,flex")
    parser.add_argument("--shape-index", type=int, default=0)
    parser.add_argument("--host", action="store_true", help="also profile the launch on the CPU")
    args = parser.parse_args()
    for name in args.variants.split(","):
        variant = VARIANTS[name]
        shape = variant.bench_shapes[min(args.shape_index, len(variant.bench_shapes) - 1)]
        for dtype_name in args.dtypes.split(","):
            for impl in args.impls.split(","):
                profile_one(variant, shape, dtype_name, impl, args.host)


if __name__ == "__main__":
    main()

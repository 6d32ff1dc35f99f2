"""How long each autotuning candidate of a variant's kernels takes to build for a GPU.

    python -m bench.build_times --variants vanilla,causal_tril [--dtype fp32|tf32|bf16]
                                [--shape '{"D": 64}'] [--configs 64,128,4,2 ...]
                                [--capability 90] [--backward] [--out FILE]

Needs no GPU: each kernel is compiled ahead of time (``KernelReport.aot_compile``) for
every configuration of its autotuning space, one after another on one CPU core, at the
variant's default (small) shape updated with ``--shape`` (give the head width of the
shapes that matter: the tiles' registers and the build time grow with it), or for the
configurations given with ``--configs`` (also ones outside the space). Prints build
seconds, registers and spill stack per thread for each (BLOCK_M, BLOCK_N, warps, stages).
The autotuner builds all candidates before timing them (in parallel, see
``flashlight.runtime.precompile``), so the slowest candidate bounds a kernel's first call.
With ``--backward`` the kernels of a training step (forward and backward) are built: the
step runs once on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``; minutes at
head width 128 and a few hundred positions), which compiles the backward.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from bench.common import DTYPES, set_precision


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.build_times", description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", required=True, help="comma-separated catalog names")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--shape", default="{}", help="JSON dict of sizes that replace the default shape's")
    p.add_argument("--configs", nargs="*", default=None,
                   help="BLOCK_M,BLOCK_N,num_warps,num_stages to build instead of the kernel's space")
    p.add_argument("--capability", type=int, default=90)
    p.add_argument("--backward", action="store_true",
                   help="the kernels of forward and backward (runs the step under TRITON_INTERPRET=1)")
    p.add_argument("--out", help="also write the rows as JSON here")
    return p.parse_args(argv)


def _training_step_report(variant, inputs):
    """What Flashlight compiled for ``variant``'s forward and backward on ``inputs``."""
    import torch

    import flashlight
    from bench.training import learned
    from bench.variants_base import as_outputs
    from flashlight.report import ExplainReport

    positions = learned(variant, inputs)  # the inputs bench.training differentiates
    args = [x.detach().requires_grad_() if k in positions else x for k, x in enumerate(inputs)]
    report = ExplainReport()
    outs = as_outputs(torch.compile(variant.fn, backend=flashlight.backend.make_backend(report=report))(*args))
    g = torch.Generator().manual_seed(1)
    torch.autograd.backward(outs, [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs])
    return report


def build_times(variant, dtype: str, capability: int, sizes: dict | None = None,
                configs: list[tuple[int, int, int, int]] | None = None, backward: bool = False) -> list[dict]:
    """One row per (kernel, configuration) of ``variant`` at its default shape updated with
    ``sizes``; with ``backward``, of its training step's kernels."""
    import os

    import torch

    import flashlight

    if backward and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("--backward runs the step on the CPU: set TRITON_INTERPRET=1")
    try:
        torch_dtype = set_precision(dtype)  # TF32 or IEEE contractions for float32
        shape = {**variant.default_shape, **(sizes or {})}
        inputs = variant.make_inputs(shape, torch_dtype, "cpu", torch.Generator().manual_seed(0))
        report = _training_step_report(variant, inputs) if backward else flashlight.explain(variant.fn, *inputs)
    finally:
        set_precision("fp32")  # PyTorch's default
        torch.compiler.reset()
    rows = []
    for kernel in report.kernels:
        for block_m, block_n, warps, stages in configs or kernel.gpu_configs:
            t0 = time.perf_counter()
            built = kernel.aot_compile(capability, block_m=block_m, block_n=block_n, num_warps=warps,
                                       num_stages=stages)
            rows.append({"variant": variant.name, "shape": shape, "dtype": dtype, "kernel": kernel.name,
                         "config": [block_m, block_n, warps, stages],
                         "build_s": round(time.perf_counter() - t0, 2), "registers": built.n_regs,
                         "spill_bytes": built.stack, "shared_bytes": built.shared})
    return rows


def main(argv=None) -> int:
    from bench.variants import VARIANTS

    args = parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"bench.build_times: unknown variants {unknown}; known: {sorted(VARIANTS)}", file=sys.stderr)
        return 2
    sizes = json.loads(args.shape)
    configs = [tuple(int(x) for x in c.split(",")) for c in args.configs] if args.configs else None
    if configs and any(len(c) != 4 for c in configs):
        print("bench.build_times: --configs takes BLOCK_M,BLOCK_N,num_warps,num_stages", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        for row in build_times(VARIANTS[name], args.dtype, args.capability, sizes, configs, args.backward):
            rows.append(row)
            print(f"{row['variant']:<18} {row['dtype']:<5} {row['kernel']:<24} {str(tuple(row['config'])):<18} "
                  f"{row['build_s']:6.1f} s  regs {row['registers']:>4}  spill {row['spill_bytes']:>6} B",
                  flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

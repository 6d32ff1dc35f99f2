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
With ``--sass`` each row also counts the SASS instructions of the build's loops (a loop:
the code from a backward branch's target to the branch; ``cuobjdump -sass``, shipped with
Triton), per thread and step, by opcode: what a loop step issues, for comparing two
forms of a kernel without a GPU (issue slots are not times).
With ``--backward`` the kernels of a training step (forward and backward) are built: the
step runs once on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``; minutes at
head width 128 and a few hundred positions), which compiles the backward.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
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
    p.add_argument("--sass", action="store_true", help="also count each build's loop instructions by opcode")
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


def loop_instructions(sass: str) -> list[dict]:
    """Per loop of a kernel's SASS text (``cuobjdump -sass``; a loop runs from a backward
    branch's target to the branch), its instruction count and the count of each opcode
    (predicates and modifiers dropped: ``@!P0 FFMA.FTZ`` is ``FFMA``)."""
    lines = [(int(m.group(1), 16), m.group(2).strip())
             for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;\n]*);", sass)]
    at = {address: k for k, (address, _) in enumerate(lines)}
    loops = []
    for k, (address, text) in enumerate(lines):
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address and int(target.group(1), 16) in at:
            body = [t for _, t in lines[at[int(target.group(1), 16)]:k + 1]]
            opcodes = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
            loops.append({"instructions": len(body), "opcodes": dict(opcodes.most_common())})
    return loops


def _sass(cubin: str) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout


def build_times(variant, dtype: str, capability: int, sizes: dict | None = None,
                configs: list[tuple[int, int, int, int]] | None = None, backward: bool = False,
                sass: bool = False) -> list[dict]:
    """One row per (kernel, configuration) of ``variant`` at its default shape updated with
    ``sizes``; with ``backward``, of its training step's kernels; with ``sass``, each
    row with its loops' instruction counts (:func:`loop_instructions`)."""
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
            with tempfile.TemporaryDirectory() as tmp:
                cubin = os.path.join(tmp, "kernel.cubin") if sass else None
                built = kernel.aot_compile(capability, block_m=block_m, block_n=block_n, num_warps=warps,
                                           num_stages=stages, cubin_path=cubin)
                loops = loop_instructions(_sass(cubin)) if sass else None
            rows.append({"variant": variant.name, "shape": shape, "dtype": dtype, "kernel": kernel.name,
                         "config": [block_m, block_n, warps, stages],
                         "build_s": round(time.perf_counter() - t0, 2), "registers": built.n_regs,
                         "spill_bytes": built.stack, "shared_bytes": built.shared,
                         **({"loops": loops} if sass else {})})
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
        for row in build_times(VARIANTS[name], args.dtype, args.capability, sizes, configs, args.backward,
                               args.sass):
            rows.append(row)
            loops = " ".join(str(loop["instructions"]) for loop in row.get("loops", ()))
            print(f"{row['variant']:<18} {row['dtype']:<5} {row['kernel']:<24} {str(tuple(row['config'])):<18} "
                  f"{row['build_s']:6.1f} s  regs {row['registers']:>4}  spill {row['spill_bytes']:>6} B"
                  + (f"  loop instructions {loops}" if args.sass else ""), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

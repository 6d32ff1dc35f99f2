"""Flashlight's Evoformer-core kernel in the forms its base-2 pass can give it, timed side by side.

    python -m bench.core_forms [--shapes all|0,2] [--dtypes bf16,tf32] [--forms exp,base2,lazy]
                               [--max-minutes 3] [--out bench/results/core_forms.json]

For each shape of ``evoformer_core`` (:mod:`bench.variants_core`) and dtype, the kernel
is built three ways from the same graph, with the same tile candidates (the cost
model's few), and autotuned and timed in one process:

- ``exp``: without the base-2 pass (the loop's exponentials as ``exp``, the scale as a
  multiply of its own);
- ``base2``: as the pipeline builds it ([Note: base-2 online softmax] in
  ``flashlight/passes/base2.py``: the scale and log2(e) in one multiply, ``exp2``),
  rescaled on every step;
- ``lazy``: base 2 with lazy rescaling ([Note: lazy rescaling]).

Per cell: every candidate's median time (Triton's autotuner), the best, the launcher's
median time at it, and the largest difference from the ``exp`` form's output relative
to its largest value (a check that the forms compute the same). Needs a CUDA GPU; on a
CPU ``--device cpu`` runs the default small shape under the interpreter (checks the
harness, times mean nothing).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time

FORMS = ("exp", "base2", "lazy")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.core_forms", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="all", help="all, default, or indices into evoformer_core's bench shapes")
    p.add_argument("--dtypes", default="bf16,tf32")
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--max-minutes", type=float, default=3.0, help="stop before starting a cell after this")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default=None, help="result file (.json)")
    return p.parse_args(argv)


def build(fn, inputs, form: str, fp32_precision: str, interpret: bool):
    """The launcher of ``fn``'s single kernel in ``form``, and its inputs in argument order."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from flashlight import pipeline
    from flashlight.backoff import search
    from flashlight.codegen import generate
    from flashlight.decompositions import decompositions
    from flashlight.ir import dim_names
    from flashlight.lower import lower
    from flashlight.passes.base2 import RESCALE_THRESHOLD, to_base2
    from flashlight.runtime import Launcher

    gm = make_fx(fn, decomposition_table=decompositions())(*inputs)
    lowered = lower(gm)
    passes = []
    for p in pipeline.KERNEL_PASSES:
        if p.name == "to_base2" and form == "exp":
            continue
        if p.name == "to_base2" and form == "lazy":
            p = dataclasses.replace(p, run=lambda k, _: to_base2(k, RESCALE_THRESHOLD))
        passes.append(p)
    compiler = dataclasses.replace(pipeline.pipeline_for(lowered), kernel_passes=tuple(passes))
    with dim_names(lowered.next_dim_id):
        plan = search(lowered, compiler, lambda *_: None)
    ((_, tiled),) = plan.kernels.items()
    src = generate(tiled, None, fp32_precision, interpret=interpret)
    tensor_of = dict(zip([n.name for n in gm.graph.nodes if n.op == "placeholder"], inputs))
    tensors = [tensor_of[name] for name in src.inputs]
    return Launcher(tiled, src, autotune=True, input_dtypes=tuple(t.dtype for t in tensors)), tensors


def run_cell(variant, shape: dict, dtype_name: str, form: str, device: str, base_out=None) -> tuple[dict, object]:
    import torch

    from bench.common import bench_ms, set_precision

    dtype = set_precision(dtype_name)
    inputs = variant.make_inputs(shape, dtype, device, torch.Generator(device="cpu").manual_seed(0))
    launcher, tensors = build(variant.fn, inputs, form, "tf32" if dtype_name == "tf32" else "ieee", device == "cpu")
    t0 = time.perf_counter()
    out = launcher(*tensors)
    torch.cuda.synchronize() if device == "cuda" else None
    rec = {"form": form, "dtype": dtype_name, "shape": shape, "first_call_s": round(time.perf_counter() - t0, 2)}
    ((_, chosen),) = launcher.chosen_configs().items()
    rec["config"] = list(chosen)
    timings = getattr(launcher._fn, "configs_timings", None) or {}
    rec["candidates"] = {"{}x{} w{} s{}".format(c.all_kwargs()["BLOCK_M"], c.all_kwargs()["BLOCK_N"], c.num_warps,
                                                 c.num_stages): (t[0] if isinstance(t, (list, tuple)) else t)
                         for c, t in timings.items()}
    rec["ms"] = bench_ms(lambda: launcher(*tensors), device, rep_ms=100)
    if base_out is not None:
        rec["rel_diff_vs_exp"] = float((out.double() - base_out.double()).abs().max()
                                       / base_out.double().abs().max().clamp_min(1e-30))
    return rec, out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from bench.common import RESULTS, environment
    from bench.variants import VARIANTS
    from flashlight import settings

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    variant = VARIANTS["evoformer_core"]
    shapes = ([variant.default_shape] if args.shapes == "default" or device == "cpu" else list(variant.bench_shapes)
              if args.shapes == "all" else [variant.bench_shapes[int(i)] for i in args.shapes.split(",")])
    forms = [f for f in args.forms.split(",") if f]
    out_path = pathlib.Path(args.out) if args.out else RESULTS / "core_forms.json"
    data = {"schema": "flashlight-bench-core-forms/1", "run": environment(device), "cells": []}
    deadline = time.monotonic() + 60 * args.max_minutes
    status = 0
    with settings.override(tuning_cache=False, tuned_configs="0"):
        for dtype_name in args.dtypes.split(","):
            for shape in shapes:
                base_out = None
                for form in forms:
                    if time.monotonic() > deadline:
                        print("bench.core_forms: out of time; the cells left are not measured", file=sys.stderr)
                        status = 3
                        break
                    rec, out = run_cell(variant, shape, dtype_name, form, device, base_out)
                    base_out = out if form == "exp" else base_out
                    data["cells"].append(rec)
                    print(f"{dtype_name:5s} {' '.join(f'{k}{v}' for k, v in shape.items()):24s} {form:6s} "
                          f"{rec['ms']:.4f} ms  {'x'.join(map(str, rec['config']))}  "
                          f"diff {rec.get('rel_diff_vs_exp', 0.0):.1e}  candidates {rec['candidates']}", flush=True)
                    del out
                    torch.cuda.empty_cache() if device == "cuda" else None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"bench.core_forms: {len(data['cells'])} cells -> {out_path}")
    return status


if __name__ == "__main__":
    sys.exit(main())

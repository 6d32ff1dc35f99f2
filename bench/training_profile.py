"""Where the GPU time of one ``model_1`` training step goes, stock and patched.

The model, batch and loss of :mod:`bench.training_step`; after one warm step, one step
under ``torch.profiler`` (CUDA activity), its device time summed by kernel family:
Flashlight's kernels, GEMMs, OpenFold's softmax extension, copies and elementwise
kernels, the rest (layer-norm backward, reductions). ``wall`` is the step timed
without the profiler; "GPU busy" is the profiled device time (the rest of the wall
time the GPU waits for the host).

    python -m bench.training_profile --out bench/results/training_step_profile.json
"""
from __future__ import annotations

import argparse
import collections
import copy
import pathlib
import time

import torch

from bench.common import atomic_write_json, environment
from bench.training_step import build, loss_weights, step


def family(name: str) -> str:
    low = name.lower()
    if name.startswith("flashlight_"):
        return "flashlight"
    if "softmax" in low:
        return "softmax_extension"
    if any(s in low for s in ("gemm", "nvjet", "cutlass", "xmma")):
        return "gemm"
    if "elementwise" in low or "copy" in low:
        return "copy_elementwise"
    return "other"


def profile_step(model, batch) -> dict:
    weights = loss_weights(model, batch)
    step(model, batch, weights)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    step(model, batch, weights)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(model, batch, weights)
        torch.cuda.synchronize()
    groups: collections.Counter = collections.Counter()
    for event in prof.key_averages():
        if event.device_time_total > 0:
            groups[family(event.key)] += event.device_time_total / 1e6
    return {"wall_s": round(wall, 3), "gpu_busy_s": round(sum(groups.values()), 3),
            "by_family_s": {k: round(v, 3) for k, v in groups.most_common()}}


def main(argv=None) -> int:
    import flashlight

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/training_step_profile.json"))
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = True
    model, batch = build(256, 128, 1024)
    patched = copy.deepcopy(model)
    flashlight.patch_openfold(patched)
    rows = {}
    for name, m in (("flashlight", patched), ("stock", model)):
        rows[name] = profile_step(m, batch)
        m.cpu()
        torch.cuda.empty_cache()
        print(name, rows[name], flush=True)
    atomic_write_json(args.out, {"schema": "flashlight-bench-training-profile/1", "environment": environment("cuda"),
                                 "config": {"residues": 256, "clusters": 128, "extra": 1024, "precision": "tf32"},
                                 "results": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

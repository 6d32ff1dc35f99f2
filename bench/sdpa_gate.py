"""SDPA with an additive mask and a sigmoid gate: Flashlight against eager SDPA and
default ``torch.compile`` (the case of the Inductor-remainder issue).

    python -m bench.sdpa_gate [--out bench/results/sdpa_gate.json] [--profile]

``o = sdpa(q, k, v, attn_mask=mask) * sigmoid(g)`` in bf16, q/k/v/g ``[B, H, L, D]``,
mask ``[B, 1, 1, L]`` (an additive key-padding bias); median of Triton's ``do_bench``
for each form, all in one process, checked against float64. ``--profile`` also records
each form's CUDA kernels per call (``torch.profiler``) and the host time to issue one call
(calls back to back), and prints where Flashlight's host time goes (cProfile).
"""
from __future__ import annotations

import argparse
import json
import platform

import torch
import torch.nn.functional as F

SHAPES = ((4, 8, 1024, 64), (8, 16, 512, 64), (2, 8, 4096, 64))


def gated_sdpa(q, k, v, mask, g):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * torch.sigmoid(g)


def main(argv=None) -> int:
    import triton

    import flashlight
    from bench.profile import print_kernels, profile_host

    p = argparse.ArgumentParser(prog="python -m bench.sdpa_gate")
    p.add_argument("--out", default="bench/results/sdpa_gate.json")
    p.add_argument("--profile", action="store_true", help="also kernels per call and host time per call")
    args = p.parse_args(argv)
    rows = []
    for B, H, L, D in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(L)
        q, k, v, g = (torch.randn(B, H, L, D, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(4))
        mask = torch.where(torch.rand(B, 1, 1, L, device="cuda", generator=gen) < 0.1, -1e4, 0.0).to(torch.bfloat16)
        inputs = (q, k, v, mask, g)
        want = gated_sdpa(*(t.double() for t in inputs))
        forms = {"eager": gated_sdpa, "torch_compile": torch.compile(gated_sdpa),
                 "flashlight": flashlight.compile(gated_sdpa)}
        row = {"B": B, "H": H, "L": L, "D": D}
        for name, fn in forms.items():
            with torch.no_grad():
                out = fn(*inputs)
                err = float((out.double() - want).abs().max() / want.abs().max())
                ms = triton.testing.do_bench(lambda: fn(*inputs), warmup=25, rep=200, return_mode="median")
            row[name] = {"ms": round(ms, 4), "max_rel_err": err}
            if args.profile:
                with torch.no_grad():
                    title = f"B{B} H{H} L{L} D{D} {name}"
                    row[name]["kernel_ms"] = round(print_kernels(fn, inputs, title), 4)
                    row[name]["host_ms"] = round(profile_host(fn, inputs, functions=name == "flashlight"), 4)
        report = flashlight.explain(gated_sdpa, *inputs)
        row["flashlight_kernels"] = len(report.kernels)
        row["flashlight_fallback_ops"] = [op.name for op in report.fallback_ops]
        rows.append(row)
        print(f"B{B} H{H} L{L} D{D}: " + ", ".join(f"{n} {row[n]['ms']:.3f} ms" for n in forms)
              + f"; Flashlight kernels {row['flashlight_kernels']}, left over {row['flashlight_fallback_ops']}")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version()}
    with open(args.out, "w") as f:
        json.dump({"schema": "flashlight-bench-sdpa-gate/1", "meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

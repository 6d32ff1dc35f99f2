"""Where a compiled form's time goes on the GPU: ``flashlight.compile`` with each
remainder (Inductor, eager) against eager and ``torch.compile``, median ms, and the
CUDA kernels of a few calls of each (``torch.profiler``), for one form of
:mod:`bench.new_forms`.

    python -m bench.new_forms_profile --form latent --shape 4x8x1024x64 [--out FILE]
"""
from __future__ import annotations

import argparse

import torch

from bench.common import bench_ms
from bench.new_forms import DTYPES, FORMS, _inputs


def main(argv=None) -> int:
    import flashlight

    p = argparse.ArgumentParser(prog="python -m bench.new_forms_profile")
    p.add_argument("--form", default="latent")
    p.add_argument("--shape", default="4x8x1024x64")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--out")
    args = p.parse_args(argv)
    fn, device = FORMS[args.form], torch.device("cuda")
    inputs = _inputs(args.form, tuple(int(x) for x in args.shape.split("x")), DTYPES[args.dtype], device)
    impls = {"eager": fn, "torch_compile": torch.compile(fn),
             "flashlight_inductor": flashlight.compile(fn, remainder="inductor"),
             "flashlight_eager": flashlight.compile(fn, remainder="eager")}
    lines = []
    with torch.no_grad():
        for name, impl in impls.items():
            if name.startswith("flashlight"):
                torch._dynamo.reset()  # each remainder compiles its own graph
            impl(*inputs)
            ms = bench_ms(lambda: impl(*inputs), "cuda", rep_ms=200)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    impl(*inputs)
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
            lines += [f"== {name}: {ms:.3f} ms", table]
            print(lines[-2], flush=True)
    text = "\n".join(lines)
    print(text[-6000:])
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

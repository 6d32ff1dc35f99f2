"""Host cost of one patched OpenFold attention module against stock, on the GPU.

    python -m bench.module_host [--n-res 256] [--n-seq 512] [--dtypes fp32,bf16] [--calls 50]

For OpenFold's triangle attention (starting node; 4 heads of 32, c_z 128), MSA row
attention with pair bias and MSA column attention (8 heads of 32, c_m 256), stock and
patched with :func:`flashlight.patch_openfold` (unchunked, as the fold calls them), it
measures per call:

- ``gpu_ms``: the median over rounds of ``calls`` back-to-back calls between two CUDA
  events, divided by ``calls`` (the device's time when the host keeps up);
- ``host_ms``: the wall time of issuing ``calls`` calls without synchronising, divided by
  ``calls`` (when it exceeds ``gpu_ms`` the module is bound by the host);
- the Python functions the patched call's host time goes to (cProfile, own time).

Prints one table and writes ``--out`` (JSON with the profiles as text).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.module_host", description=__doc__.split("\n\n")[0])
    p.add_argument("--n-res", type=int, default=256)
    p.add_argument("--n-seq", type=int, default=512)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default="bench/results/module_host.json")
    return p.parse_args(argv)


def modules_and_inputs(n_res: int, n_seq: int, dtype, device: str = "cuda"):
    """name -> (module, args): the three Evoformer attentions at model_1's widths."""
    import torch
    from openfold.model.msa import MSAColumnAttention, MSARowAttentionWithPairBias
    from openfold.model.triangular_attention import TriangleAttention

    from flashlight.integrations.openfold_testing import randomize_

    g = torch.Generator().manual_seed(0)
    m = torch.randn(1, n_seq, n_res, 256, generator=g)
    z = torch.randn(1, n_res, n_res, 128, generator=g)
    msa_mask = (torch.rand(1, n_seq, n_res, generator=g) > 0.1).float()
    pair_mask = (torch.rand(1, n_res, n_res, generator=g) > 0.1).float()
    found = {
        "tri_att_start": (TriangleAttention(128, 32, 4, starting=True), (z,), {"mask": pair_mask}),
        "msa_att_row": (MSARowAttentionWithPairBias(256, 128, 32, 8), (m,), {"z": z, "mask": msa_mask}),
        "msa_att_col": (MSAColumnAttention(256, 32, 8), (m,), {"mask": msa_mask}),
    }
    out = {}
    for name, (module, args, kwargs) in found.items():
        randomize_(module, g, gain=0.5)
        module = module.to(device=device, dtype=dtype).eval()
        cast = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
        out[name] = (module, tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()})
    return out


def time_calls(call, calls: int, rounds: int) -> tuple[float, float]:
    import torch

    call()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        for _ in range(calls):
            call()
        end.record()
        host.append((time.perf_counter() - t0) * 1e3 / calls)
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end) / calls)
    return statistics.median(gpu), statistics.median(host)


def host_profile(call, calls: int, top: int = 18) -> str:
    import torch

    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    import flashlight
    from bench.common import environment, set_precision

    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = set_precision("tf32" if dtype_name == "fp32" else dtype_name)
        for name, (module, a, kw) in modules_and_inputs(args.n_res, args.n_seq, dtype).items():
            call = lambda: module(*a, **kw)  # noqa: E731
            with torch.no_grad():
                stock = time_calls(call, args.calls, args.rounds)
                flashlight.patch_openfold(module)
                patched = time_calls(call, args.calls, args.rounds)
                profile = host_profile(call, args.calls)
                flashlight.unpatch_openfold(module)
            rows.append({"module": name, "dtype": dtype_name, "n_res": args.n_res, "n_seq": args.n_seq,
                         "stock_gpu_ms": stock[0], "stock_host_ms": stock[1],
                         "flashlight_gpu_ms": patched[0], "flashlight_host_ms": patched[1],
                         "flashlight_host_profile": profile})
    with open(args.out, "w") as f:
        json.dump({"machine": environment("cuda"), "args": vars(args), "rows": rows}, f, indent=1)
    print(f"{'module':14} {'dtype':5} {'stock gpu':>10} {'stock host':>10} {'fl gpu':>8} {'fl host':>8}  (ms/call)")
    for r in rows:
        print(f"{r['module']:14} {r['dtype']:5} {r['stock_gpu_ms']:10.3f} {r['stock_host_ms']:10.3f} "
              f"{r['flashlight_gpu_ms']:8.3f} {r['flashlight_host_ms']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

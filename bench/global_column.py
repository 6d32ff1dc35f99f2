"""The extra-MSA stack's global column attention, stock against patched, on the GPU.

    python -m bench.global_column [--n-res 256] [--n-seqs 1024,5120] [--dtypes bf16,fp32]

OpenFold's ``MSAColumnGlobalAttention`` at model_1's extra-MSA widths (c_e 64, 8 heads of
8), seeded random weights and a random sequence mask, unchunked as the fold calls it:
stock; patched with the attention alone compiled (the gate and the output projection as
the module's layers: a forward hook on ``linear_o`` keeps them so); patched whole (the
attention, and the gate with the output projection, as two kernels). Each row: the
median of ``triton.testing.do_bench`` (ms), the largest difference from stock relative
to its largest value, and the kernels each patched form launched; then each kernel's
autotuning outcome (its time against its unfused graph's, and the choice). Prints one
table and writes ``--out`` (JSON with the GPU and versions).
"""
from __future__ import annotations

import argparse
import copy
import json
import platform


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.global_column", description=__doc__.split("\n\n")[0])
    p.add_argument("--n-res", type=int, default=256)
    p.add_argument("--n-seqs", default="1024,5120")
    p.add_argument("--dtypes", default="bf16,tf32,fp32", help="fp32: IEEE float32 matmuls; tf32: float32 with TF32 "
                   "matmuls allowed, as flashlight-fold runs float32")
    p.add_argument("--out", default="bench/results/global_column.json")
    return p.parse_args(argv)


def forms(dtype):
    """name -> module: stock, the attention alone compiled, the whole module compiled."""
    import torch
    from openfold.model.msa import MSAColumnGlobalAttention

    import flashlight
    from flashlight.integrations.openfold_testing import randomize_

    stock = MSAColumnGlobalAttention(64, 8, 8).eval()
    randomize_(stock, torch.Generator().manual_seed(0))
    stock = stock.to(device="cuda", dtype=dtype)
    attention_only, whole = copy.deepcopy(stock), copy.deepcopy(stock)
    # a hook makes the output projection a layer the patch leaves in place
    attention_only.global_attention.linear_o.register_forward_hook(lambda *_: None)
    flashlight.patch_openfold(attention_only)
    flashlight.patch_openfold(whole)
    return {"stock": stock, "attention_only": attention_only, "whole": whole}


def measure(n_res: int, n_seq: int, dtype_name: str) -> list[dict]:
    import torch
    from triton.testing import do_bench

    from flashlight.integrations import openfold_testing as oft

    dtype = {"bf16": torch.bfloat16, "tf32": torch.float32, "fp32": torch.float32}[dtype_name]
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
    g = torch.Generator().manual_seed(1)
    m = torch.randn(n_seq, n_res, 64, generator=g).to("cuda", dtype)  # [S, R, c_e]
    mask = (torch.rand(n_seq, n_res, generator=g) > 0.2).to("cuda", dtype)  # [S, R]
    rows, want = [], None
    with torch.no_grad():
        for name, module in forms(dtype).items():
            out = module(m, mask=mask)  # compiles and tunes
            with oft.count_launches() as launches:
                module(m, mask=mask)
            ms = do_bench(lambda: module(m, mask=mask), warmup=25, rep=200, return_mode="median")
            want = out if want is None else want
            diff = ((out.double() - want.double()).abs().max() / want.double().abs().max()).item()
            rows.append({"n_res": n_res, "n_seq": n_seq, "dtype": dtype_name, "form": name, "ms": round(ms, 4),
                         "vs_stock": None, "rel_diff_vs_stock": diff, "kernels": len(launches)})
    for row in rows:
        row["vs_stock"] = round(rows[0]["ms"] / row["ms"], 3)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import triton

    rows = [row for dtype in args.dtypes.split(",") for n_seq in map(int, args.n_seqs.split(","))
            for row in measure(args.n_res, n_seq, dtype)]
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version()}
    from flashlight.runtime import TUNING_EVENTS

    tuning = [{k: e[k] for k in ("kernel", "sizes", "choice", "candidates", "kernel_ms", "eager_ms")}
              for e in TUNING_EVENTS]
    with open(args.out, "w") as f:
        json.dump({"environment": env, "rows": rows, "tuning": tuning}, f, indent=1)
    print(env)
    print("autotuning (kernel against its unfused graph):")
    for e in tuning:
        print(" ", e["kernel"], e["sizes"], e["choice"], e["kernel_ms"], e["eager_ms"])
    print("dtype n_seq form ms stock/form rel_diff kernels")
    for r in rows:
        print(r["dtype"], r["n_seq"], r["form"], r["ms"], r["vs_stock"], f"{r['rel_diff_vs_stock']:.1e}", r["kernels"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
